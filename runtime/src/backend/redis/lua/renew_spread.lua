-- RENEW_SPREAD: the renewals that came due together for locks of one Redis Cluster node, whatever their slots,
-- in one call (RENEW_MANY takes one slot's only, as a call's declared keys must share a slot).
-- KEYS[1]: one of the records; it routes the call to the node serving its slot. The records themselves come in
--   ARGV: a script without flags may reach keys of any slot its node serves. A record the node does not serve
--   (its slot moved) fails alone, and the client renews it with its own slot's call.
-- ARGV: each lock's record, token and ttl ms, in order.
-- Reply: one value per lock, as RENEW replies, or the error message when that lock's renewal failed.
-- #include record renew_fn
local out = {}
for i = 1, #ARGV / 3 do
  local ok, result = pcall(renew, ARGV[3 * i - 2], ARGV[3 * i - 1], ARGV[3 * i])
  if ok then
    out[i] = result
  else
    out[i] = type(result) == 'table' and result.err or tostring(result)
  end
end
return out
