//! Where locks live: one Redis server (or cluster, or sentinel-watched primary), a Redlock quorum of
//! independent servers, a PostgreSQL database (feature `postgres`), or this process's memory, each behind the [`Store`] trait, with the
//! types the engine and the stores share.

mod listing;
mod memory;
#[cfg(feature = "postgres")]
mod postgres;
mod redis;
mod redlock;
mod store;

use std::sync::Arc;
use std::time::Duration;

pub(crate) use self::listing::{glob_matches, name_of_record, record_pattern, Place, Scan};
pub(crate) use self::memory::MemoryBackend;
#[cfg(feature = "postgres")]
pub(crate) use self::postgres::{describe_postgres_url, PostgresBackend, PostgresSettings, DEFAULT_SCHEMA};
#[cfg(feature = "simulation")]
pub(crate) use self::redis::batch_arity;
#[cfg(feature = "simulation")]
pub(crate) use self::redis::script_name;
#[cfg(feature = "simulation")]
pub(crate) use self::redis::script_sources;
pub(crate) use self::redis::{ConnectSettings, RedisBackend, ReplicaAcks, Timeouts};
pub(crate) use self::redlock::RedlockBackend;
pub(crate) use self::store::{probe_lock_cycle, Capabilities, Fencing, Store, WakeUps, PROBE_CLIENT};
use crate::observe::timed;
use crate::{LockError, LockInfo, LockToken, ReleaseOutcome};

/// The names one lock uses in the backend. All share the hash tag `{<escaped key>}`, so in a cluster they sit
/// in one slot; the user's key is escaped so that it cannot end the tag early or reach another lock's names.
#[derive(Debug, Clone, Default)]
pub(crate) struct LockKeys {
    /// The key as the user wrote it: the lock's identity in messages and for reentrancy.
    pub(crate) name: String,
    /// `<prefix>{<key>}`: the lock record.
    pub(crate) record: String,
}

impl LockKeys {
    pub(crate) fn new(prefix: &str, name: String) -> Self {
        let mut record = String::with_capacity(prefix.len() + name.len() + 2);
        record.push_str(prefix);
        record.push('{');
        escape_into(&mut record, &name);
        record.push('}');
        Self { name, record }
    }

    /// The startup check's lock (`ClientBuilder::build` takes and gives back one to check the server), outside
    /// every lock's key space: `<prefix>startup-check{<token>}`, where a lock's record is `<prefix>{<key>}`, so no
    /// key a program locks can name it, and no listing shows it. Its own hash tag keeps its keys in one slot.
    pub(crate) fn startup_check(prefix: &str, token: &str) -> Self {
        Self { name: STARTUP_CHECK.to_owned(), record: format!("{prefix}startup-check{{{token}}}") }
    }

    /// `<prefix>{<key>}:released`: the pub/sub channel hand-overs are announced on (the scripts append the
    /// same suffix to KEYS[1]).
    pub(crate) fn channel(&self) -> String {
        format!("{}{CHANNEL}", self.record)
    }
}

/// The startup check's name in messages, where a lock's key would be.
pub(crate) const STARTUP_CHECK: &str = "the startup check";

/// How long the in-process store keeps a lock's last fencing token after its grant's lease: the next token is
/// `max(last + 1, the clock in µs)`, so past this the clock alone keeps tokens rising, and no state of a
/// released lock outlives it. (Redis keeps it in the freed record, for the rest of the lease: fence.lua.)
pub(crate) const FENCE_RETENTION: Duration = Duration::from_secs(60);

/// The suffix of the lock's channel, the one derived name the client uses itself. The Redis scripts name it
/// and the wait queue's keys after the record on their own (a unit test checks they agree).
pub(crate) const CHANNEL: &str = ":released";

/// Published on a lock's channel instead of a hand-over (`<heir>:<fence>:<lease ms>`) when the lock was freed
/// for everyone (a forced unlock): every waiter tries again at once. No token starts with it.
pub(crate) const WAKE_ALL: &str = "*";

/// Percent-encodes `%`, `{` and `}`: the escaped text holds no brace, so it cannot close the hash tag, and the
/// encoding is injective, so two keys never share a record.
fn escape_into(out: &mut String, key: &str) {
    for c in key.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
}

/// A lock this token holds, as the server reported it: its fencing token, and the lease the server had left
/// when it answered (never more than it had when the request was sent, so the lease counts from the send).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hold {
    pub(crate) fence: u64,
    pub(crate) lease: Duration,
}

/// What one acquire attempt found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// The lock is this token's: granted now, or a hand-over to this token claimed (and stretched to `ttl`).
    Granted(Hold),
    /// Another grant holds it: that grant's fencing token, and about how much longer (`None`: unknown).
    Busy { fence: u64, remaining: Option<Duration> },
}

/// One lock to renew.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Renewal<'a> {
    pub(crate) keys: &'a LockKeys,
    pub(crate) token: &'a LockToken,
    pub(crate) ttl: Duration,
}

/// A waiter's place in the queue, sent with each attempt while waiting.
///
/// A place is alive while both its own registration (`keep`, long: refreshed seldom) and its client's mark
/// for the lock (`register`, short) last. One waiter of each client refreshes that mark for all the client's
/// waiters of the lock (acquire.rs's `Line`), so waiters cost the store next to nothing while they wait, and
/// a client that dies leaves the queue, every waiter of it, within `register`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Queueing {
    /// How long the client's mark for the lock lasts unless refreshed (by this attempt, or another waiter of
    /// the same client): a client that dies leaves the queue after this.
    pub(crate) register: Duration,
    /// How long this waiter's own registration lasts unless refreshed: at least `register`.
    pub(crate) keep: Duration,
    /// The client's id (random): its waiters' places name it, and its mark is kept per lock.
    pub(crate) client: u64,
    /// The lease a hand-over grants, until the new holder's first renewal: short, so a waiter that died
    /// just before its turn holds the lock only briefly.
    pub(crate) lease: Duration,
    /// This attempt's number within its request: a hand-over that uses this registration announces it, and
    /// the waiter dates the hand-over from this attempt's send only when it is its latest (fencing tokens
    /// cannot prove that: they go back with the server's clock).
    pub(crate) attempt: u64,
}

/// What a waiter hears about the lock it waits for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) enum Announcement {
    /// Nothing yet.
    #[default]
    Nothing,
    /// Announcements may have been missed (a reconnect): try again now.
    Retry,
    /// The lock was handed to the waiter whose token is `heir`, as a new grant.
    HandedOver { heir: Arc<str>, hand_over: HandOver },
}

/// A hand-over to this waiter, as announced: the grant, and the number of the waiter's attempt whose
/// registration it used ([`Queueing::attempt`]), so it happened after that attempt reached the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HandOver {
    pub(crate) hold: Hold,
    pub(crate) attempt: u64,
}

impl Announcement {
    /// A hand-over to `token`, if this announces one: the grant's fencing token and the lease it was given
    /// (counted from the hand-over, a moment the announcement does not tell), and the attempt it answers.
    pub(crate) fn handed_to(&self, token: &LockToken) -> Option<HandOver> {
        match self {
            Self::HandedOver { heir, hand_over } if **heir == *token.as_str() => Some(*hand_over),
            _ => None,
        }
    }

    /// The announcement of a hand-over to `heir`, which used the registration of its attempt `attempt`.
    pub(crate) fn hand_over(heir: &str, hold: Hold, attempt: u64) -> Self {
        Self::HandedOver { heir: heir.into(), hand_over: HandOver { hold, attempt } }
    }
}

/// The store a client talks to. An enum over the [`Store`]s rather than a trait object: async trait methods
/// called through it need no allocation per call.
// One per client, behind its Arc: the size difference between the variants costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum Backend {
    Redis(RedisBackend),
    Redlock(RedlockBackend),
    Memory(MemoryBackend),
    #[cfg(feature = "postgres")]
    Postgres(PostgresBackend),
    /// The memory store's semantics behind a seeded fault layer, in simulated time (tests only).
    #[cfg(feature = "simulation")]
    Simulated(crate::simulation::SimStore),
}

/// Announcements of releases of one lock: the counter moves on every release seen, and also whenever
/// announcements may have been missed (a reconnect). Dropping it ends this waiter's interest.
pub(crate) struct ReleaseWatch {
    rx: tokio::sync::watch::Receiver<Announcement>,
    on_drop: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl ReleaseWatch {
    pub(crate) fn new(
        rx: tokio::sync::watch::Receiver<Announcement>,
        on_drop: impl FnOnce() + Send + Sync + 'static,
    ) -> Self {
        Self { rx, on_drop: Some(Box::new(on_drop)) }
    }

    /// Waits for an announcement not yet seen (forever, if the announcer is gone).
    pub(crate) async fn next(&mut self) -> Announcement {
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
        self.rx.borrow_and_update().clone()
    }
}

impl Drop for ReleaseWatch {
    fn drop(&mut self) {
        if let Some(on_drop) = self.on_drop.take() {
            on_drop();
        }
    }
}

impl std::fmt::Debug for ReleaseWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReleaseWatch").finish_non_exhaustive()
    }
}

/// Calls the same [`Store`] method on whichever store this is: enum dispatch, so no call allocates.
macro_rules! dispatch {
    ($self:ident, $b:ident => $call:expr) => {
        match $self {
            Backend::Redis($b) => $call,
            Backend::Redlock($b) => $call,
            Backend::Memory($b) => $call,
            #[cfg(feature = "postgres")]
            Backend::Postgres($b) => $call,
            #[cfg(feature = "simulation")]
            Backend::Simulated($b) => $call,
        }
    };
}

/// Where a scan stands, on whichever store this is (the in-process stores need none).
#[derive(Debug, Default)]
pub(crate) enum BackendCursor {
    #[default]
    Start,
    Redis(<RedisBackend as Store>::Cursor),
    Redlock(<RedlockBackend as Store>::Cursor),
    #[cfg(feature = "postgres")]
    Postgres(<PostgresBackend as Store>::Cursor),
}

/// One scan step on `store`, with its own cursor taken out of the client's (`open`; a fresh one when that is
/// another store's) and put back (`close`).
async fn scan_on<S: Store>(
    store: &S,
    scan: &mut Scan<BackendCursor>,
    open: impl FnOnce(BackendCursor) -> Option<S::Cursor>,
    close: impl FnOnce(S::Cursor) -> BackendCursor,
    pattern: &str,
    count: usize,
) -> Result<Vec<String>, LockError> {
    let mut on = std::mem::take(scan).map(|cursor| open(cursor).unwrap_or_default());
    let found = store.scan(&mut on, pattern, count).await;
    *scan = on.map(close);
    found
}

/// Every call but `capabilities` is timed by operation (feature `metrics`; nothing without it).
impl Store for Backend {
    type Cursor = BackendCursor;

    fn capabilities(&self) -> Capabilities {
        dispatch!(self, b => b.capabilities())
    }

    async fn acquire(
        &self,
        keys: &LockKeys,
        token: &LockToken,
        ttl: Duration,
        metadata: &str,
        queueing: Option<Queueing>,
    ) -> Result<Attempt, LockError> {
        timed!("acquire", dispatch!(self, b => b.acquire(keys, token, ttl, metadata, queueing).await))
    }

    async fn acquire_free(
        &self,
        locks: &[(&LockKeys, &LockToken)],
        ttl: Duration,
        metadata: &str,
    ) -> Result<Option<Vec<Hold>>, LockError> {
        dispatch!(self, b => b.acquire_free(locks, ttl, metadata).await)
    }

    async fn withdraw(&self, keys: &LockKeys, token: &LockToken) -> Result<Option<Hold>, LockError> {
        timed!("withdraw", dispatch!(self, b => b.withdraw(keys, token).await))
    }

    async fn renew(&self, keys: &LockKeys, token: &LockToken, ttl: Duration) -> Result<bool, LockError> {
        timed!("renew", dispatch!(self, b => b.renew(keys, token, ttl).await))
    }

    fn renewal_shard(&self, keys: &LockKeys) -> u64 {
        dispatch!(self, b => b.renewal_shard(keys))
    }

    async fn renew_many(&self, items: &[Renewal<'_>]) -> Result<Vec<Result<bool, LockError>>, LockError> {
        timed!("renew_many", dispatch!(self, b => b.renew_many(items).await))
    }

    async fn release(
        &self,
        keys: &LockKeys,
        token: &LockToken,
        fence: Option<u64>,
        keep: Option<Duration>,
    ) -> Result<ReleaseOutcome, LockError> {
        timed!("release", dispatch!(self, b => b.release(keys, token, fence, keep).await))
    }

    async fn remaining(&self, keys: &LockKeys, token: &LockToken) -> Result<Option<Duration>, LockError> {
        timed!("remaining", dispatch!(self, b => b.remaining(keys, token).await))
    }

    async fn info(&self, keys: &LockKeys) -> Result<Option<LockInfo>, LockError> {
        timed!("info", dispatch!(self, b => b.info(keys).await))
    }

    async fn force_unlock(&self, keys: &LockKeys) -> Result<bool, LockError> {
        timed!("force_unlock", dispatch!(self, b => b.force_unlock(keys).await))
    }

    async fn scan(
        &self,
        scan: &mut Scan<BackendCursor>,
        pattern: &str,
        count: usize,
    ) -> Result<Vec<String>, LockError> {
        match self {
            Backend::Redis(b) => {
                let open = |c| if let BackendCursor::Redis(c) = c { Some(c) } else { None };
                scan_on(b, scan, open, BackendCursor::Redis, pattern, count).await
            }
            Backend::Redlock(b) => {
                let open = |c| if let BackendCursor::Redlock(c) = c { Some(c) } else { None };
                scan_on(b, scan, open, BackendCursor::Redlock, pattern, count).await
            }
            Backend::Memory(b) => scan_on(b, scan, |_| None, |()| BackendCursor::Start, pattern, count).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(b) => {
                let open = |c| if let BackendCursor::Postgres(c) = c { Some(c) } else { None };
                scan_on(b, scan, open, BackendCursor::Postgres, pattern, count).await
            }
            #[cfg(feature = "simulation")]
            Backend::Simulated(b) => scan_on(b, scan, |_| None, |()| BackendCursor::Start, pattern, count).await,
        }
    }

    async fn waiters(&self, keys: &LockKeys, limit: usize) -> Result<Vec<Place>, LockError> {
        dispatch!(self, b => b.waiters(keys, limit).await)
    }

    async fn watch_releases(&self, keys: &LockKeys, token: &LockToken) -> Result<ReleaseWatch, LockError> {
        timed!("watch_releases", dispatch!(self, b => b.watch_releases(keys, token).await))
    }
}

#[cfg(test)]
mod tests {
    use super::LockKeys;

    #[test]
    fn keys_share_one_hash_tag_and_cannot_collide() {
        let k = LockKeys::new("distlock:", "report:42".into());
        assert_eq!(k.record, "distlock:{report:42}");
        assert_eq!(k.channel(), "distlock:{report:42}:released");
        // A key that tries to close the tag early, or to name another lock's queue, is escaped.
        let evil = LockKeys::new("distlock:", "a}:queue".into());
        assert_eq!(evil.record, "distlock:{a%7D:queue}");
        assert_ne!(evil.record, format!("{}:queue", LockKeys::new("distlock:", "a".into()).record));
        assert_ne!(LockKeys::new("p:", "%7B".into()).record, LockKeys::new("p:", "{".into()).record);
    }
}
