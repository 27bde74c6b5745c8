//! The behaviour suite: every scenario is written once, as an `async fn(Fixture)`, and run against both
//! backends — `with_redis::<scenario>` on a private `redis-server`, `with_memory::<scenario>` on the in-process
//! backend. Scenarios that only make sense across processes or against a server are in `processes.rs`.
//!
//! Timing: outcomes are awaited (with generous upper bounds), never slept for; the only sleeps are the
//! "work" done while holding a lock and the short setup pause that lets a waiter start waiting.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use distlock::{LockError, ReleaseOutcome, RetryStrategy};
use distlock_tests::time::{ms, secs};
use distlock_tests::{busy_for_outsiders, within, Fixture};
use tokio::task::JoinSet;

// Each named scenario runs once per backend.

// Redlock gives no fencing tokens and announces no releases (tests/tests/redlock.rs checks both refusals).
distlock_tests::all_backends_and_redlock!(
    mutual_exclusion_loses_no_update,
    vanished_holder_cannot_release_next_holders_lock,
    wait_bounds_waiting,
    watchdog_keeps_short_lease_through_long_work,
    dropped_guard_frees_lock_promptly,
    metadata_is_readable_by_others,
    try_acquire_returns_none_when_busy,
    extend_and_remaining_ttl,
    keys_with_braces_are_distinct_locks,
    min_hold_keeps_lock_after_body,
    busy_error_says_who_holds_the_lock;
    not_on_redlock: fencing_tokens_strictly_increase, waiters_are_woken_by_release,
);

// ---------------------------------------------------------------------------------------------------------
// Scenarios for both backends
// ---------------------------------------------------------------------------------------------------------

/// 4 clients x 8 tasks, 3 rounds each, do GET / pause / SET on a counter under one lock: no update is
/// lost, never two bodies run at once, and the fencing tokens seen inside the bodies strictly increase.
async fn mutual_exclusion_loses_no_update(fx: Fixture) {
    const CLIENTS: usize = 4;
    const TASKS: usize = 8;
    const ROUNDS: usize = 3;
    const KEY: &str = "rmw-counter";

    let counter = fx.counter("rmw");
    let inside = Arc::new(AtomicUsize::new(0));
    let max_inside = Arc::new(AtomicUsize::new(0));
    let fences = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = JoinSet::new();
    for _ in 0..CLIENTS {
        let client = fx.other_client().await;
        for _ in 0..TASKS {
            let (client, counter) = (client.clone(), counter.clone());
            let (inside, max_inside, fences) = (inside.clone(), max_inside.clone(), fences.clone());
            tasks.spawn(async move {
                for _ in 0..ROUNDS {
                    let body = async {
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        max_inside.fetch_max(now, Ordering::SeqCst);
                        let info = client.lock_info(KEY).await.expect("lock_info");
                        let fence = info.expect("held inside the body").fencing_token;
                        fences.lock().unwrap().push(fence);
                        counter.racy_increment(ms(2)).await;
                        inside.fetch_sub(1, Ordering::SeqCst);
                    };
                    client.lock(KEY).ttl(secs(10)).wait(secs(60)).run(body).await.expect("lock under contention");
                }
            });
        }
    }
    within(secs(60), "all 96 locked increments", async {
        while let Some(r) = tasks.join_next().await {
            r.expect("worker task");
        }
    })
    .await;

    let total = (CLIENTS * TASKS * ROUNDS) as i64;
    assert_eq!(counter.get().await, total, "lost updates: the lock let bodies overlap");
    assert_eq!(max_inside.load(Ordering::SeqCst), 1, "two lock bodies ran at once");
    let fences = fences.lock().unwrap().clone();
    assert_eq!(fences.len(), total as usize);
    assert!(
        !fx.gives_fencing_tokens() || fences.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens not strictly increasing in grant order: {fences:?}"
    );
}

/// A holder whose record vanished (lease ran out, or someone deleted it) must not be able to release the
/// lock that the next holder has since taken.
async fn vanished_holder_cannot_release_next_holders_lock(fx: Fixture) {
    const KEY: &str = "vanish";
    let first = fx.client().lock(KEY).ttl(secs(10)).acquire().await.expect("first holder");
    fx.vanish_record(KEY).await;

    let other = fx.other_client().await;
    let second = other
        .lock(KEY)
        .ttl(secs(10))
        .try_acquire()
        .await
        .expect("try_acquire")
        .expect("the lock is free once its record is gone");
    if fx.gives_fencing_tokens() {
        assert!(second.fencing_token() > first.fencing_token());
    }

    let outcome = first.release().await.expect("release by the stale holder");
    assert!(
        matches!(outcome, ReleaseOutcome::Expired | ReleaseOutcome::TakenByOther),
        "the stale holder's release said {outcome:?}"
    );

    let info = other.lock_info(KEY).await.expect("lock_info").expect("the second holder still holds the lock");
    assert_eq!(info.fencing_token, second.fencing_token());
    assert!(busy_for_outsiders(&other, KEY).await, "the stale release freed the lock");
    assert!(!second.is_lost());
    assert!(matches!(second.release().await.expect("release"), ReleaseOutcome::Released));
    assert!(other.lock_info(KEY).await.expect("lock_info").is_none());
}

/// `wait` bounds waiting: `NotObtained` after about the wait, not before and not much later; wait 0 (the
/// default) is a single attempt.
async fn wait_bounds_waiting(fx: Fixture) {
    const KEY: &str = "busy";
    let _held = fx.client().lock(KEY).ttl(secs(30)).acquire().await.expect("holder");
    let other = fx.other_client().await;

    let start = Instant::now();
    let err = within(secs(10), "a bounded wait", other.lock(KEY).wait(ms(600)).acquire())
        .await
        .expect_err("the lock is held for 30 s");
    let elapsed = start.elapsed();
    match &err {
        LockError::NotObtained { key, waited, .. } => {
            assert_eq!(key, KEY);
            assert!(*waited >= ms(550) && *waited < secs(3), "waited {waited:?}");
        }
        other => panic!("expected NotObtained, got {other:?}"),
    }
    assert!(elapsed >= ms(550), "gave up early, after {elapsed:?}");
    assert!(elapsed < secs(3), "waited far past the bound: {elapsed:?}");
    assert!(err.to_string().contains(KEY), "error text names the lock: {err}");

    let start = Instant::now();
    let err = other.lock(KEY).acquire().await.expect_err("held");
    assert!(matches!(err, LockError::NotObtained { .. }), "{err:?}");
    assert!(start.elapsed() < secs(1), "wait 0 waited {:?}", start.elapsed());
}

/// A 1 s lease survives 3.6 s of work: the watchdog renews it (both for `run` and for a held guard).
async fn watchdog_keeps_short_lease_through_long_work(fx: Fixture) {
    let client = fx.client().clone();
    let observer = fx.other_client().await;

    let run_case = async {
        let start = Instant::now();
        let out = client
            .lock("watchdog-run")
            .ttl(secs(1))
            .run(async {
                for step in 1..=3 {
                    tokio::time::sleep(ms(1200)).await;
                    assert!(
                        busy_for_outsiders(&observer, "watchdog-run").await,
                        "lease ran out during the body, at step {step}, {:?} in",
                        start.elapsed()
                    );
                }
                "done"
            })
            .await;
        assert_eq!(out.expect("run with a 1 s lease and 3.6 s of work"), "done");
        assert!(start.elapsed() >= ms(3600));
        assert!(observer.lock_info("watchdog-run").await.unwrap().is_none(), "run released at the end");
    };

    let guard_case = async {
        let guard = client.lock("watchdog-guard").ttl(secs(1)).acquire().await.expect("acquire");
        tokio::time::sleep(ms(3500)).await;
        assert!(!guard.is_lost(), "the watchdog let a live guard's lease run out");
        let left = guard.remaining_ttl().await.expect("remaining_ttl").expect("still ours");
        assert!(left <= secs(1), "lease {left:?} longer than the ttl");
        assert!(busy_for_outsiders(&observer, "watchdog-guard").await);
        assert!(matches!(guard.release().await.expect("release"), ReleaseOutcome::Released));
    };

    tokio::join!(run_case, guard_case);
}

/// Fencing tokens strictly increase across successive holders, whichever client they use and whether the
/// lock is taken by `acquire` or by `run`; `lock_info` reports the holder's token.
async fn fencing_tokens_strictly_increase(fx: Fixture) {
    const KEY: &str = "fenced";
    let clients = [fx.client().clone(), fx.other_client().await];
    let mut last = 0u64;
    for round in 0..6 {
        let client = &clients[round % 2];
        let guard = client.lock(KEY).acquire().await.expect("acquire");
        let token = guard.fencing_token();
        assert!(token > last, "round {round}: token {token} after {last}");
        let info = clients[(round + 1) % 2].lock_info(KEY).await.unwrap().expect("held");
        assert_eq!(info.fencing_token, token);
        last = token;
        assert!(matches!(guard.release().await.expect("release"), ReleaseOutcome::Released));

        let in_run = client
            .lock(KEY)
            .run(async { client.lock_info(KEY).await.unwrap().expect("held").fencing_token })
            .await
            .expect("run");
        assert!(in_run > last, "round {round}: run's token {in_run} after {last}");
        last = in_run;
    }
}

/// Dropping a guard never blocks, and frees the lock well before its 30 s lease ends.
async fn dropped_guard_frees_lock_promptly(fx: Fixture) {
    const KEY: &str = "dropped";
    let guard = fx.client().lock(KEY).ttl(secs(30)).acquire().await.expect("acquire");
    let other = fx.other_client().await;

    let start = Instant::now();
    drop(guard);
    assert!(start.elapsed() < ms(100), "drop blocked for {:?}", start.elapsed());

    let next =
        other.lock(KEY).ttl(secs(30)).wait(secs(15)).acquire().await.expect("a dropped guard's lock is free again");
    let elapsed = start.elapsed();
    assert!(elapsed < secs(2), "took {elapsed:?} to free a dropped guard's 30 s lock");
    drop(next);
}

/// A waiter with a 5 s linear backoff is woken by the holder's release: the hand-off takes well under the
/// backoff (three rounds, so a lucky jitter cannot hide a missing wake-up).
async fn waiters_are_woken_by_release(fx: Fixture) {
    const KEY: &str = "handoff";
    let other = fx.other_client().await;
    for round in 0..3 {
        let holder = fx.client().lock(KEY).ttl(secs(30)).acquire().await.expect("holder");
        let waiter = {
            let other = other.clone();
            tokio::spawn(async move {
                let guard = other
                    .lock(KEY)
                    .ttl(secs(30))
                    .wait(secs(20))
                    .retry(RetryStrategy::Linear { step: secs(5) })
                    .acquire()
                    .await;
                (guard, Instant::now())
            })
        };
        // Setup, not an outcome: let the waiter make its first attempt and start waiting.
        tokio::time::sleep(ms(300)).await;
        assert!(!waiter.is_finished(), "round {round}: the waiter did not wait for a held lock");

        let released_at = Instant::now();
        assert!(matches!(holder.release().await.expect("release"), ReleaseOutcome::Released));
        let (guard, acquired_at) = within(secs(25), "the waiter", waiter).await.expect("waiter task");
        let guard = guard.expect("the waiter gets the lock after the release");
        let handoff = acquired_at.duration_since(released_at);
        assert!(handoff < secs(1), "round {round}: hand-off took {handoff:?}; the release did not wake the waiter");
        guard.release().await.expect("release");
    }
}

/// Metadata is stored with the lock and readable by anyone through `lock_info`, byte for byte, even when
/// it looks like Lua or Redis syntax (it only travels as a script argument).
async fn metadata_is_readable_by_others(fx: Fixture) {
    const KEY: &str = "with-metadata";
    let meta = "billing-worker \"q\" ]] ') redis.call('set', 'pwned', '1') -- {tag} ünïcødé\n2nd line";
    let guard = fx.client().lock(KEY).ttl(secs(10)).metadata(meta).acquire().await.expect("acquire");
    let other = fx.other_client().await;
    let info = other.lock_info(KEY).await.expect("lock_info").expect("held");
    assert_eq!(info.metadata, meta);
    assert_eq!(info.fencing_token, guard.fencing_token());
    assert!(info.remaining_ttl <= secs(10) && info.remaining_ttl > secs(5), "remaining {:?}", info.remaining_ttl);
    assert!(other.lock_info("some-other-lock").await.expect("lock_info").is_none());

    if let Some(mut conn) = fx.raw_connection() {
        let pwned: i64 = redis::cmd("EXISTS").arg("pwned").query_async(&mut conn).await.unwrap();
        assert_eq!(pwned, 0, "metadata was executed as Lua");
    }
    guard.release().await.expect("release");
    assert!(other.lock_info(KEY).await.expect("lock_info").is_none());
}

/// `try_acquire` gives `Ok(None)` when the lock is busy, and the guard when it is free.
async fn try_acquire_returns_none_when_busy(fx: Fixture) {
    const KEY: &str = "try";
    let other = fx.other_client().await;
    let guard = fx.client().lock(KEY).try_acquire().await.expect("try_acquire").expect("free");
    let start = Instant::now();
    assert!(other.lock(KEY).try_acquire().await.expect("try_acquire").is_none());
    assert!(start.elapsed() < secs(1), "try_acquire waited {:?}", start.elapsed());
    guard.release().await.expect("release");
    let again = other.lock(KEY).try_acquire().await.expect("try_acquire").expect("free again");
    assert_eq!(again.key(), KEY);
}

/// `remaining_ttl` reports the lease, `extend` lengthens it, and others see the new lease.
async fn extend_and_remaining_ttl(fx: Fixture) {
    const KEY: &str = "extend";
    let guard = fx.client().lock(KEY).ttl(secs(2)).acquire().await.expect("acquire");
    let left = guard.remaining_ttl().await.unwrap().expect("ours");
    assert!(left <= secs(2) && left > ms(500), "remaining {left:?}");
    guard.extend(secs(20)).await.expect("extend");
    let left = guard.remaining_ttl().await.unwrap().expect("ours");
    assert!(left > secs(10) && left <= secs(20), "remaining after extend {left:?}");
    let info = fx.other_client().await.lock_info(KEY).await.unwrap().expect("held");
    assert!(info.remaining_ttl > secs(10), "others see {:?}", info.remaining_ttl);
    guard.release().await.expect("release");
}

/// Keys that contain braces (or what their escapes look like) are distinct locks with distinct records.
async fn keys_with_braces_are_distinct_locks(fx: Fixture) {
    let keys = ["a", "a}", "{a}", "a}:fence", "a%7D", "{", "}", "a:fence"];
    let client = fx.client();
    let mut guards = Vec::new();
    for key in keys {
        let guard = client
            .lock(key)
            .try_acquire()
            .await
            .expect("try_acquire")
            .unwrap_or_else(|| panic!("lock {key:?} collided with another key's lock"));
        guards.push(guard);
    }
    let records: Vec<String> = keys.iter().map(|k| client.record_key(k)).collect();
    for (key, record) in keys.iter().zip(&records) {
        assert_eq!(record.matches('{').count(), 1, "record {record} of {key:?}");
        assert_eq!(record.matches('}').count(), 1, "record {record} of {key:?}");
        assert!(record.ends_with('}'), "record {record} of {key:?}: the hash tag must end the name");
    }
    let mut unique = records.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), records.len(), "two keys share a record: {records:?}");
    for guard in &guards {
        let info = client.lock_info(guard.key()).await.unwrap().expect("held");
        assert_eq!(info.fencing_token, guard.fencing_token(), "lock {:?}", guard.key());
    }
    if let Some(mut conn) = fx.raw_connection() {
        for record in &records {
            let exists: i64 = redis::cmd("EXISTS").arg(record).query_async(&mut conn).await.unwrap();
            assert_eq!(exists, 1, "record_key {record} is not where the lock lives");
        }
    }
}

/// `min_hold` keeps the lock after a short body ends, until the minimum has passed.
async fn min_hold_keeps_lock_after_body(fx: Fixture) {
    const KEY: &str = "at-least";
    let other = fx.other_client().await;
    let start = Instant::now();
    fx.client().lock(KEY).ttl(secs(10)).min_hold(secs(1)).run(async {}).await.expect("run");
    assert!(other.lock_info(KEY).await.unwrap().is_some(), "released before min_hold");
    assert!(other.lock(KEY).try_acquire().await.unwrap().is_none());
    let _guard = other.lock(KEY).wait(secs(10)).acquire().await.expect("free after min_hold");
    let elapsed = start.elapsed();
    assert!(elapsed >= ms(900) && elapsed < secs(3), "held for {elapsed:?}, asked 1 s");
}

// ---------------------------------------------------------------------------------------------------------
// Redis only: other processes, an unreachable server
// ---------------------------------------------------------------------------------------------------------

/// A request that is not granted says so (`is_busy`, not transient) and who held the lock when its wait ended:
/// metadata, fencing token, lease left. `try_acquire`'s `None` costs no such lookup.
async fn busy_error_says_who_holds_the_lock(fx: Fixture) {
    let held = fx.client().lock("busy-holder").metadata("replica a, job 42").ttl(secs(30)).acquire().await.expect("H");
    let other = fx.other_client().await;
    let error = other.lock("busy-holder").wait(ms(50)).acquire().await.expect_err("held by H");
    assert!(error.is_busy() && !error.is_transient(), "{error:?}");
    let holder = error.holder().expect("who held it");
    assert_eq!(holder.metadata, "replica a, job 42");
    assert_eq!(holder.fencing_token, held.fencing_token());
    assert!(holder.remaining_ttl > secs(20) && holder.remaining_ttl <= secs(30), "{holder:?}");
    assert!(other.lock("busy-holder").try_acquire().await.expect("try").is_none());
    assert_eq!(held.release().await.expect("release"), ReleaseOutcome::Released);
    // A lock that is free again has no holder to report, and the next request gets it.
    let guard = other.lock("busy-holder").acquire().await.expect("free now");
    assert!(guard.release().await.is_ok());
}
