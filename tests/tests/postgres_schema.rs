//! The PostgreSQL store's schema and functions (`runtime/src/backend/postgres/schema.sql`) on a private server
//! the harness starts: grants, the fair queue and its hand-overs, releases (sent again, kept for min_hold),
//! withdrawals, expiry by the server's clock, rising fencing tokens, hand-over announcements, and the refusal
//! of any isolation but READ COMMITTED. Each statement is its own autocommit session, as the store sends them.
//! Leases that must not run out between statements are a minute long; those that must, 100 ms, waited out on the
//! server's own clock (`pg_sleep`).

use distlock_tests::PostgresServer;

const SCHEMA_SQL: &str = include_str!("../../runtime/src/backend/postgres/schema.sql");

/// A server with the schema loaded as `"dl"`, announcing on `distlock_dl`.
fn server() -> PostgresServer {
    let server = PostgresServer::new();
    let sql = SCHEMA_SQL.replace("{schema}", "\"dl\"").replace("{channel}", "'distlock_dl'");
    server.psql(&sql);
    server
}

/// One attempt: `(code, fence, ms)`. Each token is a client of its own (`t7`: client 7), and its place lasts as
/// long as its client's mark (`register`).
fn acquire(pg: &PostgresServer, key: &str, token: &str, ttl: u64, register: u64, lease: u64) -> (u8, u64, u64) {
    acquire_kept(pg, key, token, ttl, register, lease, register)
}

/// One attempt whose place lasts `keep`, its client's mark `register`.
fn acquire_kept(
    pg: &PostgresServer,
    key: &str,
    token: &str,
    ttl: u64,
    register: u64,
    lease: u64,
    keep: u64,
) -> (u8, u64, u64) {
    let client: u64 = token.trim_start_matches('t').parse().unwrap_or(0);
    let row = pg.psql(&format!(
        "SELECT * FROM dl.acquire('{key}', '{token}', {ttl}, 'owner', '', {register}, {lease}, 1, {client}, {keep})"
    ));
    let fields: Vec<u64> = row.split('|').map(|f| f.parse().unwrap_or_else(|_| panic!("bad reply {row}"))).collect();
    match fields.as_slice() {
        [code, fence, ms] => (u8::try_from(*code).expect("code"), *fence, *ms),
        _ => panic!("bad reply {row}"),
    }
}

fn release(pg: &PostgresServer, key: &str, token: &str, keep: u64) -> u8 {
    pg.psql(&format!("SELECT dl.release('{key}', '{token}', {keep})")).parse().expect("a code")
}

fn holder(pg: &PostgresServer, key: &str) -> (String, u64) {
    let row = pg.psql(&format!("SELECT coalesce(token, ''), fence FROM dl.locks WHERE key = '{key}'"));
    let (token, fence) = row.split_once('|').unwrap_or_else(|| panic!("no row for {key}: {row}"));
    (token.to_owned(), fence.parse().expect("fence"))
}

const MINUTE: u64 = 60_000;
const GRANTED: u8 = 1;
const BUSY: u8 = 0;
const RELEASED: u8 = 1;
const EXPIRED: u8 = 0;
const TAKEN_BY_OTHER: u8 = 2;

#[test]
fn waiters_are_served_in_arrival_order_with_rising_tokens_and_releases_read_right_when_sent_again() {
    let pg = server();
    let (code, first, ms) = acquire(&pg, "k", "t1", MINUTE, 0, 0);
    assert_eq!((code, ms), (GRANTED, MINUTE));
    let (code, fence, left) = acquire(&pg, "k", "t2", MINUTE, MINUTE, MINUTE);
    assert_eq!((code, fence), (BUSY, first), "busy, with the holder's token");
    assert!(left > 0 && left <= MINUTE, "the holder's lease left: {left}");
    assert_eq!(acquire(&pg, "k", "t3", MINUTE, MINUTE, MINUTE).0, BUSY);

    // t1's release hands the lock to t2, first in line, as a new grant.
    assert_eq!(release(&pg, "k", "t1", 0), RELEASED);
    let (heir, second) = holder(&pg, "k");
    assert_eq!(heir, "t2");
    assert!(second > first, "tokens must rise: {first} then {second}");
    assert_eq!(release(&pg, "k", "t1", 0), RELEASED, "a release sent again reads as released");
    // t2 claims its hand-over: the same grant, its lease stretched to the ttl.
    assert_eq!(acquire(&pg, "k", "t2", MINUTE, 0, 0), (GRANTED, second, MINUTE));
    assert_eq!(release(&pg, "k", "t9", 0), TAKEN_BY_OTHER);

    // t2's release hands it to t3.
    assert_eq!(release(&pg, "k", "t2", 0), RELEASED);
    let (heir, third) = holder(&pg, "k");
    assert_eq!(heir, "t3");
    assert!(third > second, "tokens must rise: {second} then {third}");
    assert_eq!(release(&pg, "k", "t3", 0), RELEASED);
    assert_eq!(holder(&pg, "k").0, "", "free once nobody waits");
    assert_eq!(release(&pg, "k", "t3", 0), RELEASED, "sent again");
    assert_eq!(release(&pg, "k", "t4", 0), EXPIRED, "never held by t4, and free");
    assert_eq!(pg.psql("SELECT count(*) FROM dl.waiters"), "0", "places left behind");
    let (code, fourth, _) = acquire(&pg, "k", "t4", MINUTE, 0, 0);
    assert!(code == GRANTED && fourth > third, "a fresh grant's token rises too: {third} then {fourth}");
}

#[test]
fn a_lease_ends_on_the_server_s_clock_and_a_waiter_that_stopped_refreshing_is_skipped() {
    let pg = server();
    let (_, first, _) = acquire(&pg, "k", "t1", 100, 0, 0);
    // t2 waits, but its place lives only 100 ms: it stops refreshing it.
    assert_eq!(acquire(&pg, "k", "t2", MINUTE, 100, MINUTE).0, BUSY);
    pg.psql("SELECT pg_sleep(0.3)");
    // t1's lease is over: free, and t2's place is dead, so t3 gets it at once.
    let (code, fence, _) = acquire(&pg, "k", "t3", MINUTE, 0, 0);
    assert!(code == GRANTED && fence > first, "{code} {fence}");
    assert_eq!(release(&pg, "k", "t1", 0), TAKEN_BY_OTHER, "t1's lease ran out and t3 holds it");
    assert_eq!(pg.psql("SELECT count(*) FROM dl.waiters"), "0", "the dead place was not cleared");
}

#[test]
fn min_hold_keeps_the_lock_busy_with_no_holder_until_it_ends() {
    let pg = server();
    acquire(&pg, "k", "t1", MINUTE, 0, 0);
    assert_eq!(release(&pg, "k", "t1", 200), RELEASED);
    assert_eq!(holder(&pg, "k").0, "", "released: no holder");
    assert_eq!(acquire(&pg, "k", "t2", MINUTE, 0, 0).0, BUSY, "kept for min_hold");
    pg.psql("SELECT pg_sleep(0.3)");
    assert_eq!(acquire(&pg, "k", "t2", MINUTE, 0, 0).0, GRANTED);
    assert_eq!(release(&pg, "k", "t1", 0), RELEASED, "t1's release, sent again");
}

/// A place lives only while its client's mark does: t2's own place lasts a minute, its client's mark 100 ms
/// (its client stopped refreshing it), so the release hands the lock past it to t3.
#[test]
fn a_place_whose_client_s_mark_ran_out_is_skipped() {
    let pg = server();
    acquire(&pg, "k", "t1", MINUTE, 0, 0);
    assert_eq!(acquire_kept(&pg, "k", "t2", MINUTE, 100, MINUTE, MINUTE).0, BUSY);
    assert_eq!(acquire(&pg, "k", "t3", MINUTE, MINUTE, MINUTE).0, BUSY);
    pg.psql("SELECT pg_sleep(0.3)");
    assert_eq!(release(&pg, "k", "t1", 0), RELEASED);
    assert_eq!(holder(&pg, "k").0, "t3", "the lock went to a place whose client's mark had run out");
}

#[test]
fn a_withdrawn_place_is_skipped_and_a_hand_over_that_came_first_is_reported() {
    let pg = server();
    acquire(&pg, "k", "t1", MINUTE, 0, 0);
    acquire(&pg, "k", "t2", MINUTE, MINUTE, MINUTE);
    acquire(&pg, "k", "t3", MINUTE, MINUTE, MINUTE);
    assert_eq!(pg.psql("SELECT * FROM dl.withdraw('k', 't2')"), "|", "t2 never held it");
    assert_eq!(release(&pg, "k", "t1", 0), RELEASED);
    let (heir, fence) = holder(&pg, "k");
    assert_eq!(heir, "t3", "the withdrawn t2 was handed the lock");
    // t3 withdraws too late: the lock is already its own, and the withdrawal says so.
    let reply = pg.psql("SELECT * FROM dl.withdraw('k', 't3')");
    let (got, ms) = reply.split_once('|').expect("fence|ms");
    assert_eq!(got.parse::<u64>().ok(), Some(fence), "{reply}");
    assert!(ms.parse::<u64>().is_ok_and(|ms| ms > 0 && ms <= MINUTE), "{reply}");
}

#[test]
fn a_hand_over_is_announced_to_the_heir_after_its_commit() {
    let pg = server();
    acquire(&pg, "k", "t1", MINUTE, 0, 0);
    acquire(&pg, "k", "t2", MINUTE, MINUTE, 5_000);
    // psql prints the notifications its session received once the statement committed.
    let out = pg.psql("LISTEN distlock_dl; SELECT dl.release('k', 't1', 0)");
    let fence = holder(&pg, "k").1;
    let key_hash = pg.psql("SELECT md5('k')");
    let payload = format!("\"{key_hash}:t2:{fence}:5000:1\"");
    assert!(out.contains(&payload), "no announcement {payload} in: {out}");
    // An uncontended release announces nothing.
    let (_, _, _) = acquire(&pg, "j", "t1", MINUTE, 0, 0);
    let out = pg.psql("LISTEN distlock_dl; SELECT dl.release('j', 't1', 0)");
    assert!(!out.contains("notification"), "{out}");
}

#[test]
fn any_isolation_but_read_committed_is_refused_with_a_clear_error() {
    let pg = server();
    let sql =
        "BEGIN ISOLATION LEVEL SERIALIZABLE; SELECT * FROM dl.acquire('k', 't1', 1000, 'o', '', 0, 0, 0, 0, 0); COMMIT";
    let error = pg.try_psql(sql).expect_err("a serializable acquire was accepted");
    assert!(error.contains("distlock needs READ COMMITTED, not serializable"), "{error}");
    assert_eq!(pg.psql("SELECT count(*) FROM dl.locks WHERE token IS NOT NULL"), "0");
}
