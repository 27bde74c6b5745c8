-- hand_over(R, last) → the heir's token, or nil when nobody waits. Gives the free lock R to the longest-waiting
-- waiter still refreshing its place, for the hand-over lease it registered, as a new grant (its time now,
-- the holder field the heir registered: its owner and metadata), and announces
-- `<heir>:<fence>:<lease ms>` on `<R>:released` (by SPUBLISH on a Redis Cluster: scripts.rs). `last` is the
-- lock's last token, nil when its record is gone (see next_fence). Needs next_fence.
local function hand_over(R, last)
  local Q = R .. ':queue'
  while true do
    local heir = redis.call('zpopmin', Q)[1]
    if not heir then return nil end
    -- A waiter that stopped refreshing its place has no details left: Redis expired them.
    local w = redis.call('getdel', R .. ':waiter:' .. heir)
    if w then
      local lease, holder = string.match(w, '^(%d+):(.*)$')
      local fence, now = next_fence(last)
      redis.call('set', R, heir .. '+' .. fence .. ':' .. now .. ':' .. holder, 'px', lease)
      redis.call('publish', R .. ':released', heir .. ':' .. fence .. ':' .. lease)
      return heir
    end
  end
end
