-- WITHDRAW: a waiter leaves the queue.
-- KEYS[1]: the record R. Also touches R:queue and R:waiter:<token> (same hash slot); not R:client:<client>, which
--   lasts until it expires (the client's other waiters may need it; queue.lua, included, writes it).
-- ARGV: token.
-- Reply: {fence, PTTL} if the lock was handed to this token meanwhile (it now holds it), else {NOT_HANDED, 0}.
-- #include record queue
local R, token = KEYS[1], ARGV[1]
redis.call('zrem', R .. ':queue', token)
redis.call('del', R .. ':waiter:' .. token)
local v = redis.call('get', R)
if v and string.sub(v, 1, TOKEN_END) == token then return {fence_of(v), redis.call('pttl', R)} end
return {NOT_HANDED, 0}
