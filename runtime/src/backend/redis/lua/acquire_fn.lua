-- acquire(R, token, ttl ms, holder, register ms (0: do not queue), hand-over lease ms) → code, fence, ms:
-- GRANTED, fence, ttl: the lock is this token's for ttl from now, granted now or claimed (a hand-over to this
--   token, made by a release since its last busy attempt or by this call, is stretched to the full ttl);
-- BUSY, the holder's fence, its PTTL: another grant holds it (and, with register > 0, this token is queued or
--   refreshed in the queue).
-- The common cases, a free lock nobody waits for, come first: GET, then TIME and SET, after EXISTS of the queue
-- when the record is gone. A FREED record (record.lua) gives the last token and has no queue: places are
-- taken only behind a held record, and a release takes them all (hand_over) before it frees the lock.
-- Needs grant, hand_over, fence_of and enqueue.
local function acquire(R, token, ttl, holder, register, lease)
  local v = redis.call('get', R)
  if v and string.sub(v, 1, TOKEN_END) == FREED then
    return GRANTED, grant(R, token, ttl, holder, string.sub(v, FENCE_AT)), ttl
  end
  if not v then
    if redis.call('exists', R .. ':queue') == 0 then return GRANTED, grant(R, token, ttl, holder, nil), ttl end
    if hand_over(R, nil) then v = redis.call('get', R) end
  end
  if v then
    if string.sub(v, 1, TOKEN_END) == token then
      redis.call('pexpire', R, ttl)
      return GRANTED, fence_of(v), ttl
    end
    register = tonumber(register)
    if register > 0 then enqueue(R, v, token, register, lease, holder) end
    return BUSY, fence_of(v), redis.call('pttl', R)
  end
  return GRANTED, grant(R, token, ttl, holder, nil), ttl
end
