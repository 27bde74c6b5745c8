-- BATCH: several acquires and releases, of any locks, in one call. Redis spends most of a small script's
-- time on the call itself, so under load one call for many operations is what keeps up with plain SET/DEL.
-- KEYS: each operation's record, in order (each touches its derived keys as ACQUIRE and RELEASE do).
-- ARGV[1]: one letter per operation; then each operation's arguments, in order:
--   a  acquire: token, ttl ms, holder
--   q  acquire and queue: token, ttl ms, holder, register ms, hand-over lease ms
--   p  acquire on a store without queue or fencing (ACQUIRE_PLAIN): token, ttl ms, holder
--   r  release: token
--   k  release but keep: token, keep ms
-- Reply: three values per operation: {code, fence, ms} as ACQUIRE replies, {code, 0, 0} for a release, or
--   {FAILED, error message, 0} when that operation failed (the others still ran).
-- #include record fence hand_over queue acquire_fn acquire_plain_fn release_fn
-- Every command of an operation runs under its pcall, so its failure is its own.
local function release_op(R, token, keep)
  return release(R, token, keep, redis.call('get', R))
end
local out = {}
local ops = ARGV[1]
local a = 2
for i = 1, #ops do
  local op = string.byte(ops, i)
  local ok, code, fence, ms
  if op == 97 then
    ok, code, fence, ms = pcall(acquire, KEYS[i], ARGV[a], ARGV[a + 1], ARGV[a + 2], '0', '0')
    a = a + 3
  elseif op == 112 then
    ok, code, fence, ms = pcall(acquire_plain, KEYS[i], ARGV[a], ARGV[a + 1], ARGV[a + 2])
    a = a + 3
  elseif op == 113 then
    ok, code, fence, ms = pcall(acquire, KEYS[i], ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4])
    a = a + 5
  elseif op == 114 then
    ok, code = pcall(release_op, KEYS[i], ARGV[a], '0')
    a = a + 1
  else
    ok, code = pcall(release_op, KEYS[i], ARGV[a], ARGV[a + 1])
    a = a + 2
  end
  if ok then
    out[3 * i - 2], out[3 * i - 1], out[3 * i] = code, fence or 0, ms or 0
  else
    out[3 * i - 2], out[3 * i - 1], out[3 * i] = FAILED, type(code) == 'table' and code.err or tostring(code), 0
  end
end
return out
