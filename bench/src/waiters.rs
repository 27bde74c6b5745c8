//! Scenario 6: many waiters on one hot key (issue 33). N tasks on one distlock client loop acquire → ~2 ms
//! hold → release on one key with the default retry, so at any moment one holds it and the others are queued.
//! Measures what the waiting costs Redis, per acquisition: the commands it runs (scripts' inner calls
//! included, as `total_commands_processed` counts them) and its CPU time (user + system, from `/proc`),
//! beside the throughput and the holder's release call. Each row starts on an empty server and measures
//! [`WINDOWS`] windows back to back; it reports the median window, so that one disturbed window moves nothing.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

use crate::measure::{median, ns32, percentile_us, process_cpu, ServerCounters};
use crate::systems::Systems;

const HOLD: Duration = Duration::from_millis(2);
const TTL: Duration = Duration::from_secs(10);
/// Longer than any queue takes to turn over here: a waiter that gives up is an error.
const WAIT: Duration = Duration::from_secs(120);
/// Windows measured per row.
pub const WINDOWS: usize = 5;

/// One row: N waiters.
#[derive(Debug, Clone, Default)]
pub struct Row {
    pub waiters: usize,
    /// One window's length; the rates below are the median of [`WINDOWS`] windows.
    pub window: Duration,
    pub acquisitions_per_s: f64,
    pub commands_per_acquisition: f64,
    pub redis_cpu_us_per_acquisition: f64,
    /// Over every window.
    pub release_p50_us: f64,
    /// Keys Redis expired during the windows (the queue's own dead places; nothing left from earlier rows).
    pub expired_keys: u64,
    /// Times a task got the lock while another task held it (must be 0).
    pub overlaps: u64,
    pub errors: u64,
    pub first_error: Option<String>,
}

#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    measuring: AtomicBool,
    holders: AtomicU32,
    overlaps: AtomicU64,
    acquisitions: AtomicU64,
    errors: AtomicU64,
    first_error: Mutex<Option<String>>,
    release_calls: Mutex<Vec<u32>>,
}

impl Shared {
    fn error(&self, e: impl ToString) {
        self.errors.fetch_add(1, SeqCst);
        self.first_error.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert_with(|| e.to_string());
    }
}

/// N waiters on one key, [`WINDOWS`] windows of `window` each, after they have all queued.
pub async fn run(
    sys: &Arc<Systems>,
    info: &mut MultiplexedConnection,
    server_pid: u32,
    waiters: usize,
    window: Duration,
) -> Row {
    // Earlier scenarios leave keys that expire later: scenario 4's released locks keep their last fencing
    // token for their ttl (100,000 of them), the previous row's cancelled places live up to 90 s. Redis's
    // active expiry of them would be counted in this row's Redis CPU. The server is the benchmark's own.
    let () = redis::cmd("FLUSHALL").arg("SYNC").query_async(info).await.expect("FLUSHALL");
    let key = Arc::new(format!("waiters:{waiters}:{}", std::process::id()));
    let shared = Arc::new(Shared::default());
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..waiters {
        let (sys, shared, key) = (Arc::clone(sys), Arc::clone(&shared), Arc::clone(&key));
        tasks.spawn(async move {
            while !shared.stop.load(SeqCst) {
                let guard = match sys.distlock.lock(key.as_str()).ttl(TTL).wait(WAIT).acquire().await {
                    Ok(guard) => guard,
                    Err(e) => {
                        shared.error(e);
                        continue;
                    }
                };
                if shared.holders.fetch_add(1, SeqCst) > 0 {
                    shared.overlaps.fetch_add(1, SeqCst);
                }
                tokio::time::sleep(HOLD).await;
                shared.holders.fetch_sub(1, SeqCst);
                let measuring = shared.measuring.load(SeqCst);
                let started = Instant::now();
                if let Err(e) = guard.release().await {
                    shared.error(e);
                }
                if measuring {
                    shared.acquisitions.fetch_add(1, SeqCst);
                    shared.release_calls.lock().unwrap_or_else(PoisonError::into_inner).push(ns32(started.elapsed()));
                }
            }
        });
    }
    // Every waiter queued (one attempt each, a few thousand a second), and the queue turning over.
    tokio::time::sleep(Duration::from_secs(2) + Duration::from_micros(200 * waiters as u64)).await;
    // Per window: acquisitions/s, commands and Redis CPU µs per acquisition.
    let (mut rates, mut commands, mut cpu) = (Vec::new(), Vec::new(), Vec::new());
    let mut expired_keys = 0;
    shared.measuring.store(true, SeqCst);
    for _ in 0..WINDOWS {
        let before = (ServerCounters::read(info).await.expect("INFO"), process_cpu(server_pid));
        let (started, acquired) = (Instant::now(), shared.acquisitions.load(SeqCst));
        tokio::time::sleep(window).await;
        let after = (ServerCounters::read(info).await.expect("INFO"), process_cpu(server_pid));
        let (elapsed, acquired) = (started.elapsed(), shared.acquisitions.load(SeqCst) - acquired);
        let per = |x: f64| x / acquired.max(1) as f64;
        rates.push(acquired as f64 / elapsed.as_secs_f64());
        // The two INFO commands of `before` are inside the window's count.
        commands.push(per(after.0.total.saturating_sub(before.0.total).saturating_sub(2) as f64));
        cpu.push(per(after.1.saturating_sub(before.1).as_secs_f64() * 1e6));
        expired_keys += after.0.expired_keys.saturating_sub(before.0.expired_keys);
    }
    shared.measuring.store(false, SeqCst);
    shared.stop.store(true, SeqCst);
    // The waiters still queued are cancelled: each gives its place back.
    tasks.shutdown().await;

    let mut release_calls = std::mem::take(&mut *shared.release_calls.lock().unwrap_or_else(PoisonError::into_inner));
    release_calls.sort_unstable();
    let first_error = shared.first_error.lock().unwrap_or_else(PoisonError::into_inner).take();
    Row {
        waiters,
        window,
        acquisitions_per_s: median(rates),
        commands_per_acquisition: median(commands),
        redis_cpu_us_per_acquisition: median(cpu),
        release_p50_us: percentile_us(&release_calls, 50.0),
        expired_keys,
        overlaps: shared.overlaps.load(SeqCst),
        errors: shared.errors.load(SeqCst),
        first_error,
    }
}
