-- RELEASE: gives a lock back.
-- KEYS[1]: the record R, left FREED (record.lua) when nobody takes it over. A hand-over also touches R:queue
--   and R:waiter:<heir> (same hash slot) and publishes on R:released.
-- ARGV: token[, keep ms] ('0' when left out: free it now).
-- Reply: RELEASED, EXPIRED or TAKEN_BY_OTHER, as `release` returns them.
-- #include record free
local R, token, keep = KEYS[1], ARGV[1], ARGV[2] or '0'
local v = redis.call('get', R)
-- The common case, the owner freeing a lock nobody queued for, runs before the other functions are defined.
if v and keep == '0' and string.sub(v, 1, TOKEN_END) == token and string.byte(v, MARK_AT) ~= QUEUED_MARK then
  free(R, v)
  return RELEASED
end
-- #include fence hand_over release_fn
return release(R, token, keep, v)
