-- renew(R, token, ttl ms) → RENEWED (the lease is ttl from now) or NOT_OWNER.
local function renew(R, token, ttl)
  local v = redis.call('get', R)
  if v and string.sub(v, 1, TOKEN_END) == token then
    redis.call('pexpire', R, ttl)
    return RENEWED
  end
  return NOT_OWNER
end
