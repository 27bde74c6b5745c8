-- Snippet (not a function): the body of grant (fence.lua), which ACQUIRE's fast path also runs inline. Reads
-- R, token, ttl, holder, last and the script's `clock`; sets `clock`, `fence` and `now`, and writes the record.
-- #include next_fence
redis.call('set', R, token .. ':' .. fence .. ':' .. now .. ':' .. holder, 'px', ttl)
