//! The client: one backend connection shared by every lock request, the global instance and scoped overrides.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use once_cell::sync::OnceCell;

use crate::backend::{Backend, ConnectSettings, LockKeys, MemoryBackend, RedisBackend, RedlockBackend, ReplicaAcks};
use crate::backend::{Store, Timeouts};
use crate::error::redact_url;
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

/// Configures a [`Client`]: which store, key prefix, timeouts.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
/// use std::time::Duration;
/// let client = distlock::Client::builder()
///     .memory() // or .redis("redis://127.0.0.1:6379/")
///     .key_prefix("myapp:locks:")
///     .response_timeout(Duration::from_millis(500))
///     .build()
///     .await?;
/// # drop(client); Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    store: StoreChoice,
    prefix: String,
    /// `None`: `<hostname>:<pid>`, looked up when building.
    owner: Option<String>,
    timeouts: Timeouts,
    allow_insecure_tls: bool,
    replicas: Option<ReplicaAcks>,
    sentinel_primary: Option<PrimaryAuth>,
}

/// The credentials of the primary behind Sentinel: `Debug` shows no password.
#[derive(Clone)]
pub(crate) struct PrimaryAuth {
    pub(crate) username: Option<String>,
    pub(crate) password: String,
}

impl std::fmt::Debug for PrimaryAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrimaryAuth").field("username", &self.username).field("password", &"***").finish()
    }
}

#[derive(Debug, Clone)]
enum StoreChoice {
    Unset,
    Redis(RedisUrl),
    RedisCluster(Vec<RedisUrl>),
    RedisSentinel(Vec<RedisUrl>, String),
    Redlock(Vec<RedisUrl>),
    Memory,
}

/// A Redis URL, which may carry a password: `Debug` shows it redacted.
#[derive(Clone)]
struct RedisUrl(String);

impl std::fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&redact_url(&self.0))
    }
}

impl Default for ClientBuilder {
    fn default() -> Self {
        Self {
            store: StoreChoice::Unset,
            prefix: "distlock:".to_owned(),
            owner: None,
            timeouts: Timeouts { connect: Duration::from_secs(2), response: Duration::from_secs(2) },
            allow_insecure_tls: false,
            replicas: None,
            sentinel_primary: None,
        }
    }
}

impl ClientBuilder {
    /// Keeps locks on the Redis server at `url` (`redis://[user:password@]host[:port][/db]`, `rediss://` for
    /// TLS, `redis+unix:///path`).
    pub fn redis(mut self, url: impl Into<String>) -> Self {
        self.store = StoreChoice::Redis(RedisUrl(url.into()));
        self
    }

    /// Keeps locks on a Redis Cluster, reached through `seeds`: one or more of its nodes' URLs (as for
    /// [`redis`](Self::redis)); the client learns the rest of the cluster from them. Every key of one lock
    /// shares one hash slot, whatever characters the lock's name holds, so each operation is one script call
    /// on the node that owns that slot; the cluster's slot moves and failovers are followed. Waiters hear
    /// releases by sharded pub/sub (`SSUBSCRIBE`; the scripts `SPUBLISH`), on that same node: the README's
    /// least-privilege user needs `+spublish +ssubscribe +sunsubscribe` there.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// let client = distlock::Client::builder()
    ///     .redis_cluster(["redis://10.0.0.1:6379/", "redis://10.0.0.2:6379/"])
    ///     .build()
    ///     .await?;
    /// # drop(client); Ok(()) }
    /// ```
    pub fn redis_cluster<S: Into<String>>(mut self, seeds: impl IntoIterator<Item = S>) -> Self {
        self.store = StoreChoice::RedisCluster(seeds.into_iter().map(|s| RedisUrl(s.into())).collect());
        self
    }

    /// Keeps locks on the primary that Redis Sentinel names for `service`, asking the sentinels at
    /// `sentinels` (their URLs, as for [`redis`](Self::redis)). After a failover the client asks them again
    /// and moves to the new primary: calls that failed meanwhile are retried by waiters, and a holder whose
    /// renewals could not reach a primary in time is told its lock is lost. Combine with
    /// [`wait_for_replicas`](Self::wait_for_replicas) so that a failover cannot lose a grant. The sentinels'
    /// own password (or ACL user) goes in their URLs (`redis://:PASSWORD@HOST:26379/`); the data nodes' in
    /// [`sentinel_primary_password`](Self::sentinel_primary_password).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// use std::time::Duration;
    /// let client = distlock::Client::builder()
    ///     .redis_sentinel(["redis://10.0.0.1:26379/", "redis://10.0.0.2:26379/", "redis://10.0.0.3:26379/"], "locks")
    ///     .wait_for_replicas(1, Duration::from_millis(50))
    ///     .build()
    ///     .await?;
    /// # drop(client); Ok(()) }
    /// ```
    pub fn redis_sentinel<S: Into<String>>(
        mut self,
        sentinels: impl IntoIterator<Item = S>,
        service: impl Into<String>,
    ) -> Self {
        self.store =
            StoreChoice::RedisSentinel(sentinels.into_iter().map(|s| RedisUrl(s.into())).collect(), service.into());
        self
    }

    /// The password (and ACL user, if any) of the data nodes behind [`redis_sentinel`](Self::redis_sentinel),
    /// when they need one: the sentinels' URLs authenticate to the sentinels only, and the primary the
    /// sentinels name (now and after a failover) is reached with these. Only with `redis_sentinel`. A wrong or
    /// missing password fails at `build()` saying whether the sentinels or the primary refused.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// let password = std::env::var("REDIS_PASSWORD").unwrap_or_default();
    /// // The sentinels' own password in their URLs, the data nodes' ACL user `locker` and its password here.
    /// let client = distlock::Client::builder()
    ///     .redis_sentinel(["redis://:s3ntinel@10.0.0.1:26379/", "redis://:s3ntinel@10.0.0.2:26379/"], "locks")
    ///     .sentinel_primary_password(Some("locker"), password)
    ///     .build()
    ///     .await?;
    /// # drop(client); Ok(()) }
    /// ```
    pub fn sentinel_primary_password(mut self, username: Option<&str>, password: impl Into<String>) -> Self {
        self.sentinel_primary = Some(PrimaryAuth { username: username.map(str::to_owned), password: password.into() });
        self
    }

    /// Keeps locks on `servers`, independent Redis primaries (an odd number, at least 3; URLs as for
    /// [`redis`](Self::redis)), with the Redlock algorithm: a lock is held while a majority of them holds it,
    /// so it survives the loss of a minority. An acquire asks all at once and is decided as soon as a majority
    /// granted (or can no longer), each server getting a twentieth of the ttl (at least 10 ms, at most the
    /// response timeout) to answer; the lease counts from before the first request, less a drift allowance.
    /// A server that lost its keys (a restart without persistence, a flush) counts toward a new holder only
    /// once its lock state is a ttl old. Renewals need a majority, and take the lock again by the same token
    /// where a server lost the record; a release goes to every server.
    ///
    /// Not offered on Redlock: a fair queue and hand-over (waiters poll on their retry strategy, and nothing
    /// stops one from being overtaken again and again), and fencing tokens
    /// ([`LockGuard::fencing_token`](crate::LockGuard::fencing_token) is 0 and
    /// [`LockGuard::try_fencing_token`](crate::LockGuard::try_fencing_token) an error). Every server must be
    /// reachable when the client is built. See the README's Redlock section for the clock and restart
    /// assumptions.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// let client = distlock::Client::builder()
    ///     .redlock(["redis://10.0.0.1:6379/", "redis://10.0.1.1:6379/", "redis://10.0.2.1:6379/"])
    ///     .build()
    ///     .await?;
    /// # drop(client); Ok(()) }
    /// ```
    pub fn redlock<S: Into<String>>(mut self, servers: impl IntoIterator<Item = S>) -> Self {
        self.store = StoreChoice::Redlock(servers.into_iter().map(|s| RedisUrl(s.into())).collect());
        self
    }

    /// Keeps locks in this process's memory: the same semantics, for tests and single-process programs.
    pub fn memory(mut self) -> Self {
        self.store = StoreChoice::Memory;
        self
    }

    /// Prepended to every backend key this client uses. Default `"distlock:"`.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Names this process in every lock record its client writes, for whoever reads them
    /// ([`LockInfo::owner`], [`LockError::holder`]): any non-empty text. Default `<hostname>:<pid>`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// let client = distlock::Client::builder().memory().owner("worker-7 (eu-west)").build().await?;
    /// let _guard = client.lock("job").acquire().await?;
    /// assert_eq!(client.lock_info("job").await?.expect("held").owner, "worker-7 (eu-west)");
    /// # Ok(()) }
    /// ```
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    /// How long connecting may take, all of it: TCP, TLS and the handshake, with the redis crate's retries of a
    /// refused attempt; behind Sentinel also asking the sentinels for the primary (the redis crate gives each
    /// sentinel, and its check of the primary named, 1 s to connect and 500 ms to answer, then asks the next:
    /// allow for the sentinels that may hang). It bounds every connection the client makes — at `build()`, for
    /// release announcements, and again after a reset — so `build()` against a server that does not answer
    /// (stopped, overloaded, or behind a firewall that drops packets) fails after it, with a
    /// [`BackendError`](crate::BackendError) whose [`is_timeout`](crate::BackendError::is_timeout) is true. On a
    /// Redis Cluster it is each node's: connecting to the seeds, then to the nodes of the slot map they give,
    /// takes up to twice it, so that one hung node does not fail the whole. Default 2 s.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// use std::time::Duration;
    /// let builder = distlock::Client::builder()
    ///     .redis("redis://cache.internal:6379/")
    ///     .connect_timeout(Duration::from_millis(500)); // build() gives up on connecting after 500 ms
    /// # drop(builder); Ok(()) }
    /// ```
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.timeouts.connect = timeout;
        self
    }

    /// How long any one Redis call may take before it fails with a timeout (a
    /// [`BackendError`](crate::BackendError) whose [`is_timeout`](crate::BackendError::is_timeout) is true).
    /// Each call is bounded, not a whole operation: `build()` makes several (PING, `INFO`, the probe lock), and
    /// an acquire with a `wait` as many as its wait needs. Default 2 s.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// use std::time::Duration;
    /// let builder = distlock::Client::builder()
    ///     .redis("redis://cache.internal:6379/")
    ///     .connect_timeout(Duration::from_secs(1))
    ///     .response_timeout(Duration::from_millis(500));
    /// # drop(builder); Ok(()) }
    /// ```
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.timeouts.response = timeout;
        self
    }

    /// Counts a grant, renewal or extension only once `replicas` replicas have acknowledged it (Redis `WAIT`,
    /// up to `timeout`), so a failover to one of them keeps the lock. A grant too few acknowledge is given back
    /// and fails with [`LockError::NotReplicated`]; such a renewal is retried and does not extend the lease.
    /// Costs a round trip per grant, and `WAIT` holds the shared connection until acknowledged: keep
    /// `timeout` short. Redis only; `replicas = 0` turns it off.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// use std::time::Duration;
    /// let builder = distlock::Client::builder()
    ///     .redis("redis://primary.internal:6379/")
    ///     .wait_for_replicas(1, Duration::from_millis(50));
    /// # drop(builder); Ok(()) }
    /// ```
    pub fn wait_for_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replicas = (replicas > 0).then_some(ReplicaAcks { count: replicas, timeout });
        self
    }

    /// Accepts a `rediss://…/#insecure` URL, which turns off TLS certificate checks. Refused by default:
    /// whoever can intercept the connection could then grant locks. Needs the `tls-insecure` feature.
    pub fn allow_insecure_tls(mut self, allow: bool) -> Self {
        self.allow_insecure_tls = allow;
        self
    }

    /// Connects and, for Redis, checks the server: it must answer PING, grant and release a probe lock (so
    /// missing ACL rights show here), and not be a cluster node. Warns when its `maxmemory-policy` may evict
    /// lock records. Errors name the URL with the password redacted.
    pub async fn build(self) -> Result<Client, LockError> {
        if self.timeouts.connect.is_zero() || self.timeouts.response.is_zero() {
            return Err(LockError::InvalidConfig("connect and response timeouts must be above zero".into()));
        }
        let owner = match self.owner {
            Some(owner) if owner.is_empty() => {
                return Err(LockError::InvalidConfig(
                    "ClientBuilder::owner is empty: name this process (for example its host and role), or leave \
                     it unset for `<hostname>:<pid>`"
                        .into(),
                ))
            }
            Some(owner) => owner,
            None => default_owner(),
        };
        let settings = ConnectSettings {
            timeouts: self.timeouts,
            prefix: &self.prefix,
            owner: &owner,
            allow_insecure_tls: self.allow_insecure_tls,
            replicas: self.replicas,
        };
        if self.sentinel_primary.is_some() && !matches!(self.store, StoreChoice::RedisSentinel(..)) {
            return Err(LockError::InvalidConfig(
                "sentinel_primary_password applies to redis_sentinel only: give other servers' passwords in their \
                 URLs (redis://:PASSWORD@HOST:PORT/)"
                    .into(),
            ));
        }
        let backend = match self.store {
            StoreChoice::Unset => {
                return Err(LockError::InvalidConfig(
                    "no store chosen: call ClientBuilder::redis(url), ClientBuilder::redis_cluster(seeds), ClientBuilder::redis_sentinel(sentinels, service), ClientBuilder::redlock(servers) or ClientBuilder::memory()".into(),
                ))
            }
            StoreChoice::Redis(RedisUrl(url)) => {
                Backend::Redis(RedisBackend::connect(&url, settings).await?)
            }
            StoreChoice::RedisCluster(seeds) => {
                let seeds: Vec<String> = seeds.into_iter().map(|RedisUrl(url)| url).collect();
                Backend::Redis(RedisBackend::connect_cluster(&seeds, settings).await?)
            }
            StoreChoice::RedisSentinel(sentinels, service) => {
                let sentinels: Vec<String> = sentinels.into_iter().map(|RedisUrl(url)| url).collect();
                let primary = self.sentinel_primary.as_ref();
                Backend::Redis(RedisBackend::connect_sentinel(&sentinels, &service, primary, settings).await?)
            }
            StoreChoice::Redlock(servers) => {
                let servers: Vec<String> = servers.into_iter().map(|RedisUrl(url)| url).collect();
                Backend::Redlock(RedlockBackend::connect(&servers, settings).await?)
            }
            StoreChoice::Memory => Backend::Memory(MemoryBackend::new(owner.as_str().into())),
        };
        Ok(Client {
            inner: Arc::new(ClientInner {
                backend,
                prefix: self.prefix,
                owner: owner.into(),
                renewer: Renewer::default(),
                shutdown: Shutdown::default(),
            }),
        })
    }
}

/// `<hostname>:<pid>`: the host's name as the OS gives it (the `gethostname` crate: uname's nodename on Unix,
/// GetComputerNameExW on Windows), lossily made UTF-8.
fn default_owner() -> String {
    format!("{}:{}", gethostname::gethostname().to_string_lossy(), std::process::id())
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
