//! The lease as this process knows it, and the one rule that applies a server's answer to it: the drift
//! allowance, a grant's lease from its reply, and a renewal's or extend's reply (late, refused, unknown).

use std::time::Duration;

use tokio::time::Instant;

use crate::grant::Grant;
use crate::LossReason;

/// The allowance for clock-rate drift between this process and Redis: 1% of the lease plus 2 ms.
pub(crate) fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// The lease as this process knows it, in monotonic time.
///
/// **Invariant: `valid_until` never lies past the server's expiry of the grant.** Every lease counts from an
/// instant taken *before* a request the server answered was sent, for no more than the lease the server says
/// it set, less the drift allowance; where the outcome is unknown, the worse one is assumed:
/// - a grant or a claimed hand-over: the acquire's send + the lease in its reply (the server's PTTL);
/// - a hand-over heard as an announcement: the send of the last attempt that found another grant holding the
///   lock, provided the announcement names that attempt (the hand-over used the place in the queue that this
///   attempt registered, so it happened after the attempt reached the server) + the announced hand-over
///   lease. Nothing here rests on fencing tokens rising: they go back with the server's clock, or across a
///   failover to a replica whose clock is behind;
/// - a renewal or extend: its send + the ttl it set; a reply that comes back after `valid_until` counts for
///   nothing (a lock seen lost never comes back);
/// - an extend whose outcome is unknown (a timeout, `NotReplicated`): the earlier of the old deadline and
///   the one the extend would have set, as the server may have applied it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lease {
    /// The lease length renewals ask for.
    pub(crate) ttl: Duration,
    /// When the request behind this lease was sent.
    pub(crate) since: Instant,
    /// Until when the lock is surely ours.
    pub(crate) valid_until: Instant,
    /// When the next renewal is due: a third of the lease after `since`.
    pub(crate) renew_at: Instant,
    /// Known lost: a renewal or extend said so, or `valid_until` passed without one.
    pub(crate) lost: bool,
    /// Why, once known (the first reason found; a grant finished by its holder has none).
    pub(crate) why: Option<LossReason>,
    /// The server said this token no longer holds the lock: there is nothing left to release.
    pub(crate) gone: bool,
}

impl Lease {
    /// The server gave this token `lease` in answer to a request sent at `sent`; renewals ask for `ttl`.
    pub(crate) fn granted(ttl: Duration, sent: Instant, lease: Duration) -> Self {
        let valid_until = sent + lease.saturating_sub(drift(lease));
        Self { ttl, since: sent, valid_until, renew_at: sent + lease / 3, lost: false, why: None, gone: false }
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost || Instant::now() >= self.valid_until
    }
}

/// What a renewal's or extend's reply did to the lease ([`Grant::apply_renewal`]).
#[derive(Debug)]
pub(crate) enum Applied<E> {
    /// Renewed in time: the lease now runs `ttl` from the send.
    Renewed,
    /// The lock is lost (marked so): the reply came after the lease ran out, the server no longer holds it
    /// for this token, or the lease was marked lost while the reply was on its way.
    Lost,
    /// The call failed: whether the server applied it is unknown, and the deadline lowered before the send
    /// stands.
    Unknown(E),
}

impl Grant {
    /// Applies `reply`, the answer to a renewal or extend setting `ttl` sent at `sent`, to the lease, which
    /// was lowered before the send to end at `valid_until` at the latest ([`Grant::lower_for`]). The renewer
    /// and extend both go through here, so late and unknown replies follow one rule:
    /// - a reply arriving at or after `valid_until` counts for nothing: the lock is lost, and a lock seen lost
    ///   never comes back;
    /// - "renewed" sets the lease to `ttl` from the send, unless the lease was marked lost meanwhile (a loss is
    ///   final) or a newer lease was set (renewals and extends never overlap, `Grant::exclusive`: a guard);
    /// - "not held" marks the lock gone: nothing is left to release.
    pub(crate) fn apply_renewal<E>(
        &self,
        reply: Result<bool, E>,
        ttl: Duration,
        sent: Instant,
        valid_until: Instant,
    ) -> Applied<E> {
        if Instant::now() >= valid_until {
            self.mark_lost(LossReason::NotRenewedInTime);
            return Applied::Lost;
        }
        match reply {
            Ok(true) => {
                let renewed = Lease::granted(ttl, sent, ttl);
                let mut lost = false;
                self.update_lease(|l| {
                    lost = l.lost;
                    let applies = !l.lost && l.since <= sent;
                    if applies {
                        *l = renewed;
                    }
                    applies
                });
                if lost {
                    Applied::Lost
                } else {
                    Applied::Renewed
                }
            }
            Ok(false) => {
                self.mark_gone(LossReason::Refused);
                Applied::Lost
            }
            Err(e) => Applied::Unknown(e),
        }
    }
}
