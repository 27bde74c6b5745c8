//! The Redis backend: every operation is one Lua script call (one round trip), keys and values passed only
//! through KEYS and ARGV. Waiters listen for releases on one shared RESP3 subscriber connection.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use once_cell::sync::Lazy;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, FromRedisValue, IntoConnectionInfo, ProtocolVersion, PushInfo, PushKind, Value};
use tokio::sync::watch;

use super::{Attempt, LockKeys, ReleaseWatch};
use crate::error::{redact_url, BackendError};
use crate::{LockError, LockInfo, LockToken, ReleaseOutcome};

/// A Lua script with its SHA1, sent as EVALSHA and, when the server has not cached it (after a restart or
/// SCRIPT FLUSH), once more as EVAL, which caches it again.
struct LuaScript {
    source: &'static str,
    sha: String,
}

impl LuaScript {
    fn new(source: &'static str) -> Self {
        Self { source, sha: redis::Script::new(source).get_hash().to_owned() }
    }
}

// The record is one string, `<token>:<fence>:<acquired at, server ms>:<metadata>`: cheaper for Redis than a
// hash, and the 32-character token at its start is all that renew and release compare. While `hold_at_least`
// keeps a released lock, the token is replaced by `NOBODY`, which no hex token can equal.

/// KEYS: record, fence. ARGV: token, ttl ms, metadata.
/// Granted: {1, fencing token}. Busy: {0, the holder's PTTL (-1: no expiry)}.
static ACQUIRE: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(
        r"local pttl = redis.call('pttl', KEYS[1])
if pttl ~= -2 then return {0, pttl} end
local fence = redis.call('incr', KEYS[2])
local now = redis.call('time')
local since = string.format('%d', now[1] * 1000 + math.floor(now[2] / 1000))
redis.call('set', KEYS[1], ARGV[1] .. ':' .. fence .. ':' .. since .. ':' .. ARGV[3], 'px', ARGV[2])
return {1, fence}",
    )
});

/// KEYS: record. ARGV: token, ttl ms. 1 when renewed, 0 when the token no longer owns the lock.
static RENEW: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(
        r"local v = redis.call('get', KEYS[1])
if v and string.sub(v, 1, 32) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
return 0",
    )
});

/// KEYS: record. ARGV: token, keep ms (0: delete now).
/// 1 released, 0 expired (no owner), 2 owned by another token.
static RELEASE: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(
        r"local v = redis.call('get', KEYS[1])
if not v then return 0 end
local owner = string.sub(v, 1, 32)
if owner ~= ARGV[1] then
  if owner == string.rep('-', 32) then return 0 end
  return 2
end
if tonumber(ARGV[2]) > 0 then
  redis.call('set', KEYS[1], string.rep('-', 32) .. string.sub(v, 33), 'px', ARGV[2])
  return 1
end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[1] .. ':released', '1')
return 1",
    )
});

/// KEYS: record. ARGV: token. The PTTL if the token owns the lock, else -2.
static REMAINING: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(
        r"local v = redis.call('get', KEYS[1])
if v and string.sub(v, 1, 32) == ARGV[1] then return redis.call('pttl', KEYS[1]) end
return -2",
    )
});

/// KEYS: record. {metadata, fence, pttl}, or nil when nobody holds the lock.
static INFO: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(
        r"local v = redis.call('get', KEYS[1])
if not v then return nil end
local fence, meta = string.match(v, '^[^:]*:(%d+):%d+:(.*)$')
return {meta or '', tonumber(fence) or 0, redis.call('pttl', KEYS[1])}",
    )
});

/// KEYS: record. 1 if a lock was deleted (and its waiters told), else 0.
static FORCE_UNLOCK: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(
        r"local n = redis.call('del', KEYS[1])
if n == 1 then redis.call('publish', KEYS[1] .. ':released', '1') end
return n",
    )
});

/// What connecting needs from the builder.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnectSettings<'a> {
    pub(crate) timeouts: Timeouts,
    pub(crate) prefix: &'a str,
    pub(crate) allow_insecure_tls: bool,
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
    subscriber: Subscriber,
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
        let backend = Self { server, commands, subscriber };
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
        let keys = LockKeys::new(prefix, "distlock-startup-probe".to_owned());
        let token = LockToken::random();
        let probe = Duration::from_secs(5);
        if let Attempt::Granted { .. } = self.acquire(&keys, &token, probe, "startup probe").await? {
            self.release(&keys, &token, None).await?;
        }
        Ok(())
    }

    fn error(&self, keys: &LockKeys, e: redis::RedisError) -> LockError {
        BackendError::new(&self.server, Some(&keys.name), e).into()
    }

    /// EVALSHA, falling back to EVAL when the server lost its script cache.
    async fn eval<T: FromRedisValue>(
        &self,
        script: &LuaScript,
        keys: &LockKeys,
        build: impl Fn(&mut Cmd),
    ) -> Result<T, LockError> {
        let mut conn = self.commands.clone();
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&script.sha);
        build(&mut cmd);
        match cmd.query_async(&mut conn).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                let mut cmd = redis::cmd("EVAL");
                cmd.arg(script.source);
                build(&mut cmd);
                cmd.query_async(&mut conn).await.map_err(|e| self.error(keys, e))
            }
            Err(e) if matches!(e.kind(), redis::ErrorKind::Server(redis::ServerErrorKind::Moved)) => {
                Err(LockError::InvalidConfig(format!(
                    "{} answered MOVED for lock `{}`: it is a Redis Cluster node; point the client at a standalone Redis",
                    self.server, keys.name
                )))
            }
            other => other.map_err(|e| self.error(keys, e)),
        }
    }

    pub(crate) async fn acquire(
        &self,
        keys: &LockKeys,
        token: &LockToken,
        ttl: Duration,
        metadata: &str,
    ) -> Result<Attempt, LockError> {
        let (granted, value): (i64, i64) = self
            .eval(&ACQUIRE, keys, |c| {
                c.arg(2).arg(&keys.record).arg(keys.fence()).arg(token.as_str()).arg(millis(ttl)).arg(metadata);
            })
            .await?;
        Ok(if granted == 1 {
            Attempt::Granted { fence: value.max(0) as u64 }
        } else {
            Attempt::Busy { remaining: u64::try_from(value).ok().map(Duration::from_millis) }
        })
    }

    pub(crate) async fn renew(&self, keys: &LockKeys, token: &LockToken, ttl: Duration) -> Result<bool, LockError> {
        let renewed: i64 = self
            .eval(&RENEW, keys, |c| {
                c.arg(1).arg(&keys.record).arg(token.as_str()).arg(millis(ttl));
            })
            .await?;
        Ok(renewed == 1)
    }

    pub(crate) async fn release(
        &self,
        keys: &LockKeys,
        token: &LockToken,
        keep: Option<Duration>,
    ) -> Result<ReleaseOutcome, LockError> {
        // A keep that rounds to 0 ms would mean "delete": keep at least 1 ms.
        let keep_ms = keep.map_or(0, |k| millis(k).max(1));
        let outcome: i64 = self
            .eval(&RELEASE, keys, |c| {
                c.arg(1).arg(&keys.record).arg(token.as_str()).arg(keep_ms);
            })
            .await?;
        Ok(match outcome {
            1 => ReleaseOutcome::Released,
            2 => ReleaseOutcome::TakenByOther,
            _ => ReleaseOutcome::Expired,
        })
    }

    pub(crate) async fn remaining(&self, keys: &LockKeys, token: &LockToken) -> Result<Option<Duration>, LockError> {
        let pttl: i64 = self
            .eval(&REMAINING, keys, |c| {
                c.arg(1).arg(&keys.record).arg(token.as_str());
            })
            .await?;
        Ok(match pttl {
            -2 => None,
            // Ours without expiry cannot happen through this crate; report it as "as long as you like".
            -1 => Some(Duration::MAX),
            ms => Some(Duration::from_millis(ms.max(0) as u64)),
        })
    }

    pub(crate) async fn info(&self, keys: &LockKeys) -> Result<Option<LockInfo>, LockError> {
        let info: Option<(String, u64, i64)> = self
            .eval(&INFO, keys, |c| {
                c.arg(1).arg(&keys.record);
            })
            .await?;
        Ok(info.map(|(metadata, fencing_token, pttl)| LockInfo {
            metadata,
            fencing_token,
            remaining_ttl: Duration::from_millis(pttl.max(0) as u64),
        }))
    }

    pub(crate) async fn force_unlock(&self, keys: &LockKeys) -> Result<bool, LockError> {
        let deleted: i64 = self
            .eval(&FORCE_UNLOCK, keys, |c| {
                c.arg(1).arg(&keys.record);
            })
            .await?;
        Ok(deleted == 1)
    }

    pub(crate) async fn watch_releases(&self, keys: &LockKeys) -> Result<ReleaseWatch, LockError> {
        self.subscriber.watch(&keys.channel()).await.map_err(|e| self.error(keys, e))
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn timeout_error(what: &'static str) -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(std::io::ErrorKind::TimedOut, what))
}

/// The shared subscriber: one RESP3 connection per client, opened on the first wait, carrying the
/// subscriptions of all waiters. A channel is subscribed while at least one waiter watches it.
struct Subscriber {
    info: redis::ConnectionInfo,
    timeouts: Timeouts,
    channels: Arc<Mutex<HashMap<Vec<u8>, Channel>>>,
    connection: Arc<tokio::sync::OnceCell<ConnectionManager>>,
    /// Serializes SUBSCRIBE/UNSUBSCRIBE so each is decided on the waiter count at the time it is sent.
    commands: Arc<tokio::sync::Mutex<()>>,
}

struct Channel {
    tx: watch::Sender<u64>,
    waiters: usize,
    subscribed: bool,
}

fn lock_channels(channels: &Mutex<HashMap<Vec<u8>, Channel>>) -> MutexGuard<'_, HashMap<Vec<u8>, Channel>> {
    // Every critical section leaves the map consistent, so a panic elsewhere cannot have broken it.
    channels.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Subscriber {
    fn new(info: redis::ConnectionInfo, timeouts: Timeouts) -> Self {
        Self { info, timeouts, channels: Arc::default(), connection: Arc::default(), commands: Arc::default() }
    }

    async fn connection(&self) -> redis::RedisResult<ConnectionManager> {
        let channels = Arc::clone(&self.channels);
        self.connection
            .get_or_try_init(|| async move {
                let on_push = move |push: PushInfo| -> Result<(), std::convert::Infallible> {
                    let channels = lock_channels(&channels);
                    match push.kind {
                        PushKind::Message => {
                            if let Some(Value::BulkString(name)) = push.data.first() {
                                if let Some(channel) = channels.get(name.as_slice()) {
                                    channel.tx.send_modify(|n| *n = n.wrapping_add(1));
                                }
                            }
                        }
                        // Announcements may have been lost while disconnected: every waiter retries once.
                        PushKind::Disconnection => {
                            for channel in channels.values() {
                                channel.tx.send_modify(|n| *n = n.wrapping_add(1));
                            }
                        }
                        _ => {}
                    }
                    Ok(())
                };
                let config = manager_config(self.timeouts).set_push_sender(on_push).set_automatic_resubscription();
                let client = redis::Client::open(self.info.clone())?;
                ConnectionManager::new_with_config(client, config).await
            })
            .await
            .cloned()
    }

    /// Registers a waiter on `channel` and returns once the server has confirmed the subscription, so no
    /// release published after this returns can be missed.
    async fn watch(&self, channel: &str) -> redis::RedisResult<ReleaseWatch> {
        let name = channel.as_bytes().to_vec();
        let rx = {
            let mut channels = lock_channels(&self.channels);
            let entry = channels.entry(name.clone()).or_insert_with(|| Channel {
                tx: watch::Sender::new(0),
                waiters: 0,
                subscribed: false,
            });
            entry.waiters += 1;
            entry.tx.subscribe()
        };
        let watch = ReleaseWatch::new(rx, self.on_last_waiter_gone(name.clone()));
        let subscribed = lock_channels(&self.channels).get(&name).is_some_and(|c| c.subscribed);
        if !subscribed {
            let mut conn = self.connection().await?;
            let _serial = self.commands.lock().await;
            let subscribed = lock_channels(&self.channels).get(&name).is_some_and(|c| c.subscribed);
            if !subscribed {
                conn.subscribe(channel).await?;
                if let Some(c) = lock_channels(&self.channels).get_mut(&name) {
                    c.subscribed = true;
                }
            }
        }
        Ok(watch)
    }

    /// What a waiter's drop does: count down, and unsubscribe in the background when it was the last one.
    fn on_last_waiter_gone(&self, name: Vec<u8>) -> impl FnOnce() + Send + Sync + 'static {
        let channels = Arc::clone(&self.channels);
        let commands = Arc::clone(&self.commands);
        let connection = Arc::clone(&self.connection);
        let runtime = tokio::runtime::Handle::try_current().ok();
        move || {
            let last = {
                let mut map = lock_channels(&channels);
                let Some(entry) = map.get_mut(&name) else { return };
                entry.waiters -= 1;
                entry.waiters == 0
            };
            let (Some(runtime), true) = (runtime, last) else { return };
            runtime.spawn(async move {
                let _serial = commands.lock().await;
                let was_subscribed = {
                    let mut map = lock_channels(&channels);
                    match map.get(&name) {
                        Some(entry) if entry.waiters == 0 => map.remove(&name).is_some_and(|c| c.subscribed),
                        _ => false,
                    }
                };
                if let (true, Some(mut conn)) = (was_subscribed, connection.get().cloned()) {
                    if let Err(e) = conn.unsubscribe(&name).await {
                        tracing::debug!(error = %e, "distlock: unsubscribe failed; the subscription lingers harmlessly");
                    }
                }
            });
        }
    }
}
