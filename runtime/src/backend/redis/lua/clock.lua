-- Snippet (not a function): sets the script's `clock`, the server's clock in µs as decimal text, unless a grant
-- earlier in the same call already did (nil until then: one TIME per call). A µs field shorter than 6 digits is
-- padded (string.rep of an interned string allocates nothing, where a table of pads would be a new table on
-- every call).
if not clock then
  local t = redis.call('time')
  local us = t[2]
  if #us < 6 then us = string.rep('0', 6 - #us) .. us end
  clock = t[1] .. us
end
