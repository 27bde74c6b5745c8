-- FORCE_UNLOCK: frees a lock whoever holds it, deletes its wait queue, and tells every waiter to try again. No
-- hand-over: the queue's head may have died, and would then block the key for as long as its place lasts.
-- KEYS[1]: the record R, left FREED (record.lua) so that the next grant's token still follows the last one.
--   Also deletes R:queue (same hash slot) and publishes on R:released (SPUBLISH on a Redis Cluster: scripts.rs).
-- ARGV[1]: the wake-all message (WAKE_ALL in the Rust code), which every waiter's subscriber reads as "retry".
-- Reply: 1 if a lock was held (also by nobody, for min_hold), 2 if the key held a value distlock did not write
--   (deleted), else 0.
-- #include record free
local R = KEYS[1]
-- A value that is not a string (not distlock's) is deleted, as GET cannot read it.
local v = redis.pcall('get', R)
local n = 0
if type(v) == 'string' and not string.match(v, '^%d+:', FENCE_AT) then
  n = redis.call('del', R) * 2
elseif type(v) == 'string' then
  if string.sub(v, 1, TOKEN_HALF) ~= FREED then n = 1 end
  free(R, v)
  -- FREED over the second half too: the holder's own release, sent later, must not read as done by it.
  if redis.call('exists', R) == 1 then redis.call('setrange', R, tostring(TOKEN_HALF), FREED) end
elseif v then
  n = redis.call('del', R) * 2
end
redis.call('del', R .. ':queue')
redis.call('publish', R .. ':released', ARGV[1])
return n
