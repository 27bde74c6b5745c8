-- fence_of(record value) → the holder's fencing token (decimal text), nil for a value that is no record.
-- enqueue(R, v, token, register ms, hand-over lease ms, ttl ms, attempt, holder, client, keep ms): a busy
-- attempt's place in the queue `<R>:queue` (a sorted set of waiter tokens by arrival time), taken or
-- refreshed, with its details in `<R>:waiter:<token>` (`<hand-over lease ms>:<ttl ms>:<attempt>:<client>:
-- <holder>`, expiring unless refreshed within `keep`), and the record `v` marked so that its release looks at
-- the queue. Its client's mark `<R>:client:<client>` lasts `register`: one waiter of each client refreshes it
-- (the others refresh only their details, seldom), and a place whose client's mark is gone is dead.
local function fence_of(v)
  return string.match(v, '^(%d+)', FENCE_AT)
end
-- foreign(R): fails the operation on R, whose value distlock did not write, with the FOREIGN error the client
-- explains (which key, what to do).
local function foreign(R)
  error({err = 'FOREIGN the value at ' .. R .. ' was not written by distlock'})
end
local function enqueue(R, v, token, register, lease, ttl, attempt, holder, client, keep)
  local Q = R .. ':queue'
  if string.byte(v, MARK_AT) ~= QUEUED_MARK then
    redis.call('set', R, string.sub(v, 1, TOKEN_END) .. '+' .. string.sub(v, FENCE_AT), 'keepttl')
  end
  if not redis.call('zscore', Q, token) then
    local t = redis.call('time')
    redis.call('zadd', Q, t[1] * 1000000 + t[2], token)
  end
  local details = lease .. ':' .. ttl .. ':' .. attempt .. ':' .. client .. ':' .. holder
  redis.call('set', R .. ':waiter:' .. token, details, 'px', keep)
  redis.call('set', R .. ':client:' .. client, 1, 'px', register)
  if redis.call('pttl', Q) < tonumber(keep) then redis.call('pexpire', Q, keep) end
end
