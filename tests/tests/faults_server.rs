//! Fault injection on the Redis server: frozen (SIGSTOP, DEBUG SLEEP) (scenario 4), writes paused
//! (`CLIENT PAUSE WRITE`) (scenario 5), restarted empty (scenario 10), evicting lock records (scenario 11),
//! busy with a script and with its script cache flushed (scenario 12).

use std::sync::Arc;
use std::time::Duration;

use distlock::{Client, LockError, ReleaseOutcome};
use distlock_tests::events::{EventLog, Kind};
use distlock_tests::logs;
use distlock_tests::monitor::Monitor;
use distlock_tests::proxy::{Fault, FaultProxy};
use distlock_tests::sys::Stopped;
use distlock_tests::time::{drift, ms, secs};
use distlock_tests::{acquire_after_recovery, raw_connection, serial, within, Fixture, RedisServer};
use tokio::time::Instant;
use tracing::Level;

/// Scheduling slack on a loaded 2-core machine, on top of every bound below.
const SLACK: Duration = Duration::from_millis(250);

async fn client_with_timeouts(url: &str, connect: Duration, response: Duration) -> Client {
    Client::builder().redis(url).connect_timeout(connect).response_timeout(response).build().await.expect("client")
}

/// Sets its flag when dropped.
struct OnDrop(Arc<EventLog>, &'static str, u64);

impl Drop for OnDrop {
    fn drop(&mut self) {
        self.0.record(self.1, Kind::Dropped { fence: self.2 });
    }
}

/// Starts `run` on `key` in a task whose body records `Entered` and, when dropped, `Dropped`; returns the
/// task once the body runs.
async fn spawn_holder(
    client: &Client,
    key: &'static str,
    ttl: Duration,
    log: &Arc<EventLog>,
) -> tokio::task::JoinHandle<Result<(), LockError>> {
    let (client, log) = (client.clone(), Arc::clone(log));
    let run = tokio::spawn({
        let log = Arc::clone(&log);
        async move {
            let fence_client = client.clone();
            client
                .lock(key)
                .ttl(ttl)
                .run(async move {
                    let fence = fence_client.lock_info(key).await.unwrap().expect("held").fencing_token;
                    let _dropped = OnDrop(Arc::clone(&log), "holder", fence);
                    log.record("holder", Kind::Entered { fence });
                    std::future::pending::<()>().await;
                })
                .await
        }
    });
    log.wait_for("holder", secs(10), |k| matches!(k, Kind::Entered { .. })).await;
    run
}

/// Asserts that `call` ends within `limit` (plus slack) and returns its result and how long it took.
async fn bounded<T>(what: &str, limit: Duration, call: impl std::future::Future<Output = T>) -> (T, Duration) {
    let start = Instant::now();
    let out = within(limit + secs(5), what, call).await;
    let took = start.elapsed();
    assert!(took <= limit + SLACK, "{what} took {took:?}, more than its bound {limit:?}");
    (out, took)
}

/// A backend timeout whose message says which lock, which server and what to do (the rule for every Redis
/// error; `build()`'s own timeouts are checked in timeouts.rs).
fn expect_timeout<T: std::fmt::Debug>(what: &str, key: &str, server: &str, result: Result<T, LockError>) {
    match result {
        Err(LockError::Backend(e)) => {
            let message = e.to_string();
            assert!(e.is_timeout() || message.contains("timed out"), "{what}: {message}");
            assert!(message.contains(&format!("lock `{key}`")), "{what}: the lock is not named: {message}");
            assert!(message.contains(&format!(" at {server} ")), "{what}: {server} is not named: {message}");
            let hint = message.rsplit("; ").next().unwrap_or_default();
            assert!(hint.len() > 20 && hint != message, "{what}: no hint of what to do: {message}");
        }
        other => panic!("{what}: expected a backend timeout, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------------------
// Scenario 4: Redis frozen
// ---------------------------------------------------------------------------------------------------------

/// Scenario 4 with SIGSTOP. While the server is frozen no call hangs past its timeout (response timeout
/// 500 ms; an acquire with a wait ends within wait + one timeout; a new client within its connect
/// timeout), the running lock body is cancelled at its lease deadline — not before the lease could have
/// run out, not later than the deadline — and after SIGCONT the lock can be taken again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s04_frozen_server_no_call_hangs_body_cancelled_at_deadline_recovers() {
    const KEY: &str = "frozen";
    let ttl = secs(2);
    let timeout = ms(500);
    let _serial = serial().await;
    let fx = Fixture::redis().await;
    let server = fx.server().unwrap();
    let client = client_with_timeouts(&server.url(), timeout, timeout).await;
    let log = EventLog::new();
    let holder = spawn_holder(&client, KEY, ttl, &log).await;

    let frozen = Stopped::stop(server.pid().unwrap());
    let froze = Instant::now();
    let calls = async {
        let (r, _) = bounded("try_acquire on a frozen server", timeout, client.lock("other").try_acquire()).await;
        expect_timeout("try_acquire", "other", &server.url(), r);
        let (r, _) = bounded("lock_info on a frozen server", timeout, client.lock_info(KEY)).await;
        expect_timeout("lock_info", KEY, &server.url(), r);
        let wait = ms(700);
        let (r, _) = bounded("acquire with a wait", wait + timeout, client.lock("other").wait(wait).acquire()).await;
        assert!(r.is_err(), "acquired on a frozen server: {r:?}");
        let url = server.url();
        let build = Client::builder().redis(url).connect_timeout(timeout).response_timeout(timeout).build();
        // The connect timeout bounds all of connecting (issue 34; it was twice that).
        let (r, _) = bounded("a new client", timeout, build).await;
        assert!(r.is_err(), "connected to a frozen server");
    };
    let (result, ()) = tokio::join!(within(ttl * 3, "the holder's run", holder), calls);
    let result = result.expect("holder task");
    assert!(matches!(result, Err(LockError::Lost { .. })), "the holder's run returned {result:?}");
    let dropped = log.find("holder", |k| matches!(k, Kind::Dropped { .. })).expect("the body was dropped").at;
    // The last successful renewal was sent at most ttl/3 (plus a retry) before the freeze, and not after it.
    let since_freeze = dropped - froze;
    assert!(since_freeze <= ttl - drift(ttl) + SLACK, "body dropped {since_freeze:?} after the freeze (ttl {ttl:?})");
    assert!(since_freeze >= ttl * 2 / 3 - ms(200), "body dropped only {since_freeze:?} after the freeze: too early");

    frozen.resume();
    let guard = within(secs(10), "acquire after SIGCONT", client.lock(KEY).wait(ttl * 2).acquire())
        .await
        .expect("the lock can be taken after the server resumed");
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
}

/// Scenario 4 with `DEBUG SLEEP`: calls made while the server sleeps end with a timeout within the
/// response timeout, and the same client works again afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s04_debug_sleep_calls_end_within_their_timeout_then_work() {
    const KEY: &str = "debug-sleep";
    let timeout = ms(400);
    let _serial = serial().await;
    let fx = Fixture::redis().await;
    let server = fx.server().unwrap();
    let client = client_with_timeouts(&server.url(), timeout, timeout).await;
    let mut sleeper = raw_connection(&server.url(), None).await;
    let sleeping = tokio::spawn(async move {
        let _: redis::RedisResult<String> = redis::cmd("DEBUG").arg("SLEEP").arg("1.5").query_async(&mut sleeper).await;
    });
    // Setup pause: let the server start sleeping.
    tokio::time::sleep(ms(100)).await;
    // (The server runs these once it wakes up: the timed-out acquire then leaves an orphan grant on its
    // key until its lease ends, which is scenario 8's subject; KEY is not used for it.)
    let (r, _) = bounded("try_acquire during DEBUG SLEEP", timeout, client.lock("during-sleep").try_acquire()).await;
    expect_timeout("try_acquire", "during-sleep", &server.url(), r);
    let (r, _) = bounded("lock_info during DEBUG SLEEP", timeout, client.lock_info(KEY)).await;
    expect_timeout("lock_info", KEY, &server.url(), r);
    within(secs(5), "DEBUG SLEEP ends", sleeping).await.unwrap();
    let guard =
        within(secs(5), "acquire after the sleep", client.lock(KEY).acquire()).await.expect("the client works again");
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
}

/// Scenario 4 / L3: a waiter's first attempt finds the lock busy, and the connection it then opens to
/// listen for releases hangs (accepted, never answered: a frozen or half-dead server). The acquire must
/// still end within its wait plus one timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s04_waiter_whose_release_listener_hangs_ends_within_wait_plus_one_timeout() {
    const KEY: &str = "hanging-listener";
    let timeout = ms(500);
    let _serial = serial().await;
    let fx = Fixture::redis().await;
    let server = fx.server().unwrap();
    let _held = fx.client().lock(KEY).ttl(secs(30)).acquire().await.expect("holder");
    let proxy = FaultProxy::to_port(server.port()).await;
    let waiter = client_with_timeouts(&proxy.url(), timeout, timeout).await;
    // The waiter's command connection keeps working; any new connection hangs.
    proxy.set_fault_for_new_connections(Fault::Blackhole);
    let wait = secs(1);
    let start = Instant::now();
    let result = within(secs(30), "the waiter", waiter.lock(KEY).wait(wait).acquire()).await;
    let took = start.elapsed();
    assert!(result.is_err(), "got a lock that is held: {result:?}");
    assert!(took <= wait + timeout + SLACK, "acquire with wait {wait:?} took {took:?}: {result:?}");
}

// ---------------------------------------------------------------------------------------------------------
// Scenario 5: CLIENT PAUSE WRITE
// ---------------------------------------------------------------------------------------------------------

/// Scenario 5. `CLIENT PAUSE 2500 WRITE` blocks every script call, renewals included: the holder is lost
/// at its deadline (its body dropped, well before the pause ends), and when the pause lifts, the renewal
/// that was queued meanwhile runs and finds nothing — it never re-creates or extends the record. The next
/// holder gets a higher fencing token and keeps its lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s05_client_pause_write_holder_lost_at_deadline_queued_renewal_never_recreates_the_key() {
    const KEY: &str = "paused-writes";
    let ttl = secs(1);
    let pause = ms(2500);
    let _serial = serial().await;
    let fx = Fixture::redis().await;
    let server = fx.server().unwrap();
    let monitor = Monitor::start(server);
    let mut conn = fx.redis_connection().unwrap();
    let record = fx.client().record_key(KEY);
    let log = EventLog::new();
    let holder = spawn_holder(fx.client(), KEY, ttl, &log).await;
    let fence = fx.client().lock_info(KEY).await.unwrap().expect("held").fencing_token;
    // The record starts with the holder's 32-character token.
    let value: String = redis::cmd("GET").arg(&record).query_async(&mut conn).await.unwrap();
    let token: String = value.chars().take(32).collect();

    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(pause.as_millis() as u64)
        .arg("WRITE")
        .query_async(&mut conn)
        .await
        .unwrap();
    let paused = Instant::now();
    // ECHO is not a write: it runs during the pause. Every lease change after it ran after the pause.
    let mark = monitor.mark(&mut conn, "paused").await;
    let result = within(secs(10), "the holder's run", holder).await.unwrap();
    assert!(matches!(result, Err(LockError::Lost { .. })), "{result:?}");
    let lost_after = paused.elapsed();
    assert!(lost_after <= ttl + SLACK, "lost {lost_after:?} into the pause (ttl {ttl:?})");
    assert!(lost_after < pause, "the loss must be noticed while writes are still paused");

    // A write of ours, queued behind the holder's renewal, returns once the pause lifted and the queue ran.
    let mut writer = raw_connection(&server.url(), None).await;
    let _: () = redis::cmd("SET").arg("test:after-pause").arg(1).query_async(&mut writer).await.unwrap();
    let end = monitor.mark(&mut conn, "after-pause").await;
    let window = &monitor.lines()[mark..end];
    let queued: Vec<&String> = window.iter().filter(|l| l.contains(&token)).collect();
    assert!(!queued.is_empty(), "no renewal was queued during the pause:\n{}", window.join("\n"));
    let free = distlock_tests::record_is_free(&mut conn, &record).await;
    assert!(free, "the queued renewal re-created or kept the record:\n{}", window.join("\n"));
    let leases: Vec<&String> = window.iter().filter(|l| l.contains("\"pexpire\"")).collect();
    assert!(leases.is_empty(), "a lease was set after the pause:\n{}", window.join("\n"));

    let next = fx.other_client().await;
    let guard = next.lock(KEY).ttl(secs(10)).wait(secs(5)).acquire().await.expect("the next holder");
    assert!(guard.fencing_token() > fence);
    assert_eq!(next.lock_info(KEY).await.unwrap().unwrap().fencing_token, guard.fencing_token());
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
}

// ---------------------------------------------------------------------------------------------------------
// Scenario 10: restarted empty
// ---------------------------------------------------------------------------------------------------------

/// Scenario 10. The server restarts without persistence while a guard holds a lock: the holder learns it
/// at its next renewal (within ttl/3, plus one renewal retry after the connection error), and the same
/// client locks again once the server is back. The fencing counter restarted from zero with the data: the
/// new token is not above the old one, which README documents ("fencing counters reset too").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s10_restart_without_persistence_holder_lost_within_ttl_over_3_fencing_reset_documented() {
    const KEY: &str = "restarted";
    let ttl = secs(3);
    let _serial = serial().await;
    let mut fx = Fixture::redis().await;
    let client = fx.client().clone();
    // Let the counter reach a few grants, so that its reset is visible.
    for _ in 0..3 {
        client.lock(KEY).acquire().await.unwrap().release().await.unwrap();
    }
    let guard = client.lock(KEY).ttl(ttl).acquire().await.expect("acquire");
    let before = guard.fencing_token();
    tokio::task::block_in_place(|| fx.server_mut().unwrap().restart());
    let restarted = Instant::now();
    within(ttl, "the holder learns of the restart", guard.lost()).await;
    let noticed = restarted.elapsed();
    assert!(noticed <= ttl / 3 + ttl / 20 + SLACK, "lost noticed {noticed:?} after the restart (ttl {ttl:?})");

    let recovered = acquire_after_recovery(restarted + secs(5), "after the restart", || client.lock(KEY).wait(secs(2)));
    let again = within(secs(10), "lock after the restart", recovered).await;
    let after = again.fencing_token();
    eprintln!("fencing token {before} before the restart, {after} after");
    if after <= before {
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
        assert!(
            readme.contains("fencing counters reset"),
            "the fencing token went from {before} to {after} across a restart, and README does not say so"
        );
    }
    assert!(matches!(guard.release().await.unwrap(), ReleaseOutcome::Expired | ReleaseOutcome::TakenByOther));
    assert_eq!(again.release().await.unwrap(), ReleaseOutcome::Released);
}

// ---------------------------------------------------------------------------------------------------------
// Scenario 11: eviction
// ---------------------------------------------------------------------------------------------------------

/// Scenario 11, startup: a client warns when the server's `maxmemory-policy` may evict lock records, and
/// stays quiet on `noeviction`.
#[tokio::test(flavor = "current_thread")]
async fn s11_client_warns_at_startup_when_maxmemory_policy_evicts() {
    let logs = logs::capture();
    for policy in ["allkeys-lru", "volatile-ttl", "noeviction"] {
        let server = RedisServer::new();
        let mut conn = server.connection().await;
        let _: () =
            redis::cmd("CONFIG").arg("SET").arg("maxmemory-policy").arg(policy).query_async(&mut conn).await.unwrap();
        let _client = Client::builder().redis(server.url()).build().await.expect("client");
        let port = format!(":{}", server.port());
        let warnings = logs.matching(Level::WARN, &["maxmemory-policy", &port]);
        if policy == "noeviction" {
            assert!(warnings.is_empty(), "warned about noeviction: {warnings:?}");
        } else {
            assert_eq!(warnings.len(), 1, "policy {policy}: expected one startup warning; log:\n{}", logs.dump());
            assert!(warnings[0].text.contains(policy), "{}", warnings[0]);
        }
    }
}

/// Scenario 11, eviction: lock records evicted under memory pressure (`allkeys-random`, `maxmemory` set
/// below what is used) make the holder lost at its next renewal (within ttl/3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s11_evicted_record_holder_lost_at_next_renewal() {
    const KEY: &str = "evicted";
    let ttl = secs(3);
    let _serial = serial().await;
    let fx = Fixture::redis().await;
    let mut conn = fx.redis_connection().unwrap();
    let record = fx.client().record_key(KEY);
    let guard = fx.client().lock(KEY).ttl(ttl).acquire().await.expect("acquire");
    let config = |k: &'static str, v: &'static str| redis::cmd("CONFIG").arg("SET").arg(k).arg(v).clone();
    let _: () = config("maxmemory-policy", "allkeys-random").query_async(&mut conn).await.unwrap();
    let _: () = config("maxmemory", "1").query_async(&mut conn).await.unwrap();
    // Any write now makes Redis evict (and then refuse the write itself: out of memory).
    let _: redis::RedisResult<()> = redis::cmd("SET").arg("test:pressure").arg("x").query_async(&mut conn).await;
    let exists: i64 = redis::cmd("EXISTS").arg(&record).query_async(&mut conn).await.unwrap();
    let evicted = Instant::now();
    let _: () = config("maxmemory", "0").query_async(&mut conn).await.unwrap();
    assert_eq!(exists, 0, "the lock record was not evicted");
    within(ttl, "the holder notices the eviction", guard.lost()).await;
    let noticed = evicted.elapsed();
    assert!(noticed <= ttl / 3 + SLACK, "eviction noticed after {noticed:?} (ttl {ttl:?})");
}

// ---------------------------------------------------------------------------------------------------------
// Scenario 12: BUSY and SCRIPT FLUSH
// ---------------------------------------------------------------------------------------------------------

/// Scenario 12, SCRIPT FLUSH: the server forgets the scripts while a guard renews; the next renewal's
/// EVALSHA gets NOSCRIPT, falls back to EVAL (MONITOR shows it), and the guard keeps its lock; afterwards
/// EVALSHA works again, and the other operations (acquire, release) fall back the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s12_script_flush_renewal_falls_back_to_eval_and_keeps_the_lock() {
    const KEY: &str = "flushed";
    let ttl = ms(900);
    let _serial = serial().await;
    let fx = Fixture::redis().await;
    let monitor = Monitor::start(fx.server().unwrap());
    let mut conn = fx.redis_connection().unwrap();
    let guard = fx.client().lock(KEY).ttl(ttl).acquire().await.expect("acquire");
    let token = guard.token().expose_secret().to_owned();
    let mark = monitor.mark(&mut conn, "flush").await;
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query_async(&mut conn).await.unwrap();
    let quoted = format!("\"{token}\"");
    let eval = monitor.wait_for_all(mark, &["\"EVAL\"", &quoted], secs(3)).await;
    let sha_again = monitor.wait_for(eval + 1, &quoted, secs(3)).await;
    assert!(monitor.lines()[sha_again].contains("\"EVALSHA\""), "{}", monitor.lines()[sha_again]);
    assert!(!guard.is_lost(), "the flush cost the lock");
    assert!(guard.remaining_ttl().await.unwrap().is_some());

    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query_async(&mut conn).await.unwrap();
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query_async(&mut conn).await.unwrap();
    let other = fx.other_client().await;
    let again = other.lock(KEY).acquire().await.expect("acquire after a flush");
    assert_eq!(again.release().await.unwrap(), ReleaseOutcome::Released);
}

/// Scenario 12, BUSY: a script runs on the server past `busy-reply-threshold`, so every other call gets a
/// `BUSY` error at once. The watchdog's renewal is retried (the client logs each BUSY at debug level) and
/// the guard keeps its lock once the script is killed, well within its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s12_busy_script_renewal_retried_lock_kept() {
    const KEY: &str = "busy";
    let ttl = secs(3);
    let logs = logs::capture();
    let _serial = serial().await;
    let fx = Fixture::redis().await;
    let url = fx.server().unwrap().url();
    let mut conn = raw_connection(&url, Some(secs(5))).await;
    let _: () =
        redis::cmd("CONFIG").arg("SET").arg("busy-reply-threshold").arg("100").query_async(&mut conn).await.unwrap();
    let guard = fx.client().lock(KEY).ttl(ttl).acquire().await.expect("acquire");

    let mut busy = raw_connection(&url, None).await;
    let script = tokio::spawn(async move {
        let _: redis::RedisResult<()> = redis::cmd("EVAL").arg("while true do end").arg(0).query_async(&mut busy).await;
    });
    within(secs(5), "the server turns busy", async {
        loop {
            let r: redis::RedisResult<String> = redis::cmd("PING").query_async(&mut conn).await;
            if matches!(&r, Err(e) if e.to_string().contains("BUSY")) {
                break;
            }
            tokio::time::sleep(ms(10)).await;
        }
    })
    .await;
    let busy_since = Instant::now();
    // Busy for longer than the renewal period, so that a renewal meets BUSY, and its retry too.
    let key_field = format!("key={KEY}");
    let busy_renewals = || logs.matching(Level::DEBUG, &["renewal failed", "BUSY", &key_field]).len();
    within(ttl, "a renewal meets BUSY, and so does its retry", async {
        while busy_renewals() < 2 {
            tokio::time::sleep(ms(10)).await;
        }
    })
    .await;
    let _: () = redis::cmd("SCRIPT").arg("KILL").query_async(&mut conn).await.unwrap();
    within(secs(5), "the busy script ends", script).await.unwrap();
    let busy_for = busy_since.elapsed();
    eprintln!("server busy for {busy_for:?}");
    assert!(!guard.is_lost(), "BUSY cost the lock");
    // A failed renewal is retried a twentieth of the ttl later, not at once: no busy loop against a server
    // that is already struggling (the mutation report's renewer.rs `arrived + retry` -> `arrived - retry`).
    let most = busy_for.as_millis() / (ttl / 20).as_millis() + 2;
    let tries = busy_renewals();
    eprintln!("{tries} renewals met BUSY (at most {most})");
    assert!(tries as u128 <= most, "{tries} renewals met BUSY in {busy_for:?}: retried without a pause");
    within(secs(2), "a renewal succeeds after BUSY", async {
        while guard.remaining_ttl().await.unwrap().expect("still ours") < ttl - ms(500) {
            tokio::time::sleep(ms(20)).await;
        }
    })
    .await;
    assert!(!guard.is_lost());
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
}
