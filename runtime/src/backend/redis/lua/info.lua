-- INFO: who holds a lock.
-- KEYS[1]: the record R. Also reads R:queue (same hash slot).
-- ARGV: none.
-- Reply: {metadata, fence, PTTL, queue length}, or nil when nobody holds the lock.
-- #include record
local v = redis.call('get', KEYS[1])
if not v then return nil end
local fence, meta = string.match(v, '^(%d+):(.*)$', FENCE_AT)
return {meta or '', tonumber(fence) or 0, redis.call('pttl', KEYS[1]), redis.call('zcard', KEYS[1] .. ':queue')}
