//! Scenario 3: 16 tasks take turns on one key, each holding it ~1 ms and pausing 5 ms after its release.
//! Measures acquisitions/s, the hand-off gap (a holder starts its release → the next holder, which was already
//! waiting, has the lock) and fairness (acquisitions per task).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use tokio::sync::Barrier;

use crate::measure::{median, ns32, percentile_us, ServerCounters};
use crate::systems::{Raw, Systems, Token};

pub const TASKS: usize = 16;
const HOLD: Duration = Duration::from_millis(1);
const PAUSE: Duration = Duration::from_millis(5);
const TTL: Duration = Duration::from_secs(10);
/// How often the raw contender polls a busy key.
pub const RAW_POLL: Duration = Duration::from_millis(1);

/// The waiting strategies compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Waiter {
    /// Raw `SET NX PX`, retried every 1 ms while busy.
    RawPoll,
    /// distlock `.wait(..)` with the default retry strategy: woken by the release announcement.
    Distlock,
    /// rslock `acquire` (its own retry: up to 3 tries 0–200 ms apart, in a loop).
    Rslock,
}

impl Waiter {
    pub const ALL: [Waiter; 3] = [Waiter::RawPoll, Waiter::Distlock, Waiter::Rslock];

    pub fn name(self) -> &'static str {
        match self {
            Waiter::RawPoll => "raw",
            Waiter::Distlock => "distlock",
            Waiter::Rslock => "rslock",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Waiter::RawPoll => "raw SET NX PX, polled every 1 ms",
            Waiter::Distlock => "distlock `.wait(..)` (queued, handed over on release)",
            Waiter::Rslock => "rslock 0.10 `acquire` (own retry)",
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Round {
    pub acquisitions_per_s: f64,
    pub gap_p50_us: f64,
    pub gap_p99_us: f64,
    /// The holder's release call, start to reply: the round trip a hand-off cannot beat.
    pub release_p50_us: f64,
    pub min_per_task: u64,
    pub max_per_task: u64,
    pub mean_per_task: f64,
    /// Times a task got the lock while another task held it (must be 0).
    pub overlaps: u64,
    pub gaps: usize,
    /// Commands the contenders sent (SET, EVALSHA, EVAL) per acquisition: attempts, releases, polls.
    pub commands_per_acquisition: f64,
}

#[derive(Debug, Default)]
pub struct WaiterResult {
    pub rounds: Vec<Round>,
    pub errors: u64,
    pub first_error: Option<String>,
}

impl WaiterResult {
    pub fn median(&self, f: impl Fn(&Round) -> f64) -> f64 {
        median(self.rounds.iter().map(f))
    }
}

#[derive(Debug, Default)]
pub struct Scenario {
    pub window: Duration,
    pub by_waiter: HashMap<Waiter, WaiterResult>,
}

/// A held lock of any contender.
enum Held {
    Raw(Token),
    Distlock(distlock::LockGuard),
    Rslock(rslock::LockGuard),
}

struct Shared {
    epoch: Instant,
    /// When the last holder started its release (ns since `epoch`; 0: none yet).
    last_release: AtomicU64,
    holders: AtomicU32,
    overlaps: AtomicU64,
}

impl Shared {
    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }
}

struct TaskOutcome {
    acquisitions: u64,
    gaps: Vec<u32>,
    release_calls: Vec<u32>,
    errors: u64,
    first_error: Option<String>,
}

async fn acquire(
    sys: &Systems,
    waiter: Waiter,
    key: &str,
    conn: &mut redis::aio::ConnectionManager,
    give_up: Instant,
) -> Result<Option<Held>, String> {
    match waiter {
        Waiter::RawPoll => {
            let token = Token::random();
            loop {
                if Raw::try_lock(conn, key, &token, TTL).await.map_err(|e| e.to_string())? {
                    return Ok(Some(Held::Raw(token)));
                }
                if Instant::now() >= give_up {
                    return Ok(None);
                }
                tokio::time::sleep(RAW_POLL).await;
            }
        }
        Waiter::Distlock => {
            let wait = give_up.saturating_duration_since(Instant::now());
            match sys.distlock.lock(key).ttl(TTL).wait(wait).acquire().await {
                Ok(guard) => Ok(Some(Held::Distlock(guard))),
                Err(distlock::LockError::NotObtained { .. }) => Ok(None),
                Err(e) => Err(e.to_string()),
            }
        }
        Waiter::Rslock => {
            let deadline = tokio::time::Instant::from_std(give_up);
            match tokio::time::timeout_at(deadline, sys.rslock.acquire(key.as_bytes(), TTL)).await {
                Ok(Ok(guard)) => Ok(Some(Held::Rslock(guard))),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Ok(None),
            }
        }
    }
}

async fn release(sys: &Systems, held: Held, key: &str, conn: &mut redis::aio::ConnectionManager) -> Result<(), String> {
    match held {
        Held::Raw(token) => sys.raw.unlock(conn, key, &token).await.map(drop).map_err(|e| e.to_string()),
        Held::Distlock(guard) => guard.release().await.map(drop).map_err(|e| e.to_string()),
        Held::Rslock(guard) => {
            guard.release().await;
            Ok(())
        }
    }
}

async fn round(
    sys: &Arc<Systems>,
    info: &mut MultiplexedConnection,
    waiter: Waiter,
    key: String,
    window: Duration,
) -> (Round, u64, Option<String>) {
    let before = ServerCounters::read(info).await.ok();
    let shared = Arc::new(Shared {
        epoch: Instant::now(),
        last_release: AtomicU64::new(0),
        holders: AtomicU32::new(0),
        overlaps: AtomicU64::new(0),
    });
    let barrier = Arc::new(Barrier::new(TASKS + 1));
    let key = Arc::new(key);
    let mut handles = Vec::new();
    for _ in 0..TASKS {
        let (sys, shared, barrier, key) =
            (Arc::clone(sys), Arc::clone(&shared), Arc::clone(&barrier), Arc::clone(&key));
        handles.push(tokio::spawn(async move {
            let mut conn = sys.raw.conn.clone();
            let mut out = TaskOutcome {
                acquisitions: 0,
                gaps: Vec::with_capacity(4096),
                release_calls: Vec::with_capacity(4096),
                errors: 0,
                first_error: None,
            };
            barrier.wait().await;
            let end = Instant::now() + window;
            // Every loop is bounded by `end`: waits give up shortly after it.
            let give_up = end + Duration::from_millis(50);
            while Instant::now() < end {
                let waiting_since = shared.now_ns();
                let held = match acquire(&sys, waiter, &key, &mut conn, give_up).await {
                    Ok(Some(held)) => held,
                    Ok(None) => break,
                    Err(e) => {
                        out.errors += 1;
                        out.first_error.get_or_insert(e);
                        tokio::time::sleep(PAUSE).await;
                        continue;
                    }
                };
                let acquired = shared.now_ns();
                if shared.holders.fetch_add(1, SeqCst) != 0 {
                    shared.overlaps.fetch_add(1, SeqCst);
                }
                let previous = shared.last_release.load(SeqCst);
                let in_window = Instant::now() <= end;
                if in_window {
                    out.acquisitions += 1;
                    // A hand-off: the previous release started after this task began waiting.
                    if previous > waiting_since && out.gaps.len() < out.gaps.capacity() {
                        out.gaps.push(ns32(Duration::from_nanos(acquired.saturating_sub(previous))));
                    }
                }
                tokio::time::sleep(HOLD).await;
                shared.holders.fetch_sub(1, SeqCst);
                let releasing = shared.now_ns();
                shared.last_release.store(releasing, SeqCst);
                if let Err(e) = release(&sys, held, &key, &mut conn).await {
                    out.errors += 1;
                    out.first_error.get_or_insert(e);
                } else if in_window && out.release_calls.len() < out.release_calls.capacity() {
                    out.release_calls.push(ns32(Duration::from_nanos(shared.now_ns().saturating_sub(releasing))));
                }
                tokio::time::sleep(PAUSE).await;
            }
            out
        }));
    }
    barrier.wait().await;
    let mut outcomes = Vec::new();
    for h in handles {
        outcomes.push(h.await.expect("contention task panicked"));
    }
    let after = ServerCounters::read(info).await.ok();
    // The server counts the commands scripts run under their own names too: distlock sends no plain SET, so
    // its SETs all ran inside its scripts and are not commands it sent.
    let sent: &[&str] = if waiter == Waiter::Distlock { &["evalsha", "eval"] } else { &["set", "evalsha", "eval"] };
    let commands = match (&before, &after) {
        (Some(b), Some(a)) => sent.iter().map(|c| a.delta(b, c)).sum::<u64>() as f64,
        _ => f64::NAN,
    };
    let counts: Vec<u64> = outcomes.iter().map(|o| o.acquisitions).collect();
    let total: u64 = counts.iter().sum();
    if let (Some(b), Some(a), true) = (&before, &after, std::env::var_os("BENCH_DEBUG").is_some()) {
        a.print_per_cycle(b, &format!("{}, per acquisition", waiter.name()), total);
    }
    let mut gaps: Vec<u32> = outcomes.iter().flat_map(|o| o.gaps.iter().copied()).collect();
    gaps.sort_unstable();
    let mut release_calls: Vec<u32> = outcomes.iter().flat_map(|o| o.release_calls.iter().copied()).collect();
    release_calls.sort_unstable();
    let errors = outcomes.iter().map(|o| o.errors).sum();
    let first_error = outcomes.iter().find_map(|o| o.first_error.clone());
    let r = Round {
        acquisitions_per_s: total as f64 / window.as_secs_f64(),
        gap_p50_us: percentile_us(&gaps, 50.0),
        gap_p99_us: percentile_us(&gaps, 99.0),
        release_p50_us: percentile_us(&release_calls, 50.0),
        min_per_task: counts.iter().copied().min().unwrap_or(0),
        max_per_task: counts.iter().copied().max().unwrap_or(0),
        mean_per_task: total as f64 / TASKS as f64,
        overlaps: shared.overlaps.load(SeqCst),
        gaps: gaps.len(),
        commands_per_acquisition: commands / total.max(1) as f64,
    };
    (r, errors, first_error)
}

pub async fn run(
    sys: &Arc<Systems>,
    info: &mut MultiplexedConnection,
    waiters: &[Waiter],
    window: Duration,
    rounds: usize,
) -> Scenario {
    let mut scenario = Scenario { window, by_waiter: HashMap::new() };
    for &w in waiters {
        scenario.by_waiter.insert(w, WaiterResult::default());
    }
    for r in 0..rounds {
        for i in 0..waiters.len() {
            let w = waiters[(i + r) % waiters.len()];
            // A fresh key per round: a timed-out rslock attempt may leave its key set until the lease ends.
            let key = format!("contended:{}:{r}", w.name());
            let (round, errors, first_error) = round(sys, info, w, key, window).await;
            eprintln!(
                "  round {}/{rounds} {:>8}: {:>6.0} acq/s  gap p50 {:>8.1} µs  p99 {:>9.1} µs  per task {}..{} (mean {:.1})  overlaps {}  {:.1} commands/acquisition",
                r + 1,
                w.name(),
                round.acquisitions_per_s,
                round.gap_p50_us,
                round.gap_p99_us,
                round.min_per_task,
                round.max_per_task,
                round.mean_per_task,
                round.overlaps,
                round.commands_per_acquisition
            );
            let result = scenario.by_waiter.get_mut(&w).expect("inserted above");
            result.rounds.push(round);
            result.errors += errors;
            if result.first_error.is_none() {
                result.first_error = first_error;
            }
        }
    }
    scenario
}
