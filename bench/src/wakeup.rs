//! Scenario 5: a waiter blocked with a long backoff; how soon after the holder's release does it hold the
//! lock? Compared with the round trip of one command on the same kind of connection.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

use crate::measure::{ns32, percentile_us};
use crate::systems::Systems;

const TTL: Duration = Duration::from_secs(10);
/// distlock's waiter backoff: far longer than any wake-up the release announcement should give.
pub const LONG_STEP: Duration = Duration::from_secs(5);
/// How long the waiter is left blocked before the release.
pub const SETTLE: Duration = Duration::from_millis(30);

/// Round-trip time of PING on a `ConnectionManager`, back to back, sorted samples in ns.
pub async fn round_trips(sys: &Systems, count: usize) -> Vec<u32> {
    round_trips_after(sys, count, Duration::ZERO).await
}

/// Round-trip time of PING on a `ConnectionManager`, each after `idle` without traffic (as a release comes
/// after a wait), sorted samples in ns.
pub async fn round_trips_after(sys: &Systems, count: usize, idle: Duration) -> Vec<u32> {
    pings(&mut sys.raw.conn.clone(), count, idle).await
}

/// `count` PINGs on `conn`, one at a time, each after `idle`: their round trips, sorted, in ns.
pub async fn pings<C: redis::aio::ConnectionLike + Send>(conn: &mut C, count: usize, idle: Duration) -> Vec<u32> {
    let mut samples = Vec::with_capacity(count);
    for _ in 0..count {
        if !idle.is_zero() {
            tokio::time::sleep(idle).await;
        }
        let t = Instant::now();
        let _: String = redis::cmd("PING").query_async(conn).await.expect("PING");
        samples.push(ns32(t.elapsed()));
    }
    samples.sort_unstable();
    samples
}

#[derive(Debug, Default, Clone)]
pub struct WakeResult {
    pub label: &'static str,
    /// Release started → waiter holds the lock (ns, sorted).
    pub from_release_start: Vec<u32>,
    /// Release call returned → waiter holds the lock (ns, sorted; 0 when the waiter was first).
    pub from_release_done: Vec<u32>,
    /// How long the holder's release call took (one round trip, after the same idle time; ns, sorted).
    pub release_call: Vec<u32>,
    /// Trials in which the waiter was not blocked in the middle of a wait when the release came, or failed.
    pub bad_trials: usize,
    /// Trials in which `<record>:released` had a subscriber while the waiter waited.
    pub subscribed: usize,
    pub first_error: Option<String>,
}

impl WakeResult {
    pub fn p50_us(&self) -> f64 {
        percentile_us(&self.from_release_start, 50.0)
    }

    pub fn max_us(&self) -> f64 {
        percentile_us(&self.from_release_start, 100.0)
    }

    pub fn done_p50_us(&self) -> f64 {
        percentile_us(&self.from_release_done, 50.0)
    }

    pub fn release_call_p50_us(&self) -> f64 {
        percentile_us(&self.release_call, 50.0)
    }
}

fn finish(mut r: WakeResult) -> WakeResult {
    r.from_release_start.sort_unstable();
    r.from_release_done.sort_unstable();
    r.release_call.sort_unstable();
    r
}

/// distlock: the waiter uses `RetryStrategy::Linear { step: 5 s }` and a 10 s wait; the holder is another
/// client (another process, as far as Redis can tell).
pub async fn distlock(
    sys: &Arc<Systems>,
    holder: &distlock::Client,
    info: &mut MultiplexedConnection,
    trials: usize,
) -> WakeResult {
    let mut r = WakeResult { label: "distlock, waiter backoff `Linear { step: 5s }`", ..WakeResult::default() };
    for trial in 0..trials {
        let key = format!("wake:{trial}");
        let guard = match holder.lock(key.as_str()).ttl(TTL).acquire().await {
            Ok(g) => g,
            Err(e) => {
                r.bad_trials += 1;
                r.first_error.get_or_insert(e.to_string());
                continue;
            }
        };
        let client = sys.distlock.clone();
        let waiter_key = key.clone();
        let waiter = tokio::spawn(async move {
            let result = client
                .lock(waiter_key)
                .ttl(TTL)
                .wait(Duration::from_secs(10))
                .retry(distlock::RetryStrategy::Linear { step: LONG_STEP })
                .acquire()
                .await;
            (Instant::now(), result)
        });
        tokio::time::sleep(SETTLE).await;
        // The waiter must still be waiting. (Whether it listens on `<record>:released` is counted, not
        // required: how it learns of a release is distlock's business.)
        let channel = format!("{}:released", sys.distlock.record_key(&key));
        let subscribers: (String, i64) =
            redis::cmd("PUBSUB").arg("NUMSUB").arg(&channel).query_async(info).await.unwrap_or_default();
        if subscribers.1 >= 1 {
            r.subscribed += 1;
        }
        let blocked = !waiter.is_finished();
        let released_at = Instant::now();
        let outcome = guard.release().await;
        let release_done = Instant::now();
        let (acquired_at, result) = tokio::time::timeout(Duration::from_secs(12), waiter)
            .await
            .expect("waiter bounded by its 10 s wait")
            .expect("waiter panicked");
        match (outcome, result) {
            (Ok(_), Ok(g)) if blocked => {
                r.from_release_start.push(ns32(acquired_at.saturating_duration_since(released_at)));
                r.from_release_done.push(ns32(acquired_at.saturating_duration_since(release_done)));
                r.release_call.push(ns32(release_done - released_at));
                let _ = g.release().await;
            }
            (outcome, result) => {
                r.bad_trials += 1;
                let why = match (outcome, result) {
                    (Err(e), _) | (_, Err(e)) => e.to_string(),
                    _ => "the waiter was no longer waiting when the lock was released".to_owned(),
                };
                r.first_error.get_or_insert(why);
            }
        }
    }
    finish(r)
}

/// rslock: the waiter calls `acquire` (its default retry: up to 3 tries, 0–200 ms apart, in a loop); the
/// holder is another `LockManager`.
pub async fn rslock(sys: &Arc<Systems>, holder: &rslock::LockManager, trials: usize) -> WakeResult {
    let mut r = WakeResult { label: "rslock 0.10 `acquire`, default retry (0–200 ms)", ..WakeResult::default() };
    for trial in 0..trials {
        let key = format!("rswake:{trial}");
        let lock = match holder.lock(key.as_bytes(), TTL).await {
            Ok(l) => l,
            Err(e) => {
                r.bad_trials += 1;
                r.first_error.get_or_insert(e.to_string());
                continue;
            }
        };
        let manager = sys.rslock.clone();
        let waiter_key = key.clone();
        let waiter = tokio::spawn(async move {
            let result =
                tokio::time::timeout(Duration::from_secs(3), manager.acquire(waiter_key.as_bytes(), TTL)).await;
            (Instant::now(), result)
        });
        tokio::time::sleep(SETTLE).await;
        let blocked = !waiter.is_finished();
        let released_at = Instant::now();
        holder.unlock(&lock).await;
        let release_done = Instant::now();
        let (acquired_at, result) = waiter.await.expect("waiter panicked");
        match result {
            Ok(Ok(guard)) if blocked => {
                r.from_release_start.push(ns32(acquired_at.saturating_duration_since(released_at)));
                r.from_release_done.push(ns32(acquired_at.saturating_duration_since(release_done)));
                r.release_call.push(ns32(release_done - released_at));
                guard.release().await;
            }
            Ok(Ok(guard)) => {
                r.bad_trials += 1;
                guard.release().await;
            }
            Ok(Err(e)) => {
                r.bad_trials += 1;
                r.first_error.get_or_insert(e.to_string());
            }
            Err(_) => {
                r.bad_trials += 1;
                r.first_error.get_or_insert("timed out after 3 s".to_owned());
            }
        }
    }
    finish(r)
}
