-- The names every script shares: where the fields of a lock record lie and what the scripts reply. Each value
-- is tied to the Rust side (scripts.rs, `record` and `reply`) by a unit test; no other script file may write
-- these numbers itself.
--
-- The record, at KEYS[1], is one string: <token><mark><fence>:<granted>:<holder>, where <token> is the
-- holder's 32-hex-digit owner token, <mark> is ':' (nobody queued behind this holder) or '+' (a waiter may
-- have), <fence> the grant's fencing token in decimal, <granted> the server's clock in µs at the grant (a
-- hand-over is a new grant; renewals leave it), and <holder> the text the client sent with its attempt,
-- `<owner's length in bytes>:<owner><metadata>`, which the scripts never look into. While `min_hold` keeps a
-- released lock, the first half of <token> is NOBODY, which no hex digits can equal. A lock given back with
-- nobody to hand it to has FREED written over the first half of its <token> (free.lua) and stays so for the
-- rest of its lease (Redis keeps the record's expiry): free, but its last fencing token stays known to the
-- next grant (fence.lua); its other fields mean nothing any more. The token's second half stays in both: it
-- tells a release sent again after its reply was lost that the release was its own (release_fn.lua), with the
-- <fence>, which tells two grants of one token apart, and half a token grants nothing. FORCE_UNLOCK writes FREED over both halves: nobody released it.
--
-- `R:last`, written only where a record ends or shortens sooner than the lease of the lock's last grant
-- (a hand-over, whose record lasts the short hand-over lease; min_hold's NOBODY), is
-- `<fence>:<second half of the releasing token, or nothing>:<the released grant's fence, or nothing>`: the last
-- fencing token, kept for that lease (the heir's ttl; the released record's PTTL), and which grant released.
-- Read only when the record is gone.
local TOKEN_END = 32
local TOKEN_HALF = 16
local MARK_AT = 33
local FENCE_AT = 34
local QUEUED_MARK = 43
local NOBODY = '----------------'
local FREED = '================'
-- First values of the acquire and release replies.
local BUSY = 0
local GRANTED = 1
local EXPIRED = 0
local RELEASED = 1
local TAKEN_BY_OTHER = 2
local UNCONFIRMED = 3
-- The renew reply; REMAINING's reply for a lock the token does not own; WITHDRAW's first value when the
-- lock was not handed to the token; the code of one operation that failed inside BATCH or RENEW_MANY.
local NOT_OWNER = 0
local RENEWED = 1
local NOT_HELD = -2
local NOT_HANDED = -1
local FAILED = -1
