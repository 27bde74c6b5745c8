-- Snippet (not a function): the body of next_fence (fence.lua), which ACQUIRE's fast path also runs inline.
-- Reads `last` and the script's `clock` (clock.lua); sets `clock`, `fence` and `now`.
-- #include clock
now = clock
if last and (#last > #now or (#last == #now and last >= now)) then
  fence = string.format('%d', tonumber(last) + 1)
else
  fence = now
end
