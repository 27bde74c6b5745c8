-- run_batch(records, at, ops, a) → the BATCH reply: one value per operation (batch.lua). `records[at + i]`
-- is operation i's record (read in place: a copy into a table of their own cost Redis 1.6k instructions a
-- lock cycle), `ops` has one letter per operation (see batch.lua), and its arguments start at ARGV[a].
--
-- The common cases run inline, as ACQUIRE's and RELEASE's fast paths do: an acquire of a FREED lock or of
-- one with no record and no queue, and a release by its owner with nobody queued. Anything else calls the
-- functions `slow()` defines, on the first operation that needs them (batch_slow.lua).
--
-- An operation's failure is its own: the loop runs under one pcall, and when an operation raises, the pass
-- ends there, its value is FAILED and the next pass goes on with the operation after it. (A pcall and a
-- function call per operation cost Redis more than the operation's own commands inside.) Each operation
-- moves `a` past its arguments before it runs a command, so a failed one leaves the next one's in place.
local function run_batch(records, at, ops, a)
  local out, n, i = {}, #ops, 0
  -- The ttl and holder of the last 'a', which a 'b' reuses.
  local ttl, holder
  local function pass()
    while i < n do
      i = i + 1
      local op, R, t = string.byte(ops, i), records[at + i], a
      -- An acquire that leaves the fast path: its reply, as one value (below).
      local code, fence, ms
      if op == 98 or op == 97 then
        if op == 97 then
          ttl, holder, a = ARGV[t + 1], ARGV[t + 2], t + 3
        else
          a = t + 1
        end
        local token, v = ARGV[t], redis.call('get', R)
        local free, last
        -- #include is_free
        if free then
          local now
          -- #include grant
          out[i] = fence
        else
          code, fence, ms = slow().acquire(R, token, ttl, holder, '0', '0', '0', '0', '0', v)
        end
      elseif op == 114 then
        a = t + 2
        local token, v = ARGV[t], redis.call('get', R)
        -- (A token is TOKEN_END hex digits: a shorter one must not match as a prefix.)
        if v and #token == TOKEN_END and string.find(v, token, 1, true) == 1
            and string.byte(v, MARK_AT) ~= QUEUED_MARK then
          -- #include freeing
          out[i] = RELEASED
        else
          out[i] = slow().release(R, token, '0', v, false, ARGV[t + 1])
        end
      elseif op == 107 then
        a = t + 3
        out[i] = slow().release(R, ARGV[t], ARGV[t + 2], redis.call('get', R), false, ARGV[t + 1])
      elseif op == 115 then
        a = t + 4
        out[i] = slow().release(R, ARGV[t], ARGV[t + 2], redis.call('get', R), true, ARGV[t + 1])
      elseif op == 113 then
        a = t + 8
        code, fence, ms = slow().acquire(R, ARGV[t], ARGV[t + 1], ARGV[t + 2], ARGV[t + 3], ARGV[t + 4], ARGV[t + 5],
          ARGV[t + 6], ARGV[t + 7])
      elseif op == 112 then
        a = t + 4
        code, fence, ms = slow().acquire_plain(R, ARGV[t], ARGV[t + 1], ARGV[t + 2], ARGV[t + 3])
      else
        -- Where its arguments end is unknown, so every operation from here on fails with it.
        a = #ARGV + 1
        error('unknown operation ' .. string.char(op))
      end
      -- One value per operation: each value more in the reply cost Redis about 1k instructions.
      if code == GRANTED and fence then
        out[i] = fence
      elseif code then
        out[i] = {code, fence or 0, ms or 0}
      end
    end
  end
  while i < n do
    local ok, e = pcall(pass)
    if not ok then out[i] = {FAILED, type(e) == 'table' and e.err or tostring(e), 0} end
  end
  return out
end
