//! A held lock: the public face of a grant, and release on drop.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Fencing, Store};
use crate::grant::Grant;
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
    /// The release's reply was lost, it was sent again, and by then the lock was no longer this guard's with no
    /// trace left of whether the first send had released it or the lease had run out first (a release that
    /// finds its own trace, as it nearly always does, reports `Released`). Either way the guard holds nothing.
    Unconfirmed,
    /// Nothing was sent: the guard was nested, taken inside a lock body that already held the key (a reentrant
    /// request, or [`current_lock`]). The hold belongs to the outer body, which renews it and releases it when
    /// it ends; it is still in place.
    Nested,
}

/// A held lock — of one key ([`Client::lock`](crate::Client::lock)) or of several taken together
/// ([`Client::lock_all`](crate::Client::lock_all)). Dropping it stops the watchdog and releases the lock in the
/// background; [`release`](LockGuard::release) does the same and reports what it found.
///
/// While the guard lives, the client's watchdog renews the lease every `ttl / 3`. If a renewal finds the lock taken, or
/// none succeeds before the lease would run out, the lock is *lost*: [`is_lost`](LockGuard::is_lost) turns true
/// and [`lost`](LockGuard::lost) resolves. Work that must not overlap with another holder should stop then, and
/// writes to other systems should carry the [`fencing_token`](LockGuard::fencing_token).
///
/// A guard of several keys holds one grant per key, each with its own lease and fencing token
/// ([`fencing_token_of`](LockGuard::fencing_token_of)); it is one lock all the same: renewal, [`extend`](LockGuard::extend)
/// and release cover every key, and losing any key is losing the lock.
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
    /// One per key, in the keys' sorted order; never empty once the guard is handed out.
    parts: Vec<Part>,
    /// Where a background release runs when the guard is dropped.
    runtime: Option<tokio::runtime::Handle>,
    /// The owned parts were released (or there are none): nothing for the drop to do.
    released: bool,
}

/// One key of a guard.
#[derive(Debug)]
struct Part {
    grant: Arc<Grant>,
    /// Taken inside a lock body that holds the key already: the outer guard renews and releases it.
    nested: bool,
}

impl LockGuard {
    /// A guard with no key yet, for [`push`](Self::push) and [`push_nested`](Self::push_nested) to fill in the
    /// keys' sorted order. Dropped part-way, it releases the keys pushed so far.
    pub(crate) fn assemble(keys: usize) -> Self {
        Self { parts: Vec::with_capacity(keys), runtime: tokio::runtime::Handle::try_current().ok(), released: true }
    }

    /// Adds a key just taken, and starts renewing it.
    pub(crate) fn push(&mut self, grant: Grant) {
        let grant = Arc::new(grant);
        grant.client.inner.shutdown.register(grant.id, &grant);
        grant.client.inner.renewer.schedule(&grant, grant.lease().renew_at);
        self.parts.push(Part { grant, nested: false });
        self.released = false;
    }

    /// Adds a key the running lock body holds already: no renewal, no release.
    pub(crate) fn push_nested(&mut self, grant: Arc<Grant>) {
        self.parts.push(Part { grant, nested: true });
    }

    /// Renews every owned key at the earliest of their due times, so that from then on their renewals come due
    /// together and go out in one batch.
    pub(crate) fn align_renewals(&self) {
        let mut owned = self.parts.iter().filter(|p| !p.nested).map(|p| &p.grant);
        let Some(earliest) = owned.clone().map(|g| g.lease().renew_at).min() else { return };
        if let Some(first) = owned.next() {
            let renewer = &first.client.inner.renewer;
            renewer.schedule(first, earliest);
            owned.for_each(|grant| renewer.schedule(grant, earliest));
        }
    }

    /// A guard for the locks the current lock body already holds: same grants, no renewal, no release.
    pub(crate) fn nested(grants: Vec<Arc<Grant>>) -> Self {
        let parts = grants.into_iter().map(|grant| Part { grant, nested: true }).collect();
        Self { parts, runtime: None, released: true }
    }

    /// The first key's grant (the simulation watches single-key guards through it).
    pub(crate) fn grant(&self) -> &Arc<Grant> {
        &self.first().grant
    }

    /// The grants of the keys this guard took itself (not nested ones), in the keys' order.
    pub(crate) fn owned_grants(&self) -> impl Iterator<Item = &Grant> {
        self.parts.iter().filter(|p| !p.nested).map(|p| &*p.grant)
    }

    /// Every key's grant, in the keys' order.
    pub(crate) fn grants(&self) -> Vec<Arc<Grant>> {
        self.parts.iter().map(|p| Arc::clone(&p.grant)).collect()
    }

    /// Whether every key was held already by the running lock body (so this guard renews and releases nothing).
    pub(crate) fn is_nested(&self) -> bool {
        self.parts.iter().all(|p| p.nested)
    }

    /// Whether this guard has any key yet (taken or nested).
    pub(crate) fn has_any(&self) -> bool {
        !self.parts.is_empty()
    }

    /// Whether this guard took any key itself (which its release gives back).
    pub(crate) fn owns_any(&self) -> bool {
        !self.released
    }

    /// Marks lost every key whose lease ran out by the clock alone (the renewer had not noticed yet), so that
    /// the loss is reported and counted once, as one the renewer found. Nested keys too: their loss is the
    /// outer grant's, which reports it once, whichever guard finds it first.
    pub(crate) fn mark_lost_by_clock(&self) {
        self.parts.iter().for_each(|p| p.grant.mark_lost_by_clock());
    }

    /// [`LockError::Lost`] for the first key known lost, if any.
    pub(crate) fn loss(&self) -> Option<LockError> {
        self.parts.iter().find(|p| p.grant.is_lost()).map(|p| p.grant.lost_error())
    }

    fn first(&self) -> &Part {
        // Never empty: a request has at least one key, and each key adds a part before the guard is handed out.
        &self.parts[0]
    }

    /// The lock's key, as requested. For a guard of several keys, the first of [`keys`](LockGuard::keys) (in
    /// sorted order).
    pub fn key(&self) -> &str {
        &self.first().grant.keys.name
    }

    /// Every key this guard holds: sorted, each once (the order in which they were taken). One key for a guard
    /// from [`Client::lock`](crate::Client::lock).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// # let client = distlock::Client::builder().memory().build().await?;
    /// let guard = client.lock_all(["account:9", "account:1", "account:9"]).acquire().await?;
    /// assert_eq!(guard.keys().collect::<Vec<_>>(), ["account:1", "account:9"]);
    /// assert_eq!(guard.key(), "account:1");
    /// # Ok(()) }
    /// ```
    pub fn keys(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        self.parts.iter().map(|p| p.grant.keys.name.as_str())
    }

    /// This grant's owner token (the first key's, for a guard of several keys, whose every key has a token of
    /// its own). Its `Display` and `Debug` are redacted; the whole token is a credential for this grant (see
    /// [`LockToken::expose_secret`]).
    pub fn token(&self) -> &LockToken {
        &self.first().grant.token
    }

    /// The fencing token of this grant: strictly greater than that of every earlier grant of the same key, also
    /// after the server lost its state (a restart without persistence, FLUSHALL, a failover), as long as the
    /// server's clock does not step back; below 2^53. Pass it with every write the lock protects, and have the storage reject
    /// writes carrying a token lower than the highest it has seen: that is what keeps a paused, stale holder
    /// from overwriting the new holder's work.
    ///
    /// For a guard of several keys, the first key's: fencing tokens are per key, so fence each write with the
    /// token of the key it is about ([`fencing_token_of`](LockGuard::fencing_token_of)).
    ///
    /// On [Redlock](crate::ClientBuilder::redlock), which has no sound fencing token, it is always 0: below
    /// every real token, so a storage that has seen one rejects it. Use
    /// [`try_fencing_token`](LockGuard::try_fencing_token) where a missing token must be an error.
    pub fn fencing_token(&self) -> u64 {
        self.first().grant.fence
    }

    /// The fencing token of `key`'s grant in this guard, or `None` if the guard does not hold `key`: what to
    /// send with a write about `key` (see [`fencing_token`](LockGuard::fencing_token); 0 on Redlock).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// # let client = distlock::Client::builder().memory().build().await?;
    /// let guard = client.lock_all(["account:1", "account:2"]).acquire().await?;
    /// let from = guard.fencing_token_of("account:1").expect("held");
    /// let to = guard.fencing_token_of("account:2").expect("held");
    /// assert!(from > 0 && to > 0);
    /// assert_eq!(client.lock_info("account:2").await?.expect("held").fencing_token, to);
    /// assert_eq!(guard.fencing_token_of("account:3"), None);
    /// # Ok(()) }
    /// ```
    pub fn fencing_token_of(&self, key: &str) -> Option<u64> {
        self.parts.iter().find(|p| p.grant.keys.name == key).map(|p| p.grant.fence)
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
        let grant = &self.first().grant;
        match grant.client.inner.backend.capabilities().fencing {
            Fencing::Monotonic => Ok(grant.fence),
            Fencing::None => Err(LockError::InvalidConfig(format!(
                "lock `{}`: this client's store (Redlock) gives no fencing tokens; the maximum of independent \
                 servers' counters is not monotonic. Use a single server, a cluster or Sentinel where writes \
                 must be fenced",
                grant.keys.name
            ))),
        }
    }

    /// Whether the lock is known lost: a renewal found it gone or taken, or the lease ran out locally without a
    /// successful renewal, or the grant is over (a guard kept from a finished lock body). Checked against the
    /// monotonic clock on every call; once true, it stays true. A guard of several keys is lost as soon as any
    /// of its keys is.
    pub fn is_lost(&self) -> bool {
        self.parts.iter().any(|p| p.grant.is_lost())
    }

    /// The local instant after which the lock must be treated as lost: the end of the lease as this process
    /// knows it, which [`is_lost`](LockGuard::is_lost) compares with [`Instant::now`]. It never lies past the
    /// server's expiry of the grant (it counts from before the request was sent, minus a drift allowance), and
    /// moves later with every renewal or [`extend`](LockGuard::extend). Once the lock is known lost it is no
    /// later than the moment that became known. For a guard of several keys, the earliest of its keys'.
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
        self.parts.iter().map(|p| p.grant.deadline()).min().unwrap_or_else(Instant::now)
    }

    /// Resolves when the lock is known lost (see [`is_lost`](LockGuard::is_lost): any of its keys); pending
    /// while it is held.
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
        if let [part] = self.parts.as_slice() {
            return part.grant.lost().await;
        }
        futures_util::future::select_all(self.parts.iter().map(|p| Box::pin(p.grant.lost()))).await;
    }

    /// The lease left on the server (for a guard of several keys, the shortest of its keys'), or `None` when
    /// the lock (any of its keys) is no longer this guard's.
    pub async fn remaining_ttl(&self) -> Result<Option<Duration>, LockError> {
        let mut shortest: Option<Duration> = None;
        for part in &self.parts {
            let grant = &part.grant;
            match grant.client.inner.backend.remaining(&grant.keys, &grant.token).await? {
                Some(left) => shortest = Some(shortest.map_or(left, |s| s.min(left))),
                None => return Ok(None),
            }
        }
        Ok(shortest)
    }

    /// Sets the lease to `ttl` from now; the watchdog keeps renewing with `ttl` from then on.
    /// Fails with [`LockError::Lost`] when the lock is no longer this guard's, also when the reply came back
    /// after the lease had run out. While the call is on its way, and when it fails (a timeout,
    /// [`LockError::NotReplicated`]), the server may or may not have applied it: the guard then assumes the
    /// shorter of the two leases. A guard of several keys extends every key at once, and reports the first
    /// failure in key order.
    pub async fn extend(&self, ttl: Duration) -> Result<(), LockError> {
        crate::request::check_ttl(ttl)?;
        let extended = futures_util::future::join_all(self.parts.iter().map(|p| p.grant.extend(ttl))).await;
        extended.into_iter().find(Result::is_err).unwrap_or(Ok(()))
    }

    /// Stops the watchdog and gives the lock back, saying whether it was still ours. A guard the server said
    /// lost sends nothing and reports `Expired`; one lost by the clock alone (its renewals failed) may still
    /// hold the lock on the server, and sends the release, which acts only on this guard's own grant. A nested
    /// guard (taken inside a lock body that already holds the key) sends nothing, leaves the outer hold in
    /// place and reports [`ReleaseOutcome::Nested`].
    ///
    /// A guard of several keys releases every key at once and reports `Released` if every key was still its own,
    /// else the first other outcome (or error) in key order. Keys it found held already by the running lock
    /// body are left to that body.
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
        if self.is_nested() {
            return Ok(ReleaseOutcome::Nested);
        }
        // `released` is set only once the release is done: if this future is dropped on the way, the guard's
        // Drop releases in the background instead (a grant released already just reports `Expired` again).
        let outcome = match self.parts.as_slice() {
            [one] => one.grant.release().await,
            parts => release_all(parts.iter().filter(|p| !p.nested).map(|p| &p.grant)).await,
        };
        self.released = true;
        outcome
    }
}

/// Releases the grants all at once (one batch where the store batches): `Released` when every one was, else
/// the first other outcome, or the first error.
async fn release_all(grants: impl Iterator<Item = &Arc<Grant>>) -> Result<ReleaseOutcome, LockError> {
    let outcomes = futures_util::future::join_all(grants.map(|grant| grant.release())).await;
    outcomes.into_iter().find(|o| !matches!(o, Ok(ReleaseOutcome::Released))).unwrap_or(Ok(ReleaseOutcome::Released))
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
///
/// In the body of a lock of several keys ([`Client::lock_all`](crate::Client::lock_all), or the attribute's
/// `keys`), it holds them all: see [`keys`](LockGuard::keys) and [`fencing_token_of`](LockGuard::fencing_token_of).
pub fn current_lock() -> Option<LockGuard> {
    crate::held::innermost().map(LockGuard::nested)
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let mut grants: Vec<Arc<Grant>> = Vec::with_capacity(self.parts.len());
        for part in self.parts.iter().filter(|p| !p.nested) {
            let grant = &part.grant;
            // The server said the token no longer holds the lock: nothing to release. A lock lost by the clock
            // alone is released all the same (by token, so never another owner's): the server may still hold it.
            if grant.lease().gone {
                grant.abandon();
            } else if self.runtime.is_some() {
                grants.push(Arc::clone(grant));
            } else {
                grant.abandon();
                tracing::warn!(key = %grant.keys.name, "distlock: guard dropped outside a tokio runtime; the lock frees when its lease runs out");
            }
        }
        if let (Some(runtime), false) = (&self.runtime, grants.is_empty()) {
            crate::hooks::spawn_on(runtime, async move {
                let outcomes = futures_util::future::join_all(grants.iter().map(|grant| grant.release())).await;
                for (grant, outcome) in grants.iter().zip(outcomes) {
                    if let Err(e) = outcome {
                        tracing::warn!(key = %grant.keys.name, error = %e, "distlock: background release failed; the lock frees when its lease runs out");
                    }
                }
            });
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
        assert!(deadline >= before + ttl - crate::lease::drift(ttl));

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
