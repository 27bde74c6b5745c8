//! The Lua scripts: each operation is one script call, so one round trip, with keys and values only in
//! KEYS and ARGV. Under load, concurrent acquires and releases share one call ([`BATCH`]).
//!
//! KEYS[1] is always the lock's record. Its other keys are named after it, so they share its hash tag (and
//! cluster slot): `:fence` the last fencing token (kept for a retention, see [`next_fence`]), `:queue` the wait queue (a sorted set of waiter tokens in
//! arrival order), `:waiter:<token>` each waiter's details (`<hand-over lease ms>:<metadata>`, which Redis
//! expires when the waiter stops refreshing its place) and `:released` the channel hand-overs are published
//! on. Passing one key instead of four is a third of an acquire's cost in Redis.
//!
//! The record is one string, `<token><mark><fence>:<metadata>`: cheaper for Redis than a hash, and the
//! 32-character token at its start is all that renew and release compare. The mark is `:`, or `+` once a
//! waiter may have queued behind this holder: only then does a release look at the queue. While
//! `min_hold` keeps a released lock, the token is replaced by dashes, which no hex token can equal.
//!
//! A release (or an expiry noticed by an acquire) hands the lock straight to the longest-waiting live waiter
//! and publishes `<its token>:<fence>:<hand-over lease ms>` on `<record>:released`: waiters are served in order, and the next
//! holder has the lock one message after the release instead of racing for it.

use once_cell::sync::Lazy;

/// A Lua script with its SHA1, sent as EVALSHA and, when the server has not cached it (after a restart or
/// SCRIPT FLUSH), once more as EVAL, which caches it again.
pub(super) struct LuaScript {
    pub(super) source: &'static str,
    pub(super) sha: String,
}

impl LuaScript {
    fn new(source: &'static str) -> Self {
        Self { source, sha: redis::Script::new(source).get_hash().to_owned() }
    }
}

/// Lua statements that take the lock's next fencing token into `fence` (a decimal string; `R` in scope):
/// `max(last token + 1, the server's clock in µs)`, where the last token is kept in `<record>:fence` for the
/// grant's lease (`$px`, ms) + 60 s ([`FENCE_RETENTION`](crate::backend::FENCE_RETENTION)). The clock keeps
/// tokens rising when that key is gone (a restart without persistence, FLUSHALL, a failover to a replica that
/// missed it, or the retention passed); the key keeps them strictly rising within one microsecond and across
/// a clock step back shorter than its life. `%d`: Lua would print a 16-digit number as `1.79e+15`.
macro_rules! next_fence {
    ($px:literal) => {
        concat!(
            r"local t = redis.call('time')
  local fence = string.format('%d', t[1] * 1000000 + t[2])
  local last = redis.call('set', R .. ':fence', fence, 'px', ",
            $px,
            r" + 60000, 'get')
  if last and tonumber(last) >= tonumber(fence) then
    fence = string.format('%d', tonumber(last) + 1)
    redis.call('set', R .. ':fence', fence, 'px', ",
            $px,
            r" + 60000)
  end
"
        )
    };
}

/// Grants a free lock nobody queued for (R, token, ttl and meta in scope), returning `<open>1, fence, ttl<close>`.
macro_rules! free_lock_fast_path {
    ($open:literal, $close:literal) => {
        concat!(
            r"if redis.call('exists', R, R .. ':queue') == 0 then
  ",
            next_fence!("ttl"),
            r"  redis.call('set', R, token .. ':' .. fence .. ':' .. meta, 'px', ttl)
  return ",
            $open,
            "1, tonumber(fence), tonumber(ttl)",
            $close,
            "\nend\n"
        )
    };
}

/// The Lua functions the scripts share; each script defines only those it calls, as defining them costs Redis
/// time on every call.
///
/// `hand_over(R)` gives a free lock to the longest-waiting waiter still refreshing its place, for the hand-over
/// lease it registered, and announces `<heir>:<fence>:<lease ms>`; the heir's token, or nil when nobody waits.
macro_rules! hand_over_fn {
    () => {
        concat!(
            r"local function hand_over(R)
  local Q = R .. ':queue'
  while true do
    local heir = redis.call('zpopmin', Q)[1]
    if not heir then return nil end
    -- A waiter that stopped refreshing its place has no details left: Redis expired them.
    local w = redis.call('getdel', R .. ':waiter:' .. heir)
    if w then
      local lease, meta = string.match(w, '^(%d+):(.*)$')
      ",
            next_fence!("lease"),
            r"      redis.call('set', R, heir .. '+' .. fence .. ':' .. meta, 'px', lease)
      redis.call('publish', R .. ':released', heir .. ':' .. fence .. ':' .. lease)
      return heir
    end
  end
end
"
        )
    };
}

/// `fence_of(record value)` and `enqueue(R, v, token, register ms, hand-over lease ms, metadata)`: a busy
/// attempt's place in the queue, taken or refreshed.
macro_rules! queue_fns {
    () => {
        r"local function fence_of(v)
  return tonumber(string.match(v, '^(%d+)', 34))
end
local function enqueue(R, v, token, register, lease, meta)
  local Q = R .. ':queue'
  if string.byte(v, 33) ~= 43 then
    redis.call('set', R, string.sub(v, 1, 32) .. '+' .. string.sub(v, 34), 'keepttl')
  end
  if not redis.call('zscore', Q, token) then
    local t = redis.call('time')
    redis.call('zadd', Q, t[1] * 1000000 + t[2], token)
  end
  redis.call('set', R .. ':waiter:' .. token, lease .. ':' .. meta, 'px', register)
  if redis.call('pttl', Q) < register then redis.call('pexpire', Q, register) end
end
"
    };
}

/// `acquire(R, token, ttl ms, metadata, register ms (0: do not queue), hand-over lease ms)` → code, fence, ms.
/// 1, fence, ttl: the lock is this token's for `ttl` from now, granted now or claimed (a hand-over to this
/// token, made by a release since its last busy attempt or by this call, is stretched to the full ttl).
/// 0, the holder's fence, its PTTL: busy (and, with register > 0, queued or refreshed in the queue).
/// The common case, a free lock nobody waits for, comes first: EXISTS, TIME, SET the fence, SET the record.
/// Needs the functions above.
macro_rules! acquire_fn {
    () => {
        concat!(
            "local function acquire(R, token, ttl, meta, register, lease)\n",
            free_lock_fast_path!("", ""),
            r"  local v = redis.call('get', R)
  if not v and hand_over(R) then v = redis.call('get', R) end
  if v then
    if string.sub(v, 1, 32) == token then
      redis.call('pexpire', R, ttl)
      return 1, fence_of(v), tonumber(ttl)
    end
    register = tonumber(register)
    if register > 0 then enqueue(R, v, token, register, lease, meta) end
    return 0, fence_of(v), redis.call('pttl', R)
  end
  ",
            next_fence!("ttl"),
            r"  redis.call('set', R, token .. ':' .. fence .. ':' .. meta, 'px', ttl)
  return 1, tonumber(fence), tonumber(ttl)
end
"
        )
    };
}

/// `release(R, token, keep ms (0: free it now), the record's value)` → 1 released, 0 expired (no owner), 2
/// owned by another token. Freeing hands the lock to the next live waiter, if the record's mark says one may
/// be queued. Needs `hand_over`.
macro_rules! release_fn {
    () => {
        r"local function release(R, token, keep, v)
  if not v then return 0 end
  local owner = string.sub(v, 1, 32)
  if owner ~= token then
    if owner == string.rep('-', 32) then return 0 end
    return 2
  end
  if keep == '0' then
    -- A hand-over overwrites the record; without an heir it goes.
    if string.byte(v, 33) ~= 43 or not hand_over(R) then redis.call('del', R) end
  else
    redis.call('set', R, string.rep('-', 32) .. string.sub(v, 33), 'px', keep)
  end
  return 1
end
"
    };
}

/// ARGV: token, ttl ms, metadata[, register ms, hand-over lease ms (both 0 when left out)].
/// {code, fence, ms} as `acquire` returns them.
/// The common case runs before the functions are even defined: defining them is much of a script's cost.
pub(super) static ACQUIRE: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(concat!(
        "local R, token, ttl, meta = KEYS[1], ARGV[1], ARGV[2], ARGV[3]\n",
        free_lock_fast_path!("{", "}"),
        hand_over_fn!(),
        queue_fns!(),
        acquire_fn!(),
        "return {acquire(R, token, ttl, meta, ARGV[4] or '0', ARGV[5] or '0')}"
    ))
});

/// ARGV: token[, keep ms (0 when left out)]. The outcome as `release` returns it.
/// The common case, the owner freeing a lock nobody queued for, runs before the functions are defined.
pub(super) static RELEASE: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(concat!(
        r"local R, token, keep = KEYS[1], ARGV[1], ARGV[2] or '0'
local v = redis.call('get', R)
if v and keep == '0' and string.sub(v, 1, 32) == token and string.byte(v, 33) ~= 43 then
  redis.call('del', R)
  return 1
end
",
        hand_over_fn!(),
        release_fn!(),
        "return release(R, token, keep, v)"
    ))
});

/// Several acquires and releases, of any locks, in one call: Redis spends most of a small script's time on
/// the call itself, so under load one call for many operations is what keeps up with plain SET/DEL.
/// KEYS: each operation's record, in order. ARGV[1]: one letter per operation, then each one's ARGV in
/// order: `a` acquire (token, ttl, metadata), `q` acquire and queue (the same, register, lease), `r` release
/// (token), `k` release but keep (token, keep). Returns three values per operation: {code, fence, ms} as above
/// (a release's last two are 0), or {-1, message, 0} when that operation failed (the others still ran).
pub(super) static BATCH: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(concat!(
        hand_over_fn!(),
        queue_fns!(),
        acquire_fn!(),
        release_fn!(),
        r"-- Every command of an operation runs under its pcall, so its failure is its own.
local function release_op(R, token, keep)
  return release(R, token, keep, redis.call('get', R))
end
local out = {}
local ops = ARGV[1]
local a = 2
for i = 1, #ops do
  local op = string.byte(ops, i)
  local ok, code, fence, ms
  if op == 97 then
    ok, code, fence, ms = pcall(acquire, KEYS[i], ARGV[a], ARGV[a + 1], ARGV[a + 2], '0', '0')
    a = a + 3
  elseif op == 113 then
    ok, code, fence, ms = pcall(acquire, KEYS[i], ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4])
    a = a + 5
  elseif op == 114 then
    ok, code = pcall(release_op, KEYS[i], ARGV[a], '0')
    a = a + 1
  else
    ok, code = pcall(release_op, KEYS[i], ARGV[a], ARGV[a + 1])
    a = a + 2
  end
  if ok then
    out[3 * i - 2], out[3 * i - 1], out[3 * i] = code, fence or 0, ms or 0
  else
    out[3 * i - 2], out[3 * i - 1], out[3 * i] = -1, type(code) == 'table' and code.err or tostring(code), 0
  end
end
return out"
    ))
});

/// `renew(R, token, ttl ms)` → 1 when renewed, 0 when the token no longer owns the lock.
macro_rules! renew_fn {
    () => {
        r"local function renew(R, token, ttl)
  local v = redis.call('get', R)
  if v and string.sub(v, 1, 32) == token then return redis.call('pexpire', R, ttl) end
  return 0
end
"
    };
}

/// ARGV: token, ttl ms. As `renew`.
pub(super) static RENEW: Lazy<LuaScript> =
    Lazy::new(|| LuaScript::new(concat!(renew_fn!(), "return renew(KEYS[1], ARGV[1], ARGV[2])")));

/// The renewals that came due together, in one call: KEYS the records, ARGV each one's token and ttl ms in
/// order. One result per lock, as `renew`, or the error message when that lock's renewal failed.
pub(super) static RENEW_MANY: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(concat!(
        renew_fn!(),
        r"local out = {}
for i = 1, #KEYS do
  local ok, result = pcall(renew, KEYS[i], ARGV[2 * i - 1], ARGV[2 * i])
  if ok then
    out[i] = result
  else
    out[i] = type(result) == 'table' and result.err or tostring(result)
  end
end
return out"
    ))
});

/// ARGV: token. Leaves the queue; {fence, PTTL} if the lock was handed to this token meanwhile, else {-1, 0}.
pub(super) static WITHDRAW: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(concat!(
        queue_fns!(),
        r"redis.call('zrem', KEYS[1] .. ':queue', ARGV[1])
redis.call('del', KEYS[1] .. ':waiter:' .. ARGV[1])
local v = redis.call('get', KEYS[1])
if v and string.sub(v, 1, 32) == ARGV[1] then return {fence_of(v), redis.call('pttl', KEYS[1])} end
return {-1, 0}"
    ))
});

/// ARGV: token. The PTTL if the token owns the lock, else -2.
pub(super) static REMAINING: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(
        r"local v = redis.call('get', KEYS[1])
if v and string.sub(v, 1, 32) == ARGV[1] then return redis.call('pttl', KEYS[1]) end
return -2",
    )
});

/// {metadata, fence, pttl, queue length}, or nil when nobody holds the lock.
pub(super) static INFO: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(
        r"local v = redis.call('get', KEYS[1])
if not v then return nil end
local fence, meta = string.match(v, '^(%d+):(.*)$', 34)
return {meta or '', tonumber(fence) or 0, redis.call('pttl', KEYS[1]), redis.call('zcard', KEYS[1] .. ':queue')}",
    )
});

/// ARGV: the wake-all message ([`WAKE_ALL`](crate::backend::WAKE_ALL)). Deletes the record and the wait queue
/// (no hand-over: the queue's head may have died) and tells every waiter to try again. 1 if a lock was
/// deleted, else 0.
pub(super) static FORCE_UNLOCK: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(
        r"local n = redis.call('del', KEYS[1])
redis.call('del', KEYS[1] .. ':queue')
redis.call('publish', KEYS[1] .. ':released', ARGV[1])
return n",
    )
});

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{CHANNEL, FENCE};

    /// Every grant keeps the last fencing token for its lease plus the retention the client documents.
    #[test]
    fn scripts_keep_the_fence_for_the_documented_retention() {
        let retention = format!(" + {}, 'get')", crate::backend::FENCE_RETENTION.as_millis());
        for script in [&*ACQUIRE, &*BATCH, &*RELEASE] {
            assert!(script.source.contains(&retention), "{retention} in\n{}", script.source);
            assert!(!script.source.contains("'incr'"), "a fence without expiry in\n{}", script.source);
        }
    }

    /// The scripts name a lock's fencing counter and channel after its record exactly as the client does.
    #[test]
    fn scripts_derive_the_same_key_names_as_the_client() {
        for suffix in [FENCE, CHANNEL] {
            assert!(ACQUIRE.source.contains(&format!("R .. '{suffix}'")), "{suffix}");
        }
    }
}
