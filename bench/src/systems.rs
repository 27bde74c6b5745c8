//! The contenders: distlock (programmatic API, `run`, and the attribute macro), the raw floor, and rslock.

use std::fmt;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Value;

/// The lease used by every cycle: long enough that no renewal happens inside a cycle.
pub const TTL: Duration = Duration::from_secs(30);

/// Which implementation a measurement ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Variant {
    /// Hand-written `SET key token NX PX` + EVALSHA compare-and-delete on a `ConnectionManager`.
    Raw,
    /// `client.lock(key).ttl(..).acquire()` then `guard.release()`.
    Api,
    /// `client.lock(key).ttl(..).run(body)`.
    Run,
    /// A `#[distlock::distributed_lock]` function on the installed client.
    Macro,
    /// rslock's `LockManager::lock` then `unlock`.
    Rslock,
    /// The least a fenced cycle by script does (`FENCED_ACQUIRE`, `FENCED_RELEASE`: GET, TIME, SET PX; GET,
    /// SET KEEPTTL), by EVALSHA on a `ConnectionManager`: what no fenced cycle on Redis 7.0 can beat.
    Fenced,
}

impl Variant {
    /// The name used in `--variants` and in the tables.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Raw => "raw",
            Variant::Api => "api",
            Variant::Run => "run",
            Variant::Macro => "macro",
            Variant::Rslock => "rslock",
            Variant::Fenced => "fenced",
        }
    }

    /// The row label in the tables.
    pub fn label(self) -> &'static str {
        match self {
            Variant::Raw => "raw floor (SET NX PX + EVALSHA)",
            Variant::Api => "distlock `acquire` + `release`",
            Variant::Run => "distlock `run`",
            Variant::Macro => "distlock `#[distributed_lock]`",
            Variant::Rslock => "rslock 0.10",
            Variant::Fenced => "least fenced cycle by script (bound)",
        }
    }

    /// Parses a `--variants` name.
    pub fn parse(name: &str) -> Option<Self> {
        [Variant::Raw, Variant::Api, Variant::Run, Variant::Macro, Variant::Rslock, Variant::Fenced]
            .into_iter()
            .find(|v| v.name() == name)
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The same connection settings distlock uses for its command connection.
pub fn manager_config() -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(Duration::from_secs(2)))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_millis(500))
}

/// A `redis` client for `url` with Nagle off, as distlock's connections have it: the raw floor and rslock
/// (through `LockManager::from_clients`) get the same socket setting.
pub fn client(url: &str) -> redis::RedisResult<redis::Client> {
    use redis::IntoConnectionInfo;
    let info = url.into_connection_info()?.set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
    redis::Client::open(info)
}

/// rslock on `url`, with Nagle off.
pub fn rslock(url: &str) -> rslock::LockManager {
    rslock::LockManager::from_clients(vec![client(url).expect("server url")])
}

pub use crate::floor::RAW_RELEASE;
use crate::floor::{FENCED_ACQUIRE, FENCED_RELEASE};

/// Compare-and-expire: the raw renewal.
const RAW_RENEW: &str = r"if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
return 0";

/// Compare-and-expire for many locks in one call: KEYS are the locks, ARGV their tokens, then the ttl.
const RAW_RENEW_MANY: &str = r"local ttl = ARGV[#ARGV]
local n = 0
for i, key in ipairs(KEYS) do
  if redis.call('get', key) == ARGV[i] then n = n + redis.call('pexpire', key, ttl) end
end
return n";

/// The raw floor: two round trips per cycle on one `ConnectionManager`, nothing else.
#[derive(Clone)]
pub struct Raw {
    pub conn: ConnectionManager,
    release_sha: String,
    renew_sha: String,
    renew_many_sha: String,
    fenced_acquire_sha: String,
    fenced_release_sha: String,
}

impl fmt::Debug for Raw {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Raw").finish_non_exhaustive()
    }
}

/// A random owner token: 16 bytes of OS randomness, hex (like distlock's), on the stack.
#[derive(Debug, Clone, Copy)]
pub struct Token([u8; 32]);

impl Token {
    pub fn random() -> Self {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).expect("OS randomness");
        let mut hex = [0u8; 32];
        for (i, b) in bytes.iter().enumerate() {
            hex[2 * i] = HEX[usize::from(b >> 4)];
            hex[2 * i + 1] = HEX[usize::from(b & 0xf)];
        }
        Self(hex)
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

impl Raw {
    pub async fn connect(url: &str) -> redis::RedisResult<Self> {
        let client = client(url)?;
        let mut conn = ConnectionManager::new_with_config(client, manager_config()).await?;
        let load = |src: &'static str| {
            let mut conn = conn.clone();
            async move { redis::cmd("SCRIPT").arg("LOAD").arg(src).query_async::<String>(&mut conn).await }
        };
        let release_sha = load(RAW_RELEASE).await?;
        let renew_sha = load(RAW_RENEW).await?;
        let renew_many_sha = load(RAW_RENEW_MANY).await?;
        let fenced_acquire_sha = load(FENCED_ACQUIRE).await?;
        let fenced_release_sha = load(FENCED_RELEASE).await?;
        let _: String = redis::cmd("PING").query_async(&mut conn).await?;
        Ok(Self { conn, release_sha, renew_sha, renew_many_sha, fenced_acquire_sha, fenced_release_sha })
    }

    /// `SET key token NX PX ttl`: true when taken.
    pub async fn try_lock(
        conn: &mut ConnectionManager,
        key: &str,
        token: &Token,
        ttl: Duration,
    ) -> redis::RedisResult<bool> {
        let reply: Value = redis::cmd("SET")
            .arg(key)
            .arg(token.as_bytes())
            .arg("NX")
            .arg("PX")
            .arg(ttl.as_millis() as u64)
            .query_async(conn)
            .await?;
        Ok(matches!(reply, Value::Okay))
    }

    /// EVALSHA compare-and-delete: true when it was ours.
    pub async fn unlock(&self, conn: &mut ConnectionManager, key: &str, token: &Token) -> redis::RedisResult<bool> {
        let n: i64 = evalsha(&self.release_sha, key, token).query_async(conn).await?;
        Ok(n == 1)
    }

    /// The least fenced cycle by script: EVALSHA `FENCED_ACQUIRE`, then EVALSHA `FENCED_RELEASE`.
    pub async fn fenced_cycle(
        &self,
        conn: &mut ConnectionManager,
        key: &str,
        ttl: Duration,
    ) -> redis::RedisResult<bool> {
        let token = Token::random();
        let mut acquire = evalsha(&self.fenced_acquire_sha, key, &token);
        let _: i64 = acquire.arg(ttl.as_millis() as u64).query_async(conn).await?;
        let freed: i64 = evalsha(&self.fenced_release_sha, key, &token).query_async(conn).await?;
        Ok(freed == 1)
    }

    /// A pipeline of `SET NX PX` for `locks`; how many were taken.
    pub async fn lock_pipelined(&self, locks: &[(String, Token)], ttl: Duration) -> redis::RedisResult<usize> {
        let mut pipe = redis::pipe();
        for (key, token) in locks {
            pipe.cmd("SET").arg(key).arg(token.as_bytes()).arg("NX").arg("PX").arg(ttl.as_millis() as u64);
        }
        let replies: Vec<Value> = pipe.query_async(&mut self.conn.clone()).await?;
        Ok(replies.iter().filter(|v| matches!(v, Value::Okay)).count())
    }

    /// A pipeline of EVALSHA compare-and-expire (one command per lock); how many were renewed.
    pub async fn renew_pipelined(&self, locks: &[(String, Token)], ttl: Duration) -> redis::RedisResult<i64> {
        let mut pipe = redis::pipe();
        for (key, token) in locks {
            pipe.cmd("EVALSHA").arg(&self.renew_sha).arg(1).arg(key).arg(token.as_bytes()).arg(ttl.as_millis() as u64);
        }
        let replies: Vec<i64> = pipe.query_async(&mut self.conn.clone()).await?;
        Ok(replies.iter().sum())
    }

    /// One EVALSHA renewing all of `locks` (a batch); how many were renewed.
    pub async fn renew_batched(&self, locks: &[(String, Token)], ttl: Duration) -> redis::RedisResult<i64> {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.renew_many_sha).arg(locks.len());
        for (key, _) in locks {
            cmd.arg(key);
        }
        for (_, token) in locks {
            cmd.arg(token.as_bytes());
        }
        cmd.arg(ttl.as_millis() as u64);
        cmd.query_async(&mut self.conn.clone()).await
    }

    /// A pipeline of EVALSHA compare-and-delete.
    pub async fn unlock_pipelined(&self, locks: &[(String, Token)]) -> redis::RedisResult<i64> {
        let mut pipe = redis::pipe();
        for (key, token) in locks {
            pipe.cmd("EVALSHA").arg(&self.release_sha).arg(1).arg(key).arg(token.as_bytes());
        }
        let replies: Vec<i64> = pipe.query_async(&mut self.conn.clone()).await?;
        Ok(replies.iter().sum())
    }
}

/// `EVALSHA sha 1 key token`: a one-key script call with the token as its first argument.
fn evalsha(sha: &str, key: &str, token: &Token) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(sha).arg(1).arg(key).arg(token.as_bytes());
    cmd
}

/// Everything a cycle needs, shared by all tasks.
#[derive(Debug)]
pub struct Systems {
    pub raw: Raw,
    /// The distlock client (a child process that runs the macro installs it globally).
    pub distlock: distlock::Client,
    pub rslock: rslock::LockManager,
}

#[derive(Debug)]
pub enum CycleError {
    Redis(redis::RedisError),
    Distlock(distlock::LockError),
    Rslock(rslock::LockError),
    /// The lock was not ours on release, or not granted on a key nobody else uses.
    Unexpected(&'static str),
}

impl fmt::Display for CycleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CycleError::Redis(e) => write!(f, "redis: {e}"),
            CycleError::Distlock(e) => write!(f, "distlock: {e}"),
            CycleError::Rslock(e) => write!(f, "rslock: {e}"),
            CycleError::Unexpected(what) => f.write_str(what),
        }
    }
}

impl From<distlock::LockError> for CycleError {
    fn from(e: distlock::LockError) -> Self {
        CycleError::Distlock(e)
    }
}

/// The attribute macro's cycle: an empty body under the lock `macro:<task>`.
#[distlock::distributed_lock(key = "macro:<task>", ttl = "30s")]
async fn macro_cycle(task: usize) -> Result<(), CycleError> {
    Ok(())
}

/// Per-task state for uncontended cycles: the keys each variant uses, and the task's connection clone.
#[derive(Debug)]
pub struct TaskKeys {
    pub task: usize,
    pub raw: String,
    pub api: String,
    pub run: String,
    pub rslock: String,
    pub fenced: String,
}

impl TaskKeys {
    pub fn new(task: usize) -> Self {
        Self {
            task,
            raw: format!("raw:{task}"),
            api: format!("api:{task}"),
            run: format!("run:{task}"),
            rslock: format!("rslock:{task}"),
            fenced: format!("fenced:{task}"),
        }
    }
}

impl Systems {
    /// One uncontended lock cycle (acquire, then release) of `variant` on this task's key.
    pub async fn cycle(
        &self,
        variant: Variant,
        keys: &TaskKeys,
        conn: &mut ConnectionManager,
    ) -> Result<(), CycleError> {
        match variant {
            Variant::Raw => {
                let token = Token::random();
                if !Raw::try_lock(conn, &keys.raw, &token, TTL).await.map_err(CycleError::Redis)? {
                    return Err(CycleError::Unexpected("raw: SET NX found the key taken"));
                }
                if !self.raw.unlock(conn, &keys.raw, &token).await.map_err(CycleError::Redis)? {
                    return Err(CycleError::Unexpected("raw: release found the key not ours"));
                }
            }
            Variant::Api => {
                let guard = self.distlock.lock(keys.api.as_str()).ttl(TTL).acquire().await?;
                if guard.release().await? != distlock::ReleaseOutcome::Released {
                    return Err(CycleError::Unexpected("distlock: release did not find the lock ours"));
                }
            }
            Variant::Run => self.distlock.lock(keys.run.as_str()).ttl(TTL).run(async {}).await?,
            Variant::Macro => macro_cycle(keys.task).await?,
            Variant::Rslock => {
                let lock = self.rslock.lock(keys.rslock.as_bytes(), TTL).await.map_err(CycleError::Rslock)?;
                self.rslock.unlock(&lock).await;
            }
            Variant::Fenced => {
                if !self.raw.fenced_cycle(conn, &keys.fenced, TTL).await.map_err(CycleError::Redis)? {
                    return Err(CycleError::Unexpected("fenced: release found the record not ours"));
                }
            }
        }
        Ok(())
    }
}
