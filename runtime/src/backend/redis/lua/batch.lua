-- BATCH: several acquires and releases, of any locks, in one call. Redis spends most of a small script's
-- time on the call itself, so under load one call for many operations is what keeps up with plain SET/DEL.
-- KEYS: each operation's record, in order (each touches its derived keys as ACQUIRE and RELEASE do).
-- ARGV[1]: one letter per operation; then each operation's arguments, in order:
--   a  acquire: token, ttl ms, holder
--   b  acquire with the ttl and holder of the last 'a' before it in this call: token
--   p  acquire on a store without queue or fencing (ACQUIRE_PLAIN): token, ttl ms, holder
--   q  acquire and queue: token, ttl ms, holder, register ms, hand-over lease ms
--   r  release: token
--   k  release but keep: token, keep ms
-- Reply: one value per operation: a grant's fencing token as decimal text (its lease is the ttl asked for;
--   ACQUIRE_PLAIN's grants: 0), a release's code, {code, fence, ms} for any other acquire reply (as ACQUIRE's
--   slow path), or {FAILED, error message, 0} when that operation failed (the others still ran).
-- #include record
-- The script's clock (fence.lua): one TIME a call, shared by the inline grants and the slow paths'.
local clock
-- #include batch_slow
-- #include batch_fn
return run_batch(KEYS, 0, ARGV[1], 2)
