-- next_fence(R, px) → the lock's next fencing token, as a number and as decimal text, and the server's clock
-- in µs as decimal text (the grant's time, which the record keeps: the token's own text unless the last token
-- was ahead of the clock, so no second TIME nor format). The token is max(last token + 1, the server's clock
-- in µs), where the last token is kept in `<R>:fence` for the grant's lease (px ms) + RETENTION_MS. The clock
-- keeps tokens rising when that key is gone (a restart without persistence, FLUSHALL, a failover to a replica
-- that missed it, or the retention passed); the key keeps them strictly rising within one microsecond and
-- across a clock step back shorter than its life. '%d': Lua would print a 16-digit number as 1.79e+15.
-- Cost, Redis time per grant (redis-server 7.0, INFO commandstats, minimum of 15 interleaved runs of a script
-- granting and deleting one of 64 locks): the SET of R:fence 1.45 µs (its PX 0.5 of that, against KEEPTTL;
-- the number px + RETENTION_MS 0.2), TIME 0.5, string.format under 0.3. Keeping the last token in a tombstone of
-- the record instead (a release SETs it with PX in place of its DEL) saved only 0.2 µs a cycle, and a
-- crashed holder's token would then be forgotten when its lease ran out.
--
-- grant(R, token, ttl, holder) → the fencing token of a new grant of the free lock R to `token` for ttl ms;
-- `holder` is the record's last field as the client sends it (record.lua).
local function next_fence(R, px)
  local t = redis.call('time')
  local fence = t[1] * 1000000 + t[2]
  local text = string.format('%d', fence)
  local now = text
  local last = redis.call('set', R .. ':fence', text, 'px', px + RETENTION_MS, 'get')
  if last then
    last = tonumber(last)
    if last >= fence then
      fence = last + 1
      text = string.format('%d', fence)
      redis.call('set', R .. ':fence', text, 'px', px + RETENTION_MS)
    end
  end
  return fence, text, now
end
local function grant(R, token, ttl, holder)
  local fence, text, now = next_fence(R, ttl)
  redis.call('set', R, token .. ':' .. text .. ':' .. now .. ':' .. holder, 'px', ttl)
  return fence
end
