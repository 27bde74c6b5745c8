//! The connection the Redis backend sends its scripts on: one server's `ConnectionManager`, or a Redis
//! Cluster's `ClusterConnection`, which routes each script call to the node of its first key (every key of
//! one lock shares that key's hash slot, see [`LockKeys`](crate::backend::LockKeys)).

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, ToRedisArgs, Value};

/// A command connection of either kind; cheap to clone (both are handles to one multiplexed connection).
#[derive(Clone)]
pub(super) enum Link {
    /// One server: a standalone Redis or a replicated primary.
    One(ConnectionManager),
    /// A Redis Cluster: one connection per node, calls routed by key.
    Cluster(ClusterConnection),
}

impl Link {
    pub(super) fn is_cluster(&self) -> bool {
        matches!(self, Link::Cluster(_))
    }

    /// SUBSCRIBE; on a cluster, to the node that owns the channel's slot (announcements are published
    /// cluster-wide, so any node would hear them), moved with it when the topology changes.
    pub(super) async fn subscribe(&mut self, channels: impl ToRedisArgs + Send + Sync) -> RedisResult<()> {
        match self {
            Link::One(conn) => conn.subscribe(channels).await,
            Link::Cluster(conn) => conn.subscribe(channels).await,
        }
    }

    pub(super) async fn unsubscribe(&mut self, channels: impl ToRedisArgs + Send + Sync) -> RedisResult<()> {
        match self {
            Link::One(conn) => conn.unsubscribe(channels).await,
            Link::Cluster(conn) => conn.unsubscribe(channels).await,
        }
    }
}

impl ConnectionLike for Link {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Link::One(conn) => conn.req_packed_command(cmd),
            Link::Cluster(conn) => conn.req_packed_command(cmd),
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
            Link::Cluster(conn) => conn.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Link::One(conn) => conn.get_db(),
            Link::Cluster(conn) => conn.get_db(),
        }
    }
}

impl super::batch::Transport for ClusterConnection {
    async fn call(&self, ops: &[super::batch::Op<'_>]) -> RedisResult<Value> {
        super::send_script(&mut self.clone(), |by_source| super::batch::command(ops, by_source)).await
    }
}
