-- ACQUIRE_ALL: several locks in one step, all or none: the multi-key fast path on one server (or one slot).
-- KEYS: the records R1..Rn, distinct. Also reads, derived from each R (see acquire.lua), R:queue.
-- ARGV: ttl ms, holder (record.lua), then the tokens, one per record in KEYS order.
-- Reply: the fencing tokens of the grants, in KEYS order, each for ttl ms; or an empty array, having changed
--   nothing, when any lock is held (also by nobody, for min_hold) or has a queue: waiters are not jumped, and a
--   lock that needs a hand-over or a claim is left to ACQUIRE, one key at a time.
-- #include record fence
local ttl, holder = ARGV[1], ARGV[2]
-- Each lock's last token, where its FREED record keeps one.
local lasts = {}
for i = 1, #KEYS do
  local R = KEYS[i]
  local v = redis.call('get', R)
  local free, last
  -- #include is_free
  if not free then return {} end
  lasts[i] = last
end
local fences = {}
for i = 1, #KEYS do
  fences[i] = grant(KEYS[i], ARGV[i + 2], ttl, holder, lasts[i])
end
return fences
