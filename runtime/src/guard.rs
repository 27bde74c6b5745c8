//! A held lock: the public face of a grant, and release on drop.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Fencing, Store};
use crate::grant::{Grant, Lease};
use crate::hooks::{reverted, Fix};
use crate::{LockError, LockToken};

/// What [`LockGuard::release`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReleaseOutcome {
    /// The lock was ours and is now free (or, with `min_hold`, kept by nobody until that time is up).
    Released,
    /// There was no lock to release: the lease had run out (or it was force-unlocked). Another owner may have
    /// held it in between.
    Expired,
    /// Another owner holds the lock now; it was left alone.
    TakenByOther,
    /// Nothing was sent: the guard was nested, taken inside a lock body that already held the key (a reentrant
    /// request, or [`current_lock`]). The hold belongs to the outer body, which renews it and releases it when
    /// it ends; it is still in place.
    Nested,
}

/// A held lock. Dropping it stops the watchdog and releases the lock in the background;
/// [`release`](LockGuard::release) does the same and reports what it found.
///
/// While the guard lives, the client's watchdog renews the lease every `ttl / 3`. If a renewal finds the lock taken, or
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
    /// Where a background release runs when the guard is dropped.
    runtime: Option<tokio::runtime::Handle>,
    released: bool,
    /// Taken inside a lock body that holds the key already: the outer guard renews and releases.
    nested: bool,
}

impl LockGuard {
    /// Starts renewing `grant` and guards it.
    pub(crate) fn new(grant: Grant) -> Self {
        let grant = Arc::new(grant);
        grant.client.inner.shutdown.register(grant.id, &grant);
        grant.client.inner.renewer.schedule(&grant, grant.lease().renew_at);
        Self { grant, runtime: tokio::runtime::Handle::try_current().ok(), released: false, nested: false }
    }

    /// A guard for a lock the current lock body already holds: same grant, no renewal, no release.
    pub(crate) fn nested(grant: Arc<Grant>) -> Self {
        Self { grant, runtime: None, released: true, nested: true }
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

    /// This grant's owner token. Its `Display` and `Debug` are redacted; the whole token is a credential for
    /// this grant (see [`LockToken::expose_secret`]).
    pub fn token(&self) -> &LockToken {
        &self.grant.token
    }

    /// The fencing token of this grant: strictly greater than that of every earlier grant of the same key, also
    /// after the server lost its state (a restart without persistence, FLUSHALL, a failover), as long as the
    /// server's clock does not step back; below 2^53. Pass it with every write the lock protects, and have the storage reject
    /// writes carrying a token lower than the highest it has seen: that is what keeps a paused, stale holder
    /// from overwriting the new holder's work.
    ///
    /// On [Redlock](crate::ClientBuilder::redlock), which has no sound fencing token, it is always 0: below
    /// every real token, so a storage that has seen one rejects it. Use
    /// [`try_fencing_token`](LockGuard::try_fencing_token) where a missing token must be an error.
    pub fn fencing_token(&self) -> u64 {
        self.grant.fence
    }

    /// The [fencing token](LockGuard::fencing_token), or [`LockError::InvalidConfig`] when the client's store
    /// has none to give (Redlock: the maximum of independent servers' counters is not monotonic, so a token
    /// from it could let a stale holder's writes through).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// let client = distlock::Client::builder().memory().build().await?;
    /// let guard = client.lock("ledger").acquire().await?;
    /// assert_eq!(guard.try_fencing_token()?, guard.fencing_token());
    /// # Ok(()) }
    /// ```
    pub fn try_fencing_token(&self) -> Result<u64, LockError> {
        match self.grant.client.inner.backend.capabilities().fencing {
            Fencing::Monotonic => Ok(self.grant.fence),
            Fencing::None => Err(LockError::InvalidConfig(format!(
                "lock `{}`: this client's store (Redlock) gives no fencing tokens; the maximum of independent \
                 servers' counters is not monotonic. Use a single server, a cluster or Sentinel where writes \
                 must be fenced",
                self.grant.keys.name
            ))),
        }
    }

    /// Whether the lock is known lost: a renewal found it gone or taken, or the lease ran out locally without a
    /// successful renewal, or the grant is over (a guard kept from a finished lock body). Checked against the
    /// monotonic clock on every call; once true, it stays true.
    pub fn is_lost(&self) -> bool {
        self.grant.is_lost()
    }

    /// The local instant after which the lock must be treated as lost: the end of the lease as this process
    /// knows it, which [`is_lost`](LockGuard::is_lost) compares with [`Instant::now`]. It never lies past the
    /// server's expiry of the grant (it counts from before the request was sent, minus a drift allowance), and
    /// moves later with every renewal or [`extend`](LockGuard::extend). Once the lock is known lost it is no
    /// later than the moment that became known.
    ///
    /// For work that is not fenced: do not start a step that could not finish before it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// # let client = distlock::Client::builder().memory().build().await?;
    /// use std::time::Duration;
    /// use tokio::time::Instant;
    /// let guard = client.lock("job").ttl(Duration::from_secs(10)).acquire().await?;
    /// let step = Duration::from_secs(2);
    /// if Instant::now() + step < guard.deadline() {
    ///     // time enough for one more step of unfenced work
    /// }
    /// assert!(guard.deadline() <= Instant::now() + Duration::from_secs(10));
    /// # Ok(()) }
    /// ```
    pub fn deadline(&self) -> Instant {
        self.grant.deadline()
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
        self.grant.lost().await;
    }

    /// The lease left on the server, or `None` when the lock is no longer this guard's.
    pub async fn remaining_ttl(&self) -> Result<Option<Duration>, LockError> {
        self.grant.client.inner.backend.remaining(&self.grant.keys, &self.grant.token).await
    }

    /// Sets the lease to `ttl` from now; the watchdog keeps renewing with `ttl` from then on.
    /// Fails with [`LockError::Lost`] when the lock is no longer this guard's, also when the reply came back
    /// after the lease had run out. While the call is on its way, and when it fails (a timeout,
    /// [`LockError::NotReplicated`]), the server may or may not have applied it: the guard then assumes the
    /// shorter of the two leases.
    pub async fn extend(&self, ttl: Duration) -> Result<(), LockError> {
        crate::request::check_ttl(ttl)?;
        let grant = &self.grant;
        let lost = || LockError::Lost { key: grant.keys.name.clone() };
        // Declared before the ticket, so that it acts after the ticket is dropped.
        let mut unanswered = Unanswered(None);
        // One command setting the lease at a time: a renewal in flight with the old ttl comes back first.
        let serialized = !reverted(Fix::SerializedExtend);
        let ticket = if serialized { Some(grant.exclusive().await.ok_or_else(lost)?) } else { None };
        let before = grant.lease();
        if before.is_lost() {
            return Err(lost());
        }
        let sent = Instant::now();
        if serialized {
            // The server may set the new lease any moment from now on, and the reply may come late or never:
            // until it says otherwise, the lease ends no later than either outcome would end it (an extend to
            // a shorter lease lowers the deadline now, not when its reply arrives).
            let applied = Lease::granted(ttl, sent, ttl);
            grant.update_lease(|l| {
                let shorter = applied.valid_until < l.valid_until;
                if shorter {
                    l.valid_until = applied.valid_until;
                }
                shorter
            });
        }
        unanswered.0 = serialized.then_some(grant);
        let reply = grant.client.inner.backend.renew(&grant.keys, &grant.token, ttl).await;
        unanswered.0 = None;
        let outcome = match reply {
            Ok(true) if Instant::now() < before.valid_until || !serialized => {
                grant.update_lease(|l| {
                    let applies = !l.lost;
                    if applies {
                        *l = Lease::granted(ttl, sent, ttl);
                    }
                    applies
                });
                Ok(())
            }
            Ok(true) => {
                grant.mark_lost("extend came back after the lease had run out");
                Err(lost())
            }
            Ok(false) => {
                grant.mark_gone("extend found the lock gone or taken");
                Err(lost())
            }
            Err(e) if !serialized => Err(e),
            Err(e) => {
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

    /// Stops the watchdog and gives the lock back, saying whether it was still ours. A guard the server said
    /// lost sends nothing and reports `Expired`; one lost by the clock alone (its renewals failed) may still
    /// hold the lock on the server, and sends the release, which acts only on this guard's own grant. A nested
    /// guard (taken inside a lock body that already holds the key) sends nothing, leaves the outer hold in
    /// place and reports [`ReleaseOutcome::Nested`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// # let client = distlock::Client::builder().memory().build().await?;
    /// use distlock::ReleaseOutcome;
    /// let c = client.clone();
    /// client.lock("job").run(async move {
    ///     let nested = c.lock("job").acquire().await?; // the body holds "job" already
    ///     assert_eq!(nested.release().await?, ReleaseOutcome::Nested);
    ///     assert!(c.lock_info("job").await?.is_some(), "still held by the outer body");
    ///     Ok::<_, distlock::LockError>(())
    /// }).await??;
    /// assert_eq!(client.lock("job").acquire().await?.release().await?, ReleaseOutcome::Released);
    /// # Ok(()) }
    /// ```
    pub async fn release(mut self) -> Result<ReleaseOutcome, LockError> {
        if self.nested {
            return Ok(ReleaseOutcome::Nested);
        }
        // `released` is set only once the release is done: if this future is dropped on the way, the guard's
        // Drop releases in the background instead.
        let outcome = self.grant.release().await;
        self.released = true;
        outcome
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

/// The lock held by the lock body running now — the innermost [`LockRequest::run`](crate::LockRequest::run) or
/// `#[distributed_lock]` function around this call — as a nested guard: read its key and fencing token, watch
/// for its loss, extend it, see its [`deadline`](LockGuard::deadline). Dropping it leaves the hold in place,
/// and releasing it too, reporting [`ReleaseOutcome::Nested`]. `None` outside a lock body
/// (including in tasks spawned from one: they are not owners).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
/// # let client = distlock::Client::builder().memory().build().await?;
/// let token = client.lock("report:42").run(async {
///     let lock = distlock::current_lock().expect("inside a lock body");
///     assert_eq!(lock.key(), "report:42");
///     lock.fencing_token() // send this with every write the lock protects
/// }).await?;
/// assert!(token >= 1);
/// assert!(distlock::current_lock().is_none());
/// # Ok(()) }
/// ```
pub fn current_lock() -> Option<LockGuard> {
    crate::held::innermost().map(LockGuard::nested)
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let grant = Arc::clone(&self.grant);
        // The server said the token no longer holds the lock: nothing to release. A lock lost by the clock
        // alone is released all the same (by token, so never another owner's): the server may still hold it.
        if grant.lease().gone || (reverted(Fix::ReleaseLostByClock) && grant.lease().is_lost()) {
            grant.abandon();
            return;
        }
        match &self.runtime {
            Some(runtime) => {
                runtime.spawn(async move {
                    if let Err(e) = grant.release().await {
                        tracing::warn!(key = %grant.keys.name, error = %e, "distlock: background release failed; the lock frees when its lease runs out");
                    }
                });
            }
            None => {
                grant.abandon();
                tracing::warn!(key = %grant.keys.name, "distlock: guard dropped outside a tokio runtime; the lock frees when its lease runs out");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use crate::{Client, ReleaseOutcome};

    /// `deadline()` is where `is_lost()` turns true: inside the lease counted from before the request, later
    /// after an extend, and no later than the moment the loss became known.
    #[tokio::test(start_paused = true)]
    async fn deadline_is_the_instant_is_lost_uses() {
        let client = Client::builder().memory().build().await.expect("memory");
        let ttl = Duration::from_secs(10);
        let before = Instant::now();
        let guard = client.lock("k").ttl(ttl).acquire().await.expect("free");
        let deadline = guard.deadline();
        assert!(deadline <= before + ttl, "past the lease: {:?}", deadline - before);
        assert!(deadline >= before + ttl - crate::grant::drift(ttl));

        tokio::time::advance(Duration::from_secs(1)).await;
        guard.extend(Duration::from_secs(30)).await.expect("extend");
        assert!(guard.deadline() >= deadline + Duration::from_secs(20), "extend moved it later");

        assert!(client.force_unlock("k").await.expect("force_unlock"));
        guard.lost().await; // the next renewal finds the lock gone
        let noticed = Instant::now();
        assert!(guard.is_lost());
        assert!(guard.deadline() <= noticed, "a lost guard's deadline lies after the loss was known");
        assert_eq!(guard.release().await.expect("release"), ReleaseOutcome::Expired);
    }

    /// A guard lost by the clock alone: `is_lost()` turns true exactly at `deadline()`.
    #[tokio::test(start_paused = true)]
    async fn is_lost_turns_at_the_deadline() {
        let client = Client::builder().memory().build().await.expect("memory");
        let guard = client.lock("k").ttl(Duration::from_secs(3)).max_hold(Duration::from_millis(1)).acquire().await;
        let guard = guard.expect("free");
        let deadline = guard.deadline();
        tokio::time::sleep_until(deadline - Duration::from_millis(1)).await;
        assert!(!guard.is_lost(), "lost before its deadline");
        assert_eq!(guard.deadline(), deadline, "max_hold: no renewal moved it");
        tokio::time::sleep_until(deadline).await;
        assert!(guard.is_lost(), "held past its deadline");
    }
}
