-- RENEW_MANY: the renewals that came due together, in one call.
-- KEYS: the records. ARGV: each one's token and ttl ms, in order.
-- Reply: one value per lock, as RENEW replies, or the error message when that lock's renewal failed.
-- #include record renew_fn
local out = {}
for i = 1, #KEYS do
  local ok, result = pcall(renew, KEYS[i], ARGV[2 * i - 1], ARGV[2 * i])
  if ok then
    out[i] = result
  else
    out[i] = type(result) == 'table' and result.err or tostring(result)
  end
end
return out
