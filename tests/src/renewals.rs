//! [`RenewalWatch`]: held locks' renewals seen from outside, for the tests where one node hangs (issue 37).
//!
//! A guard's [`deadline`](distlock::LockGuard::deadline) counts from the send of the renewal that set it, so
//! the step between two deadlines is the step between two renewals; a renewal sent but not yet answered shows
//! as a deadline that stays put, and counts for as long as it has been pending.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock::LockGuard;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How often the watch looks at the guards.
const LOOK: Duration = Duration::from_millis(10);
/// What a renewal's reply may add to the step of a renewal still pending when looked at: the drift allowance
/// the deadline subtracts (1% of a 3 s lease plus 2 ms), the round trip, one look's lateness.
const PENDING_SLACK: Duration = Duration::from_millis(100);

/// Watches guards until [`finish`](RenewalWatch::finish): panics if any reads lost, and records each one's
/// largest step between renewals.
#[derive(Debug)]
pub struct RenewalWatch {
    done: Arc<AtomicBool>,
    task: JoinHandle<Vec<Duration>>,
}

impl RenewalWatch {
    /// Starts watching `guards` (each with its key, for messages), all held with a lease of `ttl`.
    pub fn start(guards: Arc<Vec<(String, LockGuard)>>, ttl: Duration) -> Self {
        let done = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let done = Arc::clone(&done);
            async move {
                let mut last: Vec<Instant> = guards.iter().map(|(_, g)| g.deadline()).collect();
                let mut steps = vec![Duration::ZERO; guards.len()];
                while !done.load(Ordering::Relaxed) {
                    for (i, (key, guard)) in guards.iter().enumerate() {
                        assert!(!guard.is_lost(), "the lock {key} was lost");
                        let deadline = guard.deadline();
                        if deadline > last[i] {
                            steps[i] = steps[i].max(deadline - last[i]);
                            last[i] = deadline;
                        }
                        // The renewal after the last one: at least this long a step already.
                        let pending = (Instant::now() + ttl).saturating_duration_since(last[i]);
                        steps[i] = steps[i].max(pending.saturating_sub(PENDING_SLACK));
                    }
                    tokio::time::sleep(LOOK).await;
                }
                steps
            }
        });
        Self { done, task }
    }

    /// Stops watching: each guard's largest step between renewals, in the order given.
    pub async fn finish(self) -> Vec<Duration> {
        self.done.store(true, Ordering::Relaxed);
        self.task.await.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
    }
}

/// Waits (up to 10 s) until every guard of `guards` was renewed `rounds` more times, as its deadline shows.
pub async fn renewed_again(guards: &[(String, LockGuard)], ttl: Duration, rounds: u32) {
    let from = guards.iter().map(|(_, g)| g.deadline()).min().expect("a guard");
    crate::eventually(Duration::from_secs(10), "more renewals of every lock", || async {
        guards.iter().all(|(_, g)| g.deadline() >= from + ttl / 3 * rounds)
    })
    .await;
}

/// The bound: no lock renewed later than a third of its lease plus 200 ms after its previous renewal.
pub fn assert_on_schedule(guards: &[(String, LockGuard)], steps: &[Duration], ttl: Duration) {
    for ((key, _), step) in guards.iter().zip(steps) {
        assert!(*step <= ttl / 3 + Duration::from_millis(200), "the lock {key} went {step:?} between renewals");
    }
}
