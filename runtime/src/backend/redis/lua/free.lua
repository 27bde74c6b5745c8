-- free(R, v): gives back the lock R whose record is `v`, leaving `<FREED>:<fence>` with the record's expiry
-- (KEEPTTL: no new expiry to write) so that the next grant follows its token; a record without a token (fence
-- 0: ACQUIRE_PLAIN's, on a store without tokens) or not written by distlock just goes.
local function free(R, v)
  local fence = string.match(v, '^%d+', FENCE_AT)
  if fence and fence ~= '0' then
    redis.call('set', R, FREED .. ':' .. fence, 'keepttl')
  else
    redis.call('del', R)
  end
end
