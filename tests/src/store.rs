//! The storage side of a lock: a [`Store`] that is either fenced (it rejects a write whose fencing token is
//! lower than the highest it has seen, as README's "Safety model" recommends) or unfenced (it takes every
//! write), and a read-sleep-write [`Counter`] on it that counts lost updates.
//!
//! The store lives on a Redis server (keys `test:store:<name>:*`), so holders in other processes share it;
//! [`SyncStore`] is the same store over a blocking connection, for a write that must go out in the same
//! instant as the code before it (a holder paused between its check and its write).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::MultiplexedConnection;

/// What a store did with a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// Stored.
    Accepted,
    /// Refused: the token was lower than `highest`, the highest token the store has seen.
    Rejected {
        /// The token the write carried.
        token: u64,
        /// The highest token seen before.
        highest: u64,
    },
}

impl Write {
    /// Whether the store took the write.
    pub fn accepted(self) -> bool {
        self == Write::Accepted
    }
}

/// KEYS: value, highest token. ARGV: value, token, fenced (1/0). Built once: `Script::new` hashes the source.
static WRITE: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(WRITE_SOURCE));

const WRITE_SOURCE: &str = r"local highest = tonumber(redis.call('get', KEYS[2]) or '0')
local token = tonumber(ARGV[2])
if ARGV[3] == '1' and token < highest then return {0, highest} end
if token > highest then redis.call('set', KEYS[2], token) end
redis.call('set', KEYS[1], ARGV[1])
return {1, highest}";

fn keys(name: &str) -> (String, String) {
    (format!("test:store:{name}:value"), format!("test:store:{name}:highest-token"))
}

fn outcome((ok, highest): (i64, u64), token: u64) -> Write {
    if ok == 1 {
        Write::Accepted
    } else {
        Write::Rejected { token, highest }
    }
}

/// A shared integer value written with fencing tokens.
#[derive(Clone)]
pub struct Store {
    conn: MultiplexedConnection,
    name: String,
    value: String,
    highest: String,
    fenced: bool,
}

impl Store {
    /// A store that rejects writes with a token lower than the highest seen.
    pub fn fenced(conn: MultiplexedConnection, name: &str) -> Self {
        Self::new(conn, name, true)
    }

    /// A store that takes every write, whatever its token: what most storage does by default.
    pub fn unfenced(conn: MultiplexedConnection, name: &str) -> Self {
        Self::new(conn, name, false)
    }

    fn new(conn: MultiplexedConnection, name: &str, fenced: bool) -> Self {
        let (value, highest) = keys(name);
        Self { conn, name: name.to_owned(), value, highest, fenced }
    }

    /// The store's name (shared with [`SyncStore::open`]).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether this store checks tokens.
    pub fn is_fenced(&self) -> bool {
        self.fenced
    }

    /// The value (0 when never written).
    pub async fn read(&self) -> i64 {
        let v: Option<i64> =
            redis::cmd("GET").arg(&self.value).query_async(&mut self.conn.clone()).await.expect("read");
        v.unwrap_or(0)
    }

    /// Writes `value` with fencing token `token`.
    pub async fn write(&self, value: i64, token: u64) -> Write {
        let reply = WRITE
            .key(&self.value)
            .key(&self.highest)
            .arg(value)
            .arg(token)
            .arg(if self.fenced { "1" } else { "0" })
            .invoke_async(&mut self.conn.clone())
            .await
            .expect("store write");
        outcome(reply, token)
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("name", &self.name).field("fenced", &self.fenced).finish_non_exhaustive()
    }
}

/// The same store over a blocking connection.
pub struct SyncStore {
    conn: redis::Connection,
    value: String,
    highest: String,
    fenced: bool,
}

impl SyncStore {
    /// Opens the store `name` on the server at `url`.
    pub fn open(url: &str, name: &str, fenced: bool) -> redis::RedisResult<Self> {
        let conn = redis::Client::open(url)?.get_connection_with_timeout(Duration::from_secs(5))?;
        let (value, highest) = keys(name);
        Ok(Self { conn, value, highest, fenced })
    }

    /// The value (0 when never written).
    pub fn read(&mut self) -> redis::RedisResult<i64> {
        let v: Option<i64> = redis::cmd("GET").arg(&self.value).query(&mut self.conn)?;
        Ok(v.unwrap_or(0))
    }

    /// Any other command on the same connection.
    pub fn command<T: redis::FromRedisValue>(&mut self, args: &[&str]) -> redis::RedisResult<T> {
        let mut cmd = redis::Cmd::new();
        for a in args {
            cmd.arg(*a);
        }
        cmd.query(&mut self.conn)
    }

    /// Writes `value` with fencing token `token`.
    pub fn write(&mut self, value: i64, token: u64) -> redis::RedisResult<Write> {
        let reply = WRITE
            .key(&self.value)
            .key(&self.highest)
            .arg(value)
            .arg(token)
            .arg(if self.fenced { "1" } else { "0" })
            .invoke(&mut self.conn)?;
        Ok(outcome(reply, token))
    }
}

impl std::fmt::Debug for SyncStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyncStore").field("value", &self.value).field("fenced", &self.fenced).finish_non_exhaustive()
    }
}

/// A read-sleep-write counter on a [`Store`]: every increment reads the value, pauses, and writes it plus
/// one with the caller's fencing token. Two increments that overlap lose one update; a stale holder's
/// increment that the store accepts overwrites newer ones. The counter remembers how many increments the
/// store accepted, so that `accepted - value` is the number of lost updates.
#[derive(Debug)]
pub struct Counter {
    store: Store,
    accepted: AtomicI64,
}

impl Counter {
    /// A counter on `store`.
    pub fn new(store: Store) -> Self {
        Self { store, accepted: AtomicI64::new(0) }
    }

    /// The store underneath.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Read, pause for `pause`, write the value read plus one with `token`.
    pub async fn increment(&self, token: u64, pause: Duration) -> Write {
        let v = self.store.read().await;
        tokio::time::sleep(pause).await;
        let w = self.store.write(v + 1, token).await;
        if w.accepted() {
            self.accepted.fetch_add(1, Ordering::SeqCst);
        }
        w
    }

    /// Counts increments accepted elsewhere (another process), so that they are not taken for lost.
    pub fn add_accepted_elsewhere(&self, n: i64) {
        self.accepted.fetch_add(n, Ordering::SeqCst);
    }

    /// How many increments the store accepted.
    pub fn accepted(&self) -> i64 {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Accepted increments that the value does not reflect.
    pub async fn lost_updates(&self) -> i64 {
        self.accepted() - self.store.read().await
    }
}
