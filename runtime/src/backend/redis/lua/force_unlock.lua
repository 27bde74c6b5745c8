-- FORCE_UNLOCK: deletes a lock whoever holds it, and hands it to the next waiter, if any.
-- KEYS[1]: the record R. A hand-over also touches R:fence, R:queue and R:waiter:<heir> (same hash slot) and
--   publishes on R:released.
-- ARGV: none.
-- Reply: 1 if a lock was deleted, else 0.
-- #include record fence hand_over
local n = redis.call('del', KEYS[1])
hand_over(KEYS[1])
return n
