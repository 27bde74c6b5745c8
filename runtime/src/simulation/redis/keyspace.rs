//! The simulated server's keyspace: values with their expiry, and what a command call carries (its clock,
//! its protocol, what it publishes and writes). The commands are in `strings.rs`, `generic.rs` and `zset.rs`.

use std::collections::{BTreeMap, BTreeSet};

use super::parse;
use super::reply::{Reply, NOT_INTEGER, WRONGTYPE};
use super::zset::ZSet;
use super::Published;

/// A key's value and its expiry.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Entry {
    /// The value.
    pub(crate) value: Data,
    /// When the key expires, in ms since the Unix epoch by the server's clock; `None`: never.
    pub(crate) expires_at_ms: Option<i64>,
}

/// The types of value the simulated server holds: the ones distlock's scripts use.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Data {
    /// A string (any bytes).
    String(Vec<u8>),
    /// A sorted set: member -> score, ordered by (score, member) as Redis orders it.
    ZSet(ZSet),
}

impl Data {
    /// The name TYPE replies for it.
    pub(super) fn type_name(&self) -> &'static str {
        match self {
            Data::String(_) => "string",
            Data::ZSet(_) => "zset",
        }
    }
}

/// What one command call knows and leaves behind: the server's clock (frozen for the whole call, a script
/// included, as Redis 7 freezes it for key expiry), the caller's protocol, and what it published and wrote.
#[derive(Debug)]
pub(super) struct Ctx {
    /// The server's wall clock in µs since the Unix epoch.
    pub(super) now_us: i64,
    /// Whether the reply goes to a RESP3 reader (the client, or a script after `redis.setresp(3)`).
    pub(super) resp3: bool,
    /// How many times TIME was called in this call.
    time_calls: i64,
    /// Messages published, in order.
    pub(super) published: Vec<Published>,
    /// Keys written, in the order of their first write.
    written: Vec<Vec<u8>>,
    written_set: BTreeSet<Vec<u8>>,
}

impl Ctx {
    /// A call at `now_us`.
    pub(super) fn new(now_us: i64) -> Self {
        Self {
            now_us,
            resp3: true,
            time_calls: 0,
            published: Vec::new(),
            written: Vec::new(),
            written_set: BTreeSet::new(),
        }
    }

    /// The clock in ms, as Redis's `mstime()` reads it.
    pub(super) fn now_ms(&self) -> i64 {
        self.now_us.div_euclid(1000)
    }

    /// What TIME reads: the call's clock, but each further TIME in one call (a script's) one µs later. Redis
    /// freezes time for key expiry only, and a script's TIME calls see its clock move on, so two waiters a
    /// BATCH queues get places in the order it queued them, as on a real server.
    pub(super) fn read_clock(&mut self) -> i64 {
        let now = self.now_us.saturating_add(self.time_calls);
        self.time_calls += 1;
        now
    }

    /// Notes a write of `key`.
    pub(super) fn wrote(&mut self, key: &[u8]) {
        if self.written_set.insert(key.to_vec()) {
            self.written.push(key.to_vec());
        }
    }

    /// The keys written, in the order of their first write.
    pub(super) fn into_written(self) -> (Vec<Vec<u8>>, Vec<Published>) {
        (self.written, self.published)
    }
}

/// Every key and its entry.
#[derive(Debug, Clone, Default)]
pub(super) struct Keyspace {
    /// By key; expired keys stay until the next command deletes them (`expire_all`).
    pub(super) entries: BTreeMap<Vec<u8>, Entry>,
}

/// Whether an entry that expires at `at` is gone at `now_ms`: Redis keeps a key up to and including the ms of
/// its expiry (`keyIsExpired`: `now > when`).
pub(super) fn expired(at: Option<i64>, now_ms: i64) -> bool {
    at.is_some_and(|at| at < now_ms)
}

impl Keyspace {
    /// Deletes every key expired at the call's time, as writes of the call (Redis propagates an expiry as a
    /// DEL). Done before every command: Redis may expire a key at any moment after its time (active expiry)
    /// and must at the latest when a command touches it, so deleting all of them at once is one of the
    /// behaviours it allows, and the simple one to reason about: a later step back of the clock does not
    /// revive a key once its time has been seen to pass.
    pub(super) fn expire_all(&mut self, ctx: &mut Ctx) {
        let now = ctx.now_ms();
        let gone: Vec<Vec<u8>> =
            self.entries.iter().filter(|(_, e)| expired(e.expires_at_ms, now)).map(|(k, _)| k.clone()).collect();
        for key in gone {
            self.entries.remove(&key);
            ctx.wrote(&key);
        }
    }

    /// The live entry at `key`.
    pub(super) fn get(&self, key: &[u8]) -> Option<&Entry> {
        self.entries.get(key)
    }

    /// The string at `key`, `None` if there is none, WRONGTYPE for another type.
    pub(super) fn string(&self, key: &[u8]) -> Result<Option<&Vec<u8>>, Reply> {
        match self.entries.get(key).map(|e| &e.value) {
            None => Ok(None),
            Some(Data::String(s)) => Ok(Some(s)),
            Some(_) => Err(Reply::error(WRONGTYPE)),
        }
    }

    /// Writes `entry` at `key`; an entry already expired at the call's time deletes the key instead (Redis
    /// would keep it until something looks, and then it is gone).
    pub(super) fn put(&mut self, ctx: &mut Ctx, key: &[u8], entry: Entry) {
        if expired(entry.expires_at_ms, ctx.now_ms()) {
            self.entries.remove(key);
        } else {
            self.entries.insert(key.to_vec(), entry);
        }
        ctx.wrote(key);
    }

    /// Deletes `key`; whether it was there.
    pub(super) fn remove(&mut self, ctx: &mut Ctx, key: &[u8]) -> bool {
        let found = self.entries.remove(key).is_some();
        if found {
            ctx.wrote(key);
        }
        found
    }

    /// The sorted set at `key` to change: `None` if there is none, WRONGTYPE for another type.
    pub(super) fn zset_mut(&mut self, key: &[u8]) -> Result<Option<&mut ZSet>, Reply> {
        match self.entries.get_mut(key).map(|e| &mut e.value) {
            None => Ok(None),
            Some(Data::ZSet(z)) => Ok(Some(z)),
            Some(_) => Err(Reply::error(WRONGTYPE)),
        }
    }

    /// The sorted set at `key`: `None` if there is none, WRONGTYPE for another type.
    pub(super) fn zset(&self, key: &[u8]) -> Result<Option<&ZSet>, Reply> {
        match self.entries.get(key).map(|e| &e.value) {
            None => Ok(None),
            Some(Data::ZSet(z)) => Ok(Some(z)),
            Some(_) => Err(Reply::error(WRONGTYPE)),
        }
    }
}

/// The integer argument, or Redis's error for one that is not.
pub(super) fn int_arg(arg: &[u8]) -> Result<i64, Reply> {
    parse::int(arg).ok_or_else(|| Reply::error(NOT_INTEGER))
}

/// `ERR invalid expire time in '<cmd>' command`.
pub(super) fn bad_expire(command: &str) -> Reply {
    Reply::error(format!("ERR invalid expire time in '{command}' command"))
}
