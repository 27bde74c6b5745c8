-- run_batch(records, at, ops, a) → the BATCH reply: one value per operation (batch.lua). `records[at + i]`
-- is operation i's record (read in place: a copy into a table of their own cost Redis 1.6k instructions a
-- lock cycle), `ops` has one letter per operation (see batch.lua), and its arguments start at ARGV[a]. Every
-- command of an operation runs under its pcall, so its failure is its own. Needs acquire, acquire_plain and
-- release.
local function run_batch(records, at, ops, a)
  local out = {}
  -- The ttl and holder of the last 'a', which a 'b' reuses.
  local ttl, holder
  for i = 1, #ops do
    local op, R = string.byte(ops, i), records[at + i]
    local ok, code, fence, ms
    if op == 98 then
      ok, code, fence, ms = pcall(acquire, R, ARGV[a], ttl, holder, '0', '0')
      a = a + 1
    elseif op == 97 then
      ttl, holder = ARGV[a + 1], ARGV[a + 2]
      ok, code, fence, ms = pcall(acquire, R, ARGV[a], ttl, holder, '0', '0')
      a = a + 3
    elseif op == 112 then
      ok, code, fence, ms = pcall(acquire_plain, R, ARGV[a], ARGV[a + 1], ARGV[a + 2])
      a = a + 3
    elseif op == 113 then
      ok, code, fence, ms = pcall(acquire, R, ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4])
      a = a + 5
    elseif op == 114 then
      ok, code = pcall(release_op, R, ARGV[a], '0')
      a = a + 1
    else
      ok, code = pcall(release_op, R, ARGV[a], ARGV[a + 1])
      a = a + 2
    end
    -- One value per operation: each value more in the reply cost Redis about 1k instructions.
    if not ok then
      out[i] = {FAILED, type(code) == 'table' and code.err or tostring(code), 0}
    elseif op == 114 or op == 107 then
      out[i] = code
    elseif code == GRANTED and fence then
      out[i] = fence
    else
      out[i] = {code, fence or 0, ms or 0}
    end
  end
  return out
end
