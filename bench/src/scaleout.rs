//! Scale-out rows (`--scale-out`, issues 11 and 12): distlock on Redlock over 3 and 5 independent servers
//! against rslock's Redlock on the same servers, and on a Redis Cluster (3 primaries, 1 replica each) against
//! the raw floor through the redis crate's own cluster client (`SET NX PX` + an `EVALSHA` compare-and-delete)
//! on the same cluster. One task and 64 tasks, each cycling acquire + release on keys of its own (on the
//! cluster they spread over all slots). In each round every contender runs one window, in an order rotated
//! from round to round; each number is the median of cycles/s over the rounds. All servers are pinned to the
//! last CPU and the benchmark to the others, as in the other scenarios.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::Client;
use distlock_tests::cluster::RedisCluster;
use distlock_tests::RedisServer;
use redis::cluster_async::ClusterConnection;

use crate::{coalesced, systems};

const TTL: Duration = Duration::from_secs(10);
const TASK_COUNTS: [usize; 2] = [1, 64];

/// One row: a contender's cycles/s per round, and the CPU its cycles took, per cycle, in this process and in
/// the servers (10 ms resolution over a window).
struct Row {
    setup: String,
    tasks: usize,
    contender: &'static str,
    rates: Vec<f64>,
    client_cpu_us: Vec<f64>,
    servers_cpu_us: Vec<f64>,
    /// Script calls (EVALSHA and EVAL, on every server) per cycle.
    script_calls: Vec<f64>,
}

impl Row {
    fn median(&self) -> f64 {
        median_of(&self.rates)
    }
}

fn median_of(values: &[f64]) -> f64 {
    crate::measure::median(values.iter().copied())
}

/// Script calls (EVALSHA and EVAL) the servers have run so far, summed.
async fn script_calls(servers: &mut [redis::aio::MultiplexedConnection]) -> u64 {
    let mut calls = 0;
    for conn in servers {
        if let Ok(counters) = crate::measure::ServerCounters::read(conn).await {
            calls += ["evalsha", "eval"].iter().filter_map(|&c| counters.calls.get(c)).sum::<u64>();
        }
    }
    calls
}

/// The servers' CPU time so far, summed.
fn servers_cpu(servers: &[u32]) -> Duration {
    servers.iter().map(|&pid| crate::measure::process_cpu(pid)).sum()
}

/// Runs `cycle(task, n)` in `tasks` tasks for `window`, each call doing as many cycles as it returns; (cycles
/// per second, cycles).
pub(crate) async fn window<F, Fut>(tasks: usize, window: Duration, cycle: F) -> (f64, u64)
where
    F: Fn(usize, u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<u64, String>> + Send,
{
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let (stop, done, cycle) = (stop.clone(), done.clone(), cycle.clone());
            tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    match cycle(task, n).await {
                        Ok(cycles) => {
                            done.fetch_add(cycles, Ordering::Relaxed);
                        }
                        Err(e) => {
                            eprintln!("  a cycle failed: {e}");
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                    n += 1;
                }
            })
        })
        .collect();
    tokio::time::sleep(window).await;
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed();
    for handle in handles {
        let _ = handle.await;
    }
    let done = done.load(Ordering::Relaxed);
    (done as f64 / elapsed.as_secs_f64(), done)
}

/// The distlock cycle on `client`.
fn distlock_cycle(
    client: Client,
    prefix: &'static str,
) -> impl Fn(usize, u64) -> std::pin::Pin<Box<dyn Future<Output = Result<u64, String>> + Send>> + Clone {
    move |task, _| {
        let client = client.clone();
        Box::pin(async move {
            let guard = client.lock(format!("{prefix}:{task}")).ttl(TTL).acquire().await.map_err(|e| e.to_string())?;
            guard.release().await.map(|_| 1).map_err(|e| e.to_string())
        })
    }
}

/// Rounds of windows over `contenders` (name, tasks it runs, cycle), rotating their order; `tasks` is the row's
/// (the locks in flight); `servers` are the servers' pids, `conns` a connection to each (for their command counts).
async fn rounds<F, Fut>(
    setup: &str,
    servers: &[u32],
    conns: &mut [redis::aio::MultiplexedConnection],
    tasks: usize,
    rounds: usize,
    each: Duration,
    contenders: Vec<(&'static str, usize, F)>,
) -> Vec<Row>
where
    F: Fn(usize, u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<u64, String>> + Send,
{
    let mut rows: Vec<Row> = contenders
        .iter()
        .map(|(name, _, _)| Row {
            setup: setup.to_owned(),
            tasks,
            contender: name,
            rates: Vec::new(),
            client_cpu_us: Vec::new(),
            servers_cpu_us: Vec::new(),
            script_calls: Vec::new(),
        })
        .collect();
    for round in 0..rounds {
        for k in 0..contenders.len() {
            let i = (k + round) % contenders.len();
            let calls_before = script_calls(conns).await;
            let (client_before, servers_before) = (crate::measure::cpu_now(), servers_cpu(servers));
            let (rate, cycles) = window(contenders[i].1, each, contenders[i].2.clone()).await;
            let per_cycle = |cpu: Duration| cpu.as_secs_f64() * 1e6 / cycles.max(1) as f64;
            let client = per_cycle(crate::measure::cpu_now().saturating_sub(client_before));
            let server = per_cycle(servers_cpu(servers).saturating_sub(servers_before));
            let calls = script_calls(conns).await.saturating_sub(calls_before) as f64 / cycles.max(1) as f64;
            eprintln!(
                "  {setup}, {tasks} task(s), {}: {rate:.0} cycles/s, CPU per cycle: client {client:.1} µs, \
                 servers {server:.1} µs; {calls:.2} script calls per cycle",
                contenders[i].0
            );
            rows[i].rates.push(rate);
            rows[i].client_cpu_us.push(client);
            rows[i].servers_cpu_us.push(server);
            rows[i].script_calls.push(calls);
        }
    }
    rows
}

type BoxedCycle =
    Arc<dyn Fn(usize, u64) -> std::pin::Pin<Box<dyn Future<Output = Result<u64, String>> + Send>> + Send + Sync>;

fn boxed<F>(f: F) -> BoxedCycle
where
    F: Fn(usize, u64) -> std::pin::Pin<Box<dyn Future<Output = Result<u64, String>> + Send>> + Send + Sync + 'static,
{
    Arc::new(f)
}

/// Redlock over `n` fresh servers: distlock against rslock.
async fn redlock(n: usize, rounds_n: usize, each: Duration, pin: &dyn Fn(u32)) -> Vec<Row> {
    let servers: Vec<RedisServer> = (0..n).map(|_| RedisServer::new()).collect();
    let pids: Vec<u32> = servers.iter().map(|s| s.pid().expect("server running")).collect();
    for &pid in &pids {
        pin(pid);
    }
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let mut conns = Vec::new();
    for server in &servers {
        conns.push(server.connection().await);
    }
    let client = Client::builder().redlock(urls.clone()).build().await.expect("distlock redlock client");
    let rslock = Arc::new(rslock::LockManager::from_clients(
        urls.iter().map(|u| systems::client(u).expect("server url")).collect(),
    ));
    let setup = format!("Redlock, {n} servers");
    let mut rows = Vec::new();
    for tasks in TASK_COUNTS {
        let ours = boxed(distlock_cycle(client.clone(), "dl"));
        let theirs = {
            let rslock = rslock.clone();
            boxed(move |task, _| {
                let rslock = rslock.clone();
                Box::pin(async move {
                    let key = format!("rs:{task}");
                    let lock = rslock.lock(key.as_bytes(), TTL).await.map_err(|e| format!("{e:?}"))?;
                    rslock.unlock(&lock).await;
                    Ok(1)
                })
            })
        };
        let contenders = vec![("distlock", tasks, call(ours)), ("rslock", tasks, call(theirs))];
        rows.extend(rounds(&setup, &pids, &mut conns, tasks, rounds_n, each, contenders).await);
    }
    rows
}

/// A boxed cycle as a cloneable closure.
fn call(
    f: BoxedCycle,
) -> impl Fn(usize, u64) -> std::pin::Pin<Box<dyn Future<Output = Result<u64, String>> + Send>> + Clone {
    move |task, n| f(task, n)
}

/// A 3-primary cluster: distlock against the raw floor on the crate's cluster client; then the held-locks
/// table ([`cluster_held`](crate::cluster_held)).
async fn cluster(rounds_n: usize, each: Duration, pin: &dyn Fn(u32)) -> (Vec<Row>, String) {
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start(3, 1)).await.expect("cluster");
    let pids: Vec<u32> = cluster.nodes().iter().map(|n| n.pid().expect("node running")).collect();
    for &pid in &pids {
        pin(pid);
    }
    let mut conns = Vec::new();
    for node in cluster.nodes() {
        conns.push(node.connection().await);
    }
    let client = Client::builder().redis_cluster(cluster.seeds()).build().await.expect("distlock cluster client");
    let raw: ClusterConnection = redis::cluster::ClusterClientBuilder::new(cluster.seeds())
        .build()
        .expect("cluster client")
        .get_async_connection()
        .await
        .expect("cluster connection");
    let release = Arc::new(redis::Script::new(systems::RAW_RELEASE));
    let scripts = Arc::new(coalesced::Scripts::load());
    let mut rows = Vec::new();
    for tasks in TASK_COUNTS {
        let ours = boxed(distlock_cycle(client.clone(), "dl"));
        let floor = {
            let (raw, release) = (raw.clone(), release.clone());
            boxed(move |task, n| {
                let (mut conn, release) = (raw.clone(), release.clone());
                Box::pin(async move {
                    let key = format!("raw:{task}");
                    let token = format!("{task}-{n}");
                    let set: Option<String> = redis::cmd("SET")
                        .arg(&key)
                        .arg(&token)
                        .arg("NX")
                        .arg("PX")
                        .arg(TTL.as_millis() as u64)
                        .query_async(&mut conn)
                        .await
                        .map_err(|e| e.to_string())?;
                    set.ok_or("the raw key was taken")?;
                    let _: i64 =
                        release.key(&key).arg(&token).invoke_async(&mut conn).await.map_err(|e| e.to_string())?;
                    Ok(1)
                })
            })
        };
        // The bound: the locks grouped by the primary serving each, one caller per primary.
        let groups: Arc<Vec<(String, Vec<String>)>> =
            Arc::new(coalesced::keys_by_node(&mut raw.clone(), tasks).await.into_iter().collect());
        let least = {
            let (raw, scripts, groups) = (raw.clone(), scripts.clone(), groups.clone());
            boxed(move |caller, n| {
                let (mut conn, scripts, groups) = (raw.clone(), scripts.clone(), groups.clone());
                Box::pin(async move {
                    let (node, keys) = &groups[caller];
                    scripts.cycle(&mut conn, node, keys, n).await.map_err(|e| e.to_string())
                })
            })
        };
        let contenders = vec![
            ("distlock", tasks, call(ours)),
            ("raw", tasks, call(floor)),
            ("coalesced", groups.len(), call(least)),
        ];
        rows.extend(rounds("Cluster, 3 primaries", &pids, &mut conns, tasks, rounds_n, each, contenders).await);
    }
    eprintln!("scale-out: held locks on the cluster");
    let held = crate::cluster_held::run(&cluster, &client).await;
    (rows, held)
}

/// Every scale-out row, as a Markdown table (stdout), progress on stderr.
pub async fn run(rounds_n: usize, each: Duration, pin: &(dyn Fn(u32) + Sync)) -> String {
    let mut rows = Vec::new();
    for n in [3, 5] {
        eprintln!("scale-out: Redlock over {n} servers");
        rows.extend(redlock(n, rounds_n, each, pin).await);
    }
    eprintln!("scale-out: Redis Cluster");
    let (cluster_rows, held) = cluster(rounds_n, each, pin).await;
    rows.extend(cluster_rows);
    format!("{}\n{held}", report(&rows))
}

fn report(rows: &[Row]) -> String {
    let mut out = String::from(
        "### Scale-out: Redlock and Redis Cluster (cycles/s, median over rounds)\n\n\
         CPU per cycle: this process's, and every server's summed (on the cluster, primaries and replicas), \
         median over rounds.\n\n\
         | setup | tasks | distlock | other | distlock ÷ other | client CPU µs/cycle, distlock / other | servers' \
         CPU µs/cycle, distlock / other | script calls per cycle, distlock / other | other is |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    let mut targets = Vec::new();
    // Rows come in groups of one setup and task count, distlock's first.
    for group in rows.chunk_by(|a, b| a.setup == b.setup && a.tasks == b.tasks) {
        let [ours, others @ ..] = group else { continue };
        for other in others {
            let (a, b) = (ours.median(), other.median());
            let ratio = if b > 0.0 { a / b } else { 0.0 };
            let what = match other.contender {
                "raw" => "raw SET NX PX + EVALSHA on the crate's cluster client",
                "coalesced" => "the least fenced cycle by script, its calls coalesced per primary (the bound)",
                _ => "rslock 0.10, Redlock on the same servers",
            };
            let cpu = |r: &Row| (median_of(&r.client_cpu_us), median_of(&r.servers_cpu_us));
            let ((oc, os), (tc, ts)) = (cpu(ours), cpu(other));
            let (ok, tk) = (median_of(&ours.script_calls), median_of(&other.script_calls));
            out.push_str(&format!(
                "| {} | {} | {a:.0} | {b:.0} | {ratio:.2} | {oc:.1} / {tc:.1} | {os:.1} / {ts:.1} | {ok:.2} / {tk:.2} | \
                 {what} |\n",
                ours.setup, ours.tasks
            ));
            // Issue 33's cluster targets: 64 tasks ≥ 0.90 of the coalesced bound, one task ≥ 0.90 of raw.
            let target = match (other.contender, ours.tasks) {
                ("coalesced", 64) => Some("distlock ≥ 0.90 × the coalesced bound (64 tasks)"),
                ("raw", 1) => Some("distlock ≥ 0.90 × raw (one task)"),
                _ => None,
            };
            if let (true, Some(what)) = (ours.setup.starts_with("Cluster"), target) {
                targets.push(format!("| {what} | {ratio:.2} | {} |\n", if ratio >= 0.90 { "yes" } else { "**no**" }));
            }
        }
    }
    if !targets.is_empty() {
        out.push_str("\n| cluster target (issue 33) | distlock ÷ other | met |\n|---|---:|---|\n");
        out.extend(targets);
    }
    out
}
