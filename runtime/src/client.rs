//! The client: one backend connection shared by every lock request, the global instance and scoped overrides.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use once_cell::sync::OnceCell;

use crate::backend::{Backend, LockKeys, Store};
pub use crate::builder::ClientBuilder;
use crate::renewer::Renewer;
use crate::shutdown::Shutdown;
use crate::{LockError, LockRequest};

/// A handle to a lock store (one Redis server, or this process's memory). Cheap to clone; clones share one
/// connection and are the same owner for reentrancy.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
/// // `.redis("redis://127.0.0.1:6379/")` for a real server.
/// let client = distlock::Client::builder().memory().key_prefix("myapp:").build().await?;
/// let guard = client.lock("report:42").acquire().await?;
/// assert_eq!(client.record_key("report:42"), "myapp:{report:42}");
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<ClientInner>,
}

pub(crate) struct ClientInner {
    pub(crate) backend: Backend,
    pub(crate) prefix: String,
    /// [`ClientBuilder::owner`], for the grant and release events.
    pub(crate) owner: Arc<str>,
    pub(crate) renewer: Renewer,
    pub(crate) shutdown: Shutdown,
    /// Its waiters of each lock, in line (acquire.rs).
    pub(crate) lines: crate::acquire::Lines,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("backend", &self.inner.backend).field("key_prefix", &self.inner.prefix).finish()
    }
}

/// What a lock record says, as anyone can read it with [`Client::lock_info`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The holder's client, as named by [`ClientBuilder::owner`] (by default `<hostname>:<pid>`).
    pub owner: String,
    /// The text the holder attached with [`LockRequest::metadata`].
    pub metadata: String,
    /// The holder's fencing token.
    pub fencing_token: u64,
    /// How long the lock has been held: since its grant, by the store's clock (the Redis server's), whatever
    /// renewals or extensions happened since. A lock handed to a waiter on release is a new grant.
    pub held_for: Duration,
    /// How much of the holder's lease is left.
    pub remaining_ttl: Duration,
    /// How many requests are queued for the lock (on Redis, including places of waiters that stopped
    /// refreshing and will be skipped).
    pub waiting: usize,
    /// Whether the holder has released the lock and [`LockRequest::min_hold`] keeps it held by nobody until
    /// `remaining_ttl` runs out (the work is done; nothing renews it). `false` while the holder has it.
    pub kept_by_min_hold: bool,
}

impl Client {
    /// Starts configuring a client.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// let client = distlock::Client::builder().memory().build().await?;
    /// # drop(client); Ok(()) }
    /// ```
    pub fn builder() -> ClientBuilder {
        ClientBuilder::default()
    }

    /// A request for the lock named `key`. The name is the lock's identity: every client with the same store and
    /// key prefix that asks for this name competes for the same lock.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// # let client = distlock::Client::builder().memory().build().await?;
    /// use std::time::Duration;
    /// let guard = client.lock("report:42").ttl(Duration::from_secs(60)).wait(Duration::from_secs(5)).acquire().await?;
    /// # drop(guard); Ok(()) }
    /// ```
    pub fn lock(&self, key: impl Into<String>) -> LockRequest {
        LockRequest::new(self.clone(), vec![key.into()])
    }

    /// A request for the locks named `keys`, all together: one guard holds every key, or the request fails and
    /// holds none. The request has the same settings as [`lock`](Client::lock)'s, each applying to every key
    /// (`wait` bounds the whole request).
    ///
    /// Each key is its own lock with its own grant, lease and fencing token
    /// ([`LockGuard::fencing_token_of`](crate::LockGuard::fencing_token_of)); a key named twice is taken once.
    /// When every key is free with nobody queued for it, they are taken in one step where the store can (one
    /// script on one Redis server, or on a cluster when all keys share a slot; not with
    /// [`wait_for_replicas`](crate::ClientBuilder::wait_for_replicas)); otherwise one by one in sorted order. As every such request takes its keys in the same order, two of them never wait for each
    /// other's keys, whatever order their keys were given in: a transfer from `a` to `b` and one from `b` to `a`
    /// cannot deadlock. If a key cannot be had within the wait, the keys already taken are released before
    /// the error returns ([`LockError::NotObtained`] names the key that was busy). The guard renews every
    /// key, releases every key, and is lost as soon as any key is. With no key at all, the request fails with
    /// [`LockError::InvalidConfig`].
    ///
    /// The keys need not share a server or a cluster slot; each key is exactly the lock
    /// [`lock`](Client::lock) would take, so single-key requests for one of them compete with this one.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// # let client = distlock::Client::builder().memory().build().await?;
    /// use std::time::Duration;
    /// let (from, to) = (7, 3);
    /// let guard = client
    ///     .lock_all([format!("account:{from}"), format!("account:{to}")])
    ///     .ttl(Duration::from_secs(10))
    ///     .wait(Duration::from_secs(2))
    ///     .acquire()
    ///     .await?;
    /// assert_eq!(guard.keys().collect::<Vec<_>>(), ["account:3", "account:7"]); // sorted
    /// assert!(client.lock("account:7").try_acquire().await?.is_none(), "each key is held");
    /// guard.release().await?; // every key
    ///
    /// // Or run a future under all of them.
    /// let moved = client.lock_all(["account:1", "account:2"]).run(async { 100 }).await?;
    /// assert_eq!(moved, 100);
    /// # Ok(()) }
    /// ```
    pub fn lock_all<S: Into<String>>(&self, keys: impl IntoIterator<Item = S>) -> LockRequest {
        LockRequest::new(self.clone(), keys.into_iter().map(Into::into).collect())
    }

    /// Reads who holds `key` (owner, metadata, fencing token, how long it has been held and the lease left), or
    /// `None` when it is free.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// let client = distlock::Client::builder().memory().owner("billing-7").build().await?;
    /// let guard = client.lock("job").metadata("nightly run").acquire().await?;
    /// let info = client.lock_info("job").await?.expect("held");
    /// assert_eq!((info.owner.as_str(), info.metadata.as_str()), ("billing-7", "nightly run"));
    /// assert_eq!(info.fencing_token, guard.fencing_token());
    /// assert!(info.held_for < std::time::Duration::from_secs(5));
    /// # Ok(()) }
    /// ```
    pub async fn lock_info(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        crate::request::check_key(key)?;
        self.inner.backend.info(&self.keys(key)).await
    }

    /// Frees the lock `key` now, whoever holds it: an operator's tool for a lock known to be stuck. True if a
    /// lock was deleted.
    ///
    /// - The lock is free the moment this returns (also one kept by `min_hold`): the next request gets it.
    /// - Nobody is handed the lock (a queued waiter may have died, and would block the key until its place
    ///   lapsed). The wait queue is cleared and every waiter that is still alive is woken at once to compete;
    ///   the first attempt to reach the store wins and the others queue again, in the order they arrive.
    /// - The holder is not told at once: its next renewal (within a third of its ttl) finds the lock gone, and
    ///   its guard then reads as lost ([`LockGuard::lost`](crate::LockGuard::lost) resolves, a lock body is
    ///   dropped with [`LockError::Lost`]). Until then it may still act as the holder: pass fencing tokens to
    ///   the storage it writes to.
    /// - A value at the lock's key that distlock did not write (another program's data under the key prefix,
    ///   which makes every request for the lock fail with an error saying so) is deleted too, with a WARN
    ///   event naming the key; this returns true.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// # let client = distlock::Client::builder().memory().build().await?;
    /// let guard = client.lock("job").acquire().await?;
    /// assert!(client.force_unlock("job").await?);
    /// assert_eq!(guard.release().await?, distlock::ReleaseOutcome::Expired);
    /// # Ok(()) }
    /// ```
    pub async fn force_unlock(&self, key: &str) -> Result<bool, LockError> {
        crate::request::check_key(key)?;
        let deleted = self.inner.backend.force_unlock(&self.keys(key)).await?;
        tracing::info!(key, deleted, "distlock: force unlock");
        Ok(deleted)
    }

    /// The backend key of the lock record for `key`: `<prefix>{<key>}`, with `%`, `{` and `}` in the key
    /// percent-encoded so a key cannot leave its hash tag.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// # let client = distlock::Client::builder().memory().build().await?;
    /// assert_eq!(client.record_key("a{b}"), "distlock:{a%7Bb%7D}");
    /// # Ok(()) }
    /// ```
    pub fn record_key(&self, key: &str) -> String {
        self.keys(key).record
    }

    pub(crate) fn keys(&self, key: &str) -> LockKeys {
        LockKeys::new(&self.inner.prefix, key.to_owned())
    }

    pub(crate) fn same_owner(&self, other: &Client) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

static GLOBAL: OnceCell<Client> = OnceCell::new();

tokio::task_local! {
    static SCOPED: Client;
}

/// Installs `client` as the global client that `#[distributed_lock]` functions and [`current_client()`] use.
/// Call it once at startup; a second call fails with [`LockError::AlreadyInstalled`]. The installed client stays
/// for the life of the process: after [`Client::shutdown`] (on it or any clone) the annotated functions fail
/// with [`LockError::ShuttingDown`], and it cannot be replaced.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
/// let client = distlock::Client::builder().memory().build().await?;
/// distlock::install(client.clone())?;
/// assert!(matches!(distlock::install(client), Err(distlock::LockError::AlreadyInstalled)));
/// # Ok(()) }
/// ```
pub fn install(client: Client) -> Result<(), LockError> {
    GLOBAL.set(client).map_err(|_| LockError::AlreadyInstalled)
}

/// The client in scope — the innermost [`with_client`] override, else the installed one, else
/// [`LockError::NotConfigured`] — as [`current_lock`](crate::current_lock) is the lock in scope.
///
/// ```
/// assert!(matches!(distlock::current_client(), Err(distlock::LockError::NotConfigured)));
/// ```
pub fn current_client() -> Result<Client, LockError> {
    SCOPED.try_with(Client::clone).ok().or_else(|| GLOBAL.get().cloned()).ok_or(LockError::NotConfigured)
}

/// Runs `fut` with `client` as the client in scope, overriding the installed one (for example a per-test
/// server).
///
/// The scope is `fut` itself: it does **not** cross `tokio::spawn`. A task spawned inside `fut` sees the
/// installed client (or [`LockError::NotConfigured`]); wrap that task's future in `with_client` too. A server
/// that spawns a task per connection (`axum::serve`, hyper, tonic) runs its handlers outside the scope: wrap
/// the service in [`tower::ClientLayer`](crate::tower::ClientLayer) (feature `tower`) instead.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
/// let client = distlock::Client::builder().memory().key_prefix("test:").build().await?;
/// let prefix = distlock::with_client(client, async { distlock::current_client().map(|c| c.record_key("k")) }).await?;
/// assert_eq!(prefix, "test:{k}");
/// # Ok(()) }
/// ```
pub async fn with_client<F: Future>(client: Client, fut: F) -> F::Output {
    SCOPED.scope(client, fut).await
}

/// `fut`, with `client` in scope while it runs (the future [`with_client`] awaits).
#[cfg(feature = "tower")]
pub(crate) fn scoped<F: Future>(client: Client, fut: F) -> tokio::task::futures::TaskLocalFuture<Client, F> {
    SCOPED.scope(client, fut)
}
