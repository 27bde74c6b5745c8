-- acquire(R, token, ttl ms, holder, register ms (0: do not queue), hand-over lease ms, attempt, client, keep
-- ms[, v]) → code, fence, ms:
-- GRANTED, fence, ttl: the lock is this token's for ttl from now, granted now or claimed (a hand-over to this
--   token, made by a release since its last busy attempt or by this call, is stretched to the full ttl);
-- BUSY, the holder's fence, its PTTL: another grant holds it (and, with register > 0, this token is queued or
--   refreshed in the queue, its details naming `attempt`, the number of this attempt, and `client`, whose
--   mark it refreshes for `register`; its place lasts `keep`: queue.lua).
-- `v` is the record's value when the caller has read it already (false: there is none; ACQUIRE's), nil to
-- read it here (BATCH's, inside the operation's pcall).
-- The common cases, a free lock nobody waits for, come first (is_free.lua): GET, then TIME and SET, after
-- EXISTS of the queue and R:last when the record is gone.
-- A value at R that distlock did not write fails the attempt (FOREIGN). Needs grant, hand_over, fence_of,
-- foreign and enqueue.
local function acquire(R, token, ttl, holder, register, lease, attempt, client, keep, v)
  if v == nil then v = redis.call('get', R) end
  local free, last
  -- #include is_free
  if free then return GRANTED, grant(R, token, ttl, holder, last), ttl end
  if not v then
    -- The record went sooner than its last grant's lease (a lapsed hand-over, min_hold): its token is here.
    local kept = redis.call('get', R .. ':last')
    last = kept and string.match(kept, '^%d+') or nil
    if hand_over(R, last, nil) then v = redis.call('get', R) end
  end
  if v then
    if string.sub(v, 1, TOKEN_END) == token then
      redis.call('pexpire', R, ttl)
      return GRANTED, fence_of(v), ttl
    end
    local fence = fence_of(v)
    if not fence then foreign(R) end
    register = tonumber(register)
    if register > 0 then enqueue(R, v, token, register, lease, ttl, attempt, holder, client, keep) end
    return BUSY, fence, redis.call('pttl', R)
  end
  return GRANTED, grant(R, token, ttl, holder, last), ttl
end
