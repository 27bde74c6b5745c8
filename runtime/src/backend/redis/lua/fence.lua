-- next_fence(R, px) → the lock's next fencing token as decimal text, and the server's clock in µs as decimal
-- text (the grant's time, which the record keeps; the token's own text unless the last token was ahead of the
-- clock). The token is max(last token + 1, the server's clock in µs), where the last token is kept in
-- `<R>:fence`. The clock keeps tokens rising when that key is gone (a restart without persistence, FLUSHALL, a
-- failover to a replica that missed it, or its retention passed); the key keeps them strictly rising within
-- one microsecond and across a clock step back shorter than its life.
--
-- How long `<R>:fence` lives: at least the grant's lease (px ms) + RETENTION_MS, at most px + KEEP_MS. Setting
-- an expiry on every grant costs Redis more than the rest of the token (the command is rewritten with an
-- absolute time for replication), so the key's expiry is set to px + KEEP_MS only when the last token is not
-- in this grant's REFRESH_MS window of the clock (the token's digits above 10^8 µs, 100 s, differ), when the
-- lease is REFRESH_MS or longer (its text has more than five digits), or when the key is new; other grants
-- keep its expiry (KEEPTTL). That is enough: the grant that set it did so at most REFRESH_MS ago with KEEP_MS =
-- RETENTION_MS + 2 REFRESH_MS, and this lease is shorter than REFRESH_MS. A token that did not come from the
-- clock (the clock was behind) always sets it.
--
-- The token is built as text from TIME's two fields, never through a Lua number: Lua would print a 16-digit
-- number as 1.79e+15, and reading TIME's strings as numbers and printing them back costs Redis as much as a
-- command. Tokens of equal length compare as text like numbers (digits only).
--
-- grant(R, token, ttl, holder) → the fencing token (decimal text) of a new grant of the free lock R to `token`
-- for ttl ms; `holder` is the record's last field as the client sends it (record.lua).
local PAD = {'00000', '0000', '000', '00', '0', ''}
local function next_fence(R, px)
  local t = redis.call('time')
  local text = t[1] .. PAD[#t[2]] .. t[2]
  local now = text
  local F = R .. ':fence'
  local last = redis.call('set', F, text, 'keepttl', 'get')
  if last and #px <= 5 and #last == #text and last < text
      and string.sub(last, 1, -9) == string.sub(text, 1, -9) then
    return text, now
  end
  if last and tonumber(last) >= tonumber(text) then
    text = string.format('%d', tonumber(last) + 1)
  end
  redis.call('set', F, text, 'px', px + KEEP_MS)
  return text, now
end
local function grant(R, token, ttl, holder)
  local fence, now = next_fence(R, ttl)
  redis.call('set', R, token .. ':' .. fence .. ':' .. now .. ':' .. holder, 'px', ttl)
  return fence
end
