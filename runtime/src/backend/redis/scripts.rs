//! The Lua scripts: each operation is one script call, so one round trip, with keys and values only in
//! KEYS and ARGV.
//!
//! Every script gets the same KEYS: the record, the fencing counter, the wait queue (a sorted set of waiter
//! tokens in arrival order) and the waiters' details (a hash: token → `<expires ms>:<lease ms>:<metadata>`).
//! All four share the lock's hash tag.
//!
//! The record is one string, `<token>:<fence>:<acquired at, server ms>:<metadata>`: cheaper for Redis than a
//! hash, and the 32-character token at its start is all that renew and release compare. While
//! `hold_at_least` keeps a released lock, the token is replaced by dashes, which no hex token can equal.
//!
//! A release (or an expiry noticed by an acquire) hands the lock straight to the longest-waiting live waiter
//! and publishes `<its token>:<fence>` on `<record>:released`: waiters are served in order, and the next
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

/// Helpers every script may use: the server clock in ms, the fence of a record, queueing a waiter, and
/// handing a free lock to the longest live waiter.
macro_rules! prelude {
    () => {
        r"local NOBODY = string.rep('-', 32)
local function now_ms()
  local t = redis.call('time')
  return t[1] * 1000 + math.floor(t[2] / 1000)
end
local function fence_of(v)
  return tonumber(string.match(v, '^[^:]*:(%d+):'))
end
local function enqueue(token, register, lease, meta)
  local t = redis.call('time')
  if not redis.call('zscore', KEYS[3], token) then
    redis.call('zadd', KEYS[3], t[1] * 1000000 + t[2], token)
  end
  local expires = t[1] * 1000 + math.floor(t[2] / 1000) + register
  redis.call('hset', KEYS[4], token, string.format('%d', expires) .. ':' .. lease .. ':' .. meta)
  for i = 3, 4 do
    if redis.call('pttl', KEYS[i]) < register then redis.call('pexpire', KEYS[i], register) end
  end
end
local function hand_over()
  local now = now_ms()
  while true do
    local heir = redis.call('zrange', KEYS[3], 0, 0)[1]
    if not heir then return nil end
    redis.call('zrem', KEYS[3], heir)
    local w = redis.call('hget', KEYS[4], heir)
    redis.call('hdel', KEYS[4], heir)
    if w then
      local expires, lease, meta = string.match(w, '^(%d+):(%d+):(.*)$')
      if tonumber(expires) > now then
        local fence = redis.call('incr', KEYS[2])
        redis.call('set', KEYS[1], heir .. ':' .. fence .. ':' .. string.format('%d', now) .. ':' .. meta, 'px', lease)
        redis.call('publish', KEYS[1] .. ':released', heir .. ':' .. fence)
        return heir
      end
    end
  end
end
"
    };
}

/// ARGV: token, ttl ms, metadata, register ms (0: do not queue), hand-over lease ms.
/// {1, fence}: granted now. {2, fence}: handed over to this token by a release since its last busy attempt
/// (claiming it sets the full ttl).
/// {0, PTTL}: busy (and, with register > 0, queued or refreshed in the queue).
/// The common case, a free lock nobody waits for, runs first and alone: the helpers are only built after it.
pub(super) static ACQUIRE: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(concat!(
        r"if redis.call('exists', KEYS[1], KEYS[3]) == 0 then
  local fence = redis.call('incr', KEYS[2])
  local t = redis.call('time')
  local since = string.format('%d', t[1] * 1000 + math.floor(t[2] / 1000))
  redis.call('set', KEYS[1], ARGV[1] .. ':' .. fence .. ':' .. since .. ':' .. ARGV[3], 'px', ARGV[2])
  return {1, fence}
end
",
        prelude!(),
        r"local v = redis.call('get', KEYS[1])
if not v then
  local heir = hand_over()
  if heir == ARGV[1] then return {2, fence_of(redis.call('get', KEYS[1]))} end
  if heir then v = redis.call('get', KEYS[1]) end
end
if v then
  if string.sub(v, 1, 32) == ARGV[1] then
    redis.call('pexpire', KEYS[1], ARGV[2])
    return {2, fence_of(v)}
  end
  local register = tonumber(ARGV[4])
  if register > 0 then enqueue(ARGV[1], register, ARGV[5], ARGV[3]) end
  return {0, redis.call('pttl', KEYS[1])}
end
local fence = redis.call('incr', KEYS[2])
redis.call('set', KEYS[1], ARGV[1] .. ':' .. fence .. ':' .. string.format('%d', now_ms()) .. ':' .. ARGV[3], 'px', ARGV[2])
return {1, fence}"
    ))
});

/// ARGV: token, ttl ms. 1 when renewed, 0 when the token no longer owns the lock.
pub(super) static RENEW: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(
        r"local v = redis.call('get', KEYS[1])
if v and string.sub(v, 1, 32) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
return 0",
    )
});

/// ARGV: token, keep ms (0: free it now). 1 released, 0 expired (no owner), 2 owned by another token.
/// The common case, the owner freeing a lock nobody waits for, runs first and alone.
pub(super) static RELEASE: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(concat!(
        r"local v = redis.call('get', KEYS[1])
local mine = v and string.sub(v, 1, 32) == ARGV[1]
if mine and ARGV[2] == '0' then
  redis.call('del', KEYS[1])
  if redis.call('exists', KEYS[3]) == 0 then return 1 end
end
",
        prelude!(),
        r"if not v then return 0 end
if not mine then
  if string.sub(v, 1, 32) == NOBODY then return 0 end
  return 2
end
if ARGV[2] ~= '0' then
  redis.call('set', KEYS[1], NOBODY .. string.sub(v, 33), 'px', ARGV[2])
  return 1
end
hand_over()
return 1"
    ))
});

/// ARGV: token. Leaves the queue; the fence if the lock was handed to this token meanwhile, else -1.
pub(super) static WITHDRAW: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(concat!(
        prelude!(),
        r"redis.call('zrem', KEYS[3], ARGV[1])
redis.call('hdel', KEYS[4], ARGV[1])
local v = redis.call('get', KEYS[1])
if v and string.sub(v, 1, 32) == ARGV[1] then return fence_of(v) end
return -1"
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
local fence, meta = string.match(v, '^[^:]*:(%d+):%d+:(.*)$')
return {meta or '', tonumber(fence) or 0, redis.call('pttl', KEYS[1]), redis.call('zcard', KEYS[3])}",
    )
});

/// 1 if a lock was deleted (and handed to the next waiter, if any), else 0.
pub(super) static FORCE_UNLOCK: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(concat!(
        prelude!(),
        r"local n = redis.call('del', KEYS[1])
if redis.call('exists', KEYS[3]) == 1 then hand_over() end
return n"
    ))
});
