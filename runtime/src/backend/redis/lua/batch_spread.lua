-- BATCH_SPREAD: BATCH for the operations of one Redis Cluster node, whatever their slots (BATCH's declared
-- keys must share one slot).
-- KEYS[1]: one of the records; it routes the call to the node serving its slot. The records themselves come in
--   ARGV: a script without flags may reach keys of any slot its node serves (each lock's keys share its
--   record's slot, see acquire.lua). An operation whose record the node does not serve (its slot moved) fails
--   alone, before writing anything, and the client sends it again in a call of its own.
-- ARGV[1]: one letter per operation, as BATCH's; then each operation's record, in order; then the operations'
--   arguments as BATCH takes them.
-- Reply: as BATCH's.
-- #include record
-- The script's clock (fence.lua): one TIME a call, shared by the inline grants and the slow paths'.
local clock
-- #include batch_slow
-- #include batch_fn
return run_batch(ARGV, 1, ARGV[1], #ARGV[1] + 2)
