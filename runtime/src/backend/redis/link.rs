//! The connection the Redis backend sends its scripts on: one server's `ConnectionManager`; a Redis
//! Cluster's `ClusterConnection`, which routes each script call to the node of its first key (every key of
//! one lock shares that key's hash slot, see [`LockKeys`](crate::backend::LockKeys)); or, behind Sentinel, a
//! `ConnectionManager` to whichever server the sentinels name as the primary.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, PoisonError, RwLock};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, RedisResult, Value};
use tokio::time::Instant;

use super::numbered::{is_out_of_step, numbered, numbered_pipeline, replies_to, reply_to};
use super::scripts::{Frame, LuaScript};

/// A command connection of any kind, and its epoch; cheap to clone (each is a handle to multiplexed
/// connections).
#[derive(Clone)]
pub(super) struct Link {
    conn: Conn,
    epoch: Epoch,
}

/// Counts the times the connections under a link may have been replaced: a call failed in a way after which
/// the redis crate (or [`Rebuilding`]) reconnects, a rebuild, or a disconnection pushed to the subscriber. A
/// `WAIT` counts the writes made on the connection it is sent on; one sent after a reconnect is on a new
/// connection that made none, and answers "every replica has them" for writes it never saw (found by the
/// simulation: redis+replicas seed 6723, a renewal counted across a failover). So a write counts as
/// acknowledged only if the epoch did not move between the write being sent and the `WAIT`'s answer.
#[derive(Clone, Default)]
pub(super) struct Epoch(Arc<AtomicU64>);

impl Epoch {
    pub(super) fn now(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    pub(super) fn bump(&self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }

    /// After a call: a failure after which the connection may be replaced moves the epoch.
    fn note<T>(&self, result: &RedisResult<T>) {
        if result.as_ref().is_err_and(|e| {
            e.is_unrecoverable_error() || e.is_io_error() || e.is_connection_dropped() || e.is_timeout()
        }) {
            self.bump();
        }
    }
}

/// The connection under a [`Link`].
#[derive(Clone)]
pub(super) enum Conn {
    /// One server: a standalone Redis or a replicated primary.
    One(ConnectionManager),
    /// A Redis Cluster: one connection per node, calls routed by key; rebuilt when calls time out.
    Cluster(Arc<Rebuilding<ClusterConnection>>),
    /// The primary the sentinels name; rebuilt, after asking them again, when it fails or is demoted.
    Sentinel(Arc<Rebuilding<ConnectionManager>>),
    /// A connection to a simulated redis-server, through the deterministic simulation's network (tests only).
    #[cfg(feature = "simulation")]
    Simulated(crate::simulation::Connection),
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
    /// How long making a new connection may take.
    connect_limit: Duration,
    /// Told after each rebuild (the subscriber resubscribes and makes its waiters retry).
    on_rebuilt: OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// Where it connects, password redacted, for the log.
    server: String,
    /// The epoch of the links over it, moved by each rebuild.
    epoch: Epoch,
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
        connect_limit: Duration,
        server: String,
        epoch: Epoch,
    ) -> Arc<Self> {
        Arc::new(Self {
            current: RwLock::new(connection),
            connect,
            stale,
            last_rebuild: tokio::sync::Mutex::new(None),
            connect_limit,
            on_rebuilt: OnceLock::new(),
            server,
            epoch,
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
            self.replace();
        }
    }

    async fn rebuild(self: Arc<Self>) {
        let Ok(mut last) = self.last_rebuild.try_lock() else { return };
        if last.is_some_and(|at| at.elapsed() < MIN_REBUILD_INTERVAL) {
            return;
        }
        *last = Some(Instant::now());
        match tokio::time::timeout(self.connect_limit, (self.connect)()).await {
            Ok(Ok(connection)) => {
                *self.current.write().unwrap_or_else(PoisonError::into_inner) = connection;
                self.epoch.bump();
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

    /// Replaces the connection now (in the background, unless one was made a moment ago).
    fn replace(self: &Arc<Self>) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            crate::hooks::spawn_on(&runtime, Arc::clone(self).rebuild());
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
    pub(super) fn new(conn: Conn, epoch: Epoch) -> Self {
        Self { conn, epoch }
    }

    /// The epoch now: read before a write, compared after its `WAIT` ([`Epoch`]).
    pub(super) fn epoch(&self) -> u64 {
        self.epoch.now()
    }

    pub(super) fn is_cluster(&self) -> bool {
        matches!(self.conn, Conn::Cluster(_))
    }

    /// Runs `cmd` (one without keys, such as `WAIT`) on the server that holds `key`: on a cluster, the
    /// primary serving `key`'s slot; otherwise the one server.
    pub(super) async fn query_on_node_of<T: redis::FromRedisValue>(&self, cmd: Cmd, key: &str) -> RedisResult<T> {
        match &self.conn {
            Conn::Cluster(link) => {
                use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
                let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::with_key(
                    key,
                    SlotAddr::Master,
                )));
                // Boxed: the crate's routing future is about 1.4 KB, and this method's future is part of every
                // grant's (WAIT) and acquire's (the slot map) even where neither runs; a call that does go this
                // way is a round trip to a node, next to which one allocation is nothing.
                let result = Box::pin(link.connection().route_command(cmd, route)).await;
                link.note(&result);
                Ok(redis::from_redis_value(result?)?)
            }
            _ => cmd.query_async(&mut self.clone()).await,
        }
    }

    /// On a cluster, its primaries' addresses (host, port), as `CLUSTER SLOTS` names them; `None` on one server.
    pub(super) async fn cluster_primaries(&self) -> RedisResult<Option<Vec<(String, u16)>>> {
        let Conn::Cluster(link) = &self.conn else { return Ok(None) };
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
        match &self.conn {
            Conn::Cluster(link) => {
                use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
                let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host: host.to_owned(), port });
                let result = Box::pin(link.connection().route_command(cmd, route)).await;
                link.note(&result);
                Ok(redis::from_redis_value(result?)?)
            }
            _ => cmd.query_async(&mut self.clone()).await,
        }
    }

    /// Subscribes to `channel`: SUBSCRIBE; on a cluster SSUBSCRIBE (sharded pub/sub, where the scripts
    /// SPUBLISH), sent to the primary of the channel's slot and moved with it when the topology changes.
    pub(super) async fn subscribe(&mut self, channel: &[u8]) -> RedisResult<()> {
        match &mut self.conn {
            Conn::One(conn) => conn.subscribe(channel).await,
            Conn::Cluster(link) => link.connection().ssubscribe(channel).await,
            Conn::Sentinel(link) => link.connection().subscribe(channel).await,
            #[cfg(feature = "simulation")]
            Conn::Simulated(conn) => conn.subscribe(&[channel.to_vec()]).await,
        }
    }

    /// Subscribes to every one of `channels` again: in one SUBSCRIBE; on a cluster one SSUBSCRIBE per channel
    /// (one command's channels must share a slot), all at once. Fails if any failed; subscribing twice is
    /// harmless, so all are sent again on the next attempt.
    pub(super) async fn subscribe_all(&mut self, channels: &[Vec<u8>]) -> RedisResult<()> {
        match &mut self.conn {
            Conn::One(conn) => conn.subscribe(channels).await,
            Conn::Cluster(link) => {
                let conn = link.connection();
                let each = channels.iter().map(|channel| {
                    let mut conn = conn.clone();
                    async move { conn.ssubscribe(channel).await }
                });
                futures_util::future::join_all(each).await.into_iter().collect()
            }
            Conn::Sentinel(link) => link.connection().subscribe(channels).await,
            #[cfg(feature = "simulation")]
            Conn::Simulated(conn) => conn.subscribe(channels).await,
        }
    }

    /// Unsubscribes from `channel` (SUNSUBSCRIBE on a cluster).
    pub(super) async fn unsubscribe(&mut self, channel: &[u8]) -> RedisResult<()> {
        match &mut self.conn {
            Conn::One(conn) => conn.unsubscribe(channel).await,
            Conn::Cluster(link) => link.connection().sunsubscribe(channel).await,
            Conn::Sentinel(link) => link.connection().unsubscribe(channel).await,
            #[cfg(feature = "simulation")]
            Conn::Simulated(conn) => conn.unsubscribe(channel).await,
        }
    }

    /// The text of `script` as this connection sends it (for `SCRIPT LOAD`): the numbered variant on a
    /// connection that carries subscriptions, with SPUBLISH on a cluster.
    pub(super) fn script_source(&self, script: &LuaScript) -> &'static str {
        script.sent_as(self.frame()).1
    }

    /// The frame this connection's script calls go in: none on one server's (or a simulated one), whose
    /// subscriptions have a connection of their own; numbered where the connection carries them too.
    pub(super) fn frame(&self) -> Option<Frame> {
        match &self.conn {
            Conn::One(_) => None,
            Conn::Cluster(_) => Some(Frame::Sharded),
            Conn::Sentinel(_) => Some(Frame::Numbered),
            #[cfg(feature = "simulation")]
            Conn::Simulated(_) => None,
        }
    }
}

impl Link {
    fn send<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(self.send_noted(cmd))
    }

    /// The script's own reply to `cmd`, a call built in this connection's frame whose number is `call`; a
    /// reply that answers another call replaces the connection and is an out-of-step error.
    pub(super) async fn send_framed(&mut self, cmd: &Cmd, call: &str) -> RedisResult<Value> {
        let answer = reply_to(call, self.send_noted(cmd).await?);
        if answer.as_ref().is_err_and(is_out_of_step) {
            self.out_of_step();
        }
        answer
    }

    /// `cmd` sent as it is, and the epoch moved if the call failed in a way that may replace the connection.
    /// Script calls on a connection without a frame go this way, without the box [`send`](Self::send) puts
    /// around each command: one allocation a call less on the lock path.
    pub(super) async fn send_noted(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        let epoch = self.per_call_epoch();
        let result = self.send_on_conn(cmd).await;
        if let Some(epoch) = &epoch {
            epoch.note(&result);
        }
        result
    }

    /// The epoch a failed call moves: none on a cluster, where a call fails on one node while the epoch is
    /// the whole link's (a rebuild still moves it). Moving it there made a failing shard's errors count every
    /// healthy shard's concurrent writes as unacknowledged (`NotReplicated` on a healthy shard during a
    /// failover: `cluster_failover.rs`). What stays unguarded on a cluster: one node's connection replaced by
    /// the redis crate between a write and its `WAIT`, as before the epoch existed, until it is kept per node.
    fn per_call_epoch(&self) -> Option<Epoch> {
        (!matches!(self.conn, Conn::Cluster(_))).then(|| self.epoch.clone())
    }

    fn send_all<'a>(&'a mut self, cmd: &'a Pipeline, offset: usize, count: usize) -> RedisFuture<'a, Vec<Value>> {
        let epoch = self.per_call_epoch();
        let call = self.send_all_on_conn(cmd, offset, count);
        Box::pin(async move {
            let result = call.await;
            if let Some(epoch) = &epoch {
                epoch.note(&result);
            }
            result
        })
    }

    fn send_on_conn<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match &mut self.conn {
            Conn::One(conn) => conn.req_packed_command(cmd),
            Conn::Cluster(link) => link.run(move |mut c| Box::pin(async move { c.req_packed_command(cmd).await })),
            Conn::Sentinel(link) => link.run(move |mut c| Box::pin(async move { c.req_packed_command(cmd).await })),
            #[cfg(feature = "simulation")]
            Conn::Simulated(conn) => Box::pin(conn.send(cmd)),
        }
    }

    fn send_all_on_conn<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match &mut self.conn {
            Conn::One(conn) => conn.req_packed_commands(cmd, offset, count),
            Conn::Cluster(link) => {
                link.run(move |mut c| Box::pin(async move { c.req_packed_commands(cmd, offset, count).await }))
            }
            Conn::Sentinel(link) => {
                link.run(move |mut c| Box::pin(async move { c.req_packed_commands(cmd, offset, count).await }))
            }
            #[cfg(feature = "simulation")]
            Conn::Simulated(conn) => Box::pin(conn.send_all(cmd, offset, count)),
        }
    }

    /// After a reply that answered another call: the connection's replies are out of step with its calls, so
    /// it is replaced.
    fn out_of_step(&self) {
        tracing::warn!("distlock: a reply answered another call; the call is sent again on a new connection");
        match &self.conn {
            Conn::One(_) => {}
            Conn::Cluster(link) => link.replace(),
            Conn::Sentinel(link) => link.replace(),
            #[cfg(feature = "simulation")]
            Conn::Simulated(_) => {}
        }
    }
}

impl ConnectionLike for Link {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let numbered = self.frame().and_then(|frame| numbered(cmd, frame));
        let Some((numbered, call)) = numbered else { return self.send(cmd) };
        Box::pin(async move { self.send_framed(&numbered, &call).await })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let numbered = self.frame().and_then(|frame| numbered_pipeline(cmd, frame));
        let Some((pipeline, calls)) = numbered else { return self.send_all(cmd, offset, count) };
        Box::pin(async move {
            let answers = replies_to(&calls, offset, self.send_all(&pipeline, offset, count).await?);
            if answers.is_err() {
                // Every call of the pipeline fails: a reply that answers another call says nothing of this one's.
                self.out_of_step();
            }
            answers
        })
    }

    fn get_db(&self) -> i64 {
        match &self.conn {
            Conn::One(conn) => conn.get_db(),
            Conn::Cluster(_) => 0,
            Conn::Sentinel(link) => link.connection().get_db(),
            #[cfg(feature = "simulation")]
            Conn::Simulated(_) => 0,
        }
    }
}

impl super::batch::Transport for Link {
    async fn call(&self, ops: &[super::batch::Op<'_>]) -> RedisResult<Value> {
        super::send_script(&mut self.clone(), |sending| super::batch::command(ops, sending)).await
    }
}
