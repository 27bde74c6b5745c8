-- distlock's PostgreSQL schema: one row per lock, one per waiter's place, the fencing sequence, and one
-- function per operation that reads and writes under the lock's row lock (acquire, release, withdraw). Renewals
-- are plain UPDATEs, one statement each.
--
-- `{schema}` is the schema the client is given (a quoted identifier) and `{channel}` the NOTIFY channel of
-- hand-overs (a string literal), both filled in when the schema is created.
--
-- Every caller's statement is one autocommit round trip. The functions need READ COMMITTED: each statement of a
-- VOLATILE function takes a fresh snapshot, so calls on one key run one at a time behind its row lock, each
-- seeing the last one's commit, as Lua scripts do on Redis. Leases are by the server's clock
-- (`clock_timestamp()`, never `now()`, which is the transaction's start), set after the row lock is held, so a
-- lease never ends before its send time + ttl.
--
-- Keys touched: `locks` (the lock's row), `waiters` (its places), `marks` (its waiting clients' marks), `fence`
-- (the sequence).

CREATE SCHEMA IF NOT EXISTS {schema};

-- One counter for every key, CACHE 1 (a cached sequence hands out values out of order across sessions), taken
-- only under the key's row lock: each key's tokens rise. A token leaves only in a committed grant, whose commit
-- flushes the sequence's WAL, so no restart reissues one. Seeded at the clock in µs.
CREATE SEQUENCE IF NOT EXISTS {schema}.fence AS bigint CACHE 1 NO CYCLE;
SELECT setval('{schema}.fence', greatest(last_value, floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint))
FROM {schema}.fence;

-- A lock: free when `expires_at` has passed. `token` NULL with a later `expires_at`: released but kept for
-- min_hold. `released_by`: the token of its last release, so that a release sent again reads as released.
CREATE TABLE IF NOT EXISTS {schema}.locks (
    key text COLLATE "C" PRIMARY KEY,
    token text,
    fence bigint NOT NULL,
    granted_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    owner text NOT NULL DEFAULT '',
    metadata text NOT NULL DEFAULT '',
    released_by text
) WITH (fillfactor = 70);

-- A waiter's place: alive until `until` (its attempts refresh it, seldom) while its client's mark lives too;
-- `lease_ms` is the lease a hand-over to it grants, `attempt` the number of the attempt that registered it
-- (announced with the hand-over), `client` its client's id.
CREATE TABLE IF NOT EXISTS {schema}.waiters (
    key text COLLATE "C" NOT NULL,
    token text NOT NULL,
    since timestamptz NOT NULL,
    until timestamptz NOT NULL,
    lease_ms bigint NOT NULL,
    attempt bigint NOT NULL,
    owner text NOT NULL,
    metadata text NOT NULL,
    PRIMARY KEY (key, token)
) WITH (fillfactor = 70);
CREATE INDEX IF NOT EXISTS waiters_by_arrival ON {schema}.waiters (key, since, token);
ALTER TABLE {schema}.waiters ADD COLUMN IF NOT EXISTS client bigint NOT NULL DEFAULT 0;

-- A waiting client's mark for a lock: its places there live until `until`. One waiter of the client refreshes
-- it for all of them (often), so a client that dies leaves the queue, every waiter of it, when its mark ends.
CREATE TABLE IF NOT EXISTS {schema}.marks (
    key text COLLATE "C" NOT NULL,
    client bigint NOT NULL,
    until timestamptz NOT NULL,
    PRIMARY KEY (key, client)
);

-- hand_over(k, h, at, by) → the new fencing token. Gives the lock `k` (its row locked by the caller) to the
-- waiter `h` for the lease it registered, as a new grant at `at`, removes its place, and announces
-- `<md5(k)>:<token>:<fence>:<lease ms>:<attempt>` on {channel} (delivered once the caller's statement commits).
CREATE OR REPLACE FUNCTION {schema}.hand_over(k text, h {schema}.waiters, at timestamptz, by text)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    f bigint;
BEGIN
    DELETE FROM {schema}.waiters w WHERE w.key = k AND w.token = h.token;
    UPDATE {schema}.locks l
    SET token = h.token, fence = nextval('{schema}.fence'), granted_at = at,
        expires_at = at + h.lease_ms * interval '1 millisecond', owner = h.owner, metadata = h.metadata,
        released_by = by
    WHERE l.key = k
    RETURNING l.fence INTO f;
    PERFORM pg_notify({channel}, md5(k) || ':' || h.token || ':' || f || ':' || h.lease_ms || ':' || h.attempt);
    RETURN f;
END $$;

-- acquire(k, t, ttl ms, owner, metadata, register ms, hand-over lease ms, attempt, client, keep ms) → (code,
-- fence, ms): one
-- attempt by token `t`. code 1: granted, for `ms` from now (the ttl, or longer when a grant of `t` already
-- runs longer: a claimed hand-over, or this attempt landing twice); code 0: busy, `fence` the holder's and `ms`
-- what its lease has left. A free lock goes to the longest-waiting live waiter first: to `t` if that is `t` (or
-- nobody waits), else to that waiter by a hand-over. A busy attempt with `register` > 0 takes or refreshes its
-- place in line, alive for `keep`, and its client's mark, alive for `register`.
DROP FUNCTION IF EXISTS {schema}.acquire(text, text, bigint, text, text, bigint, bigint, bigint);
CREATE OR REPLACE FUNCTION {schema}.acquire(
    k text, t text, ttl bigint, own text, meta text, reg bigint, lease bigint, attempt bigint, cli bigint,
    keep bigint, OUT code int, OUT fence bigint, OUT ms bigint)
LANGUAGE plpgsql AS $$
DECLARE
    r {schema}.locks;
    h {schema}.waiters;
    at timestamptz;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'distlock needs READ COMMITTED, not %', current_setting('transaction_isolation')
            USING ERRCODE = '25001';
    END IF;
    -- The row, made if the key has none (a sweep may delete it between the two statements: try again).
    LOOP
        INSERT INTO {schema}.locks (key, token, fence, granted_at, expires_at)
        VALUES (k, NULL, 0, '-infinity', '-infinity') ON CONFLICT DO NOTHING;
        SELECT * INTO r FROM {schema}.locks l WHERE l.key = k FOR UPDATE;
        EXIT WHEN FOUND;
    END LOOP;
    at := clock_timestamp();
    IF r.token = t AND r.expires_at > at THEN
        -- This token's already: its attempt sent again, or a hand-over to it, claimed. Never shortened.
        r.expires_at := greatest(r.expires_at, at + ttl * interval '1 millisecond');
        UPDATE {schema}.locks l SET expires_at = r.expires_at WHERE l.key = k;
        DELETE FROM {schema}.waiters w WHERE w.key = k AND w.token = t;
        code := 1;
        fence := r.fence;
        ms := floor(extract(epoch FROM r.expires_at - at) * 1000)::bigint;
        RETURN;
    END IF;
    IF r.expires_at <= at THEN
        SELECT w.* INTO h FROM {schema}.waiters w JOIN {schema}.marks m ON m.key = k AND m.client = w.client
        WHERE w.key = k AND w.until > at AND m.until > at ORDER BY w.since, w.token LIMIT 1;
        IF NOT FOUND OR h.token = t THEN
            UPDATE {schema}.locks l
            SET token = t, fence = nextval('{schema}.fence'), granted_at = at,
                expires_at = at + ttl * interval '1 millisecond', owner = own, metadata = meta
            WHERE l.key = k
            RETURNING l.fence INTO fence;
            DELETE FROM {schema}.waiters w WHERE w.key = k AND (w.token = t OR w.until <= at);
            code := 1;
            ms := ttl;
            RETURN;
        END IF;
        r.fence := {schema}.hand_over(k, h, at, r.released_by);
        r.expires_at := at + h.lease_ms * interval '1 millisecond';
    END IF;
    IF reg > 0 THEN
        INSERT INTO {schema}.waiters
        VALUES (k, t, at, at + keep * interval '1 millisecond', lease, attempt, own, meta, cli)
        ON CONFLICT (key, token) DO UPDATE
        SET until = EXCLUDED.until, lease_ms = EXCLUDED.lease_ms, attempt = EXCLUDED.attempt;
        INSERT INTO {schema}.marks VALUES (k, cli, at + reg * interval '1 millisecond')
        ON CONFLICT (key, client) DO UPDATE SET until = EXCLUDED.until;
    END IF;
    code := 0;
    fence := r.fence;
    ms := greatest(0, floor(extract(epoch FROM r.expires_at - clock_timestamp()) * 1000))::bigint;
END $$;

-- release(k, t, keep ms) → 1 released | 0 expired (not held by `t`, and free) | 2 taken by another token. A
-- release sent again (its first reply lost) reads as released: `released_by` remembers it, also after a
-- hand-over. With `keep` > 0 (min_hold) the lock stays busy, with no holder, for `keep`; otherwise it goes to
-- the longest-waiting live waiter, or is freed.
CREATE OR REPLACE FUNCTION {schema}.release(k text, t text, keep bigint)
RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    r {schema}.locks;
    h {schema}.waiters;
    at timestamptz;
BEGIN
    SELECT * INTO r FROM {schema}.locks l WHERE l.key = k FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    at := clock_timestamp();
    IF r.token IS DISTINCT FROM t OR r.expires_at <= at THEN
        RETURN CASE
            WHEN r.released_by = t THEN 1
            WHEN r.token IS NULL OR r.expires_at <= at THEN 0
            ELSE 2
        END;
    END IF;
    IF keep > 0 THEN
        UPDATE {schema}.locks l
        SET token = NULL, expires_at = at + keep * interval '1 millisecond', released_by = t
        WHERE l.key = k;
        RETURN 1;
    END IF;
    SELECT w.* INTO h FROM {schema}.waiters w JOIN {schema}.marks m ON m.key = k AND m.client = w.client
    WHERE w.key = k AND w.until > at AND m.until > at ORDER BY w.since, w.token LIMIT 1;
    IF FOUND THEN
        PERFORM {schema}.hand_over(k, h, at, t);
    ELSE
        UPDATE {schema}.locks l SET token = NULL, expires_at = at, released_by = t WHERE l.key = k;
    END IF;
    DELETE FROM {schema}.waiters w WHERE w.key = k AND w.until <= at;
    RETURN 1;
END $$;

-- withdraw(k, t) → (fence, ms): takes `t`'s place out of line. If the lock was handed to `t` meanwhile, its
-- grant's fence and lease left (the caller keeps or gives it back); else both NULL.
CREATE OR REPLACE FUNCTION {schema}.withdraw(k text, t text, OUT fence bigint, OUT ms bigint)
LANGUAGE plpgsql AS $$
DECLARE
    r {schema}.locks;
    at timestamptz;
BEGIN
    SELECT * INTO r FROM {schema}.locks l WHERE l.key = k FOR UPDATE;
    at := clock_timestamp();
    DELETE FROM {schema}.waiters w WHERE w.key = k AND w.token = t;
    IF r.token = t AND r.expires_at > at THEN
        fence := r.fence;
        ms := floor(extract(epoch FROM r.expires_at - at) * 1000)::bigint;
    END IF;
END $$;
