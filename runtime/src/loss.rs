//! Why a lock was lost: [`LossReason`], which [`LockError::Lost`](crate::LockError::Lost) carries and the lost WARN prints.

use std::fmt;

/// Why a lock was lost ([`LockError::Lost`](crate::LockError::Lost)), as its message and the lost WARN event say.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::time::Duration;
/// let client = distlock::Client::builder().memory().build().await.unwrap();
/// let ran_long = client.lock("job").ttl(Duration::from_millis(300)).max_hold(Duration::from_millis(100))
///     .run(tokio::time::sleep(Duration::from_secs(5))).await;
/// match ran_long {
///     Err(distlock::LockError::Lost { reason, .. }) => assert_eq!(reason, distlock::LossReason::MaxHold),
///     other => panic!("expected Lost, got {other:?}"),
/// }
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// `max_hold` was reached: renewals stopped and the lease ran out.
    MaxHold,
    /// A renewal or an extend was refused: the store no longer held the lock for this grant (its lease had run
    /// out there, or it was force-unlocked, and maybe taken by another owner since).
    Refused,
    /// No renewal was answered before the lease ran out: the store was unreachable or slow, or this process
    /// was paused or starved past the lease.
    NotRenewedInTime,
    /// [`Client::shutdown`](crate::Client::shutdown)'s grace period ended with the lock still held.
    ShutDown,
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LossReason::MaxHold => "max_hold was reached, so renewals stopped and the lease ran out",
            LossReason::Refused => {
                "a renewal was refused: the store no longer held it for this grant (its lease had run out there, or it was force-unlocked)"
            }
            LossReason::NotRenewedInTime => {
                "no renewal was answered before the lease ran out (the store was unreachable or slow, or this process was paused)"
            }
            LossReason::ShutDown => "the client's shutdown ended its grace period with the lock still held",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::LossReason;
    use crate::LockError;

    /// Issue 34: a lost lock's message says why.
    #[test]
    fn a_lost_message_says_why() {
        let lost = |reason| LockError::Lost { key: "job".into(), reason }.to_string();
        assert!(lost(LossReason::MaxHold).contains("lost: max_hold was reached"));
        assert!(lost(LossReason::Refused).contains("lost: a renewal was refused"));
        assert!(lost(LossReason::NotRenewedInTime).contains("lost: no renewal was answered before the lease ran out"));
        assert!(lost(LossReason::ShutDown).contains("lost: the client's shutdown ended its grace period"));
    }
}
