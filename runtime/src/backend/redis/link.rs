//! The connection the Redis backend sends its scripts on: one server's `ConnectionManager`; a Redis
//! Cluster's `ClusterConnection`, which routes each script call to the node of its first key (every key of
//! one lock shares that key's hash slot, see [`LockKeys`](crate::backend::LockKeys)); or, behind Sentinel, a
//! `ConnectionManager` to whichever server the sentinels name as the primary.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock, PoisonError, RwLock};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, RedisResult, ToRedisArgs, Value};
use tokio::time::Instant;

/// A command connection of any kind; cheap to clone (each is a handle to multiplexed connections).
#[derive(Clone)]
pub(super) enum Link {
    /// One server: a standalone Redis or a replicated primary.
    One(ConnectionManager),
    /// A Redis Cluster: one connection per node, calls routed by key; rebuilt when calls time out.
    Cluster(Arc<Rebuilding<ClusterConnection>>),
    /// The primary the sentinels name; rebuilt, after asking them again, when it fails or is demoted.
    Sentinel(Arc<Rebuilding<ConnectionManager>>),
}

/// Makes a new connection (a cluster's, or to the primary the sentinels name now).
pub(super) type Connect<C> = Box<dyn Fn() -> Pin<Box<dyn Future<Output = RedisResult<C>> + Send>> + Send + Sync>;

/// A connection that is replaced by a new one when a call fails in a way that says the old one points at
/// the wrong server:
/// - on a cluster, a timeout. The redis crate routes around a node that refuses or drops connections, but not
///   around a hung one (a stopped process whose sockets stay open): every call to its slots times out, even
///   after a replica took them over, because a timeout refreshes nothing. A new connection reads the slot map
///   afresh.
/// - behind Sentinel, any connection failure, timeout or `READONLY` (the server was demoted): the crate
///   resolves the primary once and never follows a failover, so a new connection asks the sentinels again.
pub(super) struct Rebuilding<C> {
    current: RwLock<C>,
    connect: Connect<C>,
    /// Which failures call for a new connection.
    stale: fn(&RedisError) -> bool,
    /// When the last rebuild started; one at a time, at most one per [`MIN_REBUILD_INTERVAL`].
    last_rebuild: tokio::sync::Mutex<Option<Instant>>,
    connect_timeout: Duration,
    /// Told after each rebuild (the subscriber resubscribes and makes its waiters retry).
    on_rebuilt: OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// Where it connects, password redacted, for the log.
    server: String,
}

/// Rebuilds are spaced at least this far apart: a failover takes seconds, and each rebuild reconnects.
const MIN_REBUILD_INTERVAL: Duration = Duration::from_millis(250);

/// On a cluster, only a timeout means a node the crate will not route around.
pub(super) fn cluster_stale(e: &RedisError) -> bool {
    e.is_timeout()
}

/// Behind Sentinel, the primary may have moved whenever it stops answering or refuses writes.
pub(super) fn sentinel_stale(e: &RedisError) -> bool {
    e.is_timeout()
        || e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
}

impl<C: Clone + Send + Sync + 'static> Rebuilding<C> {
    pub(super) fn new(
        connection: C,
        connect: Connect<C>,
        stale: fn(&RedisError) -> bool,
        connect_timeout: Duration,
        server: String,
    ) -> Arc<Self> {
        Arc::new(Self {
            current: RwLock::new(connection),
            connect,
            stale,
            last_rebuild: tokio::sync::Mutex::new(None),
            connect_timeout,
            on_rebuilt: OnceLock::new(),
            server,
        })
    }

    /// Calls `f` after every rebuild.
    pub(super) fn on_rebuilt(&self, f: impl Fn() + Send + Sync + 'static) {
        let _ = self.on_rebuilt.set(Box::new(f));
    }

    fn connection(&self) -> C {
        self.current.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// After a call: if it failed in a way that says the connection is stale, rebuild in the background.
    fn note<T>(self: &Arc<Self>, result: &RedisResult<T>) {
        if result.as_ref().is_err_and(|e| (self.stale)(e)) {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(Arc::clone(self).rebuild());
            }
        }
    }

    async fn rebuild(self: Arc<Self>) {
        let Ok(mut last) = self.last_rebuild.try_lock() else { return };
        if last.is_some_and(|at| at.elapsed() < MIN_REBUILD_INTERVAL) {
            return;
        }
        *last = Some(Instant::now());
        match tokio::time::timeout(self.connect_timeout * 2, (self.connect)()).await {
            Ok(Ok(connection)) => {
                *self.current.write().unwrap_or_else(PoisonError::into_inner) = connection;
                tracing::warn!(server = %self.server, "distlock: calls failed; reconnected and looked up the servers again");
                if let Some(f) = self.on_rebuilt.get() {
                    f();
                }
            }
            Ok(Err(e)) => {
                tracing::warn!(server = %self.server, error = %e, "distlock: calls failed and reconnecting failed; trying again on the next failure")
            }
            Err(_) => {
                tracing::warn!(server = %self.server, "distlock: calls failed and reconnecting timed out; trying again on the next failure")
            }
        }
    }

    /// `call` on the current connection, noting its outcome.
    fn run<'a, T: Send + 'a>(
        self: &Arc<Self>,
        call: impl FnOnce(C) -> Pin<Box<dyn Future<Output = RedisResult<T>> + Send + 'a>> + Send + 'a,
    ) -> RedisFuture<'a, T> {
        let this = Arc::clone(self);
        Box::pin(async move {
            let result = call(this.connection()).await;
            this.note(&result);
            result
        })
    }
}

impl Link {
    pub(super) fn is_cluster(&self) -> bool {
        matches!(self, Link::Cluster(_))
    }

    /// Runs `cmd` (one without keys, such as `WAIT`) on the server that holds `key`: on a cluster, the
    /// primary serving `key`'s slot; otherwise the one server.
    pub(super) async fn query_on_node_of<T: redis::FromRedisValue>(&self, cmd: Cmd, key: &str) -> RedisResult<T> {
        match self {
            Link::Cluster(link) => {
                use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
                let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::with_key(
                    key,
                    SlotAddr::Master,
                )));
                let result = link.connection().route_command(cmd, route).await;
                link.note(&result);
                Ok(redis::from_redis_value(result?)?)
            }
            other => cmd.query_async(&mut other.clone()).await,
        }
    }

    /// On a cluster, its primaries' addresses (host, port), as `CLUSTER SLOTS` names them; `None` on one server.
    pub(super) async fn cluster_primaries(&self) -> RedisResult<Option<Vec<(String, u16)>>> {
        let Link::Cluster(link) = self else { return Ok(None) };
        use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
        let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary);
        let result = link.connection().route_command(redis::cmd("CLUSTER").arg("SLOTS").clone(), route).await;
        link.note(&result);
        // Each range: [start, end, [host, port, id, ..], replicas..].
        let ranges: Vec<Vec<Value>> = redis::from_redis_value(result?)?;
        let mut primaries: Vec<(String, u16)> = Vec::new();
        for range in ranges {
            let Some(primary) = range.into_iter().nth(2) else { continue };
            let (host, port): (String, u16) = match redis::from_redis_value::<Vec<Value>>(primary)?.as_slice() {
                [host, port, ..] => (redis::from_redis_value(host.clone())?, redis::from_redis_value(port.clone())?),
                _ => continue,
            };
            if !primaries.contains(&(host.clone(), port)) {
                primaries.push((host, port));
            }
        }
        Ok(Some(primaries))
    }

    /// Runs `cmd` on the cluster node at `host:port` (for a command about that node alone, such as SCAN);
    /// on one server, on that server.
    pub(super) async fn query_on_address<T: redis::FromRedisValue>(
        &self,
        cmd: Cmd,
        host: &str,
        port: u16,
    ) -> RedisResult<T> {
        match self {
            Link::Cluster(link) => {
                use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
                let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host: host.to_owned(), port });
                let result = link.connection().route_command(cmd, route).await;
                link.note(&result);
                Ok(redis::from_redis_value(result?)?)
            }
            other => cmd.query_async(&mut other.clone()).await,
        }
    }

    /// SUBSCRIBE on the connection (on a cluster, moved with its channel's slot; announcements are published
    /// cluster-wide, so any node hears them).
    pub(super) async fn subscribe(&mut self, channels: impl ToRedisArgs + Send + Sync) -> RedisResult<()> {
        match self {
            Link::One(conn) => conn.subscribe(channels).await,
            Link::Cluster(link) => link.connection().subscribe(channels).await,
            Link::Sentinel(link) => link.connection().subscribe(channels).await,
        }
    }

    pub(super) async fn unsubscribe(&mut self, channels: impl ToRedisArgs + Send + Sync) -> RedisResult<()> {
        match self {
            Link::One(conn) => conn.unsubscribe(channels).await,
            Link::Cluster(link) => link.connection().unsubscribe(channels).await,
            Link::Sentinel(link) => link.connection().unsubscribe(channels).await,
        }
    }
}

impl ConnectionLike for Link {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Link::One(conn) => conn.req_packed_command(cmd),
            Link::Cluster(link) => link.run(move |mut c| Box::pin(async move { c.req_packed_command(cmd).await })),
            Link::Sentinel(link) => link.run(move |mut c| Box::pin(async move { c.req_packed_command(cmd).await })),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Link::One(conn) => conn.req_packed_commands(cmd, offset, count),
            Link::Cluster(link) => {
                link.run(move |mut c| Box::pin(async move { c.req_packed_commands(cmd, offset, count).await }))
            }
            Link::Sentinel(link) => {
                link.run(move |mut c| Box::pin(async move { c.req_packed_commands(cmd, offset, count).await }))
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Link::One(conn) => conn.get_db(),
            Link::Cluster(_) => 0,
            Link::Sentinel(link) => link.connection().get_db(),
        }
    }
}

impl super::batch::Transport for Link {
    async fn call(&self, ops: &[super::batch::Op<'_>]) -> RedisResult<Value> {
        super::send_script(&mut self.clone(), |by_source| super::batch::command(ops, by_source)).await
    }
}
