-- INFO: who holds a lock.
-- KEYS[1]: the record R. Also reads R:queue (same hash slot).
-- ARGV: none.
-- Reply: {holder, fence, µs since the grant by the server's clock, PTTL, queue length, 1 if released and kept
--   by min_hold (NOBODY) else 0}, or nil when nobody holds the lock; an error for a value that is not a lock
--   record.
-- #include record
local v = redis.call('get', KEYS[1])
if not v or string.sub(v, 1, TOKEN_HALF) == FREED then return nil end
local fence, granted, holder = string.match(v, '^(%d+):(%d+):(.*)$', FENCE_AT)
if not holder then return redis.error_reply('FOREIGN the value at ' .. KEYS[1] .. ' was not written by distlock') end
local t = redis.call('time')
local held = t[1] * 1000000 + t[2] - tonumber(granted)
local kept = 0
if string.sub(v, 1, TOKEN_HALF) == NOBODY then kept = 1 end
return {holder, tonumber(fence), held, redis.call('pttl', KEYS[1]), redis.call('zcard', KEYS[1] .. ':queue'), kept}
