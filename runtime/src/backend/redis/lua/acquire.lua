-- ACQUIRE: one attempt at a lock.
-- KEYS[1]: the record R. Also touches, derived from R (same hash slot): R:queue, R:waiter:<token> (this
--   token's and a hand-over heir's), and publishes on R:released.
-- ARGV: token, ttl ms, holder (owner and metadata, see record.lua)[, register ms, hand-over lease ms] (both
--   '0' when left out; register '0': do not queue).
-- Reply: {code, fence, ms} as `acquire` returns them: {GRANTED, fence, ttl} or {BUSY, holder's fence, PTTL}.
-- #include record fence
local R, token, ttl, holder = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
-- The common cases (as `acquire` takes them first) run before the other functions are defined: defining them
-- costs time on every call.
local v = redis.call('get', R)
if v then
  if string.sub(v, 1, TOKEN_END) == FREED then
    return {GRANTED, grant(R, token, ttl, holder, string.sub(v, FENCE_AT)), ttl}
  end
elseif redis.call('exists', R .. ':queue') == 0 then
  return {GRANTED, grant(R, token, ttl, holder, nil), ttl}
end
-- #include hand_over queue acquire_fn
return {acquire(R, token, ttl, holder, ARGV[4] or '0', ARGV[5] or '0')}
