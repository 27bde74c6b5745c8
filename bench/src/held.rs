//! Scenario 4: many locks held at once by one client. What renewal costs the server (commands/s) and the
//! client (CPU), and what each held lock costs in memory. distlock renews each guard from its own watchdog
//! every ttl/3; the raw rows show a hand-written holder that renews all its locks in one sweep per ttl/3,
//! pipelined (one EVALSHA per lock) or batched (one EVALSHA per 1000 locks).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

use crate::alloc;
use crate::measure::{cpu_now, rss_bytes, ServerCounters};
use crate::systems::{Systems, Token};

/// Concurrent acquisitions while filling up.
const FILLERS: usize = 64;
/// Locks per pipeline or batch in the raw holder.
const CHUNK: usize = 1000;

#[derive(Debug, Clone)]
pub struct Row {
    pub label: &'static str,
    pub locks: usize,
    pub ttl: Duration,
    /// Seconds to take all the locks.
    pub fill_s: f64,
    /// Client commands spent on renewal in one ttl/3 period.
    pub renewal_commands: u64,
    /// Leases the server extended in that period (PEXPIRE calls inside the renewal scripts).
    pub renewed: u64,
    /// Commands the server ran in that period, counting those inside scripts.
    pub server_commands: u64,
    /// Client CPU over the period, in % of one core.
    pub cpu_pct: f64,
    pub rss_per_lock: f64,
    pub heap_per_lock: f64,
    /// Heap blocks kept per lock (each costs the allocator a header and rounding on top of its bytes).
    pub blocks_per_lock: f64,
    /// Locks reported lost (must be 0).
    pub lost: usize,
    pub errors: u64,
    pub first_error: Option<String>,
}

impl Row {
    pub fn period(&self) -> Duration {
        self.ttl / 3
    }

    pub fn commands_per_s(&self) -> f64 {
        self.renewal_commands as f64 / self.period().as_secs_f64()
    }

    pub fn target_per_s(&self) -> f64 {
        self.locks as f64 / self.period().as_secs_f64()
    }
}

/// Holds one lock through a renewal, so the renewal script is in the server's script cache before the
/// measured periods (on a fresh server the first burst of renewals gets NOSCRIPT and falls back to EVAL).
pub async fn warm_up(sys: &Arc<Systems>) {
    let ttl = Duration::from_millis(300);
    if let Ok(guard) = sys.distlock.lock("held:warm-up").ttl(ttl).acquire().await {
        tokio::time::sleep(ttl / 3 + Duration::from_millis(60)).await;
        let _ = guard.release().await;
    }
}

/// distlock: `locks` guards held through one ttl/3 period (each watchdog renews exactly once in it).
pub async fn distlock(sys: &Arc<Systems>, info: &mut MultiplexedConnection, locks: usize, ttl: Duration) -> Row {
    let rss0 = rss_bytes();
    alloc::start();
    let started = Instant::now();
    let mut fillers = Vec::with_capacity(FILLERS);
    for filler in 0..FILLERS {
        let client = sys.distlock.clone();
        fillers.push(tokio::spawn(async move {
            let mut guards = Vec::with_capacity(locks / FILLERS + 1);
            let (mut errors, mut first_error) = (0u64, None);
            for i in (filler..locks).step_by(FILLERS) {
                match client.lock(format!("held:{locks}:{i}")).ttl(ttl).acquire().await {
                    Ok(guard) => guards.push(guard),
                    Err(e) => {
                        errors += 1;
                        first_error.get_or_insert(e.to_string());
                    }
                }
            }
            (guards, errors, first_error)
        }));
    }
    let mut held = Vec::with_capacity(FILLERS);
    let (mut errors, mut first_error) = (0u64, None);
    for f in fillers {
        let (guards, e, fe) = f.await.expect("filler panicked");
        held.push(guards);
        errors += e;
        if first_error.is_none() {
            first_error = fe;
        }
    }
    let fill_s = started.elapsed().as_secs_f64();
    let counts = alloc::stop();
    let rss1 = rss_bytes();

    // Every lock was taken less than ttl/3 ago, so each watchdog renews exactly once in the next ttl/3 (plus
    // a little slack for timer granularity), and none twice.
    let period = ttl / 3;
    let before = ServerCounters::read(info).await.expect("INFO");
    let cpu0 = cpu_now();
    let w0 = Instant::now();
    tokio::time::sleep(period + Duration::from_millis(250)).await;
    let cpu = cpu_now().saturating_sub(cpu0);
    let window = w0.elapsed();
    let after = ServerCounters::read(info).await.expect("INFO");
    if std::env::var_os("BENCH_DEBUG").is_some() {
        let mut names: Vec<&String> = after.calls.keys().collect();
        names.sort();
        for name in names {
            let d = after.delta(&before, name);
            if d > 0 {
                eprintln!("    {name}: +{d}");
            }
        }
    }
    let lost = held.iter().flatten().filter(|g| g.is_lost()).count();

    let mut releasers = Vec::with_capacity(held.len());
    for guards in held {
        releasers.push(tokio::spawn(async move {
            for g in guards {
                let _ = g.release().await;
            }
        }));
    }
    for r in releasers {
        r.await.expect("releaser panicked");
    }

    let n = locks.max(1) as f64;
    Row {
        label: label(Holder::Distlock),
        locks,
        ttl,
        fill_s,
        renewal_commands: after.delta(&before, "evalsha") + after.delta(&before, "eval"),
        renewed: after.delta(&before, "pexpire"),
        // The first snapshot's second INFO is counted in the delta.
        server_commands: after.total.saturating_sub(before.total).saturating_sub(1),
        cpu_pct: cpu.as_secs_f64() / window.as_secs_f64() * 100.0,
        rss_per_lock: rss1.saturating_sub(rss0) as f64 / n,
        heap_per_lock: counts.net_bytes() as f64 / n,
        blocks_per_lock: counts.live_blocks() as f64 / n,
        lost,
        errors,
        first_error,
    }
}

/// The raw holder: `locks` keys with tokens in one Vec, taken with pipelines; one renewal sweep measured
/// (pipelined or batched), its cost spread over the ttl/3 period it covers.
pub async fn raw(
    sys: &Arc<Systems>,
    info: &mut MultiplexedConnection,
    locks: usize,
    ttl: Duration,
    batched: bool,
) -> Row {
    let raw = &sys.raw;
    let tag = if batched { "b" } else { "p" };
    let rss0 = rss_bytes();
    alloc::start();
    let started = Instant::now();
    let held: Vec<(String, Token)> =
        (0..locks).map(|i| (format!("rawheld:{tag}:{locks}:{i}"), Token::random())).collect();
    let mut taken = 0;
    let (mut errors, mut first_error) = (0u64, None::<String>);
    for chunk in held.chunks(CHUNK) {
        match raw.lock_pipelined(chunk, ttl).await {
            Ok(n) => taken += n,
            Err(e) => {
                errors += 1;
                first_error.get_or_insert(e.to_string());
            }
        }
    }
    let fill_s = started.elapsed().as_secs_f64();
    let counts = alloc::stop();
    let rss1 = rss_bytes();

    let before = ServerCounters::read(info).await.expect("INFO");
    let cpu0 = cpu_now();
    let mut renewed = 0;
    for chunk in held.chunks(CHUNK) {
        let r = if batched { raw.renew_batched(chunk, ttl).await } else { raw.renew_pipelined(chunk, ttl).await };
        match r {
            Ok(n) => renewed += n,
            Err(e) => {
                errors += 1;
                first_error.get_or_insert(e.to_string());
            }
        }
    }
    let cpu = cpu_now().saturating_sub(cpu0);
    let after = ServerCounters::read(info).await.expect("INFO");
    for chunk in held.chunks(CHUNK) {
        let _ = raw.unlock_pipelined(chunk).await;
    }
    let n = locks.max(1) as f64;
    let period = ttl / 3;
    Row {
        label: if batched {
            "raw, one sweep per ttl/3, batched (1 EVALSHA per 1000 locks)"
        } else {
            "raw, one sweep per ttl/3, pipelined (1 EVALSHA per lock)"
        },
        locks,
        ttl,
        fill_s,
        renewal_commands: after.delta(&before, "evalsha"),
        renewed: after.delta(&before, "pexpire"),
        server_commands: after.total.saturating_sub(before.total).saturating_sub(1),
        cpu_pct: cpu.as_secs_f64() / period.as_secs_f64() * 100.0,
        rss_per_lock: rss1.saturating_sub(rss0) as f64 / n,
        heap_per_lock: counts.net_bytes() as f64 / n,
        blocks_per_lock: counts.live_blocks() as f64 / n,
        lost: locks - taken.min(locks) + (locks - (renewed.max(0) as usize).min(locks)),
        errors,
        first_error,
    }
}

/// Which holder a child process measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    Distlock,
    RawPipelined,
    RawBatched,
}

impl Holder {
    pub const ALL: [Holder; 3] = [Holder::Distlock, Holder::RawPipelined, Holder::RawBatched];

    fn arg(self) -> &'static str {
        match self {
            Holder::Distlock => "distlock",
            Holder::RawPipelined => "pipelined",
            Holder::RawBatched => "batched",
        }
    }
}

/// The hidden first argument that makes the binary a scenario-4 child.
pub const CHILD_FLAG: &str = "--held-child";

/// Measures one holder in a fresh child process (this binary with [`CHILD_FLAG`]), so that resident memory
/// grows from a clean heap: in the parent, memory freed by earlier scenarios would be reused and the growth
/// would read as zero. The child inherits the CPU pinning.
pub fn in_child(holder: Holder, url: &str, locks: usize, ttl: Duration) -> Result<Row, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let output = std::process::Command::new(exe)
        .args([CHILD_FLAG, holder.arg(), url, &locks.to_string(), &ttl.as_millis().to_string()])
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| e.to_string())?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("ROW "))
        .ok_or_else(|| format!("the scenario-4 child ({}) gave no result: {}", output.status, stdout.trim()))?;
    let f: Vec<f64> = line.split_whitespace().filter_map(|x| x.parse().ok()).collect();
    if f.len() != 10 {
        return Err(format!("bad child line {line:?}"));
    }
    Ok(Row {
        label: label(holder),
        locks,
        ttl,
        fill_s: f[0],
        renewal_commands: f[1] as u64,
        server_commands: f[2] as u64,
        cpu_pct: f[3],
        rss_per_lock: f[4],
        heap_per_lock: f[5],
        lost: f[6] as usize,
        errors: f[7] as u64,
        blocks_per_lock: f[8],
        renewed: f[9] as u64,
        first_error: None,
    })
}

fn label(holder: Holder) -> &'static str {
    match holder {
        Holder::Distlock => "distlock (renewal scheduler per client)",
        Holder::RawPipelined => "raw, one sweep per ttl/3, pipelined (1 EVALSHA per lock)",
        Holder::RawBatched => "raw, one sweep per ttl/3, batched (1 EVALSHA per 1000 locks)",
    }
}

/// The child's side: `--held-child <distlock|pipelined|batched> <url> <locks> <ttl ms>`; prints one `ROW` line.
pub fn child(args: &[String]) -> ExitCode {
    let [kind, url, locks, ttl_ms] = args else {
        eprintln!("{CHILD_FLAG} needs: kind url locks ttl_ms");
        return ExitCode::FAILURE;
    };
    let Some(holder) = Holder::ALL.into_iter().find(|h| h.arg() == kind) else {
        eprintln!("unknown holder {kind:?}");
        return ExitCode::FAILURE;
    };
    let (Ok(locks), Ok(ttl_ms)) = (locks.parse::<usize>(), ttl_ms.parse::<u64>()) else {
        eprintln!("bad numbers {locks:?} {ttl_ms:?}");
        return ExitCode::FAILURE;
    };
    let workers = std::thread::available_parallelism().map_or(1, usize::from).min(crate::allowed_cpus());
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(workers).enable_all().build().expect("runtime");
    let url = url.clone();
    let row = runtime.block_on(async move {
        tokio::spawn(async move {
            let sys = Arc::new(crate::connect(&url).await);
            let mut info = crate::info_connection(&url).await;
            let ttl = Duration::from_millis(ttl_ms);
            match holder {
                Holder::Distlock => {
                    warm_up(&sys).await;
                    distlock(&sys, &mut info, locks, ttl).await
                }
                Holder::RawPipelined => raw(&sys, &mut info, locks, ttl, false).await,
                Holder::RawBatched => raw(&sys, &mut info, locks, ttl, true).await,
            }
        })
        .await
        .expect("scenario-4 child panicked")
    });
    if let Some(e) = &row.first_error {
        eprintln!("scenario 4 ({kind}): {e}");
    }
    println!(
        "ROW {} {} {} {} {} {} {} {} {} {}",
        row.fill_s,
        row.renewal_commands,
        row.server_commands,
        row.cpu_pct,
        row.rss_per_lock,
        row.heap_per_lock,
        row.lost,
        row.errors,
        row.blocks_per_lock,
        row.renewed
    );
    ExitCode::SUCCESS
}
