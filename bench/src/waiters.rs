//! Scenario 6: many waiters on one hot key (issue 33). N tasks on one distlock client loop acquire → ~2 ms
//! hold → release on one key with the default retry, so at any moment one holds it and the others are queued.
//! Measures what the waiting costs Redis, per acquisition: the commands it runs (scripts' inner calls
//! included, as `total_commands_processed` counts them) and its CPU time (user + system, from `/proc`),
//! beside the throughput and the holder's release call.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

use crate::measure::{ns32, percentile_us, process_cpu, ServerCounters};
use crate::systems::Systems;

const HOLD: Duration = Duration::from_millis(2);
const TTL: Duration = Duration::from_secs(10);
/// Longer than any queue takes to turn over here: a waiter that gives up is an error.
const WAIT: Duration = Duration::from_secs(120);

/// One row: N waiters.
#[derive(Debug, Clone, Default)]
pub struct Row {
    pub waiters: usize,
    pub window: Duration,
    pub acquisitions_per_s: f64,
    pub commands_per_acquisition: f64,
    pub redis_cpu_us_per_acquisition: f64,
    pub release_p50_us: f64,
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

/// N waiters on one key for `window`, after they have all queued.
pub async fn run(
    sys: &Arc<Systems>,
    info: &mut MultiplexedConnection,
    server_pid: u32,
    waiters: usize,
    window: Duration,
) -> Row {
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
    let before = (ServerCounters::read(info).await.expect("INFO"), process_cpu(server_pid));
    shared.measuring.store(true, SeqCst);
    let started = Instant::now();
    tokio::time::sleep(window).await;
    shared.measuring.store(false, SeqCst);
    let elapsed = started.elapsed();
    let after = (ServerCounters::read(info).await.expect("INFO"), process_cpu(server_pid));
    shared.stop.store(true, SeqCst);
    // The waiters still queued are cancelled: each gives its place back.
    tasks.shutdown().await;

    let acquisitions = shared.acquisitions.load(SeqCst);
    let per = |x: f64| x / acquisitions.max(1) as f64;
    // The two INFO commands of `before` are inside the window's count.
    let commands = after.0.total.saturating_sub(before.0.total).saturating_sub(2);
    let mut release_calls = std::mem::take(&mut *shared.release_calls.lock().unwrap_or_else(PoisonError::into_inner));
    release_calls.sort_unstable();
    let first_error = shared.first_error.lock().unwrap_or_else(PoisonError::into_inner).take();
    Row {
        waiters,
        window: elapsed,
        acquisitions_per_s: acquisitions as f64 / elapsed.as_secs_f64(),
        commands_per_acquisition: per(commands as f64),
        redis_cpu_us_per_acquisition: per(after.1.saturating_sub(before.1).as_secs_f64() * 1e6),
        release_p50_us: percentile_us(&release_calls, 50.0),
        overlaps: shared.overlaps.load(SeqCst),
        errors: shared.errors.load(SeqCst),
        first_error,
    }
}
