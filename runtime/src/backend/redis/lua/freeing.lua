-- Snippet (not a function): the body of free (free.lua), which RELEASE's fast path also runs inline. Reads R
-- and v. A record with a fencing token (its first digit 1-9: tokens have no leading zero) gets FREED written
-- over the first half of its owner's token in place (the second half stays: record.lua): SETRANGE keeps the
-- record's expiry and its fields, the last token among them, and costs Redis less than writing a new value
-- (no new string to build, an integer reply). A record
-- with fence 0 (ACQUIRE_PLAIN's) just goes. The offset goes as text: Redis prints a Lua number argument with
-- snprintf, which cost it 2k instructions a release.
local digit = string.byte(v, FENCE_AT)
if digit and digit > 48 and digit <= 57 then
  redis.call('setrange', R, '0', FREED)
else
  redis.call('del', R)
end
