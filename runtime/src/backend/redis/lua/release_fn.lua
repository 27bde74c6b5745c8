-- release(R, token, keep ms ('0': free it now), the record's value) → RELEASED, EXPIRED (nobody owns it) or
-- TAKEN_BY_OTHER. Freeing hands the lock to the next live waiter, if the record's mark says one may be
-- queued, or leaves it FREED; keeping leaves it held by NOBODY for `keep` ms. Needs hand_over and free.
local function release(R, token, keep, v)
  if not v then return EXPIRED end
  local owner = string.sub(v, 1, TOKEN_END)
  if owner ~= token then
    if owner == NOBODY or owner == FREED then return EXPIRED end
    return TAKEN_BY_OTHER
  end
  if keep == '0' then
    -- A hand-over overwrites the record; without an heir it is freed.
    if string.byte(v, MARK_AT) ~= QUEUED_MARK or not hand_over(R, string.match(v, '^%d+', FENCE_AT)) then
      free(R, v)
    end
  else
    redis.call('set', R, NOBODY .. string.sub(v, MARK_AT), 'px', keep)
  end
  return RELEASED
end
