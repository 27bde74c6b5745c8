-- next_fence(R, px) → the lock's next fencing token, as a number and as decimal text:
-- max(last token + 1, the server's clock in µs), where the last token is kept in `<R>:fence` for the grant's
-- lease (px ms) + RETENTION_MS. The clock keeps tokens rising when that key is gone (a restart without
-- persistence, FLUSHALL, a failover to a replica that missed it, or the retention passed); the key keeps them
-- strictly rising within one microsecond and across a clock step back shorter than its life. '%d': Lua would
-- print a 16-digit number as 1.79e+15.
-- Cost, Redis time per grant (redis-server 7.0, INFO commandstats, minimum of 15 interleaved runs of a script
-- granting and deleting one of 64 locks): the SET of R:fence 1.45 µs (its PX 0.5 of that, against KEEPTTL;
-- the number px + RETENTION_MS 0.2), TIME 0.5, string.format under 0.3. Keeping the last token in a tombstone of
-- the record instead (a release SETs it with PX in place of its DEL) saved only 0.2 µs a cycle, and a
-- crashed holder's token would then be forgotten when its lease ran out.
--
-- grant(R, token, ttl, meta) → the fencing token of a new grant of the free lock R to `token` for ttl ms.
local function next_fence(R, px)
  local t = redis.call('time')
  local fence = t[1] * 1000000 + t[2]
  local text = string.format('%d', fence)
  local last = redis.call('set', R .. ':fence', text, 'px', px + RETENTION_MS, 'get')
  if last then
    last = tonumber(last)
    if last >= fence then
      fence = last + 1
      text = string.format('%d', fence)
      redis.call('set', R .. ':fence', text, 'px', px + RETENTION_MS)
    end
  end
  return fence, text
end
local function grant(R, token, ttl, meta)
  local fence, text = next_fence(R, ttl)
  redis.call('set', R, token .. ':' .. text .. ':' .. meta, 'px', ttl)
  return fence
end
