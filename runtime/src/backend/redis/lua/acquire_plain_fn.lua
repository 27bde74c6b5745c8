-- acquire_plain(R, token, ttl ms, holder) → code, fence, ms: one attempt on a store with neither a queue nor
-- fencing tokens (each server of a Redlock group, whose fencing is refused and whose waiters poll):
-- GRANTED, 0, ttl: the lock was free, or already this token's (a resent attempt), and is now the token's for
--   ttl from now;
-- BUSY, 0, its PTTL: another grant holds it.
-- The record is the one record.lua describes, with fence 0 and the server's clock as <granted> (a release
-- deletes it: free.lua); no last token and no queue are read or written, which is what makes this cheaper
-- than ACQUIRE for Redis. Needs the script's `clock` (fence.lua).
local function acquire_plain(R, token, ttl, holder)
  -- #include clock
  if redis.call('set', R, token .. ':0:' .. clock .. ':' .. holder, 'nx', 'px', ttl) then
    return GRANTED, 0, ttl
  end
  local v = redis.call('get', R)
  if string.sub(v, 1, TOKEN_END) == token then
    redis.call('pexpire', R, ttl)
    return GRANTED, 0, ttl
  end
  -- Freed by a store with tokens on the same server (record.lua): free here too.
  if string.sub(v, 1, TOKEN_HALF) == FREED then
    redis.call('set', R, token .. ':0:' .. clock .. ':' .. holder, 'px', ttl)
    return GRANTED, 0, ttl
  end
  return BUSY, 0, redis.call('pttl', R)
end
