-- RELEASE: gives a lock back.
-- KEYS[1]: the record R, left FREED (record.lua) when nobody takes it over. A hand-over also touches R:queue,
--   R:waiter:<heir> and R:client:<heir's client> (same hash slot) and publishes on R:released; a hand-over,
--   min_hold and a release sent again read or write R:last.
-- ARGV: token, the grant's fencing token ('' if unknown)[, keep ms ('0' when left out: free it now)[, '1': sent
--   again, the first send's outcome unknown]].
-- Reply: RELEASED, EXPIRED, TAKEN_BY_OTHER or UNCONFIRMED, as `release` returns them.
-- #include record
local R, token, fence, keep = KEYS[1], ARGV[1], ARGV[2] or '', ARGV[3] or '0'
local v = redis.call('get', R)
-- The common case, the owner freeing a lock nobody queued for, runs inline, before any function is defined.
-- (A token is TOKEN_END hex digits: a shorter one must not match as a prefix.)
if v and keep == '0' and #token == TOKEN_END and string.find(v, token, 1, true) == 1
    and string.byte(v, MARK_AT) ~= QUEUED_MARK then
  -- #include freeing
  return RELEASED
end
-- #include free fence hand_over release_fn
return release(R, token, keep, v, ARGV[4] == '1', fence)
