-- REMAINING: how long a grant has left.
-- KEYS[1]: the record. ARGV: token.
-- Reply: the record's PTTL if the token owns the lock, else NOT_HELD.
-- #include record
local v = redis.call('get', KEYS[1])
if v and string.sub(v, 1, TOKEN_END) == ARGV[1] then return redis.call('pttl', KEYS[1]) end
return NOT_HELD
