//! One grant of a lock: its lease as this process knows it, and the rule that no command carries its token
//! after it is finished (released, dropped or lost).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backend::{LockKeys, Store};
use crate::lease::Applied;
use crate::lease::Lease;
use crate::shutdown::Activity;
use crate::{Client, LockError, LockToken, LossReason, ReleaseOutcome};

/// Bounds on how long a grant is held, from the request.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct HoldLimits {
    pub(crate) min_hold: Option<Duration>,
    pub(crate) max_hold: Option<Duration>,
}

/// State bit: a renewal (or an extend) is in flight; no other may start.
const RENEWING: u8 = 1;
/// State bit: released, dropped or lost; no renewal or extend may start.
const FINISHED: u8 = 2;

/// One grant of a lock: shared by the guard, the renewer and nested (reentrant) guards.
#[derive(Debug)]
pub(crate) struct Grant {
    pub(crate) client: Client,
    pub(crate) keys: LockKeys,
    pub(crate) token: LockToken,
    pub(crate) fence: u64,
    pub(crate) acquired_at: Instant,
    pub(crate) min_hold: Option<Duration>,
    /// With `max_hold`: no renewal is sent after this instant.
    pub(crate) max_hold_until: Option<Instant>,
    /// Mutex plus Notify rather than a watch channel: a held lock should cost as little memory as possible.
    lease: Mutex<Lease>,
    /// Woken on every change of `lease`.
    lease_changed: Notify,
    /// RENEWING and FINISHED bits.
    state: AtomicU8,
    /// Woken when the renewal or extend in flight comes back.
    renewal_done: Notify,
    /// This grant's entry in its client's renewal queue, if it has one.
    queued: Mutex<Option<QueueKey>>,
    /// Its key in the client's registry of grants, which shutdown reads.
    pub(crate) id: u64,
    /// Until the release has been sent (or the server said the grant is gone): the client's shutdown waits.
    activity: Mutex<Option<Activity>>,
}

/// Where an entry sits in the renewal queue: when it is due, and a sequence number that makes it unique.
pub(crate) type QueueKey = (Instant, u64);

impl Grant {
    pub(crate) fn new(
        client: Client,
        keys: LockKeys,
        token: LockToken,
        fence: u64,
        lease: Lease,
        limits: HoldLimits,
        activity: Option<Activity>,
    ) -> Self {
        let id = client.inner.shutdown.next_grant_id();
        crate::observe::grant_started();
        Self {
            id,
            activity: Mutex::new(activity),
            client,
            keys,
            token,
            fence,
            // When the grant's reply arrived: no earlier than the server's grant, so `min_hold` keeps
            // the lock at least that long.
            acquired_at: Instant::now(),
            min_hold: limits.min_hold,
            max_hold_until: limits.max_hold.and_then(|m| Instant::now().checked_add(m)),
            lease: Mutex::new(lease),
            lease_changed: Notify::new(),
            state: AtomicU8::new(0),
            renewal_done: Notify::new(),
            queued: Mutex::new(None),
        }
    }

    pub(crate) fn lease(&self) -> Lease {
        *self.lease.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies `change` to the lease; when it says it changed something, wakes whoever waits on the lease.
    pub(crate) fn update_lease(&self, change: impl FnOnce(&mut Lease) -> bool) -> bool {
        let changed = change(&mut self.lease.lock().unwrap_or_else(PoisonError::into_inner));
        if changed {
            self.lease_changed.notify_waiters();
        }
        changed
    }

    /// Before a renewal or extend setting `ttl` from `sent` goes out: the server may apply it any moment from
    /// now on and its reply may come late or never, so the deadline drops now to where that lease would end,
    /// if that is earlier. A lease can lie past it: a claimed hand-over keeps the record's longer expiry, and an
    /// extend may ask for less. Returns the lease after the change.
    pub(crate) fn lower_for(&self, ttl: Duration, sent: Instant) -> Lease {
        let mut after = Lease::granted(ttl, sent, ttl);
        let until = after.valid_until;
        self.update_lease(|l| {
            let shorter = until < l.valid_until;
            if shorter {
                l.valid_until = until;
            }
            after = *l;
            shorter
        });
        after
    }

    /// Whether this grant may no longer be used: finished (released, dropped), marked lost, or past its
    /// validity on the monotonic clock.
    pub(crate) fn is_lost(&self) -> bool {
        self.finished_is_lost() || self.lease().is_lost()
    }

    /// A finished grant reads as lost.
    fn finished_is_lost(&self) -> bool {
        self.is_finished()
    }

    /// The instant [`is_lost`](Grant::is_lost) compares with: `valid_until`, which losing or finishing the
    /// grant pulls back to that moment at the latest.
    pub(crate) fn deadline(&self) -> Instant {
        self.lease().valid_until
    }

    /// Resolves when [`is_lost`](Grant::is_lost) turns true.
    pub(crate) async fn lost(&self) {
        loop {
            let changed = self.lease_changed.notified();
            tokio::pin!(changed);
            // Registered before reading, so a change in between is not missed.
            changed.as_mut().enable();
            let lease = self.lease();
            if self.finished_is_lost() || lease.is_lost() {
                return;
            }
            tokio::select! {
                biased;
                () = changed => {}
                () = tokio::time::sleep_until(lease.valid_until) => {}
            }
        }
    }

    /// The renewal queue entry; lock the queue first, then this.
    pub(crate) fn queued(&self) -> MutexGuard<'_, Option<QueueKey>> {
        // Only ever holds a plain value: a panic elsewhere cannot have left it half-written.
        self.queued.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn is_finished(&self) -> bool {
        self.state.load(Ordering::Acquire) & FINISHED != 0
    }

    /// Marks the grant lost (once; later calls do nothing) and wakes everyone waiting on `lost()`.
    pub(crate) fn mark_lost(&self, why: LossReason) {
        self.lose(why, false);
    }

    /// Marks the grant lost because the server said its token no longer holds the lock: nothing to release.
    pub(crate) fn mark_gone(&self, why: LossReason) {
        self.lose(why, true);
    }

    /// Marks the grant lost, if its lease ran out by the clock alone (nothing had marked it yet), so that the
    /// loss is reported and counted once, as one the renewer found.
    pub(crate) fn mark_lost_by_clock(&self) {
        if self.is_lost() {
            self.mark_lost(self.clock_reason());
        }
    }

    /// [`LockError::Lost`] for this grant, with why it was lost (or, not lost yet, why it would be if its
    /// lease ran out now).
    pub(crate) fn lost_error(&self) -> LockError {
        let reason = self.lease().why.unwrap_or_else(|| self.clock_reason());
        LockError::Lost { key: self.keys.name.clone(), reason }
    }

    /// Why a lease ran out that nothing reported lost: `max_hold` stopped its renewals, or none was answered.
    fn clock_reason(&self) -> LossReason {
        if self.max_hold_until.is_some_and(|cap| Instant::now() >= cap) {
            LossReason::MaxHold
        } else {
            LossReason::NotRenewedInTime
        }
    }

    fn lose(&self, why: LossReason, gone: bool) {
        let mut lease = self.lease.lock().unwrap_or_else(PoisonError::into_inner);
        let newly = !lease.lost;
        let changed = newly || (gone && !lease.gone);
        lease.lost = true;
        lease.why.get_or_insert(why);
        lease.gone |= gone;
        lease.valid_until = lease.valid_until.min(Instant::now());
        drop(lease);
        // Reported before anyone waiting on `lost()` is woken, so that whoever sees the loss finds it reported.
        // The reason once, as a field: the message stays the same for every loss, for searching.
        if newly && !self.is_finished() {
            crate::observe::lost();
            tracing::warn!(key = %self.keys.name, token = %self.token, why = %why, "distlock: lock lost");
        }
        if changed {
            self.lease_changed.notify_waiters();
        }
        if gone {
            self.settle();
        }
    }

    /// Nothing of this grant is left on the server, or its release has been sent: shutdown stops waiting for it.
    fn settle(&self) {
        drop(self.activity.lock().unwrap_or_else(PoisonError::into_inner).take());
    }

    /// Whether the server may still hold this grant and nobody has sent its release yet.
    pub(crate) fn is_unsettled(&self) -> bool {
        !self.is_finished() && self.activity.lock().unwrap_or_else(PoisonError::into_inner).is_some()
    }

    /// Marks a renewal in flight, unless one already is or the grant is finished; the renewal is over when the
    /// ticket drops (also when its future is dropped mid-call).
    pub(crate) fn begin_renewal(&self) -> Option<InFlight<'_>> {
        self.state.compare_exchange(0, RENEWING, Ordering::AcqRel, Ordering::Acquire).ok().map(|_| InFlight(self))
    }

    /// Waits for the renewal in flight, if any, then marks this caller's own in flight; `None` once the grant
    /// is finished. Extends go through here, so that no two commands setting the lease overlap and the last
    /// reply always describes the last lease set.
    pub(crate) async fn exclusive(&self) -> Option<InFlight<'_>> {
        loop {
            let done = self.renewal_done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            if self.is_finished() {
                return None;
            }
            if let Some(ticket) = self.begin_renewal() {
                return Some(ticket);
            }
            done.await;
        }
    }

    /// Finishes the grant: no renewal starts from now on. Returns whether one is in flight.
    fn finish(&self) -> bool {
        // State first: a schedule racing with this either sees FINISHED or is undone by the cancel.
        let before = self.state.fetch_or(FINISHED, Ordering::AcqRel);
        if before & FINISHED == 0 {
            crate::observe::grant_ended(self.acquired_at);
        }
        let in_flight = before & RENEWING != 0;
        self.client.inner.renewer.cancel(self);
        // A finished grant reads as lost, its deadline now at the latest; a renewal still in flight cannot
        // move it (renewals apply only to leases not lost).
        self.update_lease(|l| {
            l.lost = true;
            l.valid_until = l.valid_until.min(Instant::now());
            true
        });
        in_flight
    }

    /// Finishes the grant without a release (the server no longer holds it, or the runtime is gone).
    pub(crate) fn abandon(&self) {
        self.finish();
        self.settle();
    }

    /// Finishes the grant and releases it, after any renewal in flight has come back, so that no renewal
    /// follows the release. A grant the server said is gone sends nothing and reports `Expired`; one lost only
    /// by the clock may still hold the lock on the server, and the release (by token: it cannot touch another
    /// owner's grant) frees it sooner.
    pub(crate) async fn release(&self) -> Result<ReleaseOutcome, LockError> {
        let outcome = self.send_release().await;
        // Sent, or failed: either way the lease bounds what is left.
        self.settle();
        outcome
    }

    /// The client is shutting down and this grant's holder did not give it back within the grace period: its
    /// guard and body are told it is lost, then it is released. Afterwards it reads as gone, so the guard's own
    /// release sends nothing.
    pub(crate) async fn release_for_shutdown(&self) {
        self.mark_lost(LossReason::ShutDown);
        match self.release().await {
            Ok(_) => self.mark_gone(LossReason::ShutDown),
            Err(e) => {
                tracing::warn!(key = %self.keys.name, error = %e, "distlock: shutdown could not release a lock; it frees when its lease runs out");
            }
        }
    }

    async fn send_release(&self) -> Result<ReleaseOutcome, LockError> {
        if self.finish() {
            loop {
                let done = self.renewal_done.notified();
                tokio::pin!(done);
                done.as_mut().enable();
                if self.state.load(Ordering::Acquire) & RENEWING == 0 {
                    break;
                }
                done.await;
            }
        }
        let mut keep = None;
        let outcome = if self.lease().gone {
            Ok(ReleaseOutcome::Expired)
        } else {
            keep = self.keep_after_release();
            self.client.inner.backend.release(&self.keys, &self.token, Some(self.fence), keep).await
        };
        match outcome {
            Ok(outcome @ (ReleaseOutcome::Expired | ReleaseOutcome::TakenByOther)) => {
                tracing::warn!(key = %self.keys.name, ?outcome, "distlock: released a lock that was no longer held");
            }
            Ok(outcome) => crate::observe::released(self, outcome, keep),
            Err(_) => {}
        }
        outcome
    }

    /// Sets the lease to `ttl` from now (see [`LockGuard::extend`](crate::LockGuard::extend)).
    pub(crate) async fn extend(self: &Arc<Self>, ttl: Duration) -> Result<(), LockError> {
        let grant = self;
        let lost = || grant.lost_error();
        // Declared before the ticket, so that it acts after the ticket is dropped.
        let mut unanswered = Unanswered(None);
        // One command setting the lease at a time: a renewal in flight with the old ttl comes back first.
        let ticket = grant.exclusive().await.ok_or_else(lost)?;
        if grant.lease().is_lost() {
            return Err(lost());
        }
        let sent = Instant::now();
        // An extend to a shorter lease lowers the deadline now, not when its reply arrives.
        let before = grant.lower_for(ttl, sent);
        unanswered.0 = Some(grant);
        let reply = grant.client.inner.backend.renew(&grant.keys, &grant.token, ttl).await;
        unanswered.0 = None;
        let outcome = match grant.apply_renewal(reply, ttl, sent, before.valid_until) {
            Applied::Renewed => Ok(()),
            Applied::Lost => Err(lost()),
            Applied::Unknown(e) => {
                // Applied or not, unknown: the earlier deadline assumed above stays. A renewal goes out at once
                // to restore the lease.
                grant.update_lease(|l| {
                    l.renew_at = Instant::now();
                    false
                });
                Err(e)
            }
        };
        drop(ticket);
        grant.client.inner.renewer.schedule(grant, grant.lease().renew_at);
        outcome
    }

    /// How long the record should outlive the release, for `min_hold`.
    fn keep_after_release(&self) -> Option<Duration> {
        self.min_hold.and_then(|h| h.checked_sub(self.acquired_at.elapsed())).filter(|k| !k.is_zero())
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        self.client.inner.shutdown.unregister(self.id);
        // A grant that was never finished (its guard's background release never ran: the runtime shut down)
        // still ends here, once, for the held gauge.
        if !self.is_finished() {
            crate::observe::grant_ended(self.acquired_at);
        }
    }
}

/// An extend sent and not answered, because its future was dropped (cancelled): as after a failed one, its
/// outcome is unknown, the earlier deadline stays, and a renewal goes out at once to restore the lease (its
/// old time may lie past the lowered deadline).
struct Unanswered<'a>(Option<&'a Arc<Grant>>);

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if let Some(grant) = self.0 {
            let now = Instant::now();
            grant.update_lease(|l| {
                l.renew_at = now;
                false
            });
            grant.client.inner.renewer.schedule(grant, now);
        }
    }
}

/// A renewal or extend in flight; on drop, clears the bit and wakes whoever waits for it.
#[derive(Debug)]
pub(crate) struct InFlight<'a>(&'a Grant);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.state.fetch_and(!RENEWING, Ordering::AcqRel);
        self.0.renewal_done.notify_waiters();
    }
}
