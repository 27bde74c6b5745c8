//! Deterministic regression tests for issue 31's (Correctness II) schedules 2 and 3, on a redis-server whose
//! wall clock the test steps back ([`RedisServer::with_stepped_clock`]): a step moves `TIME`, and with it the
//! fencing tokens (`max(last + 1, the server's clock in µs)`), and key expiry.
//!
//! Schedule 2 (S4, the last token forgotten early): the README promises that a lock's last fencing token is
//! remembered at least a ttl after its last grant, so that the next grant's token is above it even when the
//! server's clock steps back by less than that. Every path that ends or shortens a record sooner — a
//! `min_hold` release (the record held by nobody for `min_hold` only), a hand-over that lapses unclaimed (the
//! heir's record has only the short hand-over lease), `force_unlock` of a lock kept by `min_hold`, a
//! multi-key release with `min_hold` — must keep the last token that long. Each test lets the record go,
//! steps the server's clock back 2 s (well within the ttl of the last grant), and asserts the next grant's
//! token is above the last one.
//!
//! Schedule 3 (a token that goes back gives two valid guards): a waiter must not date an announced hand-over
//! as fresh because its token is above that of its last busy attempt: tokens go back with the server's clock.
//!
//! Redis only: the in-process store's "wall clock" comes from `SystemTime` (unless the simulation's hooks set
//! it), which a test cannot step, so these schedules have no memory-backend variant. Each test skips, printing
//! why, when the stepped clock's shim cannot be built (no C compiler).
//!
//! Events (`MONITOR`, the record's disappearance, the proxy holding W's subscriber connection) sequence the
//! steps; fixed durations are used only where a stall or a lease running out is the point of the schedule.

use std::time::Duration;

use distlock::{Client, LockError, LockGuard, LockRequest, ReleaseOutcome, RetryStrategy};
use distlock_tests::monitor::{monitor_args, script_calls, Monitor};
use distlock_tests::proxy::{Fault, FaultProxy};
use distlock_tests::stall::StallableRuntime;
use distlock_tests::time::{ms, secs};
use distlock_tests::{eventually, serial, within, RedisServer};
use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

/// How far the tests step the server's clock: back 2 s, more than the time from the last grant to the step
/// (so the clock alone would give a lower token), less than the last grant's ttl of 10 s (so the README's
/// promise covers it).
const STEP_BACK_MS: i64 = -2000;

/// The ttl of every grant here.
const TTL: Duration = secs(10);

/// W's retries: every 1 ms, so it refreshes its place every 1 ms and registers the shortest hand-over lease,
/// the floor of 1 s (acquire.rs `queueing`, `HAND_OVER_LEASE_FLOOR`), which lapses well inside W's stall.
const EVERY_MS: RetryStrategy = RetryStrategy::Linear { step: ms(1) };

/// How long W's runtime is frozen: long enough for H's release, the hand-over's lapse (1 s after it), the clock
/// step and C's grant to happen inside it.
const STALL: Duration = ms(3000);

async fn client(url: String) -> Client {
    Client::builder().redis(url).build().await.expect("client")
}

/// A client for W, built on `runtime` so that its connections and its release subscription stall with it, as
/// in a frozen process.
async fn client_on(runtime: &StallableRuntime, url: String) -> Client {
    runtime.spawn(client(url)).await.expect("W's runtime")
}

/// How many requests wait for `key`, as its record reports.
async fn waiting(client: &Client, key: &str) -> usize {
    client.lock_info(key).await.expect("lock_info").map_or(0, |info| info.waiting)
}

/// Waits (up to 5 s) until `record` is gone from the server (GET finds nothing); how long that took.
async fn record_gone(conn: &mut MultiplexedConnection, record: &str) -> Duration {
    let start = Instant::now();
    loop {
        let value: Option<String> = redis::cmd("GET").arg(record).query_async(conn).await.expect("GET");
        if value.is_none() {
            return start.elapsed();
        }
        assert!(start.elapsed() < secs(5), "setup: {record} is still there after 5 s: {value:?}");
        tokio::time::sleep(ms(2)).await;
    }
}

/// What a request came to, seen from the runtime it ran on.
#[derive(Debug)]
struct Outcome {
    result: Result<LockGuard, LockError>,
    /// Whether the guard said valid when `acquire` returned, before its runtime ran anything else.
    valid_on_return: bool,
}

async fn acquire(request: LockRequest) -> Outcome {
    let result = request.acquire().await;
    let valid_on_return = result.as_ref().is_ok_and(|guard| !guard.is_lost());
    Outcome { result, valid_on_return }
}

/// The argument lists of the queued ACQUIRE calls clients sent on `record` (not a script's inner calls):
/// `EVALSHA sha 1 record token ttl holder register lease [attempt]` (the attempt's number since issue 31).
fn queued_acquires(lines: &[String], record: &str) -> Vec<Vec<String>> {
    script_calls(lines, record, 9)
}

async fn wait_monitor<T>(monitor: &Monitor, from: usize, what: &str, found: impl FnMut(&[String]) -> Option<T>) -> T {
    monitor.wait_until(from, what, found).await
}

/// The hand-over a release made on `record` since line `from`, as the script announced it on
/// `<record>:released`: the heir's token and the grant's fencing token.
async fn hand_over_since(monitor: &Monitor, from: usize, record: &str) -> (String, u64) {
    let channel = format!("{record}:released");
    wait_monitor(monitor, from, "the hand-over's announcement", |lines| {
        lines.iter().map(|l| monitor_args(l)).find_map(|args| {
            let [command, to, text] = args.as_slice() else { return None };
            if !command.eq_ignore_ascii_case("publish") || *to != channel {
                return None;
            }
            let mut fields = text.split(':');
            let heir = fields.next()?.to_owned();
            let fence = fields.next()?.parse().ok()?;
            Some((heir, fence))
        })
    })
    .await
}

/// A hand-over to W that lapsed unclaimed while W is frozen ([`lapse_a_hand_over`]).
struct LapsedHandOver {
    /// W's request, still running.
    w: tokio::task::JoinHandle<Outcome>,
    /// When W's stall ends.
    wakes: Instant,
    /// W's lock token.
    w_token: String,
    /// The handed-over grant's fencing token.
    w_fence: u64,
}

/// H holds `key`, W (ttl 10 s, retries every 1 ms, on `w_client` whose runtime is `w_runtime`) queues behind
/// it; `before_stall` runs; W's runtime is frozen for [`STALL`] and H releases, handing the lock to W, which
/// cannot claim it; returns once the hand-over's record has lapsed (its 1 s lease), well before W wakes.
async fn lapse_a_hand_over(
    server: &RedisServer,
    monitor: &Monitor,
    h_client: &Client,
    w_runtime: &StallableRuntime,
    w_client: Client,
    key: &'static str,
    before_stall: impl FnOnce(),
) -> LapsedHandOver {
    let record = h_client.record_key(key);
    let mut admin = server.connection().await;
    let h = h_client.lock(key).ttl(TTL).acquire().await.expect("H");
    let h_fence = h.fencing_token();
    let from = monitor.len();
    let w = w_runtime.spawn(acquire(w_client.lock(key).ttl(TTL).wait(secs(30)).retry(EVERY_MS)));
    eventually(secs(5), "W queued behind H", || async { waiting(h_client, key).await == 1 }).await;
    let w_token = wait_monitor(monitor, from, "W's queued attempt", |lines| {
        queued_acquires(lines, &record).first().map(|args| args[4].clone())
    })
    .await;
    before_stall();

    let wakes = w_runtime.stall(STALL).await;
    let from = monitor.len();
    assert_eq!(h.release().await.expect("H's release"), ReleaseOutcome::Released);
    let (heir, w_fence) = hand_over_since(monitor, from, &record).await;
    assert_eq!(heir, w_token, "setup: H's release did not hand {key} to W");
    assert!(w_fence > h_fence, "setup: the hand-over's token {w_fence} is not above H's {h_fence}");
    // W cannot claim it: its short hand-over lease lapses, and the record with it.
    let lapsed = record_gone(&mut admin, &record).await;
    assert!(
        Instant::now() + ms(500) < wakes,
        "setup: the hand-over lapsed only {lapsed:?} after H's release, too late in W's stall"
    );
    LapsedHandOver { w, wakes, w_token, w_fence }
}

// ---------------------------------------------------------------------------------------------------------
// Schedule 2: the last token is forgotten early (S4)
// ---------------------------------------------------------------------------------------------------------

/// Schedule 2a: a `min_hold` release. A grant (ttl 10 s, `min_hold` 300 ms) released at once leaves its
/// record held by nobody for 300 ms; the record is then gone, but the lease of the last grant runs 10 s. The
/// server's clock steps back 2 s; the next grant's token must be above the last one.
///
/// Before the fix: the record was gone ~300 ms after the grant, and the last token with it; the next grant's
/// token came from the clock, 2 s back, below the last one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s31_2a_min_hold_release_keeps_the_last_token() {
    const KEY: &str = "s31-2a";
    let _serial = serial().await;
    let Some(server) = RedisServer::with_stepped_clock() else { return };
    let client = client(server.url()).await;
    let mut admin = server.connection().await;
    let record = client.record_key(KEY);

    let first = client.lock(KEY).ttl(TTL).min_hold(ms(300)).acquire().await.expect("the first grant");
    let granted = Instant::now();
    let last = first.fencing_token();
    assert_eq!(first.release().await.expect("release"), ReleaseOutcome::Released);
    let gone = record_gone(&mut admin, &record).await;
    server.step_clock(STEP_BACK_MS);
    let since_grant = granted.elapsed();
    assert!(since_grant < TTL / 2, "setup: the clock stepped {since_grant:?} after the grant");

    let next = client.lock(KEY).ttl(TTL).wait(secs(5)).acquire().await.expect("the next grant");
    assert!(
        next.fencing_token() > last,
        "the last fencing token of {KEY} was forgotten early: its record was gone {gone:?} after a min_hold \
         (300 ms) release, and after the server's clock stepped back 2 s ({since_grant:?} after the grant of \
         ttl {TTL:?}) the next grant got token {}, not above the last grant's {last}",
        next.fencing_token()
    );
    assert_eq!(next.release().await.expect("release"), ReleaseOutcome::Released);
}

/// Schedule 2b: a hand-over that lapses unclaimed. W (ttl 10 s, retries every 1 ms) is queued behind H; W's
/// runtime is frozen, so it cannot claim; H releases and the lock is handed to W, for the 1 s hand-over
/// lease W registered; the record lapses. The server's clock steps back 2 s; C's grant must get a token above
/// W's handed-over one (W's grant had a ttl of 10 s).
///
/// Before the fix: the hand-over's token went with the heir's short record; C's token came from the clock,
/// below W's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s31_2b_lapsed_hand_over_keeps_the_heirs_token() {
    const KEY: &str = "s31-2b";
    let _serial = serial().await;
    let Some(server) = RedisServer::with_stepped_clock() else { return };
    let monitor = Monitor::start(&server);
    let h_client = client(server.url()).await;
    let c_client = client(server.url()).await;
    let w_runtime = StallableRuntime::start("W");
    let w_client = client_on(&w_runtime, server.url()).await;

    let lapsed = lapse_a_hand_over(&server, &monitor, &h_client, &w_runtime, w_client, KEY, || {}).await;
    server.step_clock(STEP_BACK_MS);
    let c = c_client.lock(KEY).ttl(TTL).try_acquire().await.expect("C's try_acquire");
    let c = c.unwrap_or_else(|| panic!("setup: C could not take {KEY} after W's hand-over lapsed"));
    assert!(Instant::now() < lapsed.wakes, "setup: C's grant came after W woke");
    assert!(
        c.fencing_token() > lapsed.w_fence,
        "the last fencing token of {KEY} was forgotten early: H's release handed it to W (token {}, ttl \
         {TTL:?}), the hand-over lapsed unclaimed, and after the server's clock stepped back 2 s C's grant got \
         token {}, not above W's",
        lapsed.w_fence,
        c.fencing_token()
    );
    assert_eq!(c.release().await.expect("C's release"), ReleaseOutcome::Released);
    drop(lapsed);
    drop(w_runtime);
}

/// Schedule 2c: `force_unlock` of a lock kept by `min_hold`. As 2a, with the lock force-unlocked while held by
/// nobody: the record goes with the rest of the `min_hold`, the last token must not.
///
/// Before the fix: the last token went with the record, ~300 ms after the grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s31_2c_force_unlock_after_min_hold_release_keeps_the_last_token() {
    const KEY: &str = "s31-2c";
    let _serial = serial().await;
    let Some(server) = RedisServer::with_stepped_clock() else { return };
    let client = client(server.url()).await;
    let mut admin = server.connection().await;
    let record = client.record_key(KEY);

    let first = client.lock(KEY).ttl(TTL).min_hold(ms(300)).acquire().await.expect("the first grant");
    let granted = Instant::now();
    let last = first.fencing_token();
    assert_eq!(first.release().await.expect("release"), ReleaseOutcome::Released);
    assert!(
        client.force_unlock(KEY).await.expect("force_unlock"),
        "setup: force_unlock found no lock kept by min_hold"
    );
    let gone = record_gone(&mut admin, &record).await;
    server.step_clock(STEP_BACK_MS);
    let since_grant = granted.elapsed();
    assert!(since_grant < TTL / 2, "setup: the clock stepped {since_grant:?} after the grant");

    let next = client.lock(KEY).ttl(TTL).wait(secs(5)).acquire().await.expect("the next grant");
    assert!(
        next.fencing_token() > last,
        "the last fencing token of {KEY} was forgotten early: after a min_hold (300 ms) release and a \
         force_unlock its record was gone {gone:?} later, and after the server's clock stepped back 2 s \
         ({since_grant:?} after the grant of ttl {TTL:?}) the next grant got token {}, not above the last {last}",
        next.fencing_token()
    );
    assert_eq!(next.release().await.expect("release"), ReleaseOutcome::Released);
}

/// Schedule 2d: a multi-key (`lock_all`) request with `min_hold`. Both keys are taken in one step and released
/// at once (ttl 10 s, `min_hold` 300 ms); once both records are gone the server's clock steps back 2 s; the
/// next `lock_all` of the same keys must get, for each key, a token above that key's last one.
///
/// Before the fix: both records went after 300 ms with their tokens; the next request found both keys free
/// and took them in one step with tokens from the clock, below the last ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s31_2d_lock_all_min_hold_release_keeps_the_last_tokens() {
    const KEYS: [&str; 2] = ["s31-2d-a", "s31-2d-b"];
    let _serial = serial().await;
    let Some(server) = RedisServer::with_stepped_clock() else { return };
    let client = client(server.url()).await;
    let mut admin = server.connection().await;

    let first = client.lock_all(KEYS).ttl(TTL).min_hold(ms(300)).acquire().await.expect("the first grant");
    let granted = Instant::now();
    let lasts = KEYS.map(|key| first.fencing_token_of(key).expect("a token for each key"));
    assert_eq!(first.release().await.expect("release"), ReleaseOutcome::Released);
    for key in KEYS {
        record_gone(&mut admin, &client.record_key(key)).await;
    }
    server.step_clock(STEP_BACK_MS);
    let since_grant = granted.elapsed();
    assert!(since_grant < TTL / 2, "setup: the clock stepped {since_grant:?} after the grant");

    let next = client.lock_all(KEYS).ttl(TTL).wait(secs(5)).acquire().await.expect("the next grant");
    let nexts = KEYS.map(|key| next.fencing_token_of(key).expect("a token for each key"));
    assert!(
        nexts.iter().zip(&lasts).all(|(next, last)| next > last),
        "the last fencing tokens of {KEYS:?} were forgotten early: after a lock_all min_hold (300 ms) release \
         both records went, and after the server's clock stepped back 2 s ({since_grant:?} after the grant of \
         ttl {TTL:?}) the next lock_all got tokens {nexts:?}, not each above the last ones {lasts:?}"
    );
    assert_eq!(next.release().await.expect("release"), ReleaseOutcome::Released);
}

// ---------------------------------------------------------------------------------------------------------
// Schedule 3: the hand-over trusts tokens to rise
// ---------------------------------------------------------------------------------------------------------

/// Schedule 3, a token that goes back gives two valid guards: "W (ttl 10 s, retries every 1 ms) is queued
/// behind H; W's runtime stalls 1.5 s; H releases and hands the lock to W; the hand-over lapses unclaimed;
/// the server's clock steps back 2 s; C acquires, with a token below W's. W wakes, its new attempt is Busy
/// with C's lower token, then it reads the old announcement, whose token is above that: it trusts it, dates
/// its lease from that busy attempt and returns `Ok`, `is_lost() == false`, while C holds the lock."
///
/// Since the fix the last token outlives the lapsed hand-over (`R:last`, schedule 2b), which alone would give
/// C a token above W's; the test deletes it before C acquires, to model a token that goes back for another
/// reason (a failover to a replica whose clock is behind, say): exclusion must not rest on tokens rising.
///
/// Sequencing: W's subscriber connection goes through a proxy that holds every byte (`Fault::Blackhole`) from
/// when W is queued, so the announcement reaches W only when the test lets it: after `MONITOR` shows two of
/// W's attempts after C's grant (W sends one at a time, so the first one's Busy reply, with C's token, was
/// read by then).
///
/// Asserted: never W valid while C is valid. W either gives up, or keeps waiting and is served once C
/// releases.
///
/// Before the fix: W returns `Ok` with `is_lost() == false` while C holds the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s31_3_token_going_back_does_not_make_a_stale_hand_over_fresh() {
    const KEY: &str = "s31-3";
    const SUBSCRIBER: u64 = 1;
    let _serial = serial().await;
    let Some(server) = RedisServer::with_stepped_clock() else { return };
    let monitor = Monitor::start(&server);
    let mut admin = server.connection().await;
    let h_client = client(server.url()).await;
    let c_client = client(server.url()).await;
    let record = h_client.record_key(KEY);
    let proxy = FaultProxy::to_port(server.port()).await;
    let w_runtime = StallableRuntime::start("W");
    let w_client = client_on(&w_runtime, proxy.url()).await;
    assert_eq!(proxy.stats().accepted, 2, "setup: W's client has a command connection, then a subscriber");

    // W listens before it queues: once queued, its subscription is in place, and the proxy can hold it.
    let hold_announcements = || {
        assert!(proxy.set_connection_fault(SUBSCRIBER, Fault::Blackhole), "setup: W's subscriber connection closed");
    };
    let lapsed = lapse_a_hand_over(&server, &monitor, &h_client, &w_runtime, w_client, KEY, hold_announcements).await;
    let LapsedHandOver { mut w, wakes, w_token, w_fence } = lapsed;
    server.step_clock(STEP_BACK_MS);
    let last_key = format!("{record}:last");
    let _: i64 = redis::cmd("DEL").arg(&last_key).query_async(&mut admin).await.expect("DEL");
    let c = c_client.lock(KEY).ttl(TTL).try_acquire().await.expect("C's try_acquire");
    let c = c.unwrap_or_else(|| panic!("setup: C could not take {KEY} after W's hand-over lapsed"));
    let c_fence = c.fencing_token();
    assert!(c_fence < w_fence, "setup: C's token {c_fence} is not below W's lapsed hand-over's {w_fence}");
    let c_granted = monitor.mark(&mut admin, "c-granted").await;
    assert!(Instant::now() < wakes, "setup: C's grant came after W woke");

    // W wakes, its refresh due and the announcement held: its attempts find C holding the lock.
    wait_monitor(&monitor, c_granted, "two of W's attempts after its stall", |lines| {
        let w_attempts = queued_acquires(lines, &record).into_iter().filter(|args| args[4] == w_token).count();
        (w_attempts >= 2).then_some(())
    })
    .await;
    // Only now the old announcement reaches W.
    assert!(proxy.set_connection_fault(SUBSCRIBER, Fault::Pass), "setup: W's subscriber connection closed");
    let delivered = Instant::now();

    let mut c = Some(c);
    let outcome = match tokio::time::timeout_at(delivered + secs(1), &mut w).await {
        Ok(outcome) => outcome.expect("W's task"),
        Err(_) => {
            // Still waiting: it must be served once C releases.
            let c = c.take().expect("C");
            assert!(!c.is_lost(), "C lost its lock");
            assert_eq!(c.release().await.expect("C's release"), ReleaseOutcome::Released);
            within(secs(5), "W's acquire after C released", w).await.expect("W's task")
        }
    };
    match &c {
        Some(c) => {
            // C was granted before W woke, and is valid now: it was valid when W's acquire returned.
            let c_valid = !c.is_lost();
            assert!(
                !(outcome.valid_on_return && c_valid),
                "two valid guards on {KEY}: W's acquire returned {:?} with is_lost() == false once the \
                 announcement of its lapsed hand-over (token {w_fence}) reached it, while C holds token {c_fence} \
                 (granted after the server's clock stepped back 2 s) and is valid: W trusted the announcement \
                 because its token is above that of W's last busy attempt, which found C",
                outcome.result.as_ref().map(LockGuard::fencing_token),
            );
        }
        None => assert!(
            outcome.result.as_ref().is_ok_and(|guard| !guard.is_lost()),
            "W, still waiting when C released {KEY}, was not served: {:?}",
            outcome.result
        ),
    }
    drop(outcome);
    drop(w_runtime);
    drop(proxy);
}
