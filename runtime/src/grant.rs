//! One grant of a lock: its lease as this process knows it, and the rule that no command carries its token
//! after it is finished (released, dropped or lost).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backend::LockKeys;
use crate::{Client, LockError, LockToken, ReleaseOutcome};

/// The allowance for clock-rate drift between this process and Redis: 1% of the lease plus 2 ms.
pub(crate) fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// The lease as this process knows it, in monotonic time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lease {
    /// The lease length renewals ask for.
    pub(crate) ttl: Duration,
    /// When the last successful acquire, renewal or extend was sent.
    pub(crate) renewed_from: Instant,
    /// Until when the lock is surely ours: `renewed_from + ttl - drift`.
    pub(crate) valid_until: Instant,
    /// Known lost: a renewal said so, or `valid_until` passed without one.
    pub(crate) lost: bool,
}

impl Lease {
    pub(crate) fn starting(ttl: Duration, sent: Instant) -> Self {
        Self { ttl, renewed_from: sent, valid_until: sent + ttl.saturating_sub(drift(ttl)), lost: false }
    }

    /// A lease handed over by a release: it began no earlier than `since` and lasts `lease`; renewals ask
    /// for `ttl`, the first one at once.
    pub(crate) fn handed_over(ttl: Duration, lease: Duration, since: Instant) -> Self {
        let valid_until = since + lease.saturating_sub(drift(lease));
        // `renewed_from` is set so that the first renewal is due now.
        let renewed_from = Instant::now().checked_sub(ttl / 3).unwrap_or(since).min(since);
        Self { ttl, renewed_from, valid_until, lost: false }
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost || Instant::now() >= self.valid_until
    }

    /// When the next renewal is due: a third of the lease after the last one.
    pub(crate) fn renew_at(&self) -> Instant {
        self.renewed_from + self.ttl / 3
    }
}

/// Bounds on how long a grant is held, from the request.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct HoldLimits {
    pub(crate) hold_at_least: Option<Duration>,
    pub(crate) max_hold: Option<Duration>,
}

/// No renewal in flight; renewals may start.
const IDLE: u8 = 0;
/// A renewal is in flight.
const RENEWING: u8 = 1;
/// Released, dropped or lost: no command with this token may start.
const FINISHED: u8 = 2;

/// One grant of a lock: shared by the guard, the renewer and nested (reentrant) guards.
#[derive(Debug)]
pub(crate) struct Grant {
    pub(crate) client: Client,
    pub(crate) keys: LockKeys,
    pub(crate) token: LockToken,
    pub(crate) fence: u64,
    pub(crate) acquired_at: Instant,
    pub(crate) hold_at_least: Option<Duration>,
    /// With `max_hold`: no renewal is sent after this instant.
    pub(crate) max_hold_until: Option<Instant>,
    /// Mutex plus Notify rather than a watch channel: a held lock should cost as little memory as possible.
    lease: Mutex<Lease>,
    /// Woken on every change of `lease`.
    lease_changed: Notify,
    /// IDLE, RENEWING or FINISHED.
    state: AtomicU8,
    /// Tells a waiting release that the renewal in flight has come back.
    renewal_done: Notify,
    /// This grant's entry in its client's renewal queue, if it has one.
    queued: Mutex<Option<QueueKey>>,
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
    ) -> Self {
        Self {
            client,
            keys,
            token,
            fence,
            acquired_at: lease.renewed_from,
            hold_at_least: limits.hold_at_least,
            max_hold_until: limits.max_hold.and_then(|m| lease.renewed_from.checked_add(m)),
            lease: Mutex::new(lease),
            lease_changed: Notify::new(),
            state: AtomicU8::new(IDLE),
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

    /// Resolves when the lock is known lost: marked so, or its validity has run out on the monotonic clock.
    pub(crate) async fn lost(&self) {
        loop {
            let changed = self.lease_changed.notified();
            tokio::pin!(changed);
            // Registered before reading, so a change in between is not missed.
            changed.as_mut().enable();
            let lease = self.lease();
            if lease.is_lost() {
                return;
            }
            tokio::select! {
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
        self.state.load(Ordering::Acquire) == FINISHED
    }

    /// Marks the grant lost (once; later calls do nothing) and wakes everyone waiting on `lost()`.
    pub(crate) fn mark_lost(&self, why: &str) {
        let newly = self.update_lease(|l| !std::mem::replace(&mut l.lost, true));
        if newly && !self.is_finished() {
            tracing::warn!(key = %self.keys.name, token = %self.token, "distlock: lock lost: {why}");
        }
    }

    /// Marks a renewal in flight, unless the grant is finished; the renewal is over when the ticket drops
    /// (also when its future is dropped mid-call).
    pub(crate) fn begin_renewal(&self) -> Option<InFlight<'_>> {
        self.state.compare_exchange(IDLE, RENEWING, Ordering::AcqRel, Ordering::Acquire).ok().map(|_| InFlight(self))
    }

    /// Finishes the grant: no renewal starts from now on. Returns whether one is in flight.
    fn finish(&self) -> bool {
        // State first: a schedule racing with this either sees FINISHED or is undone by the cancel.
        let in_flight = self.state.swap(FINISHED, Ordering::AcqRel) == RENEWING;
        self.client.inner.renewer.cancel(self);
        in_flight
    }

    /// Finishes the grant without a release (it is lost, or the runtime is gone): no command follows.
    pub(crate) fn abandon(&self) {
        self.finish();
    }

    /// Finishes the grant and releases it, after any renewal in flight has come back, so that no renewal
    /// follows the release.
    pub(crate) async fn release(&self) -> Result<ReleaseOutcome, LockError> {
        if self.finish() {
            // The renewal's end notifies once; if it already has, the stored permit completes this at once.
            self.renewal_done.notified().await;
        }
        let keep = self.keep_after_release();
        self.client.inner.backend.release(&self.keys, &self.token, keep).await
    }

    /// How long the record should outlive the release, for `hold_at_least`.
    fn keep_after_release(&self) -> Option<Duration> {
        self.hold_at_least.and_then(|h| h.checked_sub(self.acquired_at.elapsed())).filter(|k| !k.is_zero())
    }
}

/// A renewal in flight; on drop, back to IDLE, or, if the grant was finished meanwhile, tell the release.
#[derive(Debug)]
pub(crate) struct InFlight<'a>(&'a Grant);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let grant = self.0;
        if grant.state.compare_exchange(RENEWING, IDLE, Ordering::AcqRel, Ordering::Acquire).is_err() {
            grant.renewal_done.notify_one();
        }
    }
}
