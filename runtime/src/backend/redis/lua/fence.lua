-- next_fence(last) → the lock's next fencing token as decimal text, and the server's clock in µs as decimal
-- text (the grant's time, which the record keeps; the token's own text unless the last token was ahead of the
-- clock). `last` is the lock's last token as its record still holds it (held, kept by min_hold, or FREED:
-- record.lua), or nil when the record is gone. The token is max(last + 1, the server's clock in µs). The clock
-- keeps tokens rising when the record is gone: it goes only when its lease ran out (a lease, renewals
-- included, ends at least ttl after its grant, so the clock has passed the grant's token by then, unless it
-- stepped back by more than that), or with a restart without persistence, FLUSHALL or a failover to a replica
-- that missed it. The record's token keeps them strictly rising within one microsecond and across a clock
-- step back while it lives. No other key is written: a second key with its own expiry cost Redis more than
-- the rest of the grant.
--
-- One script reads the clock once (TIME costs Redis as much as a write): its grants all happen at the moment it
-- runs, and several grants of one lock in one call still rise by the record's +1.
--
-- The token is built as text from TIME's two fields, never through a Lua number: Lua would print a 16-digit
-- number as 1.79e+15, and reading TIME's strings as numbers and printing them back costs Redis as much as a
-- command. Tokens of equal length compare as text like numbers (digits only).
--
-- grant(R, token, ttl, holder, last) → the fencing token (decimal text) of a new grant of the free lock R to
-- `token` for ttl ms; `holder` is the record's last field as the client sends it (record.lua), `last` as for
-- next_fence.
--
-- Both bodies are shared snippets (next_fence.lua, grant.lua), which ACQUIRE's fast path also runs inline: a
-- function defined in a script is a new closure on every call, and the fence's two cost Redis as much as a
-- quarter of a grant.
local clock
local function next_fence(last)
  local fence, now
  -- #include next_fence
  return fence, now
end
local function grant(R, token, ttl, holder, last)
  local fence, now
  -- #include grant
  return fence
end
