//! The connection the Redis backend sends its scripts on: one server's `ConnectionManager`, or a Redis
//! Cluster's `ClusterConnection`, which routes each script call to the node of its first key (every key of
//! one lock shares that key's hash slot, see [`LockKeys`](crate::backend::LockKeys)).

use std::sync::{Arc, OnceLock, PoisonError, RwLock};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, ToRedisArgs, Value};
use tokio::time::Instant;

/// A command connection of either kind; cheap to clone (both are handles to one multiplexed connection).
#[derive(Clone)]
pub(super) enum Link {
    /// One server: a standalone Redis or a replicated primary.
    One(ConnectionManager),
    /// A Redis Cluster: one connection per node, calls routed by key.
    Cluster(Arc<ClusterLink>),
}

/// A cluster connection that is rebuilt when calls time out. The redis crate routes around a node that
/// refuses or drops connections, but not around a hung one (a stopped process whose sockets stay open):
/// every call to its slots times out, even after a replica took them over, because a timeout refreshes
/// nothing. A new connection reads the slot map afresh.
pub(super) struct ClusterLink {
    client: ClusterClient,
    current: RwLock<ClusterConnection>,
    /// When the last rebuild started; one at a time, at most one per [`MIN_REBUILD_INTERVAL`].
    last_rebuild: tokio::sync::Mutex<Option<Instant>>,
    connect_timeout: Duration,
    /// Told after each rebuild (the subscriber resubscribes and makes its waiters retry).
    on_rebuilt: OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// The seeds, password redacted, for the log.
    server: String,
}

/// Rebuilds are spaced at least this far apart: a failover takes seconds, and each rebuild reconnects to
/// every node.
const MIN_REBUILD_INTERVAL: Duration = Duration::from_millis(250);

impl ClusterLink {
    pub(super) fn new(
        client: ClusterClient,
        connection: ClusterConnection,
        connect_timeout: Duration,
        server: String,
    ) -> Arc<Self> {
        Arc::new(Self {
            client,
            current: RwLock::new(connection),
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

    fn connection(&self) -> ClusterConnection {
        self.current.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// After a failed call: a timeout may mean a hung node, so rebuild in the background.
    fn note(self: &Arc<Self>, result: &RedisResult<impl Sized>) {
        if result.as_ref().is_err_and(redis::RedisError::is_timeout) {
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
        match tokio::time::timeout(self.connect_timeout * 2, self.client.get_async_connection()).await {
            Ok(Ok(connection)) => {
                *self.current.write().unwrap_or_else(PoisonError::into_inner) = connection;
                tracing::warn!(server = %self.server, "distlock: cluster calls timed out; reconnected to the cluster and read its slots again");
                if let Some(f) = self.on_rebuilt.get() {
                    f();
                }
            }
            Ok(Err(e)) => {
                tracing::warn!(server = %self.server, error = %e, "distlock: cluster calls timed out and reconnecting failed; retrying on the next timeout")
            }
            Err(_) => {
                tracing::warn!(server = %self.server, "distlock: cluster calls timed out and reconnecting timed out; retrying on the next timeout")
            }
        }
    }
}

impl Link {
    pub(super) fn is_cluster(&self) -> bool {
        matches!(self, Link::Cluster(_))
    }

    /// SUBSCRIBE; on a cluster, through the current connection, which moves the subscription with its
    /// channel's slot (announcements are published cluster-wide, so any node hears them).
    pub(super) async fn subscribe(&mut self, channels: impl ToRedisArgs + Send + Sync) -> RedisResult<()> {
        match self {
            Link::One(conn) => conn.subscribe(channels).await,
            Link::Cluster(link) => link.connection().subscribe(channels).await,
        }
    }

    pub(super) async fn unsubscribe(&mut self, channels: impl ToRedisArgs + Send + Sync) -> RedisResult<()> {
        match self {
            Link::One(conn) => conn.unsubscribe(channels).await,
            Link::Cluster(link) => link.connection().unsubscribe(channels).await,
        }
    }
}

impl ConnectionLike for Link {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Link::One(conn) => conn.req_packed_command(cmd),
            Link::Cluster(link) => {
                let link = Arc::clone(link);
                Box::pin(async move {
                    let result = link.connection().req_packed_command(cmd).await;
                    link.note(&result);
                    result
                })
            }
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
                let link = Arc::clone(link);
                Box::pin(async move {
                    let result = link.connection().req_packed_commands(cmd, offset, count).await;
                    link.note(&result);
                    result
                })
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Link::One(conn) => conn.get_db(),
            Link::Cluster(_) => 0,
        }
    }
}

impl super::batch::Transport for Link {
    async fn call(&self, ops: &[super::batch::Op<'_>]) -> RedisResult<Value> {
        super::send_script(&mut self.clone(), |by_source| super::batch::command(ops, by_source)).await
    }
}
