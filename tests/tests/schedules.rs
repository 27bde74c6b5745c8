//! Deterministic regression tests for five interleavings that break distlock's invariant (issue 15):
//!
//! > a guard's local validity (`is_lost() == false`) never lies past the server's expiry of the grant it
//! > holds; two guards on one key are never both valid at once; a lock the client gives up on is never
//! > left held on the server longer than the lease it registered.
//!
//! Each test drives one schedule step by step — W is a client on a current-thread runtime of its own
//! ([`StallableRuntime`]) that the test freezes to stall it; H holds first, C is another client — and
//! asserts the invariant itself. Events (the queue length, `MONITOR`, the proxy's counters, channels from
//! the stalled runtime) sequence the steps; fixed durations are used only where a stall or a lease is the
//! point of the schedule.

use std::sync::Arc;
use std::time::Duration;

use distlock::{Client, LockError, LockGuard, LockRequest, ReleaseOutcome, RetryStrategy};
use distlock_tests::monitor::{monitor_args, script_calls, Monitor};
use distlock_tests::proxy::{Fault, FaultProxy};
use distlock_tests::stall::StallableRuntime;
use distlock_tests::sys::Stopped;
use distlock_tests::time::{drift, ms, secs};
use distlock_tests::{eventually, serial, within, Fixture};
use tokio::time::Instant;

distlock_tests::both_backends!(
    s15_1_stale_handover_after_stall,
    s15_2_late_claim_leaves_lock_stuck_for_full_ttl,
    s15_2b_late_claim_after_wait_ran_out_during_stall,
    s15_5_guard_escaped_from_run,
);

/// How many requests wait for `key`, as its record reports.
async fn waiting(client: &Client, key: &str) -> usize {
    client.lock_info(key).await.expect("lock_info").map_or(0, |info| info.waiting)
}

/// A client for a waiter on `runtime`. On Redis it is built there, so its connections and its release
/// subscription stall with the runtime, as in a frozen process; the in-process store is one per built
/// client, so there it is the fixture's client.
async fn client_on(fx: &Fixture, runtime: &StallableRuntime) -> Client {
    client_acknowledged_on(fx, runtime, 0).await
}

/// As [`client_on`], with grants counted only once `replicas` replicas acknowledged them (Redis only).
async fn client_acknowledged_on(fx: &Fixture, runtime: &StallableRuntime, replicas: u32) -> Client {
    match fx.server() {
        Some(server) => {
            let url = server.url();
            runtime
                .spawn(async move {
                    let builder = Client::builder().redis(url);
                    let builder = if replicas > 0 { builder.wait_for_replicas(replicas, ms(500)) } else { builder };
                    builder.build().await.expect("W's client")
                })
                .await
                .expect("W's runtime")
        }
        None => {
            assert_eq!(replicas, 0, "the in-process store has no replicas");
            fx.client().clone()
        }
    }
}

/// What a request came to, seen from the runtime it ran on.
#[derive(Debug)]
struct Outcome {
    /// When `acquire` returned.
    returned: Instant,
    result: Result<LockGuard, LockError>,
    /// Whether the guard said valid when `acquire` returned, before its runtime ran anything else (its first
    /// renewal included).
    valid_on_return: bool,
}

impl Outcome {
    fn fence(&self) -> Option<u64> {
        self.result.as_ref().ok().map(LockGuard::fencing_token)
    }
}

async fn acquire(request: LockRequest) -> Outcome {
    let result = request.acquire().await;
    let returned = Instant::now();
    let valid_on_return = result.as_ref().is_ok_and(|guard| !guard.is_lost());
    Outcome { returned, result, valid_on_return }
}

/// Takes `key` for C, retrying every 5 ms until `limit`; `None` if it stayed busy.
async fn take_within(client: &Client, key: &str, limit: Instant) -> Option<LockGuard> {
    loop {
        if let Some(guard) = client.lock(key).ttl(secs(10)).try_acquire().await.expect("C's try_acquire") {
            return Some(guard);
        }
        if Instant::now() >= limit {
            return None;
        }
        tokio::time::sleep(ms(5)).await;
    }
}

/// On Redis, waits until `MONITOR` shows the next queued attempt on `record` (W's), then `settle` more: W has
/// read its reply and sits between two attempts when the test stalls it next (a stall with an attempt in
/// flight is another schedule). In-process attempts never leave W's thread: nothing to wait for.
async fn between_attempts(monitor: Option<&Monitor>, record: &str, settle: Duration) {
    if let Some(monitor) = monitor {
        let from = monitor.len();
        wait_monitor(monitor, from, "W's next queued attempt", |lines| {
            acquire_calls(lines, record).into_iter().find(|a| a.len() == QUEUED_ACQUIRE_ARGS)
        })
        .await;
        tokio::time::sleep(settle).await;
    }
}

// ---------------------------------------------------------------------------------------------------------
// Schedule 1: stale hand-over after a stall
// ---------------------------------------------------------------------------------------------------------

/// Schedule 1, stale hand-over after a stall (two valid guards): "H holds `k`; W (`ttl` 150 ms, `wait` 3 s)
/// is queued. W stalls 500 ms; meanwhile H releases and the script hands `k` to W (token 2); the hand-over
/// lease lapses and C acquires (token 3). W wakes, its refresh timer wins the `select!`, its new attempt is
/// Busy, then it reads the old announcement and dates the lease from that newer busy attempt
/// (`handed_over_lease`): `Ok`, token 2, `is_lost() == false` while C holds token 3."
///
/// Current engine: fails on Redis (after the stall the refresh timer is seen before the subscriber has
/// delivered the announcement). On memory it passes: the announcement is already in the watch channel when W
/// wakes, so W reads it first, dates the lease from its last busy attempt before the stall, finds it expired
/// and gives up (`NotObtained`) — no second valid guard.
async fn s15_1_stale_handover_after_stall(fx: Fixture) {
    const KEY: &str = "s15-1";
    let _serial = serial().await;
    let monitor = fx.server().map(Monitor::start);
    let w_runtime = StallableRuntime::start("W");
    let w_client = client_on(&fx, &w_runtime).await;
    let c_client = fx.other_client().await;
    let h = fx.client().lock(KEY).ttl(secs(10)).acquire().await.expect("H");
    let h_fence = h.fencing_token();
    let mut w = w_runtime.spawn(acquire(w_client.lock(KEY).ttl(ms(150)).wait(secs(3))));
    eventually(secs(5), "W queued behind H", || async { waiting(fx.client(), KEY).await == 1 }).await;

    // W refreshes its place every 12-50 ms.
    between_attempts(monitor.as_ref(), &fx.client().record_key(KEY), ms(4)).await;
    let wakes = w_runtime.stall(ms(500)).await;
    // H releases: the script hands k to the stalled W, with the ~150 ms hand-over lease W registered.
    assert_eq!(h.release().await.expect("H's release"), ReleaseOutcome::Released);
    let handed = fx.client().lock_info(KEY).await.expect("lock_info").map(|i| i.fencing_token);
    assert!(handed.is_some_and(|fence| fence > h_fence), "setup: the release handed k to W: {handed:?}");
    // Unclaimed, the hand-over lapses; C takes k while W is still stalled.
    let c = take_within(&c_client, KEY, wakes - ms(100)).await;
    let c =
        c.unwrap_or_else(|| panic!("setup: C could not take {KEY} while W was stalled (the hand-over did not lapse)"));
    let c_fence = c.fencing_token();
    assert!(Instant::now() < wakes, "setup: C's grant came after W woke");

    // W wakes. A correct engine gives up, or keeps waiting (then it is served when C releases).
    let mut c = Some(c);
    let outcome = match tokio::time::timeout_at(wakes + secs(1), &mut w).await {
        Ok(outcome) => outcome.expect("W's task"),
        Err(_) => {
            let c = c.take().expect("C");
            assert!(!c.is_lost(), "C lost its lock");
            c.release().await.expect("C's release");
            within(secs(5), "W's acquire after C released", w).await.expect("W's task")
        }
    };
    if let Some(c) = &c {
        // C was granted while W was stalled, before W's acquire returned, and is valid now: it was valid then.
        let c_valid = !c.is_lost();
        assert!(
            !(outcome.valid_on_return && c_valid),
            "two valid guards on {KEY}: W's acquire returned {:?} after its stall with fence {:?} and \
             is_lost() == false, while C holds fence {c_fence} (granted while W was stalled) and is valid; \
             W's hand-over (fence {handed:?}) had lapsed before C's grant",
            outcome.returned.saturating_duration_since(wakes),
            outcome.fence(),
        );
    }
    drop(outcome);
    drop(w_runtime);
}

// ---------------------------------------------------------------------------------------------------------
// Schedule 2: a late claim leaves the lock stuck for the full ttl
// ---------------------------------------------------------------------------------------------------------

/// Schedule 2, a late claim leaves the lock stuck for the full ttl (liveness): "W (`ttl` 5 s, fast retries,
/// hand-over lease ~103 ms) stalls 130 ms; H releases 50 ms into the stall. W wakes while the hand-over is
/// still live; its next attempt hits the script branch where the record already carries W's token, which
/// stretches it to the full `ttl`; the client dates the lease from the busy attempt before the stall, finds
/// it expired, builds a guard and drops it, and `LockGuard::drop` → `abandon()` sends no release. W gets
/// `NotObtained`; the record keeps W's token for 5 s; C waits 5 s instead of ~0.1 s."
///
/// Here W's hand-over lease is the floor of 1 s (acquire.rs `HAND_OVER_LEASE_FLOOR`; its retries every
/// 5–10 ms alone would make it 115–130 ms), and W stalls 1,030 ms: W wakes after the lease it dates from its
/// last attempt before the stall, and before the server's, which counts from H's release 50 ms into it.
///
/// Current engine: fails on Redis (C cannot take the key within 1.5 s: the record has W's 5 s lease). On
/// memory it passes: the in-process store hands W its own record back without stretching the lease.
async fn s15_2_late_claim_leaves_lock_stuck_for_full_ttl(fx: Fixture) {
    late_claim(fx, "s15-2", false).await;
}

/// Schedule 2, the give-up variant: as [`s15_2_late_claim_leaves_lock_stuck_for_full_ttl`], but W's `wait`
/// runs out during the stall, so W wakes past its deadline and must give the lock up (the give-up path):
/// "a lock the client gives up on is never left held on the server longer than the lease it registered".
///
/// Current engine: fails on Redis as schedule 2 does (the attempt after the stall still claims the hand-over
/// and stretches it to the full ttl before the deadline is looked at); passes on memory.
async fn s15_2b_late_claim_after_wait_ran_out_during_stall(fx: Fixture) {
    late_claim(fx, "s15-2b", true).await;
}

/// Schedule 2 with replica acknowledgement (`wait_for_replicas`), where W never trusts an announcement (it was
/// not acknowledged) and claims every hand-over with an attempt of its own: the claim after the stall must
/// still be either a valid guard that excludes C, or a give-up that frees the lock within the hand-over lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s15_2c_late_claim_with_replica_acknowledgement() {
    let fx = Fixture::redis().await;
    let primary = fx.server().expect("a Redis fixture").port();
    let _replica = distlock_tests::RedisServer::replica_of(primary).await;
    late_claim_acknowledged(fx, "s15-2c", false, 1).await;
}

/// The give-up variant of [`s15_2c_late_claim_with_replica_acknowledgement`]: W's wait runs out in the stall.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s15_2d_late_claim_with_replica_acknowledgement_after_wait_ran_out() {
    let fx = Fixture::redis().await;
    let primary = fx.server().expect("a Redis fixture").port();
    let _replica = distlock_tests::RedisServer::replica_of(primary).await;
    late_claim_acknowledged(fx, "s15-2d", true, 1).await;
}

async fn late_claim(fx: Fixture, key: &'static str, wait_runs_out: bool) {
    late_claim_acknowledged(fx, key, wait_runs_out, 0).await;
}

async fn late_claim_acknowledged(fx: Fixture, key: &'static str, wait_runs_out: bool, replicas: u32) {
    let _serial = serial().await;
    let monitor = fx.server().map(Monitor::start);
    let ttl = secs(5);
    let stall = ms(1030);
    let w_runtime = StallableRuntime::start("W");
    let w_client = client_acknowledged_on(&fx, &w_runtime, replicas).await;
    let c_client = fx.other_client().await;
    let h = fx.client().lock(key).ttl(secs(10)).acquire().await.expect("H");
    // Refreshes every 5-10 ms: a hand-over lease of 3 refreshes + 100 ms, raised to the floor of 1 s, which the
    // stall outlasts.
    let retry = RetryStrategy::Linear { step: ms(10) };
    let wait = if wait_runs_out { ms(240) } else { secs(3) };
    let started = Instant::now();
    let w = w_runtime.spawn(acquire(w_client.lock(key).ttl(ttl).wait(wait).retry(retry)));
    eventually(secs(5), "W queued behind H", || async { waiting(fx.client(), key).await == 1 }).await;
    if wait_runs_out {
        // The stall covers W's deadline (started + 240 ms).
        tokio::time::sleep_until(started + ms(150)).await;
    }
    // W refreshes its place every 5-10 ms.
    between_attempts(monitor.as_ref(), &fx.client().record_key(key), ms(2)).await;
    let stalled = Instant::now();
    let wakes = w_runtime.stall(stall).await;
    if wait_runs_out {
        assert!(started + wait > stalled && started + wait < wakes, "setup: W's wait did not run out in the stall");
    }
    tokio::time::sleep_until(stalled + ms(50)).await;
    assert_eq!(h.release().await.expect("H's release"), ReleaseOutcome::Released);
    assert!(Instant::now() + ms(20) < wakes, "setup: H released too late in W's stall");

    let outcome = within(secs(5), "W's acquire", w).await.expect("W's task");
    match &outcome.result {
        Ok(guard) => {
            // W claimed the hand-over: then its guard must be valid, and exclude C while it is.
            assert!(outcome.valid_on_return, "W's acquire returned a guard that was already lost");
            let c = c_client.lock(key).try_acquire().await.expect("C's try_acquire");
            assert!(
                c.is_none() || guard.is_lost(),
                "two valid guards on {key}: C took it while W's guard (fence {}) was valid",
                guard.fencing_token()
            );
        }
        Err(error) => {
            // W gave up: the hand-over it did not take must free the lock within its short lease.
            let info = fx.client().lock_info(key).await.expect("lock_info");
            let bound = ms(1500);
            let c = c_client.lock(key).ttl(secs(10)).wait(bound).acquire().await;
            let freed_after = outcome.returned.elapsed();
            match c {
                Ok(c) => {
                    assert!(freed_after <= bound + ms(250), "C obtained {key} only {freed_after:?} after W gave up");
                    assert_eq!(c.release().await.expect("C's release"), ReleaseOutcome::Released);
                }
                Err(e) => panic!(
                    "W's acquire failed ({error}), yet {key} stayed held: C could not obtain it within {bound:?} \
                     ({e}). Right after W gave up the record was {info:?} — W's abandoned claim keeps the lock \
                     for W's full ttl ({ttl:?}), not the hand-over lease W registered (1 s)"
                ),
            }
        }
    }
    drop(outcome);
    drop(w_runtime);
}

// ---------------------------------------------------------------------------------------------------------
// Schedule 3: a lease assumed after a dropped reply
// ---------------------------------------------------------------------------------------------------------

/// How many arguments MONITOR shows for a queued ACQUIRE: EVALSHA, sha, 1, record, token, ttl, holder, register,
/// hand-over lease, attempt, client, keep.
const QUEUED_ACQUIRE_ARGS: usize = 12;

/// Acquire calls by client command (not a script's inner calls) on `record`: the argument lists.
fn acquire_calls(lines: &[String], record: &str) -> Vec<Vec<String>> {
    script_calls(lines, record, 7)
}

async fn wait_monitor<T>(monitor: &Monitor, from: usize, what: &str, found: impl FnMut(&[String]) -> Option<T>) -> T {
    monitor.wait_until(from, what, found).await
}

/// Schedule 3, a lease assumed after a dropped reply (two valid guards): "A crashed holder's record is in
/// place. W (`ttl` 10 s) through a `FaultProxy` makes a first, unqueued attempt (Busy). Its second, queued
/// attempt [...] run[s] in Redis but [its] repl[y is] lost (`Fault::DropReplies`, then back to `Pass`). The
/// record lapses; W's next attempt is handed the lock with the ~150 ms lease it registered; the client,
/// whose `last_busy` still points at the unqueued attempt, assumes the full 10 s `ttl`. W stalls 400 ms
/// (right after acquire returns, before the first renewal can run); C acquires; W reports valid after C's
/// grant."
///
/// Since hand-over leases have a floor of 1 s (acquire.rs `HAND_OVER_LEASE_FLOOR`), W stalls 1,400 ms, not
/// 400 ms, and C tries for 1,350 ms after W's acquire returned: past the hand-over lease, as the schedule needs.
///
/// Sequencing: W's subscriber connection is delayed 100 ms each way, so when `MONITOR` shows W's
/// `SUBSCRIBE`, the reply to the first attempt has arrived and the second has not been sent: only then do
/// the command connection's replies start being dropped. Once the second attempt's reply is thrown away,
/// the crashed holder's record is deleted (its lease "lapses"; no announcement, as on expiry) and the
/// command connection is healed, which resets it: the resend (or the next attempt) is handed the lock.
///
/// A correct engine either dates W's lease from what the server granted (then W says lost by the time C
/// takes the key) or claims the hand-over for the full ttl (then C stays out, and the record must be W's).
///
/// Current engine: fails (W says valid after its stall while C holds the key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s15_3_lease_assumed_after_dropped_reply() {
    const KEY: &str = "s15-3";
    const COMMANDS: u64 = 0;
    const SUBSCRIBER: u64 = 1;
    let _serial = serial().await;
    let fx = Fixture::redis().await;
    let server = fx.server().expect("redis");
    let monitor = Monitor::start(server);
    let mut admin = fx.redis_connection().expect("redis");
    let record = fx.client().record_key(KEY);
    // The crashed holder: its record (token, fence 1, no waiter yet) with a lease longer than the test.
    let crashed = format!("{}:1:crashed holder", "deadbeef".repeat(4));
    let _: () =
        redis::cmd("SET").arg(&record).arg(crashed).arg("PX").arg(30_000).query_async(&mut admin).await.unwrap();

    let proxy = FaultProxy::to_port(server.port()).await;
    let w_runtime = StallableRuntime::start("W");
    let url = proxy.url();
    let w_client = w_runtime
        .spawn(async move { Client::builder().redis(url).response_timeout(secs(1)).build().await.expect("W's client") })
        .await
        .expect("W's runtime");
    assert_eq!(proxy.stats().accepted, 2, "setup: W's client has a command connection, then a subscriber");
    assert!(proxy.set_connection_fault(SUBSCRIBER, Fault::Delay(ms(100))));
    let c_client = fx.other_client().await;

    let from = monitor.len();
    let (returned_tx, returned_rx) = tokio::sync::oneshot::channel();
    let w = w_runtime.spawn(async move {
        let outcome = acquire(w_client.lock(KEY).ttl(secs(10)).wait(secs(5))).await;
        let _ = returned_tx.send((outcome.returned, outcome.valid_on_return, outcome.fence()));
        // W stalls before its first renewal can run, past its hand-over lease (the floor of 1 s).
        std::thread::sleep(ms(1400));
        let valid_after_stall = outcome.result.as_ref().is_ok_and(|guard| !guard.is_lost());
        (outcome, valid_after_stall, Instant::now())
    });

    let token = wait_monitor(&monitor, from, "W's first, unqueued attempt", |lines| {
        acquire_calls(lines, &record).into_iter().find(|a| a.len() == 7).map(|a| a[4].clone())
    })
    .await;
    let channel = format!("{record}:released");
    wait_monitor(&monitor, from, "W's SUBSCRIBE", |lines| {
        lines
            .iter()
            .map(|l| monitor_args(l))
            .find(|a| a.len() == 2 && a[0].eq_ignore_ascii_case("subscribe") && a[1] == channel)
    })
    .await;
    // The first attempt's reply is in (W subscribed after it); the second attempt is not sent yet.
    assert!(proxy.set_connection_fault(COMMANDS, Fault::DropReplies), "setup: W's command connection closed");
    wait_monitor(&monitor, from, "W's second, queued attempt", |lines| {
        acquire_calls(lines, &record).into_iter().find(|a| a.len() == QUEUED_ACQUIRE_ARGS && a[4] == token)
    })
    .await;
    eventually(secs(5), "the reply to W's second attempt is dropped", || async {
        proxy.stats().dropped_reply_bytes > 0
    })
    .await;
    // The crashed holder's lease lapses, with W registered in the queue (a hand-over lease of 1 s, the floor).
    let deleted: i64 = redis::cmd("DEL").arg(&record).query_async(&mut admin).await.unwrap();
    assert_eq!(deleted, 1, "setup: the crashed holder's record was gone already");
    assert!(proxy.set_connection_fault(COMMANDS, Fault::Pass));

    let (returned, valid_on_return, w_fence) = within(secs(5), "W's acquire", returned_rx).await.expect("W reported");
    // W is stalled now. On the server its grant has the 1 s hand-over lease (a correct engine may instead
    // have claimed it for the full ttl: then C stays out, and the record must be W's).
    let c = take_within(&c_client, KEY, returned + ms(1350)).await;
    let c_granted = Instant::now();
    let (outcome, valid_after_stall, checked) = within(secs(5), "W's stall", w).await.expect("W's task");
    let stalled_for = checked.saturating_duration_since(returned);
    match c {
        Some(c) => {
            assert!(c_granted < checked, "setup: C was granted after W's check");
            let c_valid = !c.is_lost();
            assert!(
                !(valid_after_stall && c_valid),
                "two valid guards on {KEY}: W (fence {w_fence:?}, valid on return: {valid_on_return}) still says \
                 valid {stalled_for:?} after its acquire returned, while C (fence {}) was granted {:?} after it and \
                 is valid; W's lease on the server was the short hand-over lease, the client assumed its full 10 s \
                 ttl",
                c.fencing_token(),
                c_granted.saturating_duration_since(returned),
            );
        }
        None => {
            let info = fx.client().lock_info(KEY).await.expect("lock_info");
            assert!(
                !valid_after_stall || info.as_ref().map(|i| i.fencing_token) == w_fence,
                "W (fence {w_fence:?}) says valid {stalled_for:?} after its acquire returned, but the server's record \
                 is {info:?}"
            );
        }
    }
    drop(outcome);
    drop(w_runtime);
}

// ---------------------------------------------------------------------------------------------------------
// Schedule 4: extend() to a shorter lease that fails after Redis applied it
// ---------------------------------------------------------------------------------------------------------

/// Schedule 4, `extend()` to a shorter lease that fails after Redis applied it (two valid guards): "H holds
/// with `ttl` 10 s and calls `extend(150 ms)`; the call times out (SIGSTOP redis-server past the client's
/// response timeout, response_timeout 200 ms and pause 400 ms) but Redis did set 150 ms. The local lease
/// stays at 10 s; C acquires ~300 ms later; H still says valid."
///
/// Current engine: fails (H says valid while C holds the key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s15_4_extend_to_shorter_lease_fails_after_redis_applied_it() {
    const KEY: &str = "s15-4";
    let _serial = serial().await;
    let fx = Fixture::redis().await;
    let server = fx.server().expect("redis");
    let record = fx.client().record_key(KEY);
    let mut admin = fx.redis_connection().expect("redis");
    let h_client = Client::builder().redis(server.url()).response_timeout(ms(200)).build().await.expect("H's client");
    let c_client = fx.other_client().await;
    let h = h_client.lock(KEY).ttl(secs(10)).acquire().await.expect("H");

    let stopped = Stopped::stop(server.pid().expect("redis-server pid"));
    let paused = Instant::now();
    let extended = h.extend(ms(150)).await;
    assert!(extended.is_err(), "setup: extend answered while redis-server was stopped: {extended:?}");
    tokio::time::sleep_until(paused + ms(400)).await;
    stopped.resume();
    // Redis runs the RENEW it was sent while stopped: the lease is 150 ms now.
    let pttl: i64 = redis::cmd("PTTL").arg(&record).query_async(&mut admin).await.unwrap();
    assert!(pttl <= 150, "setup: Redis did not apply the extend (PTTL {pttl} ms)");

    let c = c_client.lock(KEY).ttl(secs(10)).wait(secs(2)).acquire().await;
    let c = c.unwrap_or_else(|e| panic!("setup: C could not take {KEY} after the 150 ms lease lapsed: {e}"));
    assert!(
        h.is_lost(),
        "two valid guards on {KEY}: H's extend(150 ms) failed ({}), but Redis applied it; the lease lapsed \
         and C holds fence {} since, while H (fence {}) still says valid on its old 10 s lease",
        extended.unwrap_err(),
        c.fencing_token(),
        h.fencing_token(),
    );
}

/// Blocks the calling thread (and with it a current-thread runtime: watchdog, timers, everything) until
/// `until`.
fn starve_until(until: Instant) {
    std::thread::sleep(until.saturating_duration_since(Instant::now()));
}

/// Schedule 4b: "`extend()` whose reply comes back after the old lease ran out by the clock must not make
/// the guard valid again (a guard once `is_lost()` stays lost)."
///
/// H's watchdog runs on the test's own current-thread runtime, which is blocked from the acquire on (as in
/// a long blocking call), so no renewal runs; H's connections and the `extend` run on another runtime,
/// through a proxy that delays every byte 50 ms each way. The extend is sent 30 ms before the lease runs
/// out by the clock, Redis applies it (the record outlives the client's estimate by the delay plus the
/// drift allowance), and its reply arrives ~70 ms after the guard said lost.
///
/// Current engine: fails (the late reply revives the lost guard).
#[tokio::test(flavor = "current_thread")]
async fn s15_4b_late_extend_reply_does_not_revive_a_lost_guard() {
    const KEY: &str = "s15-4b";
    let ttl = secs(1);
    let _serial = serial().await;
    let fx = Fixture::redis().await;
    let port = fx.server().expect("redis").port();
    let b = StallableRuntime::start("H-connections");
    let (proxy, h_client) = b
        .spawn(async move {
            let proxy = FaultProxy::to_port(port).await;
            let client = Client::builder().redis(proxy.url()).build().await.expect("H's client");
            (proxy, client)
        })
        .await
        .expect("runtime B");
    proxy.set_fault(Fault::Delay(ms(50)));
    let before = Instant::now();
    let h = Arc::new(h_client.lock(KEY).ttl(ttl).acquire().await.expect("H"));
    // From here on this runtime is blocked: H's watchdog cannot run. The guard is valid until
    // sent + ttl - drift, with `sent` just after `before`.
    let deadline = before + ttl - drift(ttl);
    starve_until(deadline - ms(30));
    assert!(!h.is_lost(), "setup: H lost before its deadline");

    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let guard = Arc::clone(&h);
    b.spawn(async move {
        let extended = guard.extend(secs(5)).await;
        let _ = done_tx.send((extended, Instant::now()));
    });
    let seen_lost = loop {
        if h.is_lost() {
            break Instant::now();
        }
        if let Ok((extended, _)) = done_rx.try_recv() {
            panic!("setup: the extend came back before the deadline: {extended:?}");
        }
        assert!(before.elapsed() < ttl * 2, "setup: H never said lost");
        std::thread::sleep(ms(1));
    };
    let (extended, replied) = done_rx.recv_timeout(secs(5)).expect("the extend returns");
    assert!(replied >= seen_lost, "setup: the extend's reply came before the guard said lost");
    assert!(
        h.is_lost(),
        "H said lost at {:?} after acquiring (its lease ran out by the clock, the extend in flight); the \
         extend's reply came {:?} later ({extended:?}) and H says valid again: a lost guard came back",
        seen_lost.saturating_duration_since(before),
        replied.saturating_duration_since(seen_lost),
    );
    drop(proxy);
}

// ---------------------------------------------------------------------------------------------------------
// Schedule 5: a guard escaped from run()
// ---------------------------------------------------------------------------------------------------------

/// Schedule 5, a guard escaped from `run()` (two valid guards): "A body returns the
/// `distlock::current_lock()` guard (owned, `'static`); `run` releases and C acquires; the escaped guard
/// still says valid, and its `extend()` sends the released token to Redis again." Asserted: after `run`
/// returns, the escaped guard `is_lost()`, and `extend()` returns `Err(LockError::Lost)` without sending
/// (on Redis, `MONITOR` shows no command with its token); C keeps its lock.
///
/// Current engine: fails on both backends (the escaped guard says valid; on Redis its extend sends RENEW
/// with the released token).
async fn s15_5_guard_escaped_from_run(fx: Fixture) {
    const KEY: &str = "s15-5";
    let _serial = serial().await;
    let monitor = fx.server().map(Monitor::start);
    let escaped = fx
        .client()
        .lock(KEY)
        .ttl(secs(10))
        .run(async { distlock::current_lock().expect("inside the lock body") })
        .await
        .expect("run");
    let token = escaped.token().expose_secret().to_owned();
    let c = fx.other_client().await.lock(KEY).ttl(secs(10)).acquire().await.expect("C takes the released key");
    let mut admin = fx.redis_connection();
    let start = match (&monitor, admin.as_mut()) {
        (Some(monitor), Some(conn)) => monitor.mark(conn, "c-granted").await,
        _ => 0,
    };

    let lost_after_run = escaped.is_lost();
    let extended = escaped.extend(secs(10)).await;
    let sent = match (&monitor, admin.as_mut()) {
        (Some(monitor), Some(conn)) => {
            let end = monitor.mark(conn, "extended").await;
            monitor.lines()[start..end].iter().filter(|l| l.contains(&token)).cloned().collect()
        }
        _ => Vec::new(),
    };
    let info = fx.client().lock_info(KEY).await.expect("lock_info");
    let c_intact = !c.is_lost() && info.as_ref().map(|i| i.fencing_token) == Some(c.fencing_token());
    assert!(
        lost_after_run && matches!(extended, Err(LockError::Lost { .. })) && sent.is_empty() && c_intact,
        "a guard escaped from run() on {KEY}: after run released it and C took the key (fence {}), the escaped \
         guard (fence {}) said is_lost() == {lost_after_run}; its extend() returned {extended:?}; commands with \
         its token after C's grant: {sent:#?}; C intact: {c_intact} ({info:?})",
        c.fencing_token(),
        escaped.fencing_token(),
    );
}
