-- Snippet (not a function): the body of free (free.lua), which RELEASE's fast path also runs inline. Reads R
-- and v.
local fence = string.match(v, '^%d+', FENCE_AT)
if fence and fence ~= '0' then
  redis.call('set', R, FREED .. ':' .. fence, 'keepttl')
else
  redis.call('del', R)
end
