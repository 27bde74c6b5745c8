//! Lone lock cycles for counting instructions: one task takes and releases one lock N times, with distlock
//! or with the raw floor (`SET NX PX` + an `EVALSHA` compare-and-delete on a `ConnectionManager`), against the
//! redis-server at `$REDIS_URL`. Run under callgrind twice and take the difference, which leaves out startup:
//!
//! ```sh
//! cargo build --release -p distlock-bench --bin lone_cycles
//! valgrind --tool=callgrind target/release/lone_cycles 1000 [raw|fenced|fresh]
//! valgrind --tool=callgrind target/release/lone_cycles 6000 [raw|fenced|fresh]   # (Ir at 6000 - Ir at 1000) / 5000
//! ```
//!
//! `fenced` runs the least fenced cycle by script instead (`FENCED_ACQUIRE` + `FENCED_RELEASE` by EVALSHA on the
//! same connection): what any fenced cycle by script costs Redis at least.
//!
//! `fresh` locks a new key each cycle (one lock per id, never locked before), where distlock's cycles otherwise
//! take the same key again. `TASKS=64` shares the cycles among 64 tasks, each on a key of its own: their
//! operations then share script calls, so what is counted is a batched cycle. Run redis-server itself under
//! callgrind (and `callgrind_control -d` after each run) to count what a cycle costs Redis.
//!
//! Instruction counts do not move with the machine's load, so they show client-side changes of a few percent
//! that wall-clock runs on a shared virtual machine cannot (no hardware counters there).

use std::time::Duration;

#[path = "../floor.rs"]
mod floor;
use floor::{FENCED_ACQUIRE, FENCED_RELEASE, RAW_RELEASE};

fn main() {
    let url = std::env::var("REDIS_URL").expect("set REDIS_URL to a redis-server of your own");
    let cycles: u64 = std::env::args().nth(1).map_or(10_000, |n| n.parse().expect("cycles: a whole number"));
    let raw = std::env::args().nth(2).is_some_and(|a| a == "raw");
    let fresh = std::env::args().nth(2).is_some_and(|a| a == "fresh");
    let fenced = std::env::args().nth(2).is_some_and(|a| a == "fenced");
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    // The cycles run in a task on the runtime's one worker, as the benchmark's do (`block_on` would run them on
    // this thread, and every task they spawn would wake the worker from here).
    let cycles_task = runtime.spawn(async move {
        if raw {
            raw_cycles(&url, cycles).await;
        } else if fenced {
            fenced_cycles(&url, cycles).await;
        } else {
            let client = distlock::Client::builder().redis(url).build().await.expect("client");
            let run = std::process::id();
            // TASKS=n: n tasks, each cycling on a key of its own, share the cycles; their operations share
            // script calls (BATCH), as the benchmark's 64 tasks do.
            let tasks: u64 = std::env::var("TASKS").map_or(1, |t| t.parse().expect("TASKS: a whole number"));
            let each = (0..tasks).map(|task| {
                let client = client.clone();
                tokio::spawn(async move {
                    for cycle in 0..cycles / tasks {
                        let key = if fresh { format!("lone:{run}:{task}:{cycle}") } else { format!("lone:{task}") };
                        let guard = client.lock(key).ttl(Duration::from_secs(30)).acquire().await.expect("acquire");
                        guard.release().await.expect("release");
                    }
                })
            });
            for task in each.collect::<Vec<_>>() {
                task.await.expect("a task ran to the end");
            }
        }
    });
    runtime.block_on(cycles_task).expect("the cycles ran to the end");
}

async fn raw_cycles(url: &str, cycles: u64) {
    let client = redis::Client::open(url).expect("URL");
    let mut conn = redis::aio::ConnectionManager::new(client).await.expect("connect");
    let sha: String = redis::cmd("SCRIPT").arg("LOAD").arg(RAW_RELEASE).query_async(&mut conn).await.expect("load");
    for _ in 0..cycles {
        let mut token = [0u8; 16];
        getrandom::fill(&mut token).expect("randomness");
        let set: redis::Value = redis::cmd("SET")
            .arg("lone-raw")
            .arg(&token[..])
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query_async(&mut conn)
            .await
            .expect("SET");
        assert!(matches!(set, redis::Value::Okay), "the key was taken");
        let deleted: i64 = redis::cmd("EVALSHA")
            .arg(&sha)
            .arg(1)
            .arg("lone-raw")
            .arg(&token[..])
            .query_async(&mut conn)
            .await
            .expect("EVALSHA");
        assert_eq!(deleted, 1, "the key was not ours");
    }
}

async fn fenced_cycles(url: &str, cycles: u64) {
    let client = redis::Client::open(url).expect("URL");
    let mut conn = redis::aio::ConnectionManager::new(client).await.expect("connect");
    let (acquire, release) = (redis::Script::new(FENCED_ACQUIRE), redis::Script::new(FENCED_RELEASE));
    for _ in 0..cycles {
        let mut token = [0u8; 16];
        getrandom::fill(&mut token).expect("randomness");
        let _: i64 =
            acquire.key("lone-fenced").arg(&token[..]).arg(30_000).invoke_async(&mut conn).await.expect("acquire");
        let freed: i64 = release.key("lone-fenced").arg(&token[..]).invoke_async(&mut conn).await.expect("release");
        assert_eq!(freed, 1, "the record was not ours");
    }
}
