//! [`Fixture`]: one backend (a private Redis server, or the in-process store) with a client on it, so
//! that one behaviour suite runs against both.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use std::sync::atomic::{AtomicUsize, Ordering};

use distlock::{Client, ClientBuilder, LockError, LockGuard, LockRequest};
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{AsyncCommands, Cmd, Pipeline, RedisFuture, Value};

use crate::cluster::RedisCluster;
use crate::sentinel::SentinelGroup;
use tokio::time::Instant;

use crate::{PostgresServer, RedisServer};

/// Which backend a [`Fixture`] runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A private `redis-server` process.
    Redis,
    /// `ClientBuilder::memory()`.
    Memory,
    /// `ClientBuilder::redis_cluster(..)` on the test binary's shared cluster, with a key prefix of its own.
    Cluster,
    /// `ClientBuilder::redis_sentinel(..)` on the test binary's shared Sentinel group, with a key prefix of
    /// its own.
    Sentinel,
    /// `ClientBuilder::redlock(..)` on three private `redis-server` processes.
    Redlock,
    /// `ClientBuilder::postgres(..)` on the test binary's shared PostgreSQL server, with a key prefix of its own.
    Postgres,
}

/// A backend with a connected client.
#[derive(Debug)]
pub struct Fixture {
    backend: Backend,
    client: Client,
    redis: Option<(RedisServer, MultiplexedConnection)>,
    cluster: Option<(&'static RedisCluster, RawConnection, String)>,
    sentinel: Option<(&'static SentinelGroup, RawConnection, String)>,
    /// Redlock's servers, with a connection to each.
    redlock: Vec<(RedisServer, MultiplexedConnection)>,
    /// The PostgreSQL server, a session on it for assertions, and the fixture's key prefix.
    postgres: Option<(&'static PostgresServer, Arc<tokio_postgres::Client>, String)>,
}

/// A raw connection for assertions: to the private server, or to the shared cluster (routed by key).
#[derive(Clone)]
pub enum RawConnection {
    /// To a private `redis-server`.
    Server(MultiplexedConnection),
    /// To the shared cluster.
    Cluster(ClusterConnection),
}

impl ConnectionLike for RawConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RawConnection::Server(c) => c.req_packed_command(cmd),
            RawConnection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RawConnection::Server(c) => c.req_packed_commands(cmd, offset, count),
            RawConnection::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RawConnection::Server(c) => c.get_db(),
            RawConnection::Cluster(c) => c.get_db(),
        }
    }
}

impl std::fmt::Debug for RawConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RawConnection::Server(_) => "RawConnection::Server",
            RawConnection::Cluster(_) => "RawConnection::Cluster",
        })
    }
}

impl Fixture {
    /// A fresh `redis-server` and a client on it.
    pub async fn redis() -> Self {
        let server = RedisServer::new();
        let client = Client::builder()
            .redis(server.url())
            .build()
            .await
            .unwrap_or_else(|e| panic!("client for {}: {e}", server.url()));
        let conn = server.connection().await;
        Fixture {
            backend: Backend::Redis,
            client,
            redis: Some((server, conn)),
            cluster: None,
            sentinel: None,
            redlock: Vec::new(),
            postgres: None,
        }
    }

    /// A fresh in-process backend and a client on it.
    pub async fn memory() -> Self {
        let client = Client::builder().memory().build().await.expect("memory client");
        Fixture {
            backend: Backend::Memory,
            client,
            redis: None,
            cluster: None,
            sentinel: None,
            redlock: Vec::new(),
            postgres: None,
        }
    }

    /// A client on the test binary's shared Sentinel group ([`SentinelGroup::shared`]), with a key prefix no
    /// other fixture uses.
    pub async fn sentinel() -> Self {
        let group = SentinelGroup::shared().await;
        let prefix = unique_prefix();
        let client = sentinel_client(group, &prefix, |b| b).await;
        let port = group.primary_port().await.expect("the sentinels name a primary");
        let server = group.servers.iter().find(|s| s.port() == port).expect("the primary is one of the group's");
        let conn = RawConnection::Server(server.connection().await);
        Fixture {
            backend: Backend::Sentinel,
            client,
            redis: None,
            cluster: None,
            sentinel: Some((group, conn, prefix)),
            redlock: Vec::new(),
            postgres: None,
        }
    }

    /// A client on the test binary's shared Redis Cluster ([`RedisCluster::shared`]), with a key prefix no
    /// other fixture uses, so tests running at once on the one cluster never share a key.
    pub async fn cluster() -> Self {
        let cluster = tokio::task::spawn_blocking(RedisCluster::shared).await.expect("cluster start");
        let prefix = unique_prefix();
        let client = cluster_client(cluster, &prefix, |b| b).await;
        let conn = redis::cluster::ClusterClient::new(cluster.seeds())
            .expect("cluster client")
            .get_async_connection()
            .await
            .expect("raw cluster connection");
        Fixture {
            backend: Backend::Cluster,
            client,
            redis: None,
            cluster: Some((cluster, RawConnection::Cluster(conn), prefix)),
            sentinel: None,
            redlock: Vec::new(),
            postgres: None,
        }
    }

    /// A client on the test binary's shared PostgreSQL server ([`PostgresServer::shared`]), in the default
    /// schema, with a key prefix no other fixture uses.
    pub async fn postgres() -> Self {
        let server = tokio::task::spawn_blocking(PostgresServer::shared).await.expect("postgres start");
        let prefix = unique_prefix();
        let client = postgres_client(server, &prefix, |b| b).await;
        let (session, connection) =
            tokio_postgres::connect(&server.url(), tokio_postgres::NoTls).await.expect("a session for assertions");
        tokio::spawn(connection);
        Fixture {
            backend: Backend::Postgres,
            client,
            redis: None,
            cluster: None,
            sentinel: None,
            redlock: Vec::new(),
            postgres: Some((server, Arc::new(session), prefix)),
        }
    }

    /// The PostgreSQL server and a session on it, on the PostgreSQL backend.
    pub fn postgres_session(&self) -> Option<(&'static PostgresServer, &tokio_postgres::Client)> {
        self.postgres.as_ref().map(|(server, session, _)| (*server, &**session))
    }

    /// Three fresh `redis-server`s and a Redlock client on them.
    pub async fn redlock() -> Self {
        Self::redlock_of(3).await
    }

    /// `n` fresh `redis-server`s and a Redlock client on them.
    pub async fn redlock_of(n: usize) -> Self {
        let servers: Vec<RedisServer> = (0..n).map(|_| RedisServer::new()).collect();
        let client = redlock_client(&servers, |builder| builder).await;
        let mut redlock = Vec::with_capacity(n);
        for server in servers {
            let conn = server.connection().await;
            redlock.push((server, conn));
        }
        Fixture {
            backend: Backend::Redlock,
            client,
            redis: None,
            cluster: None,
            sentinel: None,
            redlock,
            postgres: None,
        }
    }

    /// Redlock's servers, on the Redlock backend (empty on the others).
    pub fn redlock_servers(&self) -> impl Iterator<Item = &RedisServer> {
        self.redlock.iter().map(|(s, _)| s)
    }

    /// Redlock's server `i`, mutably (to kill or restart it).
    pub fn redlock_server_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.redlock[i].0
    }

    /// A connection to each of Redlock's servers.
    pub fn redlock_connections(&self) -> Vec<MultiplexedConnection> {
        self.redlock.iter().map(|(_, c)| c.clone()).collect()
    }

    /// Whether grants carry fencing tokens (every backend but Redlock, which refuses them).
    pub fn gives_fencing_tokens(&self) -> bool {
        self.backend != Backend::Redlock
    }

    /// Which backend this is.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The fixture's main client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Another client on the same backend: a separately built one (its own connections) on Redis; on the
    /// in-process backend, which is one store per built client, a clone.
    pub async fn other_client(&self) -> Client {
        match self.backend {
            Backend::Memory => self.client.clone(),
            _ => self.client_with(|builder| builder).await,
        }
    }

    /// A client built for this fixture's backend with `configure` applied to its builder (e.g.
    /// `|b| b.owner("replica-b")`): on the same server, cluster or Sentinel group, with the same key prefix. On
    /// the in-process backend, which is one store per built client, it is a new store of its own, which
    /// shares no lock with the fixture's client.
    pub async fn client_with(&self, configure: impl FnOnce(ClientBuilder) -> ClientBuilder) -> Client {
        match (&self.redis, &self.cluster, &self.sentinel) {
            (Some((server, _)), ..) => configure(Client::builder().redis(server.url()))
                .build()
                .await
                .unwrap_or_else(|e| panic!("client for {}: {e}", server.url())),
            (_, Some((cluster, _, prefix)), _) => cluster_client(cluster, prefix, configure).await,
            (.., Some((group, _, prefix))) => sentinel_client(group, prefix, configure).await,
            _ if self.postgres.is_some() => {
                let (server, _, prefix) = self.postgres.as_ref().expect("postgres");
                postgres_client(server, prefix, configure).await
            }
            _ if !self.redlock.is_empty() => redlock_client(self.redlock_servers(), configure).await,
            _ => configure(Client::builder().memory()).build().await.expect("memory client"),
        }
    }

    /// The shared cluster, on the cluster backend.
    pub fn redis_cluster(&self) -> Option<&'static RedisCluster> {
        self.cluster.as_ref().map(|(c, _, _)| *c)
    }

    /// The Redis server, on the Redis backend.
    pub fn server(&self) -> Option<&RedisServer> {
        self.redis.as_ref().map(|(s, _)| s)
    }

    /// The Redis server, mutably (to kill or restart it), on the Redis backend.
    pub fn server_mut(&mut self) -> Option<&mut RedisServer> {
        self.redis.as_mut().map(|(s, _)| s)
    }

    /// A raw connection to the Redis server, on the Redis backend.
    pub fn redis_connection(&self) -> Option<MultiplexedConnection> {
        self.redis.as_ref().map(|(_, c)| c.clone())
    }

    /// A raw connection to the Redis server or the cluster, on those backends.
    pub fn raw_connection(&self) -> Option<RawConnection> {
        match (&self.redis, &self.cluster, &self.sentinel) {
            (Some((_, c)), _, _) => Some(RawConnection::Server(c.clone())),
            (_, Some((_, c, _)), _) | (_, _, Some((_, c, _))) => Some(c.clone()),
            // Redlock: the first server, for counters kept outside the lock library.
            _ => self.redlock.first().map(|(_, c)| RawConnection::Server(c.clone())),
        }
    }

    /// A counter outside the lock library: a Redis key, or a value in this process.
    pub fn counter(&self, name: &str) -> Counter {
        let prefix = self.cluster.as_ref().map(|c| &c.2).or(self.sentinel.as_ref().map(|s| &s.2));
        match self.raw_connection() {
            Some(conn) => Counter::Redis { conn, key: format!("{}test:counter:{name}", prefix.map_or("", |p| p)) },
            None => Counter::Memory(Arc::new(Mutex::new(0))),
        }
    }

    /// Every key under the client's key prefix on the backend's servers (every Redlock server, every cluster
    /// primary), with its PTTL in milliseconds (-1: no expiry), sorted; `None` on the in-process backend, which
    /// has no server to look at. Not a Redlock server's lock-state mark (`<prefix>redlock:since`), which is
    /// the server's, not a lock's, and stays.
    pub async fn keys_left(&self) -> Option<Vec<(String, i64)>> {
        if let Some((_, session, prefix)) = &self.postgres {
            return Some(postgres_rows_left(session, prefix).await);
        }
        let record = self.client.record_key("x");
        let prefix = record.strip_suffix("{x}").expect("a record key ends with its hash tag");
        let mut connections: Vec<RawConnection> = match (&self.cluster, &self.sentinel) {
            (Some((cluster, ..)), _) => {
                let mut primaries = Vec::new();
                for node in cluster.nodes() {
                    let mut conn = node.connection().await;
                    let role: Vec<Value> = redis::cmd("ROLE").query_async(&mut conn).await.expect("ROLE");
                    if matches!(role.first(), Some(Value::BulkString(r)) if r.as_slice() == b"master") {
                        primaries.push(RawConnection::Server(conn));
                    }
                }
                primaries
            }
            (_, Some((_, conn, _))) => vec![conn.clone()],
            _ if !self.redlock.is_empty() => {
                self.redlock_connections().into_iter().map(RawConnection::Server).collect()
            }
            _ => vec![RawConnection::Server(self.redis_connection()?)],
        };
        let mut left = Vec::new();
        for conn in &mut connections {
            let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{prefix}*")).query_async(conn).await.expect("KEYS");
            for key in keys.into_iter().filter(|k| self.redlock.is_empty() || *k != format!("{prefix}redlock:since")) {
                let pttl: i64 = conn.pttl(&key).await.expect("PTTL");
                // -2: expired between KEYS and PTTL.
                if pttl != -2 {
                    left.push((key, pttl));
                }
            }
        }
        left.sort();
        Some(left)
    }

    /// Makes the lock record of `key` disappear behind its holder's back, as if its lease had run out or an
    /// operator had deleted it. Redis: `DEL` of `client.record_key(key)` on a raw connection (no release
    /// announcement). Memory: the client's forced unlock.
    pub async fn vanish_record(&self, key: &str) {
        if let Some((_, session, _)) = &self.postgres {
            let record = self.client.record_key(key);
            let deleted = session
                .execute("DELETE FROM distlock.locks WHERE key = $1 AND expires_at > clock_timestamp()", &[&record])
                .await
                .expect("DELETE the lock's row");
            assert_eq!(deleted, 1, "row {record} of lock {key:?} was not there");
            return;
        }
        if !self.redlock.is_empty() {
            let record = self.client.record_key(key);
            let mut deleted = 0;
            for mut conn in self.redlock_connections() {
                let n: i64 = conn.del(&record).await.expect("DEL record");
                deleted += n;
            }
            assert!(deleted > 0, "record {record} of lock {key:?} was on no Redlock server");
            return;
        }
        match self.raw_connection() {
            Some(mut conn) => {
                let record = self.client.record_key(key);
                let deleted: i64 = conn.del(&record).await.expect("DEL record");
                assert_eq!(deleted, 1, "record {record} of lock {key:?} was not there");
            }
            None => {
                let existed = self.client.force_unlock(key).await.expect("memory force_unlock");
                assert!(existed, "lock {key:?} was not held");
            }
        }
    }
}

/// A counter that is read and written in two separate steps, so that concurrent read-modify-writes lose
/// updates unless something serialises them.
#[derive(Debug, Clone)]
pub enum Counter {
    /// `GET` / `SET` of a Redis key.
    Redis {
        /// The connection.
        conn: RawConnection,
        /// The key.
        key: String,
    },
    /// A value in this process.
    Memory(Arc<Mutex<i64>>),
}

impl Counter {
    /// Reads the value (0 when unset).
    pub async fn get(&self) -> i64 {
        match self {
            Counter::Redis { conn, key } => {
                let v: Option<i64> = conn.clone().get(key).await.expect("GET counter");
                v.unwrap_or(0)
            }
            Counter::Memory(v) => *v.lock().unwrap_or_else(PoisonError::into_inner),
        }
    }

    /// Writes the value.
    pub async fn set(&self, value: i64) {
        match self {
            Counter::Redis { conn, key } => {
                let _: () = conn.clone().set(key, value).await.expect("SET counter");
            }
            Counter::Memory(v) => *v.lock().unwrap_or_else(PoisonError::into_inner) = value,
        }
    }

    /// A deliberately racy increment: read, pause, write.
    pub async fn racy_increment(&self, pause: Duration) {
        let v = self.get().await;
        tokio::time::sleep(pause).await;
        self.set(v + 1).await;
    }
}

/// Takes the lock `request` builds, as soon as the client has recovered from a fault (a server restart, a
/// reset, a lost reply): a backend error is retried every 50 ms until `until`; after that, or on any other
/// error, the test fails, naming `what`.
pub async fn acquire_after_recovery(until: Instant, what: &str, mut request: impl FnMut() -> LockRequest) -> LockGuard {
    loop {
        match request().acquire().await {
            Ok(guard) => return guard,
            Err(LockError::Backend(e)) if Instant::now() < until => {
                eprintln!("{what}: not reconnected yet: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{what}: cannot lock after the fault: {e}"),
        }
    }
}

/// A key prefix no other fixture of this process uses.
fn unique_prefix() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!("t{}-{}:", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

async fn sentinel_client(
    group: &SentinelGroup,
    prefix: &str,
    configure: impl FnOnce(ClientBuilder) -> ClientBuilder,
) -> Client {
    configure(Client::builder().redis_sentinel(group.sentinel_urls(), crate::sentinel::SERVICE).key_prefix(prefix))
        .build()
        .await
        .unwrap_or_else(|e| panic!("client through the sentinels: {e}"))
}

async fn postgres_client(
    server: &PostgresServer,
    prefix: &str,
    configure: impl FnOnce(ClientBuilder) -> ClientBuilder,
) -> Client {
    configure(Client::builder().postgres(server.url()).key_prefix(prefix))
        .build()
        .await
        .unwrap_or_else(|e| panic!("client for {}: {e}", server.url()))
}

/// What the PostgreSQL store holds for the locks under `prefix`, as `keys_left` lists Redis keys with their
/// PTTL: each lock's row and each waiter's place (`<record>:waiter`), with the milliseconds until the sweep may
/// delete it (a minute past its lease or its life: a released lock's row is freed in place, keeping its last
/// fencing token, as a freed Redis record does until it expires).
async fn postgres_rows_left(session: &tokio_postgres::Client, prefix: &str) -> Vec<(String, i64)> {
    let rows = session
        .query(
            "WITH c AS (SELECT clock_timestamp() - interval '1 minute' AS swept) \
             SELECT key, floor(extract(epoch FROM expires_at - c.swept) * 1000)::bigint FROM distlock.locks, c \
             WHERE starts_with(key, $1) AND expires_at > c.swept \
             UNION ALL SELECT key || ':waiter', floor(extract(epoch FROM until - c.swept) * 1000)::bigint \
             FROM distlock.waiters, c WHERE starts_with(key, $1) AND until > c.swept ORDER BY 1",
            &[&prefix],
        )
        .await
        .expect("the rows left");
    rows.iter().map(|r| (r.get(0), r.get(1))).collect()
}

async fn redlock_client<'a>(
    servers: impl IntoIterator<Item = &'a RedisServer>,
    configure: impl FnOnce(ClientBuilder) -> ClientBuilder,
) -> Client {
    let urls: Vec<String> = servers.into_iter().map(RedisServer::url).collect();
    configure(Client::builder().redlock(urls.clone()))
        .build()
        .await
        .unwrap_or_else(|e| panic!("redlock client for {urls:?}: {e}"))
}

async fn cluster_client(
    cluster: &RedisCluster,
    prefix: &str,
    configure: impl FnOnce(ClientBuilder) -> ClientBuilder,
) -> Client {
    configure(Client::builder().redis_cluster(cluster.seeds()).key_prefix(prefix))
        .build()
        .await
        .unwrap_or_else(|e| panic!("client for the cluster: {e}"))
}

/// Awaits `fut`, panicking with `what` if it takes longer than `limit`.
pub async fn within<F: Future>(limit: Duration, what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {limit:?}: {what}"),
    }
}

/// Polls `cond` every 10 ms until it is true, panicking with `what` after `limit`.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    while !cond().await {
        if tokio::time::Instant::now() >= deadline {
            panic!("not true after {limit:?}: {what}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether someone outside any lock body (a freshly spawned task) fails to take `key` at once.
/// If it does get the lock, that is a test failure anyway, so the guard is just dropped.
pub async fn busy_for_outsiders(client: &Client, key: &str) -> bool {
    let client = client.clone();
    let key = key.to_owned();
    tokio::spawn(async move { client.lock(key).try_acquire().await })
        .await
        .expect("outsider task")
        .expect("outsider try_acquire")
        .is_none()
}
