//! distlock benchmark: distlock against the raw two-round-trip floor and rslock, on a redis-server it starts.
//!
//! Run (from the workspace root; about 2.5 minutes on 2 cores):
//!
//! ```text
//! cargo run --release -p distlock-bench
//! cargo run --release -p distlock-bench -- --quick            # smoke run, under 30 s
//! cargo run --release -p distlock-bench -- --rounds 7         # more rounds for scenarios 1–3
//! cargo run --release -p distlock-bench -- --only 2 --variants raw,api   # one scenario, some contenders
//! cargo run --release -p distlock-bench -- --rtt 0,0.25,0.5,1 --only 1,2,2u,3   # a network hop away
//! cargo run --release -p distlock-bench -- --rtt 0.25,0.5,1 --proxy-check       # what the hop costs
//! cargo run --release -p distlock-bench -- --only 6   # waiters on one key: N = 10, 1,000, 10,000 (issue 33)
//! ```
//!
//! It starts a private `redis-server` (`$REDIS_SERVER_BIN`, else `redis-server` on `PATH`) on a free loopback
//! port through `distlock_tests::RedisServer` — never the machine's own Redis on 6379 — and talks to nothing
//! else. Every loop is bounded in count and time. `BENCH_DEBUG=1` also prints the server's per-command calls
//! over each measured period (for scenarios 1–3 also the time in each, per cycle or acquisition). Progress goes to stderr; the report (Markdown tables of
//! medians over rounds, ratios to the raw floor, the machine line and the targets of issue 5) goes to stdout.
//!
//! redis-server is pinned to the last CPU and the benchmark to the others (`taskset`; `--no-pin` to skip), so
//! client and server never share a CPU, as with a server on another host. The timed windows of scenarios 1
//! and 2 and each row of scenario 4 run in a fresh child process (this binary, with a hidden first argument),
//! so no contender runs on a heap another one left fragmented.
//!
//! Scenarios (A = distlock, B = raw floor, C = rslock; in each round every contender gets one window, in an
//! order rotated from round to round, so drift in the machine's load hits all of them alike):
//! 1. one task, distinct keys: cycles/s, p50, p99 — distlock's `acquire`+`release`, `run` and the
//!    `#[distributed_lock]` macro separately;
//! 2. 64 tasks, distinct keys: the same, plus client and server CPU per cycle and allocations per cycle;
//!    2u. the same unpinned: redis-server and a 2-worker client share both CPUs, as on a small host;
//! 3. 16 tasks, one key, hold ~1 ms, 5 ms pause after release: acquisitions/s, hand-off gap p50/p99,
//!    acquisitions per task (fairness);
//! 4. 1k, 10k, 100k locks held at once, ttl 30 s: renewal commands/s, client CPU, memory per held lock;
//! 5. wake-up of a waiter whose backoff is 5 s, after the holder's release, against the round-trip time.
//!
//! `--scale-out` runs only the Redlock (3 and 5 servers, against rslock) and Redis Cluster (against the raw floor
//! on the crate's cluster client) rows, 1 and 64 tasks (`scaleout.rs`), then 100 000 locks held on the cluster:
//! what one renewal period costs the client and the nodes (`cluster_held.rs`).
//!
//! `--rtt MS,...` runs the scenarios once per added round trip: for each non-zero one, every contender
//! (the timed children included) reaches redis-server through the benchmark's own delay proxy
//! (`proxy.rs`), each way half the round trip; 0 is loopback without the proxy. Scenarios 4 and 5 run in the
//! first pass only. A summary table then gives each scenario's ratios to the raw floor per round trip.

#[allow(unsafe_code)]
mod alloc;
mod cluster_held;
mod coalesced;
mod config;
mod contention;
mod floor;
mod held;
mod measure;
mod postgres;
mod proxy;
mod report;
mod scaleout;
mod systems;
mod uncontended;
mod waiters;
mod wakeup;

use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_tests::{PostgresServer, RedisServer};

use crate::config::{parse_args, USAGE};
pub use crate::config::{Config, Hop};
use crate::contention::Waiter;
use crate::proxy::DelayProxy;
use crate::systems::{Raw, Systems, Variant};

#[global_allocator]
static ALLOCATOR: alloc::Counting = alloc::Counting;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(held::CHILD_FLAG) {
        return held::child(&args[2..]);
    }
    if args.get(1).map(String::as_str) == Some(uncontended::CHILD_FLAG) {
        return uncontended::child(&args[2..]);
    }
    let config = match parse_args() {
        Ok(c) => c,
        Err(msg) => {
            if !msg.is_empty() {
                eprintln!("error: {msg}");
            }
            eprintln!("{USAGE}");
            return if msg.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE };
        }
    };
    if cfg!(debug_assertions) {
        eprintln!("warning: a debug build; measure with `cargo run --release -p distlock-bench`");
    }
    if config.scale_out {
        return scale_out(&config);
    }
    if config.postgres {
        return postgres_rows(&config);
    }
    let machine_before = report::Machine::read();
    let server = RedisServer::new();
    let upstream = SocketAddr::from((Ipv4Addr::LOCALHOST, server.port()));
    eprintln!("redis-server pid {:?} on {}", server.pid(), server.url());
    let cores = machine_cores();
    let pinning = if config.pin { pin(&server, cores) } else { None };
    // One worker per CPU the benchmark may use.
    let workers = match &pinning {
        Some(p) => p.client_cpus,
        None => std::thread::available_parallelism().map_or(1, usize::from),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("tokio runtime");
    if config.proxy_check {
        let (rtts, url) = (config.rtts.iter().map(|h| h.rtt_ms).collect(), server.url());
        runtime.block_on(async move { tokio::spawn(proxy_check(rtts, url, upstream, cores)).await }).expect("check");
        return ExitCode::SUCCESS;
    }
    let started = Instant::now();
    let pid = server.pid().expect("server running");
    let mut passes = Vec::new();
    for (i, &Hop { rtt_ms, proxied }) in config.rtts.iter().enumerate() {
        let proxy = proxied.then(|| {
            let one_way = Duration::from_secs_f64(rtt_ms / 2000.0);
            DelayProxy::start(upstream, one_way, cores).expect("start the delay proxy")
        });
        let url = proxy.as_ref().map_or_else(|| server.url(), DelayProxy::url);
        if config.rtts.len() > 1 || proxied {
            eprintln!("== added round trip {rtt_ms} ms ({url})");
        }
        let mut pass_config = config.clone();
        if i > 0 {
            pass_config.scenarios.retain(|&n| n <= 3);
        }
        let server_cpus = pinning.as_ref().map(|p| p.server_cpus.clone());
        // The whole pass runs in a spawned task, on the runtime's workers like every task it measures:
        // `block_on`'s own thread is not a worker, and a future polled there pays a cross-thread wake-up per
        // reply.
        let results = runtime
            .block_on(async move {
                tokio::spawn(async move { run(&pass_config, url, pid, server_cpus.as_deref(), cores).await }).await
            })
            .expect("the benchmark panicked");
        passes.push(report::Pass { rtt_ms, proxied, results, proxy: proxy.map(|p| p.stats()) });
    }
    let elapsed = started.elapsed();
    let mut machine = machine_before;
    machine.finish();
    machine.pinning = pinning.map(|p| p.what);
    machine.workers = workers;
    report::print(&config, &machine, &passes, elapsed);
    ExitCode::SUCCESS
}

/// `--scale-out`: the Redlock and cluster rows, every server pinned to the last CPU and the benchmark to the
/// others.
fn scale_out(config: &Config) -> ExitCode {
    let mut machine = report::Machine::read();
    let cores = machine_cores();
    let server_cpus = (cores.max(2) - 1).to_string();
    let client_cpus = if cores <= 2 { "0".to_owned() } else { format!("0-{}", cores - 2) };
    let pinned = config.pin && cores >= 2 && taskset(&client_cpus, std::process::id());
    let pin = move |pid: u32| {
        if pinned && !taskset(&server_cpus, pid) {
            eprintln!("warning: could not pin redis-server {pid}");
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(if pinned { cores.max(2) - 1 } else { cores })
        .enable_all()
        .build()
        .expect("tokio runtime");
    let each = if config.quick { Duration::from_millis(500) } else { Duration::from_secs(2) };
    let started = Instant::now();
    let table = runtime.block_on(scaleout::run(config.rounds, each, &pin));
    machine.finish();
    println!("{table}");
    println!(
        "Machine: {} cores, {}, Linux {}; redis-server {}; servers pinned to CPU {} and the benchmark to the \
         others: {pinned}; load average {} before, {} after.\nCommand: `{}` ({} rounds of {:?} windows, {:.0} s in all).",
        machine.cores,
        machine.cpu,
        machine.kernel,
        machine.redis,
        cores.max(2) - 1,
        machine.load_before,
        machine.load_after,
        config.command_line(),
        config.rounds,
        each,
        started.elapsed().as_secs_f64(),
    );
    ExitCode::SUCCESS
}

/// `--postgres`: the PostgreSQL rows, on a private server (unpinned: PostgreSQL runs a process per session).
fn postgres_rows(config: &Config) -> ExitCode {
    let mut machine = report::Machine::read();
    let server = PostgresServer::new();
    let version = server.psql("SHOW server_version");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let each = if config.quick { Duration::from_millis(500) } else { Duration::from_secs(2) };
    let trials = if config.quick { 50 } else { 500 };
    let started = Instant::now();
    let table = runtime.block_on(postgres::run(&server, config.rounds, each, trials));
    machine.finish();
    println!("{table}");
    println!(
        "Machine: {} cores, {}, Linux {}; PostgreSQL {version} (fsync on, synchronous_commit on), unpinned; load \
         average {} before, {} after.\nCommand: `{}` ({} rounds of {:?} windows, {:.0} s in all).",
        machine.cores,
        machine.cpu,
        machine.kernel,
        machine.load_before,
        machine.load_after,
        config.command_line(),
        config.rounds,
        each,
        started.elapsed().as_secs_f64(),
    );
    ExitCode::SUCCESS
}

/// How the benchmark placed itself and redis-server.
struct Pinning {
    what: String,
    /// CPUs left to the benchmark.
    client_cpus: usize,
    /// The CPU list redis-server is pinned to (for `taskset`).
    server_cpus: String,
}

fn taskset(cpus: &str, pid: u32) -> bool {
    std::process::Command::new("taskset")
        .args(["-a", "-p", "-c", cpus, &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Every CPU of the machine, as a `taskset` list.
fn all_cpus(cores: usize) -> String {
    format!("0-{}", cores.saturating_sub(1))
}

/// Pins redis-server (all its threads) to the last CPU and this process to the others, with `taskset`, so
/// that client and server never share a CPU and every reply crosses between the same two CPUs — as with a
/// server on another machine. Without it, the scheduler moves them between two regimes (same CPU: a round trip
/// is two context switches, ~10 µs here; different CPUs: an idle-CPU wake-up each way, ~60 µs in this VM)
/// in the middle of a run. Returns `None` when it could not pin.
fn pin(server: &RedisServer, cores: usize) -> Option<Pinning> {
    if cores < 2 {
        return None;
    }
    let server_cpus = (cores - 1).to_string();
    let client_cpus = if cores == 2 { "0".to_owned() } else { format!("0-{}", cores - 2) };
    let server_pid = server.pid()?;
    if taskset(&server_cpus, server_pid) && taskset(&client_cpus, std::process::id()) {
        let what = format!("redis-server pinned to CPU {server_cpus}, the benchmark to CPU {client_cpus} (taskset)");
        Some(Pinning { what, client_cpus: cores - 1, server_cpus })
    } else {
        eprintln!(
            "warning: could not pin with taskset; client and server float between the CPUs (pass --no-pin to silence)"
        );
        None
    }
}

/// `--proxy-check`: PING round trips straight to redis-server and through the proxy at each added round
/// trip (0: the proxy hop alone), printed as a table.
async fn proxy_check(rtts: Vec<f64>, url: String, upstream: SocketAddr, cores: usize) {
    const PINGS: usize = 2000;
    let pings = |url: String| async move {
        let mut conn = systems::client(&url).expect("url").get_multiplexed_async_connection().await.expect("connect");
        wakeup::pings(&mut conn, PINGS, Duration::ZERO).await
    };
    let direct = pings(url).await;
    let direct50 = measure::percentile_us(&direct, 50.0);
    println!("PING round trips, {PINGS} each, one at a time, Nagle off; the proxy's threads may use {cores} CPU(s).\n");
    println!("| added round trip asked | PING p50 µs | p99 µs | added p50 µs (vs loopback) | chunks released late p50 / p99 µs |");
    println!("|---:|---:|---:|---:|---:|");
    println!("| none (loopback) | {:.1} | {:.1} | – | – |", direct50, measure::percentile_us(&direct, 99.0));
    let mut asked: Vec<f64> = std::iter::once(0.0).chain(rtts.into_iter().filter(|&r| r > 0.0)).collect();
    asked.dedup();
    for rtt_ms in asked {
        let hop = DelayProxy::start(upstream, Duration::from_secs_f64(rtt_ms / 2000.0), cores).expect("proxy");
        let through = pings(hop.url()).await;
        let stats = hop.stats();
        let p50 = measure::percentile_us(&through, 50.0);
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} / {:.1} |",
            if rtt_ms == 0.0 { "0 ms (the proxy hop alone)".to_owned() } else { format!("{rtt_ms} ms") },
            p50,
            measure::percentile_us(&through, 99.0),
            p50 - direct50,
            measure::percentile_us(&stats.lateness, 50.0),
            measure::percentile_us(&stats.lateness, 99.0),
        );
    }
}

/// Everything measured.
#[derive(Debug, Default)]
pub struct Results {
    pub rtt: Vec<u32>,
    /// PING round trips each after the idle time a scenario-5 release follows.
    pub idle_rtt: Vec<u32>,
    pub one_task: Option<uncontended::Scenario>,
    pub many_tasks: Option<uncontended::Scenario>,
    pub contention: Option<contention::Scenario>,
    pub held: Vec<held::Row>,
    pub wake: Vec<wakeup::WakeResult>,
    /// Scenario 2u.
    pub many_tasks_unpinned: Option<uncontended::Scenario>,
    /// Scenario 6, one row per waiter count.
    pub waiters: Vec<waiters::Row>,
}

/// The three contenders, connected to `url`.
pub async fn connect(url: &str) -> Systems {
    let raw = Raw::connect(url).await.expect("raw connection");
    let client = distlock::Client::builder().redis(url).build().await.expect("distlock client");
    let rslock = systems::rslock(url);
    Systems { raw, distlock: client, rslock }
}

/// A separate connection for INFO and PUBSUB queries.
pub async fn info_connection(url: &str) -> redis::aio::MultiplexedConnection {
    systems::client(url).expect("server url").get_multiplexed_async_connection().await.expect("INFO connection")
}

/// How many CPUs this process may run on (its affinity mask, from /proc/self/status).
pub fn allowed_cpus() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:").map(|v| v.trim().to_owned())))
        .map_or(1, |list| count_cpus(&list))
}

/// How many CPUs the machine has online, whatever this process is pinned to.
pub fn machine_cores() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .map_or_else(|_| std::thread::available_parallelism().map_or(1, usize::from), |list| count_cpus(list.trim()))
}

/// The number of CPUs in a kernel CPU list such as `0-3,6`.
fn count_cpus(list: &str) -> usize {
    let n = list
        .split(',')
        .map(|part| match part.split_once('-') {
            Some((a, b)) => b.parse::<usize>().unwrap_or(0).saturating_sub(a.parse().unwrap_or(0)) + 1,
            None => 1,
        })
        .sum::<usize>();
    n.max(1)
}

/// One pass of the scenarios against `url`. `server_cpus`: what redis-server is pinned to, if it is (scenario
/// 2u unpins it for its windows).
async fn run(config: &Config, url: String, server_pid: u32, server_cpus: Option<&str>, cores: usize) -> Results {
    // The macro's cycles run in child processes, which install their own client.
    let sys = Arc::new(connect(&url).await);
    let mut info = info_connection(&url).await;
    let mut results =
        Results { rtt: wakeup::round_trips(&sys, if config.quick { 500 } else { 2000 }).await, ..Results::default() };
    eprintln!("round trip (PING): p50 {:.1} µs", measure::percentile_us(&results.rtt, 50.0));

    let wanted = |n: u8| config.scenarios.contains(&n);
    let (mut allocs_one, mut allocs_many) = Default::default();
    if wanted(1) || wanted(2) || config.unpinned_many {
        eprintln!("allocations per cycle (before anything is timed)");
        if wanted(1) {
            allocs_one = uncontended::count_allocations(&url, server_pid, &config.variants, 1, 2_000).await;
        }
        if wanted(2) || config.unpinned_many {
            allocs_many =
                uncontended::count_allocations(&url, server_pid, &config.variants, config.many_tasks, 50).await;
        }
    }
    if wanted(1) {
        eprintln!("scenario 1: one task, distinct keys");
        results.one_task = Some(
            uncontended::run(
                &url,
                server_pid,
                &config.variants,
                uncontended::Shape { tasks: 1, window: config.one_task_window, rounds: config.rounds, unpinned: false },
                &allocs_one,
            )
            .await,
        );
    }
    if wanted(2) {
        eprintln!("scenario 2: {} tasks, distinct keys", config.many_tasks);
        results.many_tasks = Some(
            uncontended::run(
                &url,
                server_pid,
                &config.variants,
                uncontended::Shape {
                    tasks: config.many_tasks,
                    window: config.many_tasks_window,
                    rounds: config.rounds,
                    unpinned: false,
                },
                &allocs_many,
            )
            .await,
        );
    }
    if config.unpinned_many {
        eprintln!(
            "scenario 2u: {} tasks, distinct keys, unpinned ({} workers; redis-server on every CPU too)",
            config.many_tasks,
            uncontended::UNPINNED_WORKERS
        );
        if server_cpus.is_some() && !taskset(&all_cpus(cores), server_pid) {
            eprintln!("  warning: could not unpin redis-server");
        }
        let shape = uncontended::Shape {
            tasks: config.many_tasks,
            window: config.many_tasks_window,
            rounds: config.rounds,
            unpinned: true,
        };
        results.many_tasks_unpinned =
            Some(uncontended::run(&url, server_pid, &config.variants, shape, &allocs_many).await);
        if let Some(cpus) = server_cpus {
            if !taskset(cpus, server_pid) {
                eprintln!("  warning: could not pin redis-server back to CPU {cpus}");
            }
        }
    }
    if wanted(3) {
        eprintln!("scenario 3: {} tasks, one key", contention::TASKS);
        let waiters: Vec<Waiter> = Waiter::ALL
            .into_iter()
            .filter(|w| match w {
                Waiter::RawPoll => config.variants.contains(&Variant::Raw),
                Waiter::Distlock => {
                    config.variants.iter().any(|v| matches!(v, Variant::Api | Variant::Run | Variant::Macro))
                }
                Waiter::Rslock => config.variants.contains(&Variant::Rslock),
            })
            .collect();
        results.contention =
            Some(contention::run(&sys, &mut info, &waiters, config.contention_window, config.rounds).await);
    }
    if wanted(4) {
        for &n in &config.held_sizes {
            eprintln!("scenario 4: {n} locks held, ttl {:?} (each holder in a fresh child process)", config.held_ttl);
            for holder in held::Holder::ALL {
                let (url, ttl) = (url.clone(), config.held_ttl);
                let row = tokio::task::spawn_blocking(move || held::in_child(holder, &url, n, ttl))
                    .await
                    .expect("scenario-4 child thread");
                match row {
                    Ok(row) => {
                        eprintln!(
                            "  {}: {} renewal commands in ttl/3, cpu {:.3}%, heap {:.0} B/lock, rss {:.0} B/lock, filled in {:.2} s, lost {}",
                            row.label, row.renewal_commands, row.cpu_pct, row.heap_per_lock, row.rss_per_lock, row.fill_s, row.lost
                        );
                        results.held.push(row);
                    }
                    Err(e) => eprintln!("  {holder:?}: {e}"),
                }
            }
        }
    }
    if wanted(5) {
        eprintln!("scenario 5: wake-up after release");
        results.idle_rtt = wakeup::round_trips_after(&sys, config.wake_trials, wakeup::SETTLE).await;
        let holder = distlock::Client::builder().redis(url.as_str()).build().await.expect("second distlock client");
        results.wake.push(wakeup::distlock(&sys, &holder, &mut info, config.wake_trials).await);
        if config.variants.contains(&Variant::Rslock) {
            let rs_holder = systems::rslock(&url);
            results.wake.push(wakeup::rslock(&sys, &rs_holder, config.rslock_wake_trials).await);
        }
        for w in &results.wake {
            eprintln!("  {}: p50 {:.1} µs, max {:.1} µs, bad trials {}", w.label, w.p50_us(), w.max_us(), w.bad_trials);
        }
    }
    if wanted(6) {
        for &n in &config.waiter_counts {
            eprintln!("scenario 6: {n} waiters on one key, hold ~2 ms");
            let row = waiters::run(&sys, &mut info, server_pid, n, config.waiters_window).await;
            eprintln!(
                "  {:.0} acquisitions/s, {:.1} commands and {:.0} µs of Redis CPU per acquisition (medians of {} windows), release p50 {:.0} µs, {} keys expired, errors {}",
                row.acquisitions_per_s, row.commands_per_acquisition, row.redis_cpu_us_per_acquisition, waiters::WINDOWS, row.release_p50_us, row.expired_keys, row.errors
            );
            results.waiters.push(row);
        }
    }
    results
}
