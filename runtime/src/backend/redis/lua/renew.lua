-- RENEW: extends a held lock's lease.
-- KEYS[1]: the record. ARGV: token, ttl ms.
-- Reply: RENEWED or NOT_OWNER, as `renew` returns them.
-- #include record renew_fn
return renew(KEYS[1], ARGV[1], ARGV[2])
