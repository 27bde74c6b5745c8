-- Snippet (not a function): whether the lock R, whose record reads `v` (false: none), may be granted at once,
-- and its last token. Sets `free` and `last`: free with the last token when its record is FREED (record.lua:
-- a FREED record has no queue, as places are taken only behind a held record and a release takes them all
-- before it frees the lock); free without one when there is no record and nobody queued; else not free.
if v then
  if string.sub(v, 1, TOKEN_END) == FREED then free, last = true, string.match(v, '^%d+', FENCE_AT) end
else
  free = redis.call('exists', R .. ':queue') == 0
end
