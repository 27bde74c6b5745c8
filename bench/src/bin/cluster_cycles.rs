//! Lock cycles on a Redis Cluster for profiling the nodes: `TASKS` tasks (default 64) each take and release a
//! lock of their own for `SECONDS` (default 10) through a distlock cluster client built from the seed URLs in
//! `$REDIS_CLUSTER` (comma-separated), or, with the argument `raw`, the raw floor (`SET NX PX` + an `EVALSHA`
//! compare-and-delete) on the redis crate's cluster client, or with `fenced` the least a fenced cycle by script
//! does, one script call per operation on that client (acquire: GET, TIME, SET PX; release: GET, then SET
//! KEEPTTL of a freed record), or with `fenced-batch` the same batched at its best: each task's call takes
//! `BATCH` (default 12) locks of one hash slot at once (one TIME for all), and the next call frees them all, so
//! a call does the work of many operations as distlock's shared calls at best do (but with `BATCH` locks a
//! task, far more locks in flight than `TASKS` tasks of one lock each have), or with `coalesced` the least a
//! fenced cycle by script does when `TASKS` locks, one per task as raw's, share calls as well as they can:
//! one task per primary takes all of that node's locks in one call (one TIME; a token of their own and the
//! record in ARGV each, as distlock's BATCH_SPREAD) and frees them all in the next (GET, SETRANGE of a freed
//! token), nothing else. Prints cycles per second.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "../coalesced.rs"]
mod coalesced;
#[path = "../floor.rs"]
mod floor;
use floor::{FENCED_ACQUIRE, FENCED_RELEASE, RAW_RELEASE};

/// FENCED_ACQUIRE for every key of the call, with one clock read for all.
const FENCED_ACQUIRE_BATCH: &str = "local t = redis.call('time') local now = t[1] .. t[2] \
     for i = 1, #KEYS do local v = redis.call('get', KEYS[i]) \
     redis.call('set', KEYS[i], ARGV[1] .. ':' .. now, 'px', ARGV[2]) end return 1";
/// FENCED_RELEASE for every key of the call.
const FENCED_RELEASE_BATCH: &str = "for i = 1, #KEYS do local v = redis.call('get', KEYS[i]) \
     if v and string.find(v, ARGV[1], 1, true) == 1 then redis.call('set', KEYS[i], 'freed', 'keepttl') end end \
     return 1";

fn main() {
    let seeds: Vec<String> = std::env::var("REDIS_CLUSTER")
        .expect("set REDIS_CLUSTER to seed URLs of a cluster of your own")
        .split(',')
        .map(str::to_owned)
        .collect();
    let mode = std::env::args().nth(1).unwrap_or_default();
    let (raw, fenced, batched) = (mode == "raw", mode == "fenced", mode == "fenced-batch");
    let coalesced = mode == "coalesced";
    let batch: usize = std::env::var("BATCH").map_or(12, |b| b.parse().expect("BATCH: a whole number"));
    let tasks: usize = std::env::var("TASKS").map_or(64, |t| t.parse().expect("TASKS: a whole number"));
    let seconds: u64 = std::env::var("SECONDS").map_or(10, |t| t.parse().expect("SECONDS: a whole number"));
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    runtime.block_on(async move {
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let mut handles = Vec::new();
        if coalesced {
            let mut conn = connect(seeds).await;
            let scripts = Arc::new(coalesced::Scripts::load());
            for (node, keys) in coalesced::keys_by_node(&mut conn, tasks).await {
                let (mut conn, scripts, stop, done) = (conn.clone(), scripts.clone(), stop.clone(), done.clone());
                handles.push(tokio::spawn(async move {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let cycles = scripts.cycle(&mut conn, &node, &keys, n).await.expect("coalesced call");
                        done.fetch_add(cycles, Ordering::Relaxed);
                        n += 1;
                    }
                }));
            }
        } else if batched {
            let conn = connect(seeds).await;
            let (acquire, release) = (
                Arc::new(redis::Script::new(FENCED_ACQUIRE_BATCH)),
                Arc::new(redis::Script::new(FENCED_RELEASE_BATCH)),
            );
            for task in 0..tasks {
                let (mut conn, acquire, release, stop, done) =
                    (conn.clone(), acquire.clone(), release.clone(), stop.clone(), done.clone());
                // One hash slot per task (a script's keys must share one); the tasks' slots spread over the nodes.
                let keys: Vec<String> = (0..batch).map(|i| format!("fb:{{{task}}}:{i}")).collect();
                handles.push(tokio::spawn(async move {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let token = format!("{task}-{n}");
                        let mut call = acquire.prepare_invoke();
                        call.arg(&token).arg(10_000);
                        for key in &keys {
                            call.key(key);
                        }
                        let _: i64 = call.invoke_async(&mut conn).await.expect("acquire");
                        let mut call = release.prepare_invoke();
                        call.arg(&token);
                        for key in &keys {
                            call.key(key);
                        }
                        let _: i64 = call.invoke_async(&mut conn).await.expect("release");
                        done.fetch_add(batch as u64, Ordering::Relaxed);
                        n += 1;
                    }
                }));
            }
        } else if fenced {
            let conn = connect(seeds).await;
            let (acquire, release) =
                (Arc::new(redis::Script::new(FENCED_ACQUIRE)), Arc::new(redis::Script::new(FENCED_RELEASE)));
            for task in 0..tasks {
                let (mut conn, acquire, release, stop, done) =
                    (conn.clone(), acquire.clone(), release.clone(), stop.clone(), done.clone());
                handles.push(tokio::spawn(async move {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let (key, token) = (format!("fenced:{task}"), format!("{task}-{n}"));
                        let _: i64 =
                            acquire.key(&key).arg(&token).arg(10_000).invoke_async(&mut conn).await.expect("acquire");
                        let _: i64 = release.key(&key).arg(&token).invoke_async(&mut conn).await.expect("release");
                        done.fetch_add(1, Ordering::Relaxed);
                        n += 1;
                    }
                }));
            }
        } else if raw {
            let conn = connect(seeds).await;
            let release = Arc::new(redis::Script::new(RAW_RELEASE));
            for task in 0..tasks {
                let (mut conn, release, stop, done) = (conn.clone(), release.clone(), stop.clone(), done.clone());
                handles.push(tokio::spawn(async move {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let (key, token) = (format!("raw:{task}"), format!("{task}-{n}"));
                        let _: Option<String> = redis::cmd("SET")
                            .arg(&key)
                            .arg(&token)
                            .arg("NX")
                            .arg("PX")
                            .arg(10_000)
                            .query_async(&mut conn)
                            .await
                            .expect("SET");
                        let _: i64 = release.key(&key).arg(&token).invoke_async(&mut conn).await.expect("release");
                        done.fetch_add(1, Ordering::Relaxed);
                        n += 1;
                    }
                }));
            }
        } else {
            let client = distlock::Client::builder().redis_cluster(seeds).build().await.expect("client");
            for task in 0..tasks {
                let (client, stop, done) = (client.clone(), stop.clone(), done.clone());
                handles.push(tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let guard = client
                            .lock(format!("dl:{task}"))
                            .ttl(Duration::from_secs(10))
                            .acquire()
                            .await
                            .expect("acquire");
                        guard.release().await.expect("release");
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }));
            }
        }
        let started = Instant::now();
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        stop.store(true, Ordering::Relaxed);
        for handle in handles {
            handle.await.expect("task");
        }
        let done = done.load(Ordering::Relaxed);
        println!("{:.0} cycles/s ({done} cycles)", done as f64 / started.elapsed().as_secs_f64());
    });
}

/// A connection through the redis crate's own cluster client.
async fn connect(seeds: Vec<String>) -> redis::cluster_async::ClusterConnection {
    let client = redis::cluster::ClusterClientBuilder::new(seeds).build().expect("cluster client");
    client.get_async_connection().await.expect("connect")
}
