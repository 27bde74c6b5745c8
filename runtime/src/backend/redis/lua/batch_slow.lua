-- slow() → the functions BATCH's uncommon cases call: acquire, acquire_plain and release, defined on the first
-- call of slow() in a script call. A function defined in a script is a new closure, with its upvalues, on
-- every call; defined here, they cost a call whose operations all take the fast paths nothing. They see the
-- record's names through a copy of their own (so creating slow() captures no more than `clock`).
--
-- First, the script's clock (fence.lua): one TIME a call, shared by BATCH's inline grants and the slow paths'.
local clock
local slow_fns
local function slow()
  if not slow_fns then
    slow_fns = (function()
      -- #include record fence_fns free hand_over queue acquire_fn acquire_plain_fn release_fn
      return {acquire = acquire, acquire_plain = acquire_plain, release = release}
    end)()
  end
  return slow_fns
end
