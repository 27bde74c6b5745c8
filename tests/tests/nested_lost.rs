//! Issue 31, schedule 1: a body runs without its lock. H runs a body with `OnLost::Continue` whose lease runs
//! out (`max_hold` stops the renewals) and C takes the lock; inside H's body, a nested (reentrant) request for
//! the same key must check the outer grant like a fresh request: lost → no body, [`LockError::Lost`] — for
//! `run`, `try_run`, `acquire`, `try_acquire`, the attribute, every `OnLost` and multi-key requests that nest
//! fully or partly. A nested body under the default `OnLost::Abort` is watched like a fresh one: dropped when
//! the outer grant is lost while it runs, `Lost` when it ends past the deadline. A partly nested request whose
//! held key is lost while it waits for another key gives back what it took.
//!
//! Each loss is reported once (one WARN from the grant, however many requests find it) and every lock span of
//! the nested requests comes to `lost`. Events sequence the steps (the guard's `lost()`, C's grant, flags set
//! by the bodies); the only waits for time are the leases running out, which are the point of each schedule.
//! Keys name their backend: both backends' tests run at once and share the captured log.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock::{Client, LockError, LockGuard, LockRequest, OnLost, RetryStrategy};
use distlock_tests::logs::{self, LogLine, Logs, SpanLine};
use distlock_tests::monitor::Monitor;
use distlock_tests::time::{ms, secs};
use distlock_tests::{eventually, within, Fixture};
use tokio::time::Instant;

distlock_tests::both_backends!(
    s31_1_nested_request_on_a_lost_outer_grant_fails_closed,
    s31_1_nested_multi_key_request_on_a_lost_outer_grant_fails_closed,
    s31_1_nested_body_is_dropped_when_the_outer_grant_is_lost,
    s31_1_nested_body_that_ends_past_the_deadline_is_lost,
    s31_1_nested_continue_body_started_in_time_runs_to_its_end,
    s31_1_held_key_lost_while_a_partly_nested_request_waits_gives_back_the_others,
);

/// The outer body's request: renewals stop at once (`max_hold` 1 ms), so its lease runs out after `lease`, and
/// `OnLost::Continue` lets the outer body go on past the loss to try its nested requests.
fn running_out(request: LockRequest, lease: Duration) -> LockRequest {
    request.ttl(lease).max_hold(ms(1)).on_lost(OnLost::Continue)
}
/// Far above anything these tests need: a hang fails the test instead of stalling the suite.
const BOUND: Duration = Duration::from_secs(10);

/// H's lease: short, so that it runs out quickly once `max_hold` has stopped its renewals.
const LEASE: Duration = Duration::from_millis(300);

/// H's lease where a nested body must start before it runs out: long enough for a loaded machine.
const LEASE_TO_START_IN: Duration = Duration::from_secs(1);

/// Sets its flag when dropped: tells whether a lock body was dropped (cancelled) or ran to the end.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A lock body of the attribute on the key of the first schedule (`s31-1-<backend>`): sets `ran` if it runs.
#[distlock::distributed_lock(key = "s31-1-<backend>")]
async fn annotated_on_key(backend: &str, ran: Arc<AtomicBool>) -> Result<(), LockError> {
    ran.store(true, Ordering::SeqCst);
    Ok(())
}

/// A lock body of the attribute on both of H's keys in the multi-key schedule: sets `ran` if it runs.
#[distlock::distributed_lock(keys = ["s31-1m-<backend>:a", "s31-1m-<backend>:b"])]
async fn annotated_on_both_keys(backend: &str, ran: Arc<AtomicBool>) -> Result<(), LockError> {
    ran.store(true, Ordering::SeqCst);
    Ok(())
}

/// The backend's name, which the keys of a test carry.
fn backend(fx: &Fixture) -> String {
    format!("{:?}", fx.backend())
}

/// Inside H's body: waits until H's lock is known lost (its lease ran out), then has C take `keys` from a task
/// of its own (not an owner: on the in-process store C's client is H's) and returns C's guard.
async fn lost_then_taken_by_c(fx: &Fixture, keys: &[&str]) -> LockGuard {
    let lock = distlock::current_lock().expect("inside H's body");
    within(BOUND, "H's lease runs out once max_hold stopped its renewals", lock.lost()).await;
    assert!(lock.is_lost());
    let c_client = fx.other_client().await;
    let keys: Vec<String> = keys.iter().map(|&k| k.to_owned()).collect();
    let c = tokio::spawn(async move {
        c_client.lock_all(keys).ttl(secs(10)).wait(BOUND).retry(RetryStrategy::Linear { step: ms(20) }).acquire().await
    });
    let c = within(BOUND, "C takes the keys H lost", c).await.expect("C's task").expect("C's acquire");
    assert!(!c.is_lost());
    c
}

/// Asserts that `result` is `LockError::Lost` naming `key`.
fn assert_lost<T: std::fmt::Debug>(what: &str, key: &str, result: Result<T, LockError>) {
    assert!(
        matches!(&result, Err(LockError::Lost { key: lost, .. }) if lost == key),
        "{what}, nested in a body whose grant of {key:?} is lost: expected Err(Lost {{ key: {key:?} }}), got {result:?}"
    );
}

/// On Redis, what the server ran from a marker on: shows that a request sent nothing.
struct Sent {
    monitor: Monitor,
    admin: redis::aio::MultiplexedConnection,
    from: usize,
}

impl Sent {
    /// From now on; `None` on the in-process store, which has no server to watch.
    async fn from_now(fx: &Fixture) -> Option<Self> {
        let (server, mut admin) = (fx.server()?, fx.redis_connection()?);
        let monitor = Monitor::start(server);
        let from = monitor.mark(&mut admin, "from").await;
        Some(Self { monitor, admin, from })
    }

    /// The commands run since the marker on the records of `keys`, but those carrying `except` (C's token:
    /// its own renewals).
    async fn on(&mut self, client: &Client, keys: &[&str], except: Option<&str>) -> Vec<String> {
        let to = self.monitor.mark(&mut self.admin, "to").await;
        let records: Vec<String> = keys.iter().map(|k| format!("\"{}\"", client.record_key(k))).collect();
        self.monitor.lines()[self.from..to]
            .iter()
            .filter(|l| records.iter().any(|r| l.contains(r.as_str())) && !except.is_some_and(|t| l.contains(t)))
            .cloned()
            .collect()
    }
}

/// The lock spans naming `key` (alone, or among the keys of a multi-key request), but C's acquisition.
fn spans_of_h(logs: &Logs, key: &str, c: Option<&LockGuard>) -> Vec<SpanLine> {
    let c_fence = c.map(|c| c.fencing_token().to_string());
    logs.spans()
        .into_iter()
        .filter(|s| s.name == "lock" && s.field("key").is_some_and(|keys| keys.split(", ").any(|k| k == key)))
        .filter(|s| c_fence.is_none() || s.field("fencing_token") != c_fence.as_deref())
        .collect()
}

/// The WARNs reporting the loss of a grant of `key`.
fn loss_warnings(logs: &Logs, key: &str) -> Vec<LogLine> {
    let of_key = |l: &LogLine| l.fields.get("key").map(String::as_str) == Some(key);
    logs.lines().into_iter().filter(|l| of_key(l) && l.text.starts_with("distlock: lock lost")).collect()
}

/// Asserts that the loss of H's grant of `key` was reported once, however many requests found it, and that each
/// of H's `spans` lock spans naming `key` came to `lost`.
async fn assert_reported_once(logs: &Logs, key: &str, c: Option<&LockGuard>, spans: usize) {
    // Whoever marks the grant lost first has it report the loss just after marking: when that was the renewer's
    // timer, the body may have seen the loss (and ended) before the warning was out.
    eventually(BOUND, "the loss is reported", || async { !loss_warnings(logs, key).is_empty() }).await;
    let warnings = loss_warnings(logs, key);
    assert_eq!(warnings.len(), 1, "the loss of {key} was not reported once: {warnings:#?}");
    let h_spans = spans_of_h(logs, key, c);
    let outcomes: Vec<Option<&str>> = h_spans.iter().map(|s| s.field("outcome")).collect();
    assert_eq!(outcomes, vec![Some("lost"); spans], "the lock spans naming {key}: {h_spans:#?}");
}

/// Whether `guard` still holds `key` on the store, as its record says.
async fn still_holds(client: &Client, guard: &LockGuard, key: &str) -> bool {
    let info = client.lock_info(key).await.expect("lock_info");
    !guard.is_lost() && info.map(|i| i.fencing_token) == guard.fencing_token_of(key)
}

/// The schedule of issue 31: H runs `lock(k).ttl(300ms).max_hold(1ms).on_lost(Continue)`; inside its body,
/// once its lock is lost and C holds `k`, every nested form of a request for `k` fails with `Lost` and runs
/// no body; a multi-key request that nests `k` leaves its other keys free; nothing is sent to the store.
async fn s31_1_nested_request_on_a_lost_outer_grant_fails_closed(fx: Fixture) {
    let logs = logs::capture();
    let client = fx.client().clone();
    let backend = backend(&fx);
    let key = format!("s31-1-{backend}");
    // Free keys sorting before and after `key`.
    let (before, after) = (format!("s31-0-{backend}"), format!("s31-1-{backend}:z"));
    let (key, before, after) = (key.as_str(), before.as_str(), after.as_str());
    let outcome = running_out(client.lock(key), LEASE)
        .run(async {
            let c = lost_then_taken_by_c(&fx, &[key]).await;
            let mut sent = Sent::from_now(&fx).await;

            let ran = Arc::new(AtomicBool::new(false));
            let body = || {
                let ran = Arc::clone(&ran);
                async move { ran.store(true, Ordering::SeqCst) }
            };
            assert_lost("lock(k).run (OnLost::Abort)", key, client.lock(key).run(body()).await);
            assert!(!ran.load(Ordering::SeqCst), "a nested run's body ran on a lost grant");
            let try_run = client
                .lock(key)
                .try_run(async {
                    body().await;
                    Ok::<_, LockError>(())
                })
                .await;
            assert_lost("lock(k).try_run", key, try_run);
            assert!(!ran.load(Ordering::SeqCst), "a nested try_run's body ran on a lost grant");
            let continued = client.lock(key).on_lost(OnLost::Continue).run(body()).await;
            assert_lost("lock(k).on_lost(Continue).run", key, continued);
            assert!(!ran.load(Ordering::SeqCst), "a nested OnLost::Continue body ran on a lost grant");
            assert_lost("lock(k).acquire", key, client.lock(key).acquire().await);
            assert_lost("lock(k).try_acquire", key, client.lock(key).try_acquire().await);
            for other in [before, after] {
                assert_lost("lock_all([k, other]).acquire", key, client.lock_all([key, other]).acquire().await);
                let run = client.lock_all([other, key]).run(body()).await;
                assert_lost("lock_all([other, k]).run", key, run);
                assert!(!ran.load(Ordering::SeqCst), "a partly nested run's body ran on a lost grant");
            }
            let annotated = annotated_on_key(&backend, Arc::clone(&ran));
            let annotated = distlock::with_client(client.clone(), annotated).await;
            assert_lost("#[distributed_lock(key = k)] fn", key, annotated);
            assert!(!ran.load(Ordering::SeqCst), "an annotated function's body ran on a lost grant");

            // Nothing was sent for the nested key (C's own renewals aside), nor for the others: none was taken.
            if let Some(sent) = sent.as_mut() {
                let sent = sent.on(&client, &[key, before, after], Some(c.token().expose_secret())).await;
                assert!(sent.is_empty(), "nested requests on a lost grant reached the store: {sent:#?}");
            }
            for other in [before, after] {
                assert!(client.lock_info(other).await.expect("lock_info").is_none(), "{other} was left held");
            }
            assert!(still_holds(&client, &c, key).await, "C's lock was disturbed");
            c
        })
        .await;
    let c = outcome.expect("H's body ran to its end (OnLost::Continue)");
    assert!(still_holds(&client, &c, key).await, "H's end disturbed C's lock");
    // H's run, its 6 nested single-key requests and the 4 multi-key ones.
    assert_reported_once(logs, key, Some(&c), 11).await;
}

/// As the schedule above, for an outer body holding two keys (`lock_all`): fully nested requests (both keys,
/// one key, the attribute's `keys`) and partly nested ones (a held key and a free one) fail with `Lost`, run
/// no body and leave the free keys free.
async fn s31_1_nested_multi_key_request_on_a_lost_outer_grant_fails_closed(fx: Fixture) {
    let logs = logs::capture();
    let client = fx.client().clone();
    let backend = backend(&fx);
    // H's keys, and free keys sorting before and after them.
    let [held_a, held_b, free_first, free_last] = ["a", "b", "0", "z"].map(|k| format!("s31-1m-{backend}:{k}"));
    let (held_a, held_b, free_first, free_last) = (&*held_a, &*held_b, &*free_first, &*free_last);
    let outcome = running_out(client.lock_all([held_a, held_b]), LEASE)
        .run(async {
            let c = lost_then_taken_by_c(&fx, &[held_a, held_b]).await;
            let mut sent = Sent::from_now(&fx).await;
            let ran = Arc::new(AtomicBool::new(false));
            let body = || {
                let ran = Arc::clone(&ran);
                async move { ran.store(true, Ordering::SeqCst) }
            };
            assert_lost("lock_all([a, b]).run", held_a, client.lock_all([held_b, held_a]).run(body()).await);
            let continued = client.lock_all([held_a, held_b]).on_lost(OnLost::Continue).run(body()).await;
            assert_lost("lock_all([a, b]).on_lost(Continue).run", held_a, continued);
            assert_lost("lock_all([a, b]).try_acquire", held_a, client.lock_all([held_a, held_b]).try_acquire().await);
            assert_lost("lock(b).acquire", held_b, client.lock(held_b).acquire().await);
            assert_lost("lock(b).run", held_b, client.lock(held_b).run(body()).await);
            let partly = client.lock_all([free_first, held_a]).run(body()).await;
            assert_lost("lock_all([0, a]).run", held_a, partly);
            let partly = client.lock_all([held_b, free_last]).try_acquire().await;
            assert_lost("lock_all([b, z]).try_acquire", held_b, partly);
            let partly = client.lock_all([free_last, held_a, free_first]).acquire().await;
            assert_lost("lock_all([z, a, 0]).acquire", held_a, partly);
            let annotated = annotated_on_both_keys(&backend, Arc::clone(&ran));
            let annotated = distlock::with_client(client.clone(), annotated).await;
            assert_lost("#[distributed_lock(keys = [a, b])] fn", held_a, annotated);
            assert!(!ran.load(Ordering::SeqCst), "a nested body ran on a lost grant");
            // A partly nested request on a lost grant takes none of its other keys: nothing was sent for them.
            if let Some(sent) = sent.as_mut() {
                let sent = sent.on(&client, &[free_first, free_last], None).await;
                assert!(sent.is_empty(), "a partly nested request on a lost grant took its other keys: {sent:#?}");
            }
            for free in [free_first, free_last] {
                assert!(client.lock_info(free).await.expect("lock_info").is_none(), "{free} was left held");
            }
            for held in [held_a, held_b] {
                assert!(still_holds(&client, &c, held).await, "C's lock of {held} was disturbed");
            }
            c
        })
        .await;
    let c = outcome.expect("H's body ran to its end (OnLost::Continue)");
    for held in [held_a, held_b] {
        assert!(still_holds(&client, &c, held).await, "H's end disturbed C's lock of {held}");
    }
    // H's run and the nested requests naming each key: both keys' losses were reported once each.
    assert_reported_once(logs, held_a, Some(&c), 7).await;
    assert_reported_once(logs, held_b, Some(&c), 8).await;
}

/// H's lock is lost *while* a nested `run` body (default `OnLost::Abort`) runs: the nested body is dropped at
/// the loss and the nested `run` returns `Lost`; H's own body (`OnLost::Continue`) goes on.
async fn s31_1_nested_body_is_dropped_when_the_outer_grant_is_lost(fx: Fixture) {
    let logs = logs::capture();
    let key = format!("s31-1-during-{}", backend(&fx));
    let key = key.as_str();
    let client = fx.client().clone();
    let outcome = running_out(client.lock(key), LEASE_TO_START_IN)
        .run(async {
            let (entered, dropped) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
            let nested = client.lock(key).run({
                let (entered, dropped) = (Arc::clone(&entered), Arc::clone(&dropped));
                async move {
                    let _dropped = SetOnDrop(dropped);
                    let lock = distlock::current_lock().expect("inside the nested body");
                    entered.store(!lock.is_lost(), Ordering::SeqCst);
                    std::future::pending::<()>().await
                }
            });
            let nested = within(BOUND, "the nested body ends at the outer grant's loss", nested).await;
            assert!(entered.load(Ordering::SeqCst), "the nested body did not start while the grant was valid");
            assert_lost("lock(k).run whose body outlived the grant", key, nested);
            assert!(dropped.load(Ordering::SeqCst), "the nested body was not dropped");
            assert!(distlock::current_lock().expect("H's body").is_lost());
            "H went on"
        })
        .await;
    assert_eq!(outcome.expect("H's body ran to its end (OnLost::Continue)"), "H went on");
    assert_reported_once(logs, key, None, 2).await;
}

/// A nested body (default `OnLost::Abort`) that keeps its thread until past the outer grant's deadline (blocking
/// code: nothing can drop it meanwhile) ends without the lock: its `run` returns `Lost`, not its output.
async fn s31_1_nested_body_that_ends_past_the_deadline_is_lost(fx: Fixture) {
    let logs = logs::capture();
    let key = format!("s31-1-blocking-{}", backend(&fx));
    let key = key.as_str();
    let client = fx.client().clone();
    let outcome = running_out(client.lock(key), LEASE_TO_START_IN)
        .run(async {
            let ran = Arc::new(AtomicBool::new(false));
            let nested = client.lock(key).run({
                let ran = Arc::clone(&ran);
                async move {
                    let lock = distlock::current_lock().expect("inside the nested body");
                    assert!(!lock.is_lost(), "the nested body started on a lost grant");
                    // Blocking until the lease has run out is the point of this schedule.
                    while !lock.is_lost() {
                        std::thread::sleep(ms(5));
                    }
                    ran.store(true, Ordering::SeqCst);
                    "finished past the deadline"
                }
            });
            let nested = within(BOUND, "the nested body ends", nested).await;
            assert!(ran.load(Ordering::SeqCst), "the nested body did not run to its end");
            assert_lost("lock(k).run whose body ended past the deadline", key, nested);
        })
        .await;
    outcome.expect("H's body ran to its end (OnLost::Continue)");
    assert_reported_once(logs, key, None, 2).await;
}

/// A nested body under its own `OnLost::Continue` that started while the outer grant was valid runs to its end
/// across the loss and returns its output (the outer body's `OnLost::Continue` lets the outer body go on too).
async fn s31_1_nested_continue_body_started_in_time_runs_to_its_end(fx: Fixture) {
    let logs = logs::capture();
    let key = format!("s31-1-continue-{}", backend(&fx));
    let key = key.as_str();
    let client = fx.client().clone();
    let outcome = running_out(client.lock(key), LEASE_TO_START_IN)
        .run(async {
            let nested = client.lock(key).on_lost(OnLost::Continue).run(async {
                let lock = distlock::current_lock().expect("inside the nested body");
                assert!(!lock.is_lost(), "the nested body started on a lost grant");
                within(BOUND, "the outer grant's lease runs out", lock.lost()).await;
                "finished after the loss"
            });
            within(BOUND, "the nested body ends", nested).await
        })
        .await;
    let nested = outcome.expect("H's body ran to its end (OnLost::Continue)");
    assert_eq!(
        nested.expect("OnLost::Continue lets a nested body that started in time finish"),
        "finished after the loss"
    );
    assert_reported_once(logs, key, None, 2).await;
}

/// A partly nested request (`lock_all([j, k])` in a body holding `k`; `j` sorts first) waits for `j`, which D
/// holds, while H's grant of `k` runs out. D then releases `j`, which the request takes, then finds `k` lost: it
/// gives `j` back and fails with `Lost` naming `k`.
async fn s31_1_held_key_lost_while_a_partly_nested_request_waits_gives_back_the_others(fx: Fixture) {
    let logs = logs::capture();
    let client = fx.client().clone();
    let [busy, held] = ["j", "k"].map(|k| format!("s31-1-wait-{}:{k}", backend(&fx)));
    let (busy, held) = (busy.as_str(), held.as_str());
    let d_client = fx.other_client().await;
    let d = d_client.lock(busy).ttl(secs(10)).acquire().await.expect("D takes the busy key");
    let outcome = running_out(client.lock(held), LEASE_TO_START_IN)
        .run(async {
            let lock = distlock::current_lock().expect("inside H's body");
            assert!(!lock.is_lost(), "H's grant ran out before the request was made");
            let request = client.lock_all([busy, held]).wait(BOUND).retry(RetryStrategy::Linear { step: ms(20) });
            let requested = async {
                let partly = within(BOUND, "the request ends", request.acquire()).await;
                (partly, Instant::now())
            };
            let d_releases_once_h_lost = async {
                within(BOUND, "H's lease runs out once max_hold stopped its renewals", lock.lost()).await;
                let released = Instant::now();
                d.release().await.expect("D's release");
                released
            };
            let ((partly, ended), released) = tokio::join!(requested, d_releases_once_h_lost);
            assert!(ended >= released, "the request ended before D released the key it waited for: {partly:?}");
            assert_lost("lock_all([j, k]) that waited for j while H's k ran out", held, partly);
            let info = client.lock_info(busy).await.expect("lock_info");
            assert!(info.is_none(), "the busy key, taken after D released it, was left held: {info:?}");
        })
        .await;
    outcome.expect("H's body ran to its end (OnLost::Continue)");
    assert_reported_once(logs, held, None, 2).await;
}
