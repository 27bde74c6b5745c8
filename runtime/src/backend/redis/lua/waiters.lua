-- WAITERS: who is queued for a lock, in arrival order, without their tokens.
-- KEYS[1]: the record R. Reads R:queue, each R:waiter:<token> and its R:client:<client> (same hash slot).
-- ARGV[1]: how many places to look at, from the head of the queue.
-- Reply: one {holder, µs since the place was taken, how long it lives unless refreshed (the PTTL of its
--   details or of its client's mark, the shorter)} per place; the holder is '' and the PTTL negative for a
--   place whose waiter or client stopped refreshing it (a release skips it).
-- #include record
local Q = KEYS[1] .. ':queue'
local places = redis.call('zrange', Q, 0, tonumber(ARGV[1]) - 1, 'withscores')
local t = redis.call('time')
local now = t[1] * 1000000 + t[2]
local out = {}
for i = 1, #places, 2 do
  local W = KEYS[1] .. ':waiter:' .. places[i]
  local details = redis.call('get', W)
  local client, holder
  if details then client, holder = string.match(details, '^%d+:%d+:%d+:(%x+):(.*)$') end
  local pttl = -2
  if holder then pttl = math.min(redis.call('pttl', W), redis.call('pttl', KEYS[1] .. ':client:' .. client)) end
  if pttl < 0 then holder = '' end
  out[#out + 1] = {holder or '', now - tonumber(places[i + 1]), pttl}
end
return out
