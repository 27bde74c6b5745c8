-- released_by(R, half, fence) → whether the release that handed the lock R over or kept it for min_hold (the
-- latest R:last, record.lua) was that of the grant whose token's second half is `half` and whose fencing token
-- is `fence` ('' when unknown). The fence tells two grants of one token apart: a request that gave a grant back
-- (not acknowledged by the replicas) and was granted again must not read the give-back as its own release.
local function released_by(R, half, fence)
  local kept = redis.call('get', R .. ':last')
  if not kept then return false end
  local by, of = string.match(kept, '^%d+:(%x*):?(%d*)$')
  return by == half and (fence == '' or of == '' or of == fence)
end
-- hand_over(R, last, half) → the heir's token, or nil when nobody waits. Gives the free lock R to the
-- longest-waiting waiter whose place and client's mark (queue.lua) are still refreshed, for the hand-over
-- lease it registered, as a new grant
-- (its time now, the holder field the heir registered: its owner and metadata), and announces
-- `<heir>:<fence>:<lease ms>:<attempt>` on `<R>:released` (by SPUBLISH on a Redis Cluster: scripts.rs), where
-- <attempt> is the number of the heir's attempt whose registration the hand-over used: the heir trusts the
-- announcement only as newer than that attempt's send. `last` is the lock's last token, nil when its record
-- is gone (see next_fence); `half` the second half of the releasing token ('' for none). The heir's token is
-- also kept in R:last for the heir's ttl: the record lasts only the hand-over lease if it goes unclaimed.
-- Needs next_fence.
local function hand_over(R, last, half)
  local Q = R .. ':queue'
  while true do
    local heir = redis.call('zpopmin', Q)[1]
    if not heir then return nil end
    -- A waiter that stopped refreshing its place has no details left, one whose client stopped refreshing its
    -- mark no mark: Redis expired them.
    local w = redis.call('getdel', R .. ':waiter:' .. heir)
    local lease, ttl, attempt, client, holder
    if w then lease, ttl, attempt, client, holder = string.match(w, '^(%d+):(%d+):(%d+):(%x+):(.*)$') end
    if holder and redis.call('exists', R .. ':client:' .. client) == 1 then
      local fence, now = next_fence(last)
      redis.call('set', R, heir .. '+' .. fence .. ':' .. now .. ':' .. holder, 'px', lease)
      redis.call('set', R .. ':last', fence .. ':' .. (half or '') .. ':' .. (half and last or ''), 'px', ttl)
      redis.call('publish', R .. ':released', heir .. ':' .. fence .. ':' .. lease .. ':' .. attempt)
      return heir
    end
  end
end
