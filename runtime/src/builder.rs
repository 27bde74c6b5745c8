//! Configuring a [`Client`]: which store, key prefix, owner, timeouts.

use std::sync::Arc;
use std::time::Duration;

use crate::backend::{Backend, ConnectSettings, MemoryBackend, RedisBackend, RedlockBackend, ReplicaAcks, Timeouts};
#[cfg(feature = "postgres")]
use crate::backend::{PostgresBackend, PostgresSettings, DEFAULT_SCHEMA};
use crate::client::{Client, ClientInner};
use crate::error::redact_url;
use crate::renewer::Renewer;
use crate::shutdown::Shutdown;
use crate::LockError;

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
    /// [`ClientBuilder::postgres_schema`]; `None`: `distlock`.
    #[cfg(feature = "postgres")]
    postgres_schema: Option<String>,
    /// [`ClientBuilder::postgres_listen_url`]; `None`: the store's URL.
    #[cfg(feature = "postgres")]
    postgres_listen_url: Option<PostgresUrl>,
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
    #[cfg(feature = "postgres")]
    Postgres(PostgresUrl),
}

/// A Redis URL, which may carry a password: `Debug` shows it redacted.
#[derive(Clone)]
struct RedisUrl(String);

impl std::fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&redact_url(&self.0))
    }
}

/// A PostgreSQL URL or `key=value` settings, which may carry a password: `Debug` shows neither it nor any
/// other setting, only the server.
#[cfg(feature = "postgres")]
#[derive(Clone)]
struct PostgresUrl(String);

#[cfg(feature = "postgres")]
impl std::fmt::Debug for PostgresUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&crate::backend::describe_postgres_url(&self.0))
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
            #[cfg(feature = "postgres")]
            postgres_schema: None,
            #[cfg(feature = "postgres")]
            postgres_listen_url: None,
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

    /// Keeps locks in the PostgreSQL database at `url` (`postgres://USER:PASSWORD@HOST:PORT/DBNAME`, or
    /// `host=… port=… user=… password=… dbname=…`), in distlock's schema ([`postgres_schema`](Self::postgres_schema),
    /// default `distlock`), which `build()` creates if it is missing (or `distlock migrate`, as the schema's
    /// owner). Leases are by the server's clock; fencing tokens come from one uncached sequence and rise across
    /// restarts; waiters queue in arrival order and hear hand-overs by LISTEN/NOTIFY on a session of their own.
    /// Each operation is one statement and one round trip, on one pipelined session, with unnamed statements,
    /// so PgBouncer in transaction mode carries them; waiters listen on a session of their own, which such a
    /// pool does not keep: give them the server with [`postgres_listen_url`](Self::postgres_listen_url).
    /// Feature `postgres`; plain TCP or a unix socket, no TLS.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// let client = distlock::Client::builder()
    ///     .postgres("postgres://app:secret@db.internal:5432/app")
    ///     .build()
    ///     .await?;
    /// # drop(client); Ok(()) }
    /// ```
    #[cfg(feature = "postgres")]
    pub fn postgres(mut self, url: impl Into<String>) -> Self {
        self.store = StoreChoice::Postgres(PostgresUrl(url.into()));
        self
    }

    /// The PostgreSQL schema distlock's tables and functions live in: lower-case letters, digits and `_`,
    /// starting with a letter, at most 49 characters. Default `distlock`. Clients that share locks must name
    /// the same schema.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// let client = distlock::Client::builder()
    ///     .postgres("postgres://app@db.internal/app")
    ///     .postgres_schema("billing_locks")
    ///     .build()
    ///     .await?;
    /// # drop(client); Ok(()) }
    /// ```
    #[cfg(feature = "postgres")]
    pub fn postgres_schema(mut self, schema: impl Into<String>) -> Self {
        self.postgres_schema = Some(schema.into());
        self
    }

    /// Where waiters listen for hand-overs (LISTEN needs a session of its own, which a transaction-mode pool
    /// such as PgBouncer's does not keep): the server itself, or a session-mode pool. Default: the URL given
    /// to [`postgres`](Self::postgres), which then must not be a transaction-mode pool.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// let client = distlock::Client::builder()
    ///     .postgres("postgres://app@pgbouncer.internal:6432/app") // pool_mode = transaction
    ///     .postgres_listen_url("postgres://app@db.internal:5432/app")
    ///     .build()
    ///     .await?;
    /// # drop(client); Ok(()) }
    /// ```
    #[cfg(feature = "postgres")]
    pub fn postgres_listen_url(mut self, url: impl Into<String>) -> Self {
        self.postgres_listen_url = Some(PostgresUrl(url.into()));
        self
    }

    /// Prepended to every backend key this client uses. Default `"distlock:"`.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Names this process in every lock record its client writes, for whoever reads them
    /// ([`LockInfo::owner`](crate::LockInfo::owner), [`LockError::holder`]): any non-empty text. Default `<hostname>:<pid>`.
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
        #[cfg(feature = "postgres")]
        if (self.postgres_schema.is_some() || self.postgres_listen_url.is_some())
            && !matches!(self.store, StoreChoice::Postgres(..))
        {
            return Err(LockError::InvalidConfig(
                "postgres_schema and postgres_listen_url apply to postgres only".into(),
            ));
        }
        let backend = match self.store {
            StoreChoice::Unset => {
                return Err(LockError::InvalidConfig(
                    "no store chosen: call ClientBuilder::redis(url), ClientBuilder::redis_cluster(seeds), ClientBuilder::redis_sentinel(sentinels, service), ClientBuilder::redlock(servers), ClientBuilder::postgres(url) (feature `postgres`) or ClientBuilder::memory()".into(),
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
            #[cfg(feature = "postgres")]
            StoreChoice::Postgres(PostgresUrl(url)) => {
                if self.replicas.is_some() {
                    return Err(LockError::InvalidConfig(
                        "wait_for_replicas is Redis's: on PostgreSQL, a synchronous standby \
                         (synchronous_standby_names, synchronous_commit = on) makes every reply wait for it"
                            .into(),
                    ));
                }
                let schema = self.postgres_schema.as_deref().unwrap_or(DEFAULT_SCHEMA);
                let settings = PostgresSettings {
                    url: &url,
                    listen_url: self.postgres_listen_url.as_ref().map(|PostgresUrl(u)| u.as_str()),
                    schema,
                    timeouts: self.timeouts,
                    owner: &owner,
                    prefix: &self.prefix,
                };
                Backend::Postgres(PostgresBackend::connect(settings).await?)
            }
        };
        Ok(Client {
            inner: Arc::new(ClientInner {
                backend,
                prefix: self.prefix,
                owner: owner.into(),
                renewer: Renewer::default(),
                shutdown: Shutdown::default(),
                lines: crate::acquire::Lines::default(),
            }),
        })
    }
}

/// `<hostname>:<pid>`: the host's name as the OS gives it (the `gethostname` crate: uname's nodename on Unix,
/// GetComputerNameExW on Windows), lossily made UTF-8.
fn default_owner() -> String {
    format!("{}:{}", gethostname::gethostname().to_string_lossy(), std::process::id())
}
