-- WAITERS: who is queued for a lock, in arrival order, without their tokens.
-- KEYS[1]: the record R. Reads R:queue and each R:waiter:<token> (same hash slot).
-- ARGV[1]: how many places to look at, from the head of the queue.
-- Reply: one {holder, µs since the place was taken, PTTL of the waiter's details} per place; the holder is
--   '' and the PTTL negative for a place whose waiter stopped refreshing it (a release skips it).
-- #include record
local Q = KEYS[1] .. ':queue'
local places = redis.call('zrange', Q, 0, tonumber(ARGV[1]) - 1, 'withscores')
local t = redis.call('time')
local now = t[1] * 1000000 + t[2]
local out = {}
for i = 1, #places, 2 do
  local W = KEYS[1] .. ':waiter:' .. places[i]
  local details = redis.call('get', W)
  local holder = details and string.match(details, '^%d+:%d+:%d+:(.*)$') or ''
  out[#out + 1] = {holder, now - tonumber(places[i + 1]), redis.call('pttl', W)}
end
return out
