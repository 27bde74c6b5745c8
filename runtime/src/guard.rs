//! A held lock: its grant, the watchdog that renews it, and release on drop.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::backend::LockKeys;
use crate::{Client, LockError, LockToken};

/// What [`LockGuard::release`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReleaseOutcome {
    /// The lock was ours and is now free (or, with `hold_at_least`, kept by nobody until that time is up).
    Released,
    /// There was no lock to release: the lease had run out (or it was force-unlocked). Another owner may have
    /// held it in between.
    Expired,
    /// Another owner holds the lock now; it was left alone.
    TakenByOther,
}

/// The lease as this process knows it, in monotonic time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lease {
    /// The lease length renewals ask for.
    pub(crate) ttl: Duration,
    /// When the last successful acquire or renewal was sent.
    pub(crate) renewed_from: Instant,
    /// Until when the lock is surely ours: `renewed_from + ttl - drift`.
    pub(crate) valid_until: Instant,
    /// Known lost: a renewal said so, or `valid_until` passed without one.
    pub(crate) lost: bool,
}

/// The allowance for clock-rate drift between this process and Redis: 1% of the lease plus 2 ms.
pub(crate) fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

impl Lease {
    pub(crate) fn starting(ttl: Duration, sent: Instant) -> Self {
        Self { ttl, renewed_from: sent, valid_until: sent + ttl.saturating_sub(drift(ttl)), lost: false }
    }

    fn is_lost(&self) -> bool {
        self.lost || Instant::now() >= self.valid_until
    }
}

/// Bounds on how long a grant is held, from the request.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct HoldLimits {
    pub(crate) hold_at_least: Option<Duration>,
    pub(crate) max_hold: Option<Duration>,
}

/// One grant of a lock: shared by the guard, its watchdog and nested (reentrant) guards.
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
    pub(crate) lease: watch::Sender<Lease>,
    /// Set on release or drop: from then on no command carries this token.
    finished: AtomicBool,
}

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
            lease: watch::Sender::new(lease),
            finished: AtomicBool::new(false),
        }
    }

    fn mark_lost(&self, why: &str) {
        let newly = !self.lease.borrow().lost;
        self.lease.send_modify(|l| l.lost = true);
        if newly && !self.finished.load(Ordering::Acquire) {
            tracing::warn!(key = %self.keys.name, token = %self.token, "distlock: lock lost: {why}");
        }
    }

    /// How long the record should outlive the release, for `hold_at_least`.
    fn keep_after_release(&self) -> Option<Duration> {
        self.hold_at_least.and_then(|h| h.checked_sub(self.acquired_at.elapsed())).filter(|k| !k.is_zero())
    }

    /// Stops the watchdog, waits until it is gone (so no renewal is sent after the release), then releases.
    async fn release(&self, watchdog: Option<JoinHandle<()>>) -> Result<ReleaseOutcome, LockError> {
        self.finished.store(true, Ordering::Release);
        if let Some(watchdog) = watchdog {
            watchdog.abort();
            // Ends at the watchdog's next await point: a renewal it already sent went out before ours.
            let _ = watchdog.await;
        }
        let keep = self.keep_after_release();
        self.client.inner.backend.release(&self.keys, &self.token, keep).await
    }
}

/// A held lock. Dropping it stops the watchdog and releases the lock in the background; [`release`]
/// (LockGuard::release) does the same and reports what it found.
///
/// While the guard lives, a watchdog renews the lease every `ttl / 3`. If a renewal finds the lock taken, or
/// none succeeds before the lease would run out, the lock is *lost*: [`is_lost`](LockGuard::is_lost) turns true
/// and [`lost`](LockGuard::lost) resolves. Work that must not overlap with another holder should stop then, and
/// writes to other systems should carry the [`fencing_token`](LockGuard::fencing_token).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
/// use std::time::Duration;
/// let client = distlock::Client::builder().memory().build().await?;
/// let guard = client.lock("report:42").ttl(Duration::from_secs(10)).acquire().await?;
/// assert_eq!(guard.key(), "report:42");
/// assert!(!guard.is_lost());
/// guard.extend(Duration::from_secs(30)).await?;
/// assert!(guard.remaining_ttl().await?.unwrap() > Duration::from_secs(10));
/// assert_eq!(guard.release().await?, distlock::ReleaseOutcome::Released);
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct LockGuard {
    grant: Arc<Grant>,
    /// `None` for a nested guard, which neither renews nor releases: the outer one does.
    watchdog: Option<JoinHandle<()>>,
    runtime: Option<tokio::runtime::Handle>,
    released: bool,
    nested: bool,
}

impl LockGuard {
    pub(crate) fn new(grant: Grant) -> Self {
        let grant = Arc::new(grant);
        let watchdog = tokio::spawn(watchdog(Arc::clone(&grant)));
        Self {
            grant,
            watchdog: Some(watchdog),
            runtime: tokio::runtime::Handle::try_current().ok(),
            released: false,
            nested: false,
        }
    }

    /// A guard for a lock the current lock body already holds: same grant, no renewal, no release.
    pub(crate) fn nested(grant: Arc<Grant>) -> Self {
        Self { grant, watchdog: None, runtime: None, released: true, nested: true }
    }

    pub(crate) fn grant(&self) -> &Arc<Grant> {
        &self.grant
    }

    pub(crate) fn is_nested(&self) -> bool {
        self.nested
    }

    /// The lock's key, as requested.
    pub fn key(&self) -> &str {
        &self.grant.keys.name
    }

    /// This grant's owner token.
    pub fn token(&self) -> &LockToken {
        &self.grant.token
    }

    /// The fencing token of this grant: strictly greater than that of every earlier grant of the same key (while
    /// the backend keeps its counter). Pass it with every write the lock protects, and have the storage reject
    /// writes carrying a token lower than the highest it has seen: that is what keeps a paused, stale holder
    /// from overwriting the new holder's work.
    pub fn fencing_token(&self) -> u64 {
        self.grant.fence
    }

    /// Whether the lock is known lost: a renewal found it gone or taken, or the lease ran out locally without a
    /// successful renewal. Checked against the monotonic clock on every call.
    pub fn is_lost(&self) -> bool {
        self.grant.lease.borrow().is_lost()
    }

    /// Resolves when the lock is known lost (see [`is_lost`](LockGuard::is_lost)); pending while it is held.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// # let client = distlock::Client::builder().memory().build().await?;
    /// let guard = client.lock("job").acquire().await?;
    /// client.force_unlock("job").await?; // e.g. an operator, or the lease ran out during a pause
    /// tokio::time::timeout(std::time::Duration::from_secs(30), guard.lost()).await.expect("noticed");
    /// assert!(guard.is_lost());
    /// # Ok(()) }
    /// ```
    pub async fn lost(&self) {
        let mut rx = self.grant.lease.subscribe();
        loop {
            let lease = *rx.borrow_and_update();
            if lease.is_lost() {
                return;
            }
            tokio::select! {
                changed = rx.changed() => if changed.is_err() { std::future::pending::<()>().await },
                () = tokio::time::sleep_until(lease.valid_until) => {}
            }
        }
    }

    /// The lease left on the server, or `None` when the lock is no longer this guard's.
    pub async fn remaining_ttl(&self) -> Result<Option<Duration>, LockError> {
        self.grant.client.inner.backend.remaining(&self.grant.keys, &self.grant.token).await
    }

    /// Sets the lease to `ttl` from now; the watchdog keeps renewing with `ttl` from then on.
    /// Fails with [`LockError::Lost`] when the lock is no longer this guard's.
    pub async fn extend(&self, ttl: Duration) -> Result<(), LockError> {
        crate::request::check_ttl(ttl)?;
        let grant = &self.grant;
        if grant.lease.borrow().is_lost() {
            return Err(LockError::Lost { key: grant.keys.name.clone() });
        }
        let sent = Instant::now();
        if grant.client.inner.backend.renew(&grant.keys, &grant.token, ttl).await? {
            grant.lease.send_modify(|l| {
                if !l.lost {
                    *l = Lease::starting(ttl, sent);
                }
            });
            Ok(())
        } else {
            grant.mark_lost("extend found the lock gone or taken");
            Err(LockError::Lost { key: grant.keys.name.clone() })
        }
    }

    /// Stops the watchdog and gives the lock back, saying whether it was still ours. A nested guard (taken
    /// inside a lock body that already holds the key) leaves the outer hold in place and reports `Released`.
    pub async fn release(mut self) -> Result<ReleaseOutcome, LockError> {
        if self.released {
            return Ok(ReleaseOutcome::Released);
        }
        self.released = true;
        let watchdog = self.watchdog.take();
        self.grant.release(watchdog).await
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let watchdog = self.watchdog.take();
        if let Some(watchdog) = &watchdog {
            watchdog.abort();
        }
        if self.released {
            return;
        }
        let grant = Arc::clone(&self.grant);
        // A lost lock is not ours to touch: no command carries its token again.
        if grant.lease.borrow().lost {
            grant.finished.store(true, Ordering::Release);
            return;
        }
        match &self.runtime {
            Some(runtime) => {
                runtime.spawn(async move {
                    if let Err(e) = grant.release(watchdog).await {
                        tracing::warn!(key = %grant.keys.name, error = %e, "distlock: background release failed; the lock frees when its lease runs out");
                    }
                });
            }
            None => {
                tracing::warn!(key = %grant.keys.name, "distlock: guard dropped outside a tokio runtime; the lock frees when its lease runs out")
            }
        }
    }
}

/// Renews the lease every `ttl / 3` until aborted by the guard, or until the lock is lost.
async fn watchdog(grant: Arc<Grant>) {
    let mut changes = grant.lease.subscribe();
    let mut next_attempt = None;
    loop {
        let lease = *changes.borrow_and_update();
        if lease.lost {
            return;
        }
        let renew_at = next_attempt.unwrap_or(lease.renewed_from + lease.ttl / 3).min(lease.valid_until);
        if grant.max_hold_until.is_some_and(|cap| renew_at >= cap) {
            // max_hold reached: stop renewing and let the lease run out; the loss is reported at its deadline.
            tokio::time::sleep_until(lease.valid_until).await;
            grant.mark_lost("max_hold reached: renewals stopped and the lease ran out");
            return;
        }
        tokio::select! {
            // An extend changed the lease: plan again.
            changed = changes.changed() => { if changed.is_err() { return } continue }
            () = tokio::time::sleep_until(renew_at) => {}
        }
        let sent = Instant::now();
        if sent >= lease.valid_until {
            grant.mark_lost("no renewal succeeded before the lease ran out");
            return;
        }
        let renewal = grant.client.inner.backend.renew(&grant.keys, &grant.token, lease.ttl);
        match tokio::time::timeout_at(lease.valid_until, renewal).await {
            Ok(Ok(true)) => {
                next_attempt = None;
                grant.lease.send_if_modified(|l| {
                    // An extend sent after this renewal has set a newer lease: keep it.
                    let newer = l.lost || l.renewed_from > sent;
                    if !newer {
                        *l = Lease::starting(lease.ttl, sent);
                    }
                    !newer
                });
            }
            Ok(Ok(false)) => {
                grant.mark_lost("a renewal found the lock gone or taken by another owner");
                return;
            }
            Ok(Err(e)) => {
                tracing::debug!(key = %grant.keys.name, error = %e, "distlock: renewal failed; retrying");
                next_attempt = Some(Instant::now() + (lease.ttl / 20).max(Duration::from_millis(10)));
            }
            Err(_) => {
                grant.mark_lost("no renewal succeeded before the lease ran out");
                return;
            }
        }
    }
}
