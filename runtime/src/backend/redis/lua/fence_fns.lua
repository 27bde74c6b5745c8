-- The functions fence.lua describes, without the script's `clock` they read and set: BATCH defines them only
-- when an operation needs them, beside the clock its inline grants share (batch_slow.lua).
local function next_fence(last)
  local fence, now
  -- #include next_fence
  return fence, now
end
local function grant(R, token, ttl, holder, last)
  local fence, now
  -- #include grant
  return fence
end
