//! The seam every lock store plugs into: what a store does ([`Store`]) and what it guarantees
//! ([`Capabilities`]). The engine (acquire, renewal, release) is written once against it; a new store brings
//! its own commands and never copies lock logic.
//!
//! # Adding a store
//!
//! 1. A module under `backend/` with a type implementing [`Store`]: each method one atomic step in the store
//!    (one statement or script, one round trip), acting only with the grant's own token, and answering with
//!    what the engine needs to date the lease (`Hold::lease`: what the store set, by its own clock). Its
//!    `Cursor` is its own ([`Store::Cursor`]); nothing of it goes into the shared types.
//! 2. [`Capabilities`] that say what it guarantees (a fair queue, wake-ups, fencing, replica acks): the engine
//!    reads them and refuses what a store cannot keep. Do not fake one.
//! 3. Its failures as [`BackendError`](crate::BackendError)s of the right
//!    [`BackendErrorKind`](crate::BackendErrorKind) (`Unreachable` and `Timeout` are retried within a wait),
//!    with the server's name, password redacted, and what to do; its own client's error as the source.
//! 4. A variant of `Backend` (and of `BackendCursor` if its cursor is not `()`), a `ClientBuilder` method,
//!    and a fixture in `tests/src/fixture.rs` that starts a real server of its own (never a shared one).
//! 5. The suites every store must pass: each `all_backends!` / `all_backends_and_redlock!` scenario file in
//!    `tests/tests/` (behaviour, holders, lifecycle, listing, multi_key, nested_lost, observability, queue
//!    where it queues, schedules, shutdown, http_answers), run on it by adding its module to those macros
//!    (`tests/src/lib.rs`); the fault tests (server paused, killed and restarted, connections reset, replies
//!    dropped after the write); the CLI's; and a column in the README's table of guarantees, each cell backed
//!    by one of those tests.
//! 6. No change to `acquire.rs`, `grant.rs`, `lease.rs`, `guard.rs` or `renewer.rs`: if the store needs one,
//!    the seam is missing something every store shares; fix the seam, for all of them.

use std::time::Duration;

use super::{Attempt, Hold, LockKeys, Place, Queueing, ReleaseWatch, Renewal, Scan};
use crate::{LockError, LockInfo, LockToken, ReleaseOutcome};

/// What a store guarantees. The engine reads this instead of asking which store it talks to, and a guarantee a
/// store cannot keep is stated here, never faked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Capabilities {
    /// Waiters queue in arrival order and a release hands the lock straight to the longest live waiter.
    /// Without it, waiters retry on their own and nobody is first in line.
    pub(crate) fair_queue: bool,
    /// How a waiter hears that the lock may be free.
    pub(crate) wake_ups: WakeUps,
    /// What fencing tokens promise.
    pub(crate) fencing: Fencing,
    /// Grants, renewals and extends count only once replicas acknowledged them; a hand-over, written by the
    /// releaser's call, must then be claimed by the heir's own attempt, whose write is acknowledged.
    pub(crate) replica_acks: bool,
}

/// How waiters are woken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WakeUps {
    /// A hand-over is announced to its heir ([`ReleaseWatch`]); a possibly missed one says `Retry`.
    Exact,
    /// Nothing is announced: waiters retry on their retry strategy's schedule.
    None,
}

/// What fencing tokens promise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fencing {
    /// Strictly rising per key, also across the store's loss of state (its clock keeps them rising).
    Monotonic,
    /// No sound token: grants carry 0 (Redlock, where the maximum of per-server counters is not monotonic).
    None,
}

/// A lock store. Every call is about one lock (`keys`), acts only with the grant's own token, and is atomic
/// in the store (one script on Redis, one critical section in memory).
pub(crate) trait Store {
    /// Where a [`scan`](Self::scan) of this store stands (which server, which position on it); a scan starts
    /// from the default.
    type Cursor: Default + Send + std::fmt::Debug;

    fn capabilities(&self) -> Capabilities;

    /// One attempt; while waiting, `queueing` keeps this token's place in the queue (only with a fair queue).
    /// A hand-over made to `token` is claimed by it and stretched to `ttl`. A grant's record names the store's
    /// owner (its client's), `metadata` and the grant's time by the store's clock; a waiter leaves its owner
    /// and metadata with its place, for the record of a hand-over to it.
    async fn acquire(
        &self,
        keys: &LockKeys,
        token: &LockToken,
        ttl: Duration,
        metadata: &str,
        queueing: Option<Queueing>,
    ) -> Result<Attempt, LockError>;

    /// Grants every lock of `locks` (each its names and token) for `ttl` in one atomic step if all of them are
    /// free with nobody queued; `None`, having changed nothing, when any is not, or when this store cannot take
    /// them in one step (the default; a cluster with keys in different slots). The engine then takes the keys
    /// one by one with [`acquire`](Store::acquire). Each grant is exactly what `acquire` would have made.
    async fn acquire_free(
        &self,
        locks: &[(&LockKeys, &LockToken)],
        ttl: Duration,
        metadata: &str,
    ) -> Result<Option<Vec<Hold>>, LockError> {
        let _ = (locks, ttl, metadata);
        Ok(None)
    }

    /// Leaves the queue; `Some` if the lock was handed to `token` meanwhile (it is then held).
    async fn withdraw(&self, keys: &LockKeys, token: &LockToken) -> Result<Option<Hold>, LockError>;

    /// Sets the lease to `ttl` from now if `token` still owns the lock; false when it does not.
    async fn renew(&self, keys: &LockKeys, token: &LockToken, ttl: Duration) -> Result<bool, LockError>;

    /// Which independently failing part of the store serves `keys` (a cluster's node): the renewer sends each
    /// part's due renewals in a [`renew_many`](Store::renew_many) of their own and applies each one's outcomes
    /// when it is answered, so one part that hangs delays no other part's locks. One part (0) by default.
    fn renewal_shard(&self, keys: &LockKeys) -> u64 {
        let _ = keys;
        0
    }

    /// Renews many locks at once (one round trip where the store can); one outcome per item, in order.
    async fn renew_many(&self, items: &[Renewal<'_>]) -> Result<Vec<Result<bool, LockError>>, LockError> {
        let mut outcomes = Vec::with_capacity(items.len());
        for item in items {
            outcomes.push(self.renew(item.keys, item.token, item.ttl).await);
        }
        Ok(outcomes)
    }

    /// Gives the lock back if `token` owns it; with `keep`, leaves it held (by nobody) that much longer. `fence`
    /// is the grant's fencing token where known: a store that recognises its own earlier release of a grant (a
    /// release sent again) tells two grants of one token apart by it.
    async fn release(
        &self,
        keys: &LockKeys,
        token: &LockToken,
        fence: Option<u64>,
        keep: Option<Duration>,
    ) -> Result<ReleaseOutcome, LockError>;

    /// The lease left, if `token` still owns the lock.
    async fn remaining(&self, keys: &LockKeys, token: &LockToken) -> Result<Option<Duration>, LockError>;

    /// Who holds the lock, if anyone.
    async fn info(&self, keys: &LockKeys) -> Result<Option<LockInfo>, LockError>;

    /// Deletes the lock whoever holds it, and its wait queue, and wakes every waiter to try again (no hand-over:
    /// the queue head may have died); true if there was a lock.
    async fn force_unlock(&self, keys: &LockKeys) -> Result<bool, LockError>;

    /// One step of a scan for lock records whose keys match `pattern` (a glob built by
    /// [`record_pattern`](super::listing::record_pattern)), asking for about `count` keys: the record keys found
    /// (maybe none, maybe some twice, as SCAN gives them) and `scan` moved on; `scan.done` once every server
    /// was scanned. Reads keys only, never the records.
    async fn scan(&self, scan: &mut Scan<Self::Cursor>, pattern: &str, count: usize) -> Result<Vec<String>, LockError>;

    /// The live waiters queued for the lock, in arrival order, at most `limit` places looked at; never their
    /// tokens. Empty on a store without a queue.
    async fn waiters(&self, keys: &LockKeys, limit: usize) -> Result<Vec<Place>, LockError>;

    /// Starts listening, as the waiter with `token`, for hand-overs of the lock; resolves once announcements
    /// can no longer be missed. Only called when the store's wake-ups are [`WakeUps::Exact`].
    async fn watch_releases(&self, keys: &LockKeys, token: &LockToken) -> Result<ReleaseWatch, LockError>;
}

/// The startup check every server store runs at `build()`: each call a lock's life uses, once — listen, take,
/// queue a second owner, release (handing over, which announces), withdraw — on a lock of its own outside every
/// lock's key space, so a missing right or a wrong address fails now, not at the first lock. Another process
/// probing at the same moment only makes it a no-op. Returns the probe's names, for the store to delete what
/// the cycle leaves behind (the freed lock's last fencing token).
/// The client id the startup probe's waiter names (its mark is one of the keys the probe leaves).
pub(crate) const PROBE_CLIENT: u64 = 1;

pub(crate) async fn probe_lock_cycle<S: Store>(store: &S, prefix: &str) -> Result<LockKeys, LockError> {
    let keys = LockKeys::startup_check(prefix, LockToken::random().as_str());
    let (holder, waiter) = (LockToken::random(), LockToken::random());
    let lease = Duration::from_secs(5);
    let queueing = Queueing { register: lease, keep: lease, client: PROBE_CLIENT, lease, attempt: 1 };
    let _listening = store.watch_releases(&keys, &waiter).await?;
    if let Attempt::Granted(_) = store.acquire(&keys, &holder, lease, "startup probe", None).await? {
        store.acquire(&keys, &waiter, lease, "startup probe", Some(queueing)).await?;
        store.release(&keys, &holder, None, None).await?;
        if store.withdraw(&keys, &waiter).await?.is_some() {
            store.release(&keys, &waiter, None, None).await?;
        }
    }
    Ok(keys)
}
