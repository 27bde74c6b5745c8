//! Scenarios 1 and 2: N tasks, each cycling (acquire + release) on its own key, as fast as it can.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use tokio::sync::Barrier;

use crate::alloc;
use crate::measure::{cpu_now, median, ns32, percentile_us, process_cpu, ServerCounters};
use crate::systems::{Systems, TaskKeys, Variant};

/// One timed window of one variant.
#[derive(Debug, Clone, Copy)]
pub struct Round {
    pub cycles_per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// This process's CPU per cycle.
    pub cpu_us: f64,
    /// redis-server's CPU per cycle (10 ms resolution over the window).
    pub server_cpu_us: f64,
    /// Time redis-server spent executing this cycle's commands (INFO commandstats), per cycle.
    pub server_cmd_us: f64,
}

/// Every round of one variant, plus its allocation pass.
#[derive(Debug, Default, Clone)]
pub struct VariantResult {
    pub rounds: Vec<Round>,
    /// Allocation calls and bytes per cycle, from a separate counting pass.
    pub allocs_per_cycle: f64,
    pub alloc_bytes_per_cycle: f64,
    /// Heap still allocated after the pass, per cycle (memory a finished cycle leaves behind, for a while).
    pub retained_bytes_per_cycle: f64,
    pub errors: u64,
    pub first_error: Option<String>,
}

impl VariantResult {
    pub fn median(&self, f: impl Fn(&Round) -> f64) -> f64 {
        median(self.rounds.iter().map(f))
    }
}

/// Results of one scenario, by variant.
#[derive(Debug, Default)]
pub struct Scenario {
    pub tasks: usize,
    pub window: Duration,
    pub by_variant: HashMap<Variant, VariantResult>,
}

struct TaskOutcome {
    cycles: u64,
    errors: u64,
    first_error: Option<String>,
    samples: Vec<u32>,
    finished: Instant,
}

/// Runs `tasks` tasks cycling `variant` for `window` (or `max_cycles` each, whichever comes first) and
/// returns the raw outcome. Tasks are spawned and parked on a barrier before anything is measured.
async fn run_tasks(
    sys: &Arc<Systems>,
    variant: Variant,
    tasks: usize,
    window: Duration,
    max_cycles: u64,
    record: bool,
    before_start: impl FnOnce(),
) -> (Instant, Vec<TaskOutcome>) {
    let barrier = Arc::new(Barrier::new(tasks + 1));
    let mut handles = Vec::with_capacity(tasks);
    for task in 0..tasks {
        let sys = Arc::clone(sys);
        let barrier = Arc::clone(&barrier);
        // Room for ~60k cycles/s for one task, ~8k/s per task with many: never grown while timing.
        let per_second = if tasks == 1 { 60_000.0 } else { 400_000.0 / tasks as f64 };
        let capacity = if record { (per_second * window.as_secs_f64()) as usize + 16 } else { 0 };
        handles.push(tokio::spawn(async move {
            let keys = TaskKeys::new(task);
            let mut conn = sys.raw.conn.clone();
            let mut samples: Vec<u32> = Vec::with_capacity(capacity);
            let (mut cycles, mut errors, mut first_error) = (0u64, 0u64, None);
            barrier.wait().await;
            let end = Instant::now() + window;
            while cycles < max_cycles {
                let started = Instant::now();
                if started >= end {
                    break;
                }
                match sys.cycle(variant, &keys, &mut conn).await {
                    Ok(()) => {
                        cycles += 1;
                        if samples.len() < samples.capacity() {
                            samples.push(ns32(started.elapsed()));
                        }
                    }
                    Err(e) => {
                        errors += 1;
                        first_error.get_or_insert_with(|| e.to_string());
                        // A failing variant should not spin: the error is reported, the rest is still measured.
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
            }
            TaskOutcome { cycles, errors, first_error, samples, finished: Instant::now() }
        }));
    }
    // Let every task reach the barrier before the clock starts.
    tokio::task::yield_now().await;
    before_start();
    barrier.wait().await;
    let started = Instant::now();
    let mut outcomes = Vec::with_capacity(tasks);
    for h in handles {
        outcomes.push(h.await.expect("benchmark task panicked"));
    }
    (started, outcomes)
}

/// One timed window.
async fn timed_window(
    sys: &Arc<Systems>,
    info: &mut MultiplexedConnection,
    variant: Variant,
    tasks: usize,
    window: Duration,
    server_pid: u32,
) -> (Round, u64, Option<String>) {
    let stats0 = ServerCounters::read(info).await.ok();
    let mut cpu0 = Duration::ZERO;
    let mut srv0 = Duration::ZERO;
    let (started, outcomes) = run_tasks(sys, variant, tasks, window, u64::MAX, true, || {
        cpu0 = cpu_now();
        srv0 = process_cpu(server_pid);
    })
    .await;
    let cpu = cpu_now().saturating_sub(cpu0);
    let srv = process_cpu(server_pid).saturating_sub(srv0);
    let stats1 = ServerCounters::read(info).await.ok();
    let cycles: u64 = outcomes.iter().map(|o| o.cycles).sum();
    if let (Some(a), Some(b), true) = (&stats0, &stats1, std::env::var_os("BENCH_DEBUG").is_some()) {
        b.print_per_cycle(a, &format!("{variant}, {tasks} task(s)"), cycles);
    }
    let cmd_usec = match (stats0, stats1) {
        (Some(a), Some(b)) => b.usec_delta(&a) as f64,
        _ => f64::NAN,
    };
    let finished = outcomes.iter().map(|o| o.finished).max().unwrap_or(started);
    let elapsed = finished.duration_since(started).as_secs_f64();
    let mut samples: Vec<u32> = Vec::with_capacity(outcomes.iter().map(|o| o.samples.len()).sum());
    let (mut errors, mut first_error) = (0, None);
    for o in &outcomes {
        samples.extend_from_slice(&o.samples);
        errors += o.errors;
        if first_error.is_none() {
            first_error.clone_from(&o.first_error);
        }
    }
    samples.sort_unstable();
    let per_cycle = |d: Duration| if cycles == 0 { f64::NAN } else { d.as_secs_f64() * 1e6 / cycles as f64 };
    let round = Round {
        cycles_per_s: cycles as f64 / elapsed,
        p50_us: percentile_us(&samples, 50.0),
        p99_us: percentile_us(&samples, 99.0),
        cpu_us: per_cycle(cpu),
        server_cpu_us: per_cycle(srv),
        server_cmd_us: if cycles == 0 { f64::NAN } else { cmd_usec / cycles as f64 },
    };
    (round, errors, first_error)
}

/// How many tasks, for how long, how many rounds.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub tasks: usize,
    pub window: Duration,
    pub rounds: usize,
    /// Scenario 2u: the child runs on every CPU, with a 2-worker runtime, instead of on the benchmark's CPUs.
    pub unpinned: bool,
}

/// Allocation counts of one variant, per cycle.
#[derive(Debug, Clone, Copy, Default)]
pub struct AllocCounts {
    pub calls: f64,
    pub bytes: f64,
    pub retained: f64,
}

/// The hidden first argument that makes the binary a child running one window of scenario 1 or 2.
pub const CHILD_FLAG: &str = "--cycle-child";

/// What a child does.
#[derive(Debug, Clone, Copy)]
enum Job {
    /// A timed window of this length.
    Time(Duration),
    /// An allocation-counting pass of this many cycles per task.
    Count(u64),
}

/// Runs one job in a fresh child process (this binary with [`CHILD_FLAG`]) and returns its result line.
///
/// Every window runs in its own process so that no contender pays for another's leftovers: a distlock
/// cycle leaves its renewal-queue entry (and the grant's allocation) behind for ttl/3, and in a shared
/// process the heap those leave fragmented slowed the raw floor's allocations by a third.
async fn in_child(
    url: &str,
    server_pid: u32,
    variant: Variant,
    tasks: usize,
    job: Job,
    unpinned: bool,
) -> Result<String, String> {
    let (mode, amount) = match job {
        Job::Time(window) => ("time", window.as_millis() as u64),
        Job::Count(cycles) => ("count", cycles),
    };
    let args = [
        CHILD_FLAG.to_owned(),
        mode.to_owned(),
        variant.name().to_owned(),
        tasks.to_string(),
        amount.to_string(),
        url.to_owned(),
        server_pid.to_string(),
        if unpinned { UNPINNED } else { "pinned" }.to_owned(),
    ];
    let output = tokio::task::spawn_blocking(move || {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        std::process::Command::new(exe)
            .args(&args)
            .stderr(std::process::Stdio::inherit())
            .output()
            .map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| e.to_string())??;
    let stdout = String::from_utf8_lossy(&output.stdout);
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .map(str::to_owned)
        .ok_or_else(|| format!("the {variant} child ({}) gave no result: {}", output.status, stdout.trim()))
}

fn numbers(line: &str) -> Vec<f64> {
    line.split_whitespace().map(|x| x.parse().unwrap_or(f64::NAN)).collect()
}

/// The child's placement argument for scenario 2u.
const UNPINNED: &str = "unpinned";
/// Scenario 2u's runtime: two workers, as on a small host.
pub const UNPINNED_WORKERS: usize = 2;

/// The child's side: `--cycle-child <time|count> <variant> <tasks> <window ms|cycles> <url> <server pid>
/// <pinned|unpinned>`; prints one `RESULT` line.
pub fn child(args: &[String]) -> std::process::ExitCode {
    let [mode, variant, tasks, amount, url, pid, placement] = args else {
        eprintln!("{CHILD_FLAG} needs: mode variant tasks amount url server_pid placement");
        return std::process::ExitCode::FAILURE;
    };
    let (Some(variant), Ok(tasks), Ok(amount), Ok(pid)) =
        (Variant::parse(variant), tasks.parse::<usize>(), amount.parse::<u64>(), pid.parse::<u32>())
    else {
        eprintln!("{CHILD_FLAG}: bad arguments {args:?}");
        return std::process::ExitCode::FAILURE;
    };
    let job = if mode == "time" { Job::Time(Duration::from_millis(amount)) } else { Job::Count(amount) };
    let workers = if placement == UNPINNED {
        // Before the runtime's threads exist: they inherit it.
        crate::proxy::run_anywhere(crate::machine_cores());
        UNPINNED_WORKERS
    } else {
        crate::allowed_cpus()
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let url = url.clone();
    let line = runtime.block_on(async move {
        tokio::spawn(async move {
            let sys = Arc::new(crate::connect(&url).await);
            if variant == Variant::Macro {
                distlock::install(sys.distlock.clone()).expect("install the client for the macro");
            }
            // Warm: connections, scripts, lazily built state.
            run_tasks(&sys, variant, tasks, Duration::from_secs(30), 20, false, || ()).await;
            match job {
                Job::Time(window) => {
                    let mut info = crate::info_connection(&url).await;
                    let (r, errors, first_error) = timed_window(&sys, &mut info, variant, tasks, window, pid).await;
                    if let Some(e) = first_error {
                        eprintln!("  {variant}: {errors} failed cycles, first: {e}");
                    }
                    format!(
                        "{} {} {} {} {} {} {errors}",
                        r.cycles_per_s, r.p50_us, r.p99_us, r.cpu_us, r.server_cpu_us, r.server_cmd_us
                    )
                }
                Job::Count(cycles_each) => {
                    let (_, outcomes) =
                        run_tasks(&sys, variant, tasks, Duration::from_secs(30), cycles_each, false, alloc::start)
                            .await;
                    let c = alloc::stop();
                    let cycles = outcomes.iter().map(|o| o.cycles).sum::<u64>().max(1) as f64;
                    format!(
                        "{} {} {}",
                        c.calls() as f64 / cycles,
                        c.bytes_in as f64 / cycles,
                        c.net_bytes() as f64 / cycles
                    )
                }
            }
        })
        .await
        .expect("cycle child panicked")
    });
    println!("RESULT {line}");
    std::process::ExitCode::SUCCESS
}

/// Counts allocations over a fixed number of cycles of each variant, untimed, each in a fresh process.
pub async fn count_allocations(
    url: &str,
    server_pid: u32,
    variants: &[Variant],
    tasks: usize,
    cycles_each: u64,
) -> HashMap<Variant, AllocCounts> {
    let mut counts = HashMap::new();
    for &variant in variants {
        match in_child(url, server_pid, variant, tasks, Job::Count(cycles_each), false).await {
            Ok(line) => {
                let f = numbers(&line);
                let a = AllocCounts {
                    calls: f.first().copied().unwrap_or(f64::NAN),
                    bytes: f.get(1).copied().unwrap_or(f64::NAN),
                    retained: f.get(2).copied().unwrap_or(f64::NAN),
                };
                eprintln!(
                    "  allocations {:>6}, {tasks} task(s): {:.1}/cycle, {:.0} B/cycle, {:.0} B/cycle still allocated after the pass",
                    variant.name(),
                    a.calls,
                    a.bytes,
                    a.retained
                );
                counts.insert(variant, a);
            }
            Err(e) => eprintln!("  allocations {variant}: {e}"),
        }
    }
    counts
}

/// Runs the scenario: `rounds` rounds in which every variant gets one window (in an order rotated each
/// round), each window in a fresh child process; `allocations` come from [`count_allocations`].
pub async fn run(
    url: &str,
    server_pid: u32,
    variants: &[Variant],
    shape: Shape,
    allocations: &HashMap<Variant, AllocCounts>,
) -> Scenario {
    let Shape { tasks, window, rounds, unpinned } = shape;
    let mut scenario = Scenario { tasks, window, by_variant: HashMap::new() };
    for &v in variants {
        let a = allocations.get(&v).copied().unwrap_or(AllocCounts {
            calls: f64::NAN,
            bytes: f64::NAN,
            retained: f64::NAN,
        });
        let result = VariantResult {
            allocs_per_cycle: a.calls,
            alloc_bytes_per_cycle: a.bytes,
            retained_bytes_per_cycle: a.retained,
            ..VariantResult::default()
        };
        scenario.by_variant.insert(v, result);
    }
    for round in 0..rounds {
        for i in 0..variants.len() {
            let v = variants[(i + round) % variants.len()];
            let result = scenario.by_variant.get_mut(&v).expect("inserted above");
            let f = match in_child(url, server_pid, v, tasks, Job::Time(window), unpinned).await {
                Ok(line) => numbers(&line),
                Err(e) => {
                    result.errors += 1;
                    result.first_error.get_or_insert(e);
                    continue;
                }
            };
            let get = |i: usize| f.get(i).copied().unwrap_or(f64::NAN);
            let r = Round {
                cycles_per_s: get(0),
                p50_us: get(1),
                p99_us: get(2),
                cpu_us: get(3),
                server_cpu_us: get(4),
                server_cmd_us: get(5),
            };
            let errors = get(6);
            if errors > 0.0 {
                result.errors += errors as u64;
                result.first_error.get_or_insert_with(|| "see stderr".to_owned());
            }
            result.rounds.push(r);
            eprintln!(
                "  round {}/{rounds} {:>6}: {:>9.0} cycles/s  p50 {:>7.1} µs  p99 {:>7.1} µs  cpu {:>5.1} µs/cycle  redis {:>5.1} µs/cycle ({:.1} in commands)",
                round + 1,
                v.name(),
                r.cycles_per_s,
                r.p50_us,
                r.p99_us,
                r.cpu_us,
                r.server_cpu_us,
                r.server_cmd_us
            );
        }
    }
    scenario
}
