-- FORCE_UNLOCK: deletes a lock whoever holds it, and its wait queue, and tells every waiter to try again. No
-- hand-over: the queue's head may have died, and would then block the key for as long as its place lasts.
-- KEYS[1]: the record R. Also deletes R:queue (same hash slot) and publishes on R:released (SPUBLISH on a
--   Redis Cluster: scripts.rs).
-- ARGV[1]: the wake-all message (WAKE_ALL in the Rust code), which every waiter's subscriber reads as "retry".
-- Reply: 1 if a lock was deleted, else 0.
-- #include record
local n = redis.call('del', KEYS[1])
redis.call('del', KEYS[1] .. ':queue')
redis.call('publish', KEYS[1] .. ':released', ARGV[1])
return n
