-- Snippet (not a function): whether the lock R, whose record reads `v` (false: none), may be granted at once,
-- and its last token. Sets `free` and `last`: free with the last token when its record is FREED (record.lua:
-- a FREED record has no queue, as places are taken only behind a held record and a release takes them all
-- before it frees the lock); free without one when there is no record, nobody queued and no R:last (one
-- EXISTS for both); else not free, and the caller's slow path reads R:last.
if v then
  if string.sub(v, 1, TOKEN_HALF) == FREED then free, last = true, string.match(v, '^%d+', FENCE_AT) end
else
  free = redis.call('exists', R .. ':queue', R .. ':last') == 0
end
