//! The Redis backend: every operation is one Lua script call (one round trip), keys and values passed only
//! through KEYS and ARGV. Waiters queue in Redis and hear hand-overs on one shared RESP3 subscriber connection.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use redis::{Cmd, FromRedisValue, Value};

use self::errors::redis_error;
use super::{Attempt, Capabilities, Fencing, Hold, LockKeys, Place, Queueing, ReleaseWatch, Renewal, Scan};
use super::{Store, WakeUps};
use crate::{LockError, LockInfo, LockToken, ReleaseOutcome};

use self::batch::{Coalescer, Op, Reply};
use self::link::Link;
pub(crate) use self::listing::RedisCursor;
use self::scripts::record::split_holder;
use self::scripts::reply::{attempt_of, release_outcome, remaining_of, renew_outcome, withdrawn};
use self::scripts::{LuaScript, FORCE_UNLOCK, INFO, REMAINING, RENEW, RENEW_MANY, WITHDRAW};
use self::send::{is_cluster_in_flux, is_noscript, send_script, Sending};
use self::subscriber::Subscriber;

mod batch;
mod cluster_nodes;
mod config_errors;
mod connect;
pub(crate) mod errors;
mod link;
mod listing;
mod multi_key;
mod numbered;
mod plain;
mod scripts;
mod send;
#[cfg(feature = "simulation")]
pub(crate) use self::scripts::script_name;
#[cfg(feature = "simulation")]
mod simulated;
mod subscriber;
mod window;

#[cfg(feature = "simulation")]
pub(crate) use batch::batch_arity;
#[cfg(feature = "simulation")]
pub(crate) use scripts::sources as script_sources;

/// Locks renewed per RENEW_MANY call: one call holds redis-server for about a microsecond per lock.
const RENEWALS_PER_CALL: usize = 256;

/// What connecting needs from the builder.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnectSettings<'a> {
    pub(crate) timeouts: Timeouts,
    pub(crate) prefix: &'a str,
    /// Who this client is, in every record it writes.
    pub(crate) owner: &'a str,
    pub(crate) allow_insecure_tls: bool,
    pub(crate) replicas: Option<ReplicaAcks>,
}

/// Grants and renewals count only once this many replicas have acknowledged them (Redis `WAIT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplicaAcks {
    pub(crate) count: u32,
    pub(crate) timeout: Duration,
}

/// Connection settings shared by the command and subscriber connections.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    pub(crate) connect: Duration,
    pub(crate) response: Duration,
}

/// Where acquires and releases go: on one server, through the coalescer (concurrent ones share a script call);
/// on a cluster, through a coalescer per node, whose shared calls are BATCH_SPREAD (`cluster_nodes.rs`).
enum Hot {
    Coalesced(Arc<Coalescer<Link>>),
    /// A cluster's: a coalescer per node.
    PerNode(cluster_nodes::PerNode),
}

impl Hot {
    async fn run(&self, op: &Op<'_>) -> Reply {
        match self {
            Hot::Coalesced(coalescer) => coalescer.run(op).await,
            // Boxed: a cluster's path wraps a coalescer's call in slot-map lookups, and inline it would enlarge
            // every acquire's and release's future (moved whole on every call) on one server too.
            Hot::PerNode(nodes) => Box::pin(nodes.run(op)).await,
        }
    }
}

pub(crate) struct RedisBackend {
    /// The URL with any password replaced, for messages.
    server: String,
    commands: Link,
    /// Acquires and releases, which share script calls under load.
    hot: Hot,
    subscriber: Subscriber,
    replicas: Option<ReplicaAcks>,
    /// The client's owner name, in every record it writes.
    owner: Arc<str>,
    /// In a Redlock group ([`Self::plain`]): grants without a queue or a fencing token, and the key of this
    /// server's lock-state mark (plain.rs).
    plain: Option<Arc<str>>,
    /// On a cluster, which node serves each slot (cluster_nodes.rs).
    node_map: Arc<cluster_nodes::NodeMap>,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend").field("server", &self.server).finish_non_exhaustive()
    }
}

impl RedisBackend {
    /// One attempt, as [`Store::acquire`] describes it; on a Redlock group's server, a grant's fence is the age
    /// of the server's lock state (plain.rs).
    async fn attempt(
        &self,
        keys: &LockKeys,
        token: &LockToken,
        ttl: Duration,
        metadata: &str,
        queueing: Option<Queueing>,
    ) -> Result<Attempt, LockError> {
        let op = Op::Acquire {
            record: Cow::Borrowed(&keys.record),
            token: token.clone(),
            ttl_ms: millis(ttl),
            owner: Arc::clone(&self.owner),
            metadata: Cow::Borrowed(metadata),
            queueing,
            plain: self.plain.clone(),
        };
        let epoch = self.commands.epoch();
        let reply = self.hot.run(&op).await.map_err(|e| self.error(keys, e))?;
        let attempt = match attempt_of(reply).map_err(|e| self.error(keys, e))? {
            busy @ Attempt::Busy { .. } => return Ok(busy),
            granted => granted,
        };
        if let Err(e) = self.replicated(keys, epoch).await {
            // Not durable enough to use: give it back (best effort; otherwise it expires). Boxed: this rare
            // path's future would otherwise set the size of every attempt's, moved whole at each level above.
            let _ = Box::pin(self.release(keys, token, None, None)).await;
            return Err(e);
        }
        Ok(attempt)
    }

    /// The server's URL with any password redacted, for messages.
    pub(crate) fn server(&self) -> &str {
        &self.server
    }

    /// Renewals on a cluster, one RENEW_MANY call per slot (a call's keys must share one), all at once: those
    /// that [`renew_on_cluster`](Self::renew_on_cluster)'s calls per node could not make.
    async fn renew_by_slot(&self, items: &[Renewal<'_>]) -> Vec<Result<bool, LockError>> {
        let mut by_slot: std::collections::HashMap<redis::cluster_routing::Slot, Vec<usize>> = Default::default();
        for (i, item) in items.iter().enumerate() {
            by_slot.entry(redis::cluster_routing::Slot::for_key(&item.keys.record)).or_default().push(i);
        }
        let calls = by_slot
            .into_values()
            .flat_map(|indices| indices.chunks(RENEWALS_PER_CALL).map(<[usize]>::to_vec).collect::<Vec<_>>());
        let calls = calls.map(|indices| {
            self.renewal_call(items, indices, |indices, sending| {
                let mut cmd = Cmd::new();
                sending.call(&mut cmd, &RENEW_MANY);
                cmd.arg(indices.len());
                for &i in indices {
                    cmd.arg(&items[i].keys.record);
                }
                for &i in indices {
                    cmd.arg(items[i].token.as_str()).arg(millis(items[i].ttl));
                }
                cmd
            })
        });
        let mut renewed: Vec<Option<Result<bool, LockError>>> = items.iter().map(|_| None).collect();
        for (indices, results) in futures_util::future::join_all(calls).await {
            for (i, result) in indices.into_iter().zip(results) {
                renewed[i] = Some(result);
            }
        }
        renewed
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(LockError::InvalidConfig("renewal not sent".into()))))
            .collect()
    }

    /// One renewal call (`build(indices, sending)`) for the locks `indices` of `items`, all on one node, then
    /// the `WAIT` on that node when replicas must acknowledge: each lock's outcome, in `indices`' order.
    async fn renewal_call(
        &self,
        items: &[Renewal<'_>],
        indices: Vec<usize>,
        build: impl Fn(&[usize], Sending) -> Cmd,
    ) -> (Vec<usize>, Vec<Result<bool, LockError>>) {
        let mut conn = self.commands.clone();
        let epoch = conn.epoch();
        let reply: redis::RedisResult<Value> = send_script(&mut conn, |sending| build(&indices, sending)).await;
        let mut results = Vec::with_capacity(indices.len());
        renewal_results(reply, indices.len(), &mut results);
        let shortfall = match results.iter().any(|r| matches!(r, Ok(true))) {
            true => self.replication_shortfall(&items[indices[0]].keys.record, epoch).await,
            false => Ok(None),
        };
        let results = self.acknowledged(results, indices.iter().map(|&i| &items[i]), &shortfall);
        (indices, results)
    }

    /// Renewals' outcomes once `shortfall`, the `WAIT` after them, is known: a renewal the replicas did not
    /// acknowledge does not count (it is retried); errors name their lock.
    fn acknowledged<'a>(
        &self,
        renewed: Vec<redis::RedisResult<bool>>,
        items: impl Iterator<Item = &'a Renewal<'a>>,
        shortfall: &redis::RedisResult<Option<(u32, u32)>>,
    ) -> Vec<Result<bool, LockError>> {
        renewed
            .into_iter()
            .zip(items)
            .map(|(reply, item)| match (reply, shortfall) {
                (Ok(true), Ok(Some((acknowledged, required)))) => Err(LockError::NotReplicated {
                    key: item.keys.name.clone(),
                    acknowledged: *acknowledged,
                    required: *required,
                }),
                (Ok(true), Err(e)) => Err(self.error(item.keys, e.clone())),
                (reply, _) => reply.map_err(|e| self.error(item.keys, e)),
            })
            .collect()
    }

    fn error(&self, keys: &LockKeys, e: redis::RedisError) -> LockError {
        if !self.commands.is_cluster() && matches!(e.kind(), redis::ErrorKind::Server(redis::ServerErrorKind::Moved)) {
            return LockError::InvalidConfig(format!(
                "{} answered MOVED for lock `{}`: it is a Redis Cluster node; use ClientBuilder::redis_cluster(seeds) for a cluster",
                self.server, keys.name
            ));
        }
        redis_error(&self.server, Some(&keys.name), e).into()
    }

    /// One script call about `keys`'s lock (see [`send_script`]).
    async fn eval<T: FromRedisValue>(
        &self,
        script: &LuaScript,
        keys: &LockKeys,
        build: impl Fn(&mut Cmd),
    ) -> Result<T, LockError> {
        let mut conn = self.commands.clone();
        send_script(&mut conn, |sending| {
            let mut cmd = Cmd::with_capacity(12, 256);
            sending.call(&mut cmd, script);
            build(&mut cmd);
            cmd
        })
        .await
        .map_err(|e| self.error(keys, e))
    }

    /// Whether the writes sent so far on the command connection, since the link's epoch was `epoch`, reached
    /// the required replicas (always true without `wait_for_replicas`). `WAIT` holds the shared connection
    /// until then: keep its timeout short.
    pub(crate) async fn replicated(&self, keys: &LockKeys, epoch: u64) -> Result<(), LockError> {
        match self.replication_shortfall(&keys.record, epoch).await {
            Ok(None) => Ok(()),
            Ok(Some((acknowledged, required))) => {
                Err(LockError::NotReplicated { key: keys.name.clone(), acknowledged, required })
            }
            Err(e) => Err(self.error(keys, e)),
        }
    }

    /// `None` when enough replicas acknowledged (or none are required), else (acknowledged, required). On a
    /// cluster, `WAIT` goes to the node that serves `record` (it counts the writes sent on the connection to
    /// that node); on one server, `record` is not needed. `epoch` is the link's before the write was sent: if
    /// it moved, the `WAIT` may have gone on a new connection that made no write, and its answer says nothing
    /// of the write: none acknowledged.
    async fn replication_shortfall(&self, record: &str, epoch: u64) -> redis::RedisResult<Option<(u32, u32)>> {
        let Some(ReplicaAcks { count, timeout }) = self.replicas else { return Ok(None) };
        let mut wait = redis::cmd("WAIT");
        wait.arg(count).arg(millis(timeout).max(1));
        let acknowledged: u32 = self.commands.query_on_node_of(wait, record).await?;
        let acknowledged = if self.commands.epoch() == epoch { acknowledged } else { 0 };
        Ok((acknowledged < count).then_some((acknowledged, count)))
    }
}

impl Store for RedisBackend {
    type Cursor = RedisCursor;

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fair_queue: self.plain.is_none(),
            wake_ups: WakeUps::Exact,
            fencing: if self.plain.is_some() { Fencing::None } else { Fencing::Monotonic },
            replica_acks: self.replicas.is_some(),
        }
    }

    /// On a Redlock group's server, a grant's fence is 0: the script's reply has the age of the server's lock
    /// state in its place, which only the group reads ([`acquire_plain`](Self::acquire_plain)).
    async fn acquire(
        &self,
        keys: &LockKeys,
        token: &LockToken,
        ttl: Duration,
        metadata: &str,
        queueing: Option<Queueing>,
    ) -> Result<Attempt, LockError> {
        match self.attempt(keys, token, ttl, metadata, queueing).await? {
            Attempt::Granted(hold) if self.plain.is_some() => Ok(Attempt::Granted(Hold { fence: 0, ..hold })),
            attempt => Ok(attempt),
        }
    }

    async fn acquire_free(
        &self,
        locks: &[(&LockKeys, &LockToken)],
        ttl: Duration,
        metadata: &str,
    ) -> Result<Option<Vec<Hold>>, LockError> {
        self.acquire_all_free(locks, ttl, metadata).await
    }

    async fn withdraw(&self, keys: &LockKeys, token: &LockToken) -> Result<Option<Hold>, LockError> {
        let reply: (i64, i64) = self
            .eval(&WITHDRAW, keys, |c| {
                c.arg(1).arg(&keys.record).arg(token.as_str());
            })
            .await?;
        withdrawn(reply).map_err(|e| self.error(keys, e))
    }

    async fn renew(&self, keys: &LockKeys, token: &LockToken, ttl: Duration) -> Result<bool, LockError> {
        let epoch = self.commands.epoch();
        let reply: i64 = self
            .eval(&RENEW, keys, |c| {
                c.arg(1).arg(&keys.record).arg(token.as_str()).arg(millis(ttl));
            })
            .await?;
        let renewed = renew_outcome(reply).map_err(|e| self.error(keys, e))?;
        if renewed {
            self.replicated(keys, epoch).await?;
        }
        Ok(renewed)
    }

    /// On a cluster, the node that serves the lock's slot in the last slot map fetched (its slot, numbered past
    /// every node, when there is none): a node that hangs then holds up only its own locks' renewals.
    fn renewal_shard(&self, keys: &LockKeys) -> u64 {
        if !self.commands.is_cluster() {
            return 0;
        }
        self.node_map.shard_of(&keys.record)
    }

    /// The renewals in one round trip: one RENEW_MANY call per [`RENEWALS_PER_CALL`] locks, pipelined; if the
    /// server lost its script cache, once more as EVAL.
    async fn renew_many(&self, items: &[Renewal<'_>]) -> Result<Vec<Result<bool, LockError>>, LockError> {
        if self.commands.is_cluster() {
            return Ok(self.renew_on_cluster(items).await);
        }
        // Unframed: on a connection that numbers its calls (Sentinel's), the link numbers the pipeline's.
        let pipeline = |by_source: bool| {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for chunk in items.chunks(RENEWALS_PER_CALL) {
                let mut cmd = Cmd::with_capacity(3 + 3 * chunk.len(), 96 * chunk.len());
                Sending { by_source, ..Sending::default() }.call(&mut cmd, &RENEW_MANY);
                cmd.arg(chunk.len());
                for item in chunk {
                    cmd.arg(&item.keys.record);
                }
                for item in chunk {
                    cmd.arg(item.token.as_str()).arg(millis(item.ttl));
                }
                pipe.add_command(cmd);
            }
            pipe
        };
        let mut conn = self.commands.clone();
        let failed = |e| redis_error(&self.server, None, e);
        let epoch = conn.epoch();
        let mut sent = pipeline(false).query_async(&mut conn).await;
        if sent.as_ref().is_err_and(redis::RedisError::is_connection_dropped) {
            // As send_script: once more at once, on the connection the manager makes anew (after a restart of
            // the server, the first call finds the old one closed). Renewing again is harmless.
            sent = pipeline(false).query_async(&mut conn).await;
        }
        let mut replies: Vec<redis::RedisResult<Value>> = sent.map_err(failed)?;
        if replies.iter().any(|r| r.as_ref().is_err_and(is_noscript)) {
            replies = pipeline(true).query_async(&mut conn).await.map_err(failed)?;
        }
        // One reply per lock, in order: each call's results, or its error for each of its locks.
        let mut renewed: Vec<redis::RedisResult<bool>> = Vec::with_capacity(items.len());
        for (reply, chunk) in replies.into_iter().zip(items.chunks(RENEWALS_PER_CALL)) {
            renewal_results(reply, chunk.len(), &mut renewed);
        }
        // One WAIT covers the whole batch: a renewal the replicas did not get does not count (it is retried).
        let shortfall = match items.first() {
            Some(item) => self.replication_shortfall(&item.keys.record, epoch).await,
            None => Ok(None),
        };
        Ok(self.acknowledged(renewed, items.iter(), &shortfall))
    }

    async fn release(
        &self,
        keys: &LockKeys,
        token: &LockToken,
        fence: Option<u64>,
        keep: Option<Duration>,
    ) -> Result<ReleaseOutcome, LockError> {
        // A keep that rounds to 0 ms would mean "delete": keep at least 1 ms.
        let keep_ms = keep.map_or(0, |k| millis(k).max(1));
        let op = Op::Release { record: Cow::Borrowed(&keys.record), token: token.clone(), fence, keep_ms };
        let (code, ..) = self.hot.run(&op).await.map_err(|e| self.error(keys, e))?;
        release_outcome(code).map_err(|e| self.error(keys, e))
    }

    async fn remaining(&self, keys: &LockKeys, token: &LockToken) -> Result<Option<Duration>, LockError> {
        let pttl: i64 = self
            .eval(&REMAINING, keys, |c| {
                c.arg(1).arg(&keys.record).arg(token.as_str());
            })
            .await?;
        remaining_of(pttl).map_err(|e| self.error(keys, e))
    }

    /// INFO replies `{holder, fence, µs since the grant, PTTL, queue length, kept by min_hold}`: the script splits the record
    /// `<token><mark><fence>:<granted>:<holder>` (scripts.rs, "The record"), sends everything but the token, and
    /// the grant's age by the server's clock; the holder field is split here.
    async fn info(&self, keys: &LockKeys) -> Result<Option<LockInfo>, LockError> {
        let info: Option<(String, u64, i64, i64, usize, u8)> = self
            .eval(&INFO, keys, |c| {
                c.arg(1).arg(&keys.record);
            })
            .await?;
        let Some((holder, fencing_token, held_us, pttl, waiting, kept)) = info else { return Ok(None) };
        let (owner, metadata) = split_holder(&holder).ok_or_else(|| self.error(keys, unexpected_reply()))?;
        Ok(Some(LockInfo {
            owner: owner.to_owned(),
            metadata: metadata.to_owned(),
            fencing_token,
            // A step back of the server's clock since the grant reads as a grant made just now.
            held_for: Duration::from_micros(held_us.max(0) as u64),
            remaining_ttl: Duration::from_millis(pttl.max(0) as u64),
            waiting,
            kept_by_min_hold: kept == 1,
        }))
    }

    async fn force_unlock(&self, keys: &LockKeys) -> Result<bool, LockError> {
        let deleted: i64 = self
            .eval(&FORCE_UNLOCK, keys, |c| {
                c.arg(1).arg(&keys.record).arg(super::WAKE_ALL);
            })
            .await?;
        if deleted == 2 {
            tracing::warn!(key = %keys.name, record = %keys.record, "distlock: force_unlock deleted a value distlock did not write at the lock's key");
        }
        Ok(deleted > 0)
    }

    async fn scan(&self, scan: &mut Scan<RedisCursor>, pattern: &str, count: usize) -> Result<Vec<String>, LockError> {
        self.scan_step(scan, pattern, count).await
    }

    async fn waiters(&self, keys: &LockKeys, limit: usize) -> Result<Vec<Place>, LockError> {
        self.queued(keys, limit).await
    }

    async fn watch_releases(&self, keys: &LockKeys, token: &LockToken) -> Result<ReleaseWatch, LockError> {
        self.subscriber.watch(&keys.channel(), token).await.map_err(|e| self.error(keys, e))
    }
}

/// A RENEW_MANY call's reply for its `count` locks, appended to `out` in order: each lock's outcome, the error
/// message the script caught for it, or the call's own error for every one.
fn renewal_results(reply: redis::RedisResult<Value>, count: usize, out: &mut Vec<redis::RedisResult<bool>>) {
    match reply {
        Ok(Value::Array(results)) if results.len() == count => {
            out.extend(results.into_iter().map(|result| match result {
                Value::Int(n) => renew_outcome(n),
                Value::BulkString(message) => Err(failed_in_script(&message)),
                _ => Err(unexpected_reply()),
            }));
        }
        Ok(_) => out.extend((0..count).map(|_| Err(unexpected_reply()))),
        Err(e) => out.extend((0..count).map(|_| Err(e.clone()))),
    }
}

/// The error a script serving several locks reported for one of them (it ran each lock under `pcall`).
fn failed_in_script(message: &[u8]) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
        "the lock script failed",
        String::from_utf8_lossy(message).into_owned(),
    ))
}

fn unexpected_reply() -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::UnexpectedReturnType, "unexpected reply to a lock script"))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

pub(crate) fn timeout_error(what: &'static str) -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(std::io::ErrorKind::TimedOut, what))
}

#[cfg(test)]
mod tests {
    #[test]
    fn connections_are_made_with_nagle_off() {
        let info = super::connect::connection_info("redis://127.0.0.1:6390/", "redis://127.0.0.1:6390/").unwrap();
        assert!(info.tcp_settings().nodelay());
        assert!(super::connect::connection_info("not a url", "not a url").is_err());
    }
}
