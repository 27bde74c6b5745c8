-- ACQUIRE_PLAIN: one attempt at a lock on a store without a queue or fencing tokens (Redlock's servers).
-- KEYS[1]: the record R. ARGV: token, ttl ms, holder (owner and metadata, see record.lua), S: the server's
-- lock-state mark (acquire_plain_fn.lua), the one key besides R it reads, and writes when it is missing.
-- Reply: {code, age, ms} as `acquire_plain` returns them: {GRANTED, the state's age in ms, ttl} or
-- {BUSY, 0, PTTL}.
-- #include record fence acquire_plain_fn
return {acquire_plain(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4])}
