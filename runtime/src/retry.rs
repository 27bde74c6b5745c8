//! How often a waiting request goes back to the store: [`RetryStrategy`].

use std::time::Duration;

/// How often a waiting request goes back to the store while the lock is busy — not how it gets the lock.
///
/// A waiter does not have to retry to be served: it queues, and the release that frees the lock hands it
/// straight to the longest live waiter and tells that waiter at once. What the strategy spaces is the
/// waiter's *refreshes*: each one keeps its place in the queue (a place not refreshed for three intervals is
/// dropped, so a waiter that died leaves the queue, and a hand-over made to it just before lasts no longer)
/// and is also an attempt, which notices a holder that crashed once its lease has run out. Every delay is
/// jittered (between half and all of it), at most a third of the request's `ttl` and never longer than the
/// holder's remaining lease. Shorter delays: a dead waiter blocks the line for less time, for more calls.
/// On a store that announces nothing, the strategy is the polling schedule. [`RetryStrategy::None`] means a
/// single attempt: no waiting at all.
///
/// Each variant is also an argument of the attribute: `retry = "none"`, `retry = "linear 100ms"`,
/// `retry = "exponential 25ms..1s"`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
/// # let client = distlock::Client::builder().memory().build().await?;
/// use std::time::Duration;
/// use distlock::RetryStrategy;
/// let guard = client.lock("job")
///     .wait(Duration::from_secs(5))
///     .retry(RetryStrategy::Exponential { base: Duration::from_millis(20), max: Duration::from_secs(1) })
///     .acquire()
///     .await?;
/// # drop(guard); Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RetryStrategy {
    /// One attempt; `wait` is not used.
    None,
    /// Go back every `step` (above zero).
    Linear {
        /// The delay between attempts.
        step: Duration,
    },
    /// Go back after `base`, then twice as long each time, up to `max` (`0 < base <= max`).
    Exponential {
        /// The first delay.
        base: Duration,
        /// The longest delay.
        max: Duration,
    },
}

impl Default for RetryStrategy {
    fn default() -> Self {
        Self::Exponential { base: Duration::from_millis(25), max: Duration::from_secs(1) }
    }
}

impl RetryStrategy {
    /// Why this strategy cannot be used, if it cannot: a zero delay would make a waiter hammer the store.
    pub(crate) fn problem(&self) -> Option<String> {
        match *self {
            Self::None => None,
            Self::Linear { step } if step.is_zero() => Some("RetryStrategy::Linear needs a step above zero".into()),
            Self::Linear { .. } => None,
            Self::Exponential { base, .. } if base.is_zero() => {
                Some("RetryStrategy::Exponential needs a base above zero".into())
            }
            Self::Exponential { base, max } if base > max => {
                Some(format!("RetryStrategy::Exponential's base {base:?} is above its max {max:?}"))
            }
            Self::Exponential { .. } => None,
        }
    }

    /// The jittered delay before retry number `attempt` (1-based); `None` for no retry.
    pub(crate) fn delay(&self, attempt: u32) -> Option<Duration> {
        let full = match *self {
            Self::None => return None,
            Self::Linear { step } => step,
            Self::Exponential { base, max } => base.saturating_mul(1 << attempt.saturating_sub(1).min(20)).min(max),
        };
        // Equal jitter: half fixed, half random, so waiters spread out but none retries at once.
        let random = crate::hooks::random_u64().or_else(|| getrandom::u64().ok()).unwrap_or(u64::MAX / 2);
        let half = full / 2;
        let spread = half.as_nanos().min(u128::from(u64::MAX)) as u64;
        let jitter = if spread == 0 { 0 } else { random % spread };
        Some(half + Duration::from_nanos(jitter))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::RetryStrategy;

    #[test]
    fn retry_delays_are_jittered_within_half_to_all_and_capped() {
        let linear = RetryStrategy::Linear { step: Duration::from_millis(100) };
        let delays: Vec<Duration> = (0..200).map(|_| linear.delay(1).expect("retries")).collect();
        assert!(delays.iter().all(|d| *d >= Duration::from_millis(50) && *d < Duration::from_millis(100)));
        // Jittered: 200 draws from a 50 ms range are not all alike.
        assert!(delays.iter().any(|d| *d != delays[0]), "no jitter: {delays:?}");

        let exponential =
            RetryStrategy::Exponential { base: Duration::from_millis(10), max: Duration::from_millis(80) };
        for (attempt, full) in [(1, 10), (2, 20), (3, 40), (4, 80), (9, 80), (u32::MAX, 80)] {
            let d = exponential.delay(attempt).expect("retries");
            assert!(
                d >= Duration::from_millis(full) / 2 && d < Duration::from_millis(full),
                "attempt {attempt}: {d:?}"
            );
        }
        assert_eq!(RetryStrategy::None.delay(1), None);
    }
}
