-- release(R, token, keep ms ('0': free it now), the record's value, sent again, the grant's fencing token ('' or
-- nil: unknown)) → RELEASED, EXPIRED (nobody
-- owns it), TAKEN_BY_OTHER, or for a release sent again that finds neither its grant nor a trace of its own
-- first run, UNCONFIRMED (that run may have released it, its trace gone since, or it may have expired first). Freeing hands the lock to the next live waiter, if the record's mark says one may be
-- queued, or leaves it FREED; keeping leaves it held by NOBODY for `keep` ms, and its last token in R:last
-- for the rest of the lease. A release sent again after its reply was lost finds its own work done (the
-- token's second half after FREED or NOBODY with the grant's fencing token, or in R:last after a hand-over:
-- record.lua) and answers RELEASED again. Needs hand_over, free and released_by.
local function release(R, token, keep, v, again, fence)
  local half = string.sub(token, TOKEN_HALF + 1)
  fence = fence or ''
  if not v then
    if released_by(R, half, fence) then return RELEASED end
    if again then return UNCONFIRMED end
    return EXPIRED
  end
  local owner = string.sub(v, 1, TOKEN_END)
  if owner ~= token then
    local first = string.sub(owner, 1, TOKEN_HALF)
    local freed = first == NOBODY or first == FREED
    -- Freed or kept by this release, or handed over by it (and perhaps freed by the heir since).
    local own = freed and string.sub(owner, TOKEN_HALF + 1) == half
      and (fence == '' or string.match(v, '^%d+', FENCE_AT) == fence)
    if own or released_by(R, half, fence) then return RELEASED end
    if again then return UNCONFIRMED end
    if freed then return EXPIRED end
    return TAKEN_BY_OTHER
  end
  local last = string.match(v, '^%d+', FENCE_AT)
  if keep == '0' then
    -- A hand-over overwrites the record; without an heir it is freed.
    if string.byte(v, MARK_AT) ~= QUEUED_MARK or not hand_over(R, last, half) then
      free(R, v)
    end
  else
    -- NOBODY holds it for `keep`; the last token outlives that for the rest of the lease.
    local pttl = redis.call('pttl', R)
    redis.call('set', R, NOBODY .. string.sub(v, TOKEN_HALF + 1), 'px', keep)
    if last and pttl > tonumber(keep) then
      redis.call('set', R .. ':last', last .. ':' .. half .. ':' .. last, 'px', pttl)
    end
  end
  return RELEASED
end
