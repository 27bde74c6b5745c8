//! The Redis backend: every operation is one Lua script call (one round trip), keys and values passed only
//! through KEYS and ARGV. Waiters queue in Redis and hear hand-overs on one shared RESP3 subscriber connection.

use std::borrow::Cow;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, FromRedisValue, IntoConnectionInfo, ProtocolVersion, Value};

use super::{Attempt, Capabilities, Fencing, Hold, LockKeys, Queueing, ReleaseWatch, Renewal, Store, WakeUps};
use crate::error::{redact_url, BackendError};
use crate::{LockError, LockInfo, LockToken, ReleaseOutcome};

use self::batch::{Coalescer, Op};
use self::scripts::reply::{attempt_of, release_outcome, remaining_of, renew_outcome, withdrawn};
use self::scripts::{LuaScript, FORCE_UNLOCK, INFO, REMAINING, RENEW, RENEW_MANY, WITHDRAW};
use self::subscriber::Subscriber;

mod batch;
mod scripts;
mod subscriber;

/// Locks renewed per RENEW_MANY call: one call holds redis-server for about a microsecond per lock.
const RENEWALS_PER_CALL: usize = 256;

/// What connecting needs from the builder.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnectSettings<'a> {
    pub(crate) timeouts: Timeouts,
    pub(crate) prefix: &'a str,
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

pub(crate) struct RedisBackend {
    /// The URL with any password replaced, for messages.
    server: String,
    commands: ConnectionManager,
    /// Acquires and releases, which share script calls under load.
    hot: std::sync::Arc<Coalescer>,
    subscriber: Subscriber,
    replicas: Option<ReplicaAcks>,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend").field("server", &self.server).finish_non_exhaustive()
    }
}

fn manager_config(timeouts: Timeouts) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeouts.connect))
        .set_response_timeout(Some(timeouts.response))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_millis(500))
}

impl RedisBackend {
    /// Connects and checks the server answers PING; the error names the URL with the password redacted.
    pub(crate) async fn connect(url: &str, settings: ConnectSettings<'_>) -> Result<Self, LockError> {
        let timeouts = settings.timeouts;
        let server = redact_url(url);
        if url.trim_end().ends_with("#insecure") && !settings.allow_insecure_tls {
            return Err(LockError::InvalidConfig(format!(
                "{server} turns off TLS certificate checks; a lock server reached without them can be impersonated. \
                 Remove `#insecure`, or opt in with ClientBuilder::allow_insecure_tls(true)"
            )));
        }
        let info = url
            .into_connection_info()
            .map_err(|e| LockError::InvalidConfig(format!("cannot use Redis URL {server}: {e}")))?;
        let client = redis::Client::open(info.clone()).map_err(|e| BackendError::new(&server, None, e))?;
        let connect = ConnectionManager::new_with_config(client, manager_config(timeouts));
        let mut commands = tokio::time::timeout(timeouts.connect * 2, connect)
            .await
            .map_err(|_| BackendError::new(&server, None, timeout_error("connect")))?
            .map_err(|e| BackendError::new(&server, None, e))?;
        let pong: String =
            redis::cmd("PING").query_async(&mut commands).await.map_err(|e| BackendError::new(&server, None, e))?;
        debug_assert_eq!(pong, "PONG");
        let resp3 = info.clone().set_redis_settings(info.redis_settings().clone().set_protocol(ProtocolVersion::RESP3));
        let subscriber = Subscriber::new(resp3, timeouts);
        let hot = Coalescer::new(commands.clone());
        let backend = Self { server, commands, hot, subscriber, replicas: settings.replicas };
        backend.probe(settings.prefix).await?;
        Ok(backend)
    }

    /// Takes and gives back a probe lock, so a missing ACL right or a cluster address fails at startup with an
    /// explanation instead of at the first real lock; warns when Redis may evict lock records.
    async fn probe(&self, prefix: &str) -> Result<(), LockError> {
        let mut conn = self.commands.clone();
        let cluster: Option<String> = redis::cmd("INFO").arg("cluster").query_async(&mut conn).await.ok();
        if cluster.is_some_and(|info| info.contains("cluster_enabled:1")) {
            return Err(LockError::InvalidConfig(format!(
                "{} is a Redis Cluster node; this client talks to one Redis server (a standalone server or a \
                 replicated primary). Point it at a standalone Redis",
                self.server
            )));
        }
        let memory: Option<String> = redis::cmd("INFO").arg("memory").query_async(&mut conn).await.ok();
        let policy = memory.as_deref().and_then(|info| {
            info.lines().find_map(|line| line.strip_prefix("maxmemory_policy:")).map(|p| p.trim().to_owned())
        });
        if let Some(policy) = policy.filter(|p| p != "noeviction") {
            tracing::warn!(
                server = %self.server,
                %policy,
                "distlock: maxmemory-policy is not noeviction: under memory pressure Redis may evict lock records, \
                 and a holder then loses its lock at its next renewal. Set maxmemory-policy noeviction"
            );
        }
        self.probe_lock_cycle(prefix).await?;
        // Cached now, so the first burst of renewals after a restart of this process needs no EVAL fallback.
        for script in [&*RENEW, &*RENEW_MANY, &*REMAINING, &*INFO, &*FORCE_UNLOCK, &*scripts::BATCH] {
            let _: redis::RedisResult<String> =
                redis::cmd("SCRIPT").arg("LOAD").arg(script.source).query_async(&mut conn).await;
        }
        Ok(())
    }

    /// Every command a lock's life uses, once: listen, take, queue a second owner, release (handing over,
    /// which publishes), and clean up. Another process probing at the same moment only makes this a no-op.
    async fn probe_lock_cycle(&self, prefix: &str) -> Result<(), LockError> {
        let keys = LockKeys::new(prefix, format!("distlock-startup-probe:{}", LockToken::random().as_str()));
        let (holder, waiter) = (LockToken::random(), LockToken::random());
        let lease = Duration::from_secs(5);
        let queueing = Queueing { register: lease, lease };
        let _listening = self.watch_releases(&keys, &waiter).await?;
        if let Attempt::Granted(_) = self.acquire(&keys, &holder, lease, "startup probe", None).await? {
            self.acquire(&keys, &waiter, lease, "startup probe", Some(queueing)).await?;
            self.release(&keys, &holder, None).await?;
            if self.withdraw(&keys, &waiter).await?.is_some() {
                self.release(&keys, &waiter, None).await?;
            }
        }
        // The probe's own fencing counter is the one key it leaves behind; don't.
        let mut conn = self.commands.clone();
        let _: redis::RedisResult<i64> = redis::cmd("DEL").arg(keys.fence()).query_async(&mut conn).await;
        Ok(())
    }

    fn error(&self, keys: &LockKeys, e: redis::RedisError) -> LockError {
        if matches!(e.kind(), redis::ErrorKind::Server(redis::ServerErrorKind::Moved)) {
            return LockError::InvalidConfig(format!(
                "{} answered MOVED for lock `{}`: it is a Redis Cluster node; point the client at a standalone Redis",
                self.server, keys.name
            ));
        }
        BackendError::new(&self.server, Some(&keys.name), e).into()
    }

    /// One script call about `keys`'s lock (see [`send_script`]).
    async fn eval<T: FromRedisValue>(
        &self,
        script: &LuaScript,
        keys: &LockKeys,
        build: impl Fn(&mut Cmd),
    ) -> Result<T, LockError> {
        let mut conn = self.commands.clone();
        send_script(&mut conn, |by_source| {
            let mut cmd = Cmd::with_capacity(12, 256);
            if by_source {
                cmd.arg("EVAL").arg(script.source);
            } else {
                cmd.arg("EVALSHA").arg(&script.sha);
            }
            build(&mut cmd);
            cmd
        })
        .await
        .map_err(|e| self.error(keys, e))
    }

    /// Whether the writes sent so far on the command connection reached the required replicas (always true
    /// without `wait_for_replicas`). `WAIT` holds the shared connection until then: keep its timeout short.
    pub(crate) async fn replicated(&self, keys: &LockKeys) -> Result<(), LockError> {
        match self.replication_shortfall().await {
            Ok(None) => Ok(()),
            Ok(Some((acknowledged, required))) => {
                Err(LockError::NotReplicated { key: keys.name.clone(), acknowledged, required })
            }
            Err(e) => Err(self.error(keys, e)),
        }
    }

    /// `None` when enough replicas acknowledged (or none are required), else (acknowledged, required).
    async fn replication_shortfall(&self) -> redis::RedisResult<Option<(u32, u32)>> {
        let Some(ReplicaAcks { count, timeout }) = self.replicas else { return Ok(None) };
        let mut conn = self.commands.clone();
        let acknowledged: u32 =
            redis::cmd("WAIT").arg(count).arg(millis(timeout).max(1)).query_async(&mut conn).await?;
        Ok((acknowledged < count).then_some((acknowledged, count)))
    }
}

impl Store for RedisBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fair_queue: true,
            wake_ups: WakeUps::Exact,
            fencing: Fencing::Monotonic,
            replica_acks: self.replicas.is_some(),
        }
    }

    async fn acquire(
        &self,
        keys: &LockKeys,
        token: &LockToken,
        ttl: Duration,
        metadata: &str,
        queueing: Option<Queueing>,
    ) -> Result<Attempt, LockError> {
        let (register, lease) = queueing.map_or((0, 0), |q| (millis(q.register), millis(q.lease)));
        let op = Op::Acquire {
            record: Cow::Borrowed(&keys.record),
            token: token.clone(),
            ttl_ms: millis(ttl),
            metadata: Cow::Borrowed(metadata),
            register_ms: register,
            lease_ms: lease,
        };
        let reply = self.hot.run(op).await.map_err(|e| self.error(keys, e))?;
        let attempt = match attempt_of(reply).map_err(|e| self.error(keys, e))? {
            busy @ Attempt::Busy { .. } => return Ok(busy),
            granted => granted,
        };
        if let Err(e) = self.replicated(keys).await {
            // Not durable enough to use: give it back (best effort; otherwise it expires).
            let _ = self.release(keys, token, None).await;
            return Err(e);
        }
        Ok(attempt)
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
        let reply: i64 = self
            .eval(&RENEW, keys, |c| {
                c.arg(1).arg(&keys.record).arg(token.as_str()).arg(millis(ttl));
            })
            .await?;
        let renewed = renew_outcome(reply).map_err(|e| self.error(keys, e))?;
        if renewed {
            self.replicated(keys).await?;
        }
        Ok(renewed)
    }

    /// The renewals in one round trip: one RENEW_MANY call per [`RENEWALS_PER_CALL`] locks, pipelined; if the
    /// server lost its script cache, once more as EVAL.
    async fn renew_many(&self, items: &[Renewal<'_>]) -> Result<Vec<Result<bool, LockError>>, LockError> {
        let pipeline = |by_source: bool| {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for chunk in items.chunks(RENEWALS_PER_CALL) {
                let cmd = if by_source {
                    pipe.cmd("EVAL").arg(RENEW_MANY.source)
                } else {
                    pipe.cmd("EVALSHA").arg(&RENEW_MANY.sha)
                };
                cmd.arg(chunk.len());
                for item in chunk {
                    cmd.arg(&item.keys.record);
                }
                for item in chunk {
                    cmd.arg(item.token.as_str()).arg(millis(item.ttl));
                }
            }
            pipe
        };
        let mut conn = self.commands.clone();
        let failed = |e| BackendError::new(&self.server, None, e);
        let mut replies: Vec<redis::RedisResult<Value>> =
            pipeline(false).query_async(&mut conn).await.map_err(failed)?;
        if replies.iter().any(|r| r.as_ref().is_err_and(is_noscript)) {
            replies = pipeline(true).query_async(&mut conn).await.map_err(failed)?;
        }
        // One reply per lock, in order: each call's results, or its error for each of its locks.
        let mut renewed: Vec<redis::RedisResult<bool>> = Vec::with_capacity(items.len());
        for (reply, chunk) in replies.into_iter().zip(items.chunks(RENEWALS_PER_CALL)) {
            match reply {
                Ok(Value::Array(results)) if results.len() == chunk.len() => {
                    renewed.extend(results.into_iter().map(|result| match result {
                        Value::Int(n) => renew_outcome(n),
                        Value::BulkString(message) => Err(failed_in_script(&message)),
                        _ => Err(unexpected_reply()),
                    }));
                }
                Ok(_) => renewed.extend(chunk.iter().map(|_| Err(unexpected_reply()))),
                Err(e) => renewed.extend(chunk.iter().map(|_| Err(e.clone()))),
            }
        }
        // One WAIT covers the whole batch: a renewal the replicas did not get does not count (it is retried).
        let shortfall = self.replication_shortfall().await;
        Ok(renewed
            .into_iter()
            .zip(items)
            .map(|(reply, item)| match (reply, &shortfall) {
                (Ok(true), Ok(Some((acknowledged, required)))) => Err(LockError::NotReplicated {
                    key: item.keys.name.clone(),
                    acknowledged: *acknowledged,
                    required: *required,
                }),
                (Ok(true), Err(e)) => Err(self.error(item.keys, e.clone())),
                (reply, _) => reply.map_err(|e| self.error(item.keys, e)),
            })
            .collect())
    }

    async fn release(
        &self,
        keys: &LockKeys,
        token: &LockToken,
        keep: Option<Duration>,
    ) -> Result<ReleaseOutcome, LockError> {
        // A keep that rounds to 0 ms would mean "delete": keep at least 1 ms.
        let keep_ms = keep.map_or(0, |k| millis(k).max(1));
        let op = Op::Release { record: Cow::Borrowed(&keys.record), token: token.clone(), keep_ms };
        let (code, ..) = self.hot.run(op).await.map_err(|e| self.error(keys, e))?;
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

    /// INFO replies `{metadata, fence, PTTL, queue length}`: the script splits the record
    /// `<token><mark><fence>:<metadata>` (scripts.rs, "The record") and sends everything but the token.
    async fn info(&self, keys: &LockKeys) -> Result<Option<LockInfo>, LockError> {
        let info: Option<(String, u64, i64, usize)> = self
            .eval(&INFO, keys, |c| {
                c.arg(1).arg(&keys.record);
            })
            .await?;
        Ok(info.map(|(metadata, fencing_token, pttl, waiting)| LockInfo {
            metadata,
            fencing_token,
            remaining_ttl: Duration::from_millis(pttl.max(0) as u64),
            waiting,
        }))
    }

    async fn force_unlock(&self, keys: &LockKeys) -> Result<bool, LockError> {
        let deleted: i64 = self
            .eval(&FORCE_UNLOCK, keys, |c| {
                c.arg(1).arg(&keys.record);
            })
            .await?;
        Ok(deleted == 1)
    }

    async fn watch_releases(&self, keys: &LockKeys, token: &LockToken) -> Result<ReleaseWatch, LockError> {
        self.subscriber.watch(&keys.channel(), token).await.map_err(|e| self.error(keys, e))
    }
}

/// Sends the script call `build` makes (EVALSHA; EVAL with the source when asked `by_source`): once more at
/// once if the connection had dropped (the manager reconnects on the failed call), and as EVAL if the server
/// lost its script cache. Every script is keyed by the grants' tokens, so a repeat is safe: a repeated
/// acquire finds its own grant.
async fn send_script<T: FromRedisValue>(
    conn: &mut ConnectionManager,
    build: impl Fn(bool) -> Cmd,
) -> redis::RedisResult<T> {
    let cmd = build(false);
    let mut reply = cmd.query_async(conn).await;
    if reply.as_ref().is_err_and(redis::RedisError::is_connection_dropped) {
        reply = cmd.query_async(conn).await;
    }
    if reply.as_ref().is_err_and(is_noscript) {
        reply = build(true).query_async(conn).await;
    }
    reply
}

fn is_noscript(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
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

fn timeout_error(what: &'static str) -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(std::io::ErrorKind::TimedOut, what))
}
