-- ACQUIRE: one attempt at a lock.
-- KEYS[1]: the record R. Also touches, derived from R (same hash slot): R:queue, R:waiter:<token> (this
--   token's and a hand-over heir's), R:client:<client> (this client's and the heir's), R:last, and publishes
--   on R:released.
-- ARGV: token, ttl ms, holder (owner and metadata, see record.lua)[, register ms, hand-over lease ms, attempt,
--   client, keep ms] (each '0' when left out; register '0': do not queue; attempt: the attempt's number, which
--   a hand-over using its registration announces; client: the client's id in hex, whose mark R:client:<id>
--   lasts `register`; keep: how long the place lasts unless refreshed. See queue.lua).
-- Reply: a grant made on the fast path is its fence alone, as the decimal text the script has (its lease is
--   the ttl asked for): one value costs Redis and the client less to write and parse than an array of three,
--   and text less than a number (tonumber is a strtod; 2.2k Redis instructions a lone cycle). Otherwise {code,
--   fence, ms} as `acquire` returns them: {GRANTED, fence, ttl} or {BUSY, holder's fence, PTTL}.
-- #include record
local R, token, ttl, holder = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
-- The common cases (as `acquire` takes them first: a FREED record, or none and no queue) run inline, before any
-- function is defined: defining one costs Redis time on every call.
local v = redis.call('get', R)
local free, last
-- #include is_free
if free then
  local clock, fence, now
  -- #include grant
  return fence
end
-- #include fence hand_over queue acquire_fn
return {acquire(R, token, ttl, holder, ARGV[4] or '0', ARGV[5] or '0', ARGV[6] or '0', ARGV[7] or '0',
  ARGV[8] or '0', v)}
