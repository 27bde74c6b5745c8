-- ACQUIRE_ALL: several locks in one step, all or none: the multi-key fast path on one server (or one slot).
-- KEYS: the records R1..Rn, distinct. Also reads, derived from each R (see acquire.lua), R:queue.
-- ARGV: ttl ms, holder (record.lua), then the tokens, one per record in KEYS order.
-- Reply: the fencing tokens of the grants, in KEYS order, each for ttl ms; or an empty array, having changed
--   nothing, when any lock is held (also by nobody, for min_hold) or has a queue: waiters are not jumped, and a
--   lock that needs a hand-over or a claim is left to ACQUIRE, one key at a time.
-- #include record fence
local ttl, holder = ARGV[1], ARGV[2]
-- Each lock's last token, where its FREED record keeps one.
local last = {}
for i = 1, #KEYS do
  local v = redis.call('get', KEYS[i])
  if v then
    if string.sub(v, 1, TOKEN_END) ~= FREED then return {} end
    last[i] = string.sub(v, FENCE_AT)
  elseif redis.call('exists', KEYS[i] .. ':queue') ~= 0 then
    return {}
  end
end
local fences = {}
for i = 1, #KEYS do
  fences[i] = grant(KEYS[i], ARGV[i + 2], ttl, holder, last[i])
end
return fences
