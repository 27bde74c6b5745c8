-- acquire_plain(R, token, ttl ms, holder, S) → code, age, ms: one attempt on a store with neither a queue nor
-- fencing tokens (each server of a Redlock group, whose fencing is refused and whose waiters poll):
-- GRANTED, age, ttl: the lock was free, or already this token's (a resent attempt), and is now the token's for
--   at least ttl from now (a resent attempt never shortens a lease: the client may have renewed or extended it
--   meanwhile, and counts on that lease, see redlock/round.rs);
-- BUSY, 0, its PTTL: another grant holds it.
-- The record is the one record.lua describes, with fence 0 and the server's clock as <granted> (a release
-- deletes it: free.lua); no last token and no queue are read or written, which is what makes this cheaper
-- than ACQUIRE for Redis. Needs the script's `clock` (fence.lua).
--
-- S is this server's lock-state mark (redlock/restart.rs): the server's clock in µs when a grant found it
-- missing and wrote it, which happens once after the server lost every key (a restart without persistence,
-- FLUSHALL), or "0" on a group set up fresh. It is the one key written without an expiry: it must outlive
-- every lease, and goes only with the records it vouches for. A grant's `age` is how long ago, in ms by this
-- server's clock, its lock state began: a server whose state is younger than a lease may have lost a record
-- that a holder still counts on, and the client does not count its grant for a new holder (0 if the clock
-- stepped back).
local function state_age(S)
  local since = redis.call('get', S)
  if not since then
    redis.call('set', S, clock)
    return 0
  end
  return math.max(0, math.floor((tonumber(clock) - tonumber(since)) / 1000))
end

local function acquire_plain(R, token, ttl, holder, S)
  -- #include clock
  if redis.call('set', R, token .. ':0:' .. clock .. ':' .. holder, 'nx', 'px', ttl) then
    return GRANTED, state_age(S), ttl
  end
  local v = redis.call('get', R)
  if string.sub(v, 1, TOKEN_END) == token then
    if redis.call('pttl', R) < tonumber(ttl) then
      redis.call('pexpire', R, ttl)
    end
    return GRANTED, state_age(S), ttl
  end
  -- Freed by a store with tokens on the same server (record.lua): free here too.
  if string.sub(v, 1, TOKEN_HALF) == FREED then
    redis.call('set', R, token .. ':0:' .. clock .. ':' .. holder, 'px', ttl)
    return GRANTED, state_age(S), ttl
  end
  return BUSY, 0, redis.call('pttl', R)
end
