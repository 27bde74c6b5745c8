-- ACQUIRE_PLAIN: one attempt at a lock on a store without a queue or fencing tokens (Redlock's servers).
-- KEYS[1]: the record R; no other key is touched.
-- ARGV: token, ttl ms, holder (owner and metadata, see record.lua).
-- Reply: {code, fence, ms} as `acquire_plain` returns them: {GRANTED, 0, ttl} or {BUSY, 0, PTTL}.
-- #include record fence acquire_plain_fn
return {acquire_plain(KEYS[1], ARGV[1], ARGV[2], ARGV[3])}
