-- run_batch(records, ops, a) → the BATCH reply: three values per operation. `records[i]` is operation i's
-- record, `ops` has one letter per operation (see batch.lua), and its arguments start at ARGV[a]. Every
-- command of an operation runs under its pcall, so its failure is its own. Needs acquire, acquire_plain and
-- release.
local function run_batch(records, ops, a)
  local out = {}
  for i = 1, #ops do
    local op, R = string.byte(ops, i), records[i]
    local ok, code, fence, ms
    if op == 97 then
      ok, code, fence, ms = pcall(acquire, R, ARGV[a], ARGV[a + 1], ARGV[a + 2], '0', '0')
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
    if ok then
      out[3 * i - 2], out[3 * i - 1], out[3 * i] = code, fence or 0, ms or 0
    else
      out[3 * i - 2], out[3 * i - 1], out[3 * i] = FAILED, type(code) == 'table' and code.err or tostring(code), 0
    end
  end
  return out
end
