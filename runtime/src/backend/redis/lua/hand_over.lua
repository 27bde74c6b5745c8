-- hand_over(R) → the heir's token, or nil when nobody waits. Gives the free lock R to the longest-waiting
-- waiter still refreshing its place, for the hand-over lease it registered, and announces
-- `<heir>:<fence>:<lease ms>` on `<R>:released`. Needs next_fence.
local function hand_over(R)
  local Q = R .. ':queue'
  while true do
    local heir = redis.call('zpopmin', Q)[1]
    if not heir then return nil end
    -- A waiter that stopped refreshing its place has no details left: Redis expired them.
    local w = redis.call('getdel', R .. ':waiter:' .. heir)
    if w then
      local lease, meta = string.match(w, '^(%d+):(.*)$')
      local _, fence = next_fence(R, lease)
      redis.call('set', R, heir .. '+' .. fence .. ':' .. meta, 'px', lease)
      redis.call('publish', R .. ':released', heir .. ':' .. fence .. ':' .. lease)
      return heir
    end
  end
end
