-- free(R, v): gives back the lock R whose record is `v`, writing FREED over the first half of its owner's
-- token in place (`<FREED><second half><mark><fence>:<granted>:<holder>`, with the record's expiry: SETRANGE
-- writes no new expiry) so that the next grant follows its token; a record without a token (fence 0:
-- ACQUIRE_PLAIN's, on a store without tokens) or not written by distlock just goes.
-- Its body is a shared snippet (freeing.lua), which RELEASE's fast path also runs inline: a function defined
-- in a script is a new closure on every call.
local function free(R, v)
  -- #include freeing
end
