//! The simulated server's keyspace: values with their expiry, and the string and generic commands
//! (`t_string.c`, `db.c`, `expire.c`, `pubsub.c` of redis-server 7.0). Sorted sets are in `zset.rs`.

use std::collections::{BTreeMap, BTreeSet};

use super::parse::{self, is};
use super::reply::{Reply, NOT_INTEGER, SYNTAX, WRONGTYPE};
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
    fn string(&self, key: &[u8]) -> Result<Option<&Vec<u8>>, Reply> {
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
fn bad_expire(command: &str) -> Reply {
    Reply::error(format!("ERR invalid expire time in '{command}' command"))
}

/// GET key.
pub(super) fn get(ks: &mut Keyspace, _: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    ks.string(&args[1]).map_or_else(|e| e, |s| Reply::bulk_or_nil(s.cloned()))
}

/// GETDEL key.
pub(super) fn getdel(ks: &mut Keyspace, ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    match ks.string(&args[1]) {
        Err(e) => e,
        Ok(None) => Reply::Nil,
        Ok(Some(s)) => {
            let value = s.clone();
            ks.remove(ctx, &args[1]);
            Reply::Bulk(value)
        }
    }
}

/// SET key value [NX | XX] [GET] [EX s | PX ms | EXAT s | PXAT ms | KEEPTTL], its options parsed as
/// `parseExtendedStringArgumentsOrReply` does (an expiry option given twice: the last wins).
pub(super) fn set(ks: &mut Keyspace, ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    #[derive(PartialEq, Clone, Copy)]
    enum Unit {
        Ex,
        Px,
        ExAt,
        PxAt,
    }
    let (mut nx, mut xx, mut get, mut keepttl) = (false, false, false, false);
    let mut expire: Option<(Unit, &[u8])> = None;
    let mut j = 3;
    while j < args.len() {
        let opt = &args[j];
        let next = args.get(j + 1);
        let other_expiry = |unit: Unit| expire.is_some_and(|(u, _)| u != unit);
        if is(opt, "nx") && !xx {
            nx = true;
        } else if is(opt, "xx") && !nx {
            xx = true;
        } else if is(opt, "get") {
            get = true;
        } else if is(opt, "keepttl") && expire.is_none() {
            keepttl = true;
        } else if let (Some(unit), Some(next)) = (
            [("ex", Unit::Ex), ("px", Unit::Px), ("exat", Unit::ExAt), ("pxat", Unit::PxAt)]
                .into_iter()
                .find(|(name, _)| is(opt, name))
                .map(|(_, unit)| unit),
            next,
        ) {
            if keepttl || other_expiry(unit) {
                return Reply::error(SYNTAX);
            }
            expire = Some((unit, next));
            j += 1;
        } else {
            return Reply::error(SYNTAX);
        }
        j += 1;
    }
    let mut at = None;
    if let Some((unit, text)) = expire {
        let mut ms = match int_arg(text) {
            Ok(ms) => ms,
            Err(e) => return e,
        };
        let seconds = matches!(unit, Unit::Ex | Unit::ExAt);
        if ms <= 0 || (seconds && ms > i64::MAX / 1000) {
            return bad_expire("set");
        }
        if seconds {
            ms *= 1000;
        }
        if matches!(unit, Unit::Ex | Unit::Px) {
            // C's signed overflow wraps here in practice, and the check below catches it.
            ms = ms.wrapping_add(ctx.now_ms());
        }
        if ms <= 0 {
            return bad_expire("set");
        }
        at = Some(ms);
    }
    let old = match ks.string(&args[1]) {
        Ok(old) => old.cloned(),
        // Only GET reads the old value: without it SET overwrites any type.
        Err(e) if get => return e,
        Err(_) => None,
    };
    let found = ks.get(&args[1]).is_some();
    let reply = if get { Reply::bulk_or_nil(old) } else { Reply::ok() };
    if (nx && found) || (xx && !found) {
        return if get { reply } else { Reply::Nil };
    }
    let kept = if keepttl { ks.get(&args[1]).and_then(|e| e.expires_at_ms) } else { None };
    ks.put(ctx, &args[1], Entry { value: Data::String(args[2].clone()), expires_at_ms: at.or(kept) });
    reply
}

/// SETRANGE key offset value.
pub(super) fn setrange(ks: &mut Keyspace, ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    let offset = match int_arg(&args[2]) {
        Ok(n) => n,
        Err(e) => return e,
    };
    if offset < 0 {
        return Reply::error("ERR offset is out of range");
    }
    let value = &args[3];
    let current = match ks.string(&args[1]) {
        Ok(s) => s.cloned(),
        Err(e) => return e,
    };
    if value.is_empty() {
        return Reply::Int(current.map_or(0, |s| s.len() as i64));
    }
    // proto-max-bulk-len's default, 512 MB.
    let end = offset.saturating_add(value.len() as i64);
    let Ok(end) = usize::try_from(end).map_err(drop).and_then(|e| if e > 512 << 20 { Err(()) } else { Ok(e) }) else {
        return Reply::error("ERR string exceeds maximum allowed size (proto-max-bulk-len)");
    };
    let start = end - value.len();
    let expires_at_ms = ks.get(&args[1]).and_then(|e| e.expires_at_ms);
    let mut s = current.unwrap_or_default();
    if s.len() < end {
        s.resize(end, 0);
    }
    s[start..end].copy_from_slice(value);
    let len = s.len() as i64;
    ks.put(ctx, &args[1], Entry { value: Data::String(s), expires_at_ms });
    Reply::Int(len)
}

/// GETRANGE key start end.
pub(super) fn getrange(ks: &mut Keyspace, _: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    let (mut start, mut end) = match (int_arg(&args[2]), int_arg(&args[3])) {
        (Ok(s), Ok(e)) => (s, e),
        (Err(e), _) | (_, Err(e)) => return e,
    };
    let s = match ks.string(&args[1]) {
        Ok(Some(s)) => s,
        Ok(None) => return Reply::Bulk(Vec::new()),
        Err(e) => return e,
    };
    let len = s.len() as i64;
    if start < 0 && end < 0 && start > end {
        return Reply::Bulk(Vec::new());
    }
    if start < 0 {
        start += len;
    }
    if end < 0 {
        end += len;
    }
    start = start.max(0);
    end = end.max(0);
    if end >= len {
        end = len - 1;
    }
    if start > end || len == 0 {
        return Reply::Bulk(Vec::new());
    }
    Reply::Bulk(s[start as usize..=end as usize].to_vec())
}

/// PEXPIRE key ms [NX | XX | GT | LT], as `expireGenericCommand` does it (options first, then the time).
pub(super) fn pexpire(ks: &mut Keyspace, ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    let (mut nx, mut xx, mut gt, mut lt) = (false, false, false, false);
    for opt in &args[3..] {
        match () {
            () if is(opt, "nx") => nx = true,
            () if is(opt, "xx") => xx = true,
            () if is(opt, "gt") => gt = true,
            () if is(opt, "lt") => lt = true,
            () => {
                // `%s` of a C string: up to its first NUL.
                let shown = opt.split(|&c| c == 0).next().unwrap_or_default();
                return Reply::formatted_error([b"ERR Unsupported option ", shown].concat());
            }
        }
    }
    if nx && (xx || gt || lt) {
        return Reply::error("ERR NX and XX, GT or LT options at the same time are not compatible");
    }
    if gt && lt {
        return Reply::error("ERR GT and LT options at the same time are not compatible");
    }
    let when = match int_arg(&args[2]) {
        Ok(n) => n,
        Err(e) => return e,
    };
    let now = ctx.now_ms();
    if when > i64::MAX - now {
        return bad_expire("pexpire");
    }
    let when = when + now;
    let Some(current) = ks.get(&args[1]).map(|e| e.expires_at_ms) else {
        return Reply::Int(0);
    };
    let refused = (nx && current.is_some())
        || (xx && current.is_none())
        || (gt && current.is_none_or(|c| when <= c))
        || (lt && current.is_some_and(|c| when >= c));
    if refused {
        return Reply::Int(0);
    }
    // `checkAlreadyExpired`: a time not after now deletes the key.
    if when <= now {
        ks.remove(ctx, &args[1]);
    } else if let Some(entry) = ks.entries.get_mut(&args[1]) {
        entry.expires_at_ms = Some(when);
        ctx.wrote(&args[1]);
    }
    Reply::Int(1)
}

/// PTTL key: -2 without the key, -1 without an expiry.
pub(super) fn pttl(ks: &mut Keyspace, ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    Reply::Int(match ks.get(&args[1]) {
        None => -2,
        Some(Entry { expires_at_ms: None, .. }) => -1,
        Some(Entry { expires_at_ms: Some(at), .. }) => (at - ctx.now_ms()).max(0),
    })
}

/// DEL key [key ...]: how many were deleted (a key named twice counts once).
pub(super) fn del(ks: &mut Keyspace, ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    Reply::Int(args[1..].iter().filter(|key| ks.remove(ctx, key)).count() as i64)
}

/// EXISTS key [key ...]: how many of the keys named exist (a key named twice counts twice).
pub(super) fn exists(ks: &mut Keyspace, _: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    Reply::Int(args[1..].iter().filter(|key| ks.get(key).is_some()).count() as i64)
}

/// TYPE key.
pub(super) fn type_of(ks: &mut Keyspace, _: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    Reply::Status(ks.get(&args[1]).map_or("none", |e| e.value.type_name()).as_bytes().to_vec())
}

/// TIME: seconds and microseconds of the server's clock, as bulk strings. The clock is the call's, but each
/// further TIME in one call (a script's) reads one µs later: Redis freezes time for key expiry only, and a
/// script's TIME calls see its clock move on, so two waiters a BATCH queues get places in the order it queued
/// them, as on a real server.
pub(super) fn time(_: &mut Keyspace, ctx: &mut Ctx, _: &[Vec<u8>]) -> Reply {
    let now = ctx.now_us.saturating_add(ctx.time_calls);
    ctx.time_calls += 1;
    let (s, us) = (now.div_euclid(1_000_000), now.rem_euclid(1_000_000));
    Reply::Array(vec![Reply::Bulk(s.to_string().into_bytes()), Reply::Bulk(us.to_string().into_bytes())])
}

/// PUBLISH channel message: recorded; the reply counts no receiver (subscribers are the simulation's, not
/// the server's).
pub(super) fn publish(_: &mut Keyspace, ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    ctx.published.push(Published { channel: args[1].clone(), message: args[2].clone(), sharded: false });
    Reply::Int(0)
}

/// SPUBLISH shardchannel message: as PUBLISH.
pub(super) fn spublish(_: &mut Keyspace, ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    ctx.published.push(Published { channel: args[1].clone(), message: args[2].clone(), sharded: true });
    Reply::Int(0)
}

/// PING [message].
pub(super) fn ping(_: &mut Keyspace, _: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    match args {
        [_] => Reply::Status(b"PONG".to_vec()),
        [_, message] => Reply::Bulk(message.clone()),
        _ => Reply::error("ERR wrong number of arguments for 'ping' command"),
    }
}

/// ECHO message.
pub(super) fn echo(_: &mut Keyspace, _: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    Reply::Bulk(args[1].clone())
}

/// SCAN cursor [MATCH pattern] [COUNT count] [TYPE type]. The cursor is a position in a fixed order of all
/// possible keys (by a 64-bit hash, then the key): each call returns the keys from the cursor on, at least
/// COUNT of them unless none are left, never splitting keys of one hash, and the next cursor is the hash
/// where it stopped (0: done). A key present from the first call to the last is returned, as Redis promises;
/// the cursors themselves are not Redis's.
pub(super) fn scan(ks: &mut Keyspace, _: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    let Some(cursor) = parse::cursor(&args[1]) else {
        return Reply::error("ERR invalid cursor");
    };
    let (mut count, mut pattern, mut type_name): (i64, Option<&[u8]>, Option<&[u8]>) = (10, None, None);
    let mut i = 2;
    while i < args.len() {
        let has_value = args.len() - i >= 2;
        if is(&args[i], "count") && has_value {
            count = match int_arg(&args[i + 1]) {
                Ok(n) if n >= 1 => n,
                Ok(_) => return Reply::error(SYNTAX),
                Err(e) => return e,
            };
        } else if is(&args[i], "match") && has_value {
            pattern = Some(&args[i + 1]).filter(|p| p.as_slice() != b"*").map(Vec::as_slice);
        } else if is(&args[i], "type") && has_value {
            type_name = Some(&args[i + 1]);
        } else {
            return Reply::error(SYNTAX);
        }
        i += 2;
    }
    let mut order: Vec<(u64, &Vec<u8>)> =
        ks.entries.keys().map(|k| (scan_hash(k), k)).filter(|(h, _)| *h >= cursor).collect();
    order.sort();
    let mut next = 0;
    let mut keys: Vec<(u64, &Vec<u8>)> = Vec::new();
    for (hash, key) in order {
        if keys.len() as i64 >= count && keys.last().is_some_and(|(h, _)| *h != hash) {
            next = hash;
            break;
        }
        keys.push((hash, key));
    }
    let keys = keys
        .into_iter()
        .filter(|(_, k)| pattern.is_none_or(|p| parse::glob(p, k)))
        .filter(|(_, k)| {
            type_name.is_none_or(|t| ks.get(k).is_some_and(|e| e.value.type_name().as_bytes().eq_ignore_ascii_case(t)))
        })
        .map(|(_, k)| Reply::Bulk(k.clone()))
        .collect();
    Reply::Array(vec![Reply::Bulk(next.to_string().into_bytes()), Reply::Array(keys)])
}

/// A key's place in SCAN's order: FNV-1a, which never changes between runs. A key hashing to 0 would read as
/// the end, so hashes start at 1.
fn scan_hash(key: &[u8]) -> u64 {
    let hash = key.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    hash.max(1)
}
