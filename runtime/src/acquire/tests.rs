//! Unit tests of taking locks, on the memory store.

use std::sync::Arc;
use std::time::Duration;

use crate::backend::{Backend, Capabilities, Fencing, MemoryBackend, WakeUps};
use crate::client::ClientInner;
use crate::{Client, LockError, ReleaseOutcome, RetryStrategy};

/// A store without a wait queue or announcements (as Redlock will be): waiters poll on their retry
/// strategy, never queue, and still get the lock once it is free, within their wait.
#[tokio::test(start_paused = true)]
async fn without_queue_or_wake_ups_waiters_poll() {
    let bare =
        Capabilities { fair_queue: false, wake_ups: WakeUps::None, fencing: Fencing::Monotonic, replica_acks: false };
    let store = MemoryBackend::with_capabilities(bare);
    let client = Client {
        inner: Arc::new(ClientInner {
            backend: Backend::Memory(store.clone()),
            prefix: "t:".into(),
            owner: "t".into(),
            renewer: Default::default(),
            shutdown: Default::default(),
            lines: Default::default(),
        }),
    };
    let holder = client.lock("k").ttl(Duration::from_secs(10)).acquire().await.unwrap();
    let waiter = client
        .lock("k")
        .wait(Duration::from_secs(5))
        .retry(RetryStrategy::Linear { step: Duration::from_millis(100) })
        .acquire();
    let waiter = crate::hooks::spawn(waiter);
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert!(!store.has_queue("t:{k}"), "a waiter queued on a store without a fair queue");
    holder.release().await.unwrap();
    let guard = waiter.await.unwrap().expect("the waiter gets the lock by polling");
    assert!(!guard.is_lost());
}

/// A request of no key is refused before any call; a key named twice is one lock.
#[tokio::test]
async fn lock_all_needs_a_key_and_merges_duplicates() {
    let client = Client::builder().memory().build().await.unwrap();
    let none = client.lock_all(Vec::<String>::new()).acquire().await;
    assert!(matches!(none, Err(LockError::InvalidConfig(ref m)) if m.contains("no key")), "{none:?}");
    let bad = client.lock_all(["ok", ""]).acquire().await;
    assert!(matches!(bad, Err(LockError::InvalidKey { .. })), "{bad:?}");
    assert!(client.lock_info("ok").await.unwrap().is_none(), "a bad key takes nothing");
    let guard = client.lock_all(["b", "a", "b"]).acquire().await.unwrap();
    assert_eq!(guard.keys().collect::<Vec<_>>(), ["a", "b"]);
    assert_ne!(guard.fencing_token_of("a"), None);
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
}

/// The keys are taken in sorted order within one wait: the busy key "b" is waited for while "a" is held,
/// and when the wait runs out "a" is given back before the error, which names "b" and the whole wait.
#[tokio::test(start_paused = true)]
async fn a_busy_later_key_gives_back_the_earlier_ones_after_one_wait() {
    let client = Client::builder().memory().build().await.unwrap();
    let holder = client.lock("b").ttl(Duration::from_secs(60)).acquire().await.unwrap();
    let started = tokio::time::Instant::now();
    let failed = client.lock_all(["b", "a"]).wait(Duration::from_secs(2)).acquire().await;
    match failed {
        Err(LockError::NotObtained { key, waited, .. }) => {
            assert_eq!(key, "b");
            assert!(waited >= Duration::from_secs(2) && started.elapsed() < Duration::from_secs(3), "{waited:?}");
        }
        other => panic!("expected NotObtained, got {other:?}"),
    }
    assert!(client.lock_info("a").await.unwrap().is_none(), "the first key was given back");
    assert_eq!(holder.release().await.unwrap(), ReleaseOutcome::Released);
}

/// Inside a body holding "a", a request for "a" and "c" uses the held "a" and takes "c"; its release gives
/// back "c" only.
#[tokio::test]
async fn a_partly_nested_request_takes_only_the_keys_not_held() {
    let client = Client::builder().memory().build().await.unwrap();
    let c = client.clone();
    client
        .lock("a")
        .run(async move {
            let outer = c.lock_info("a").await.unwrap().expect("held").fencing_token;
            let guard = c.lock_all(["c", "a"]).acquire().await.unwrap();
            assert_eq!(guard.fencing_token_of("a"), Some(outer), "the outer grant");
            assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
            assert!(c.lock_info("a").await.unwrap().is_some(), "still the outer body's");
            assert!(c.lock_info("c").await.unwrap().is_none(), "given back");
            let all = c.lock_all(["a", "a"]).acquire().await.unwrap();
            assert_eq!(all.release().await.unwrap(), ReleaseOutcome::Nested);
        })
        .await
        .unwrap();
    assert!(client.lock_info("a").await.unwrap().is_none());
}

/// Keys of one request taken at different times (a later key waited for) are renewed together from then on:
/// every key's renewal is planned at the earliest key's due time, so one batch renews them all.
#[tokio::test(start_paused = true)]
async fn a_multi_key_guard_s_renewals_come_due_together() {
    let client = Client::builder().memory().build().await.unwrap();
    let holder = client.lock("b").ttl(Duration::from_secs(60)).acquire().await.unwrap();
    let request = client.lock_all(["a", "b"]).ttl(Duration::from_secs(3)).wait(Duration::from_secs(5));
    let waiting = crate::hooks::spawn(request.acquire());
    tokio::time::sleep(Duration::from_millis(500)).await;
    holder.release().await.unwrap();
    let guard = waiting.await.unwrap().expect("both keys");
    let due: Vec<_> = guard.owned_grants().map(|grant| grant.queued().expect("a renewal planned").0).collect();
    assert_eq!(due.len(), 2);
    assert_eq!(due[0], due[1], "the keys' renewals come due apart: {due:?}");
    guard.release().await.unwrap();
}

/// A multi-key request whose earlier key is lost while a later one is awaited fails with `Lost`, hands out no
/// guard (a guard is never born lost) and gives back the later key.
#[tokio::test(start_paused = true)]
async fn a_key_lost_while_a_later_one_is_awaited_fails_the_request() {
    let client = Client::builder().memory().build().await.unwrap();
    let holder = client.lock("b").ttl(Duration::from_secs(60)).acquire().await.unwrap();
    let request = client.lock_all(["a", "b"]).ttl(Duration::from_millis(300)).wait(Duration::from_secs(5));
    let waiting = crate::hooks::spawn(request.acquire());
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(client.lock_info("a").await.unwrap().is_some(), "the request should hold `a` while it waits for `b`");
    assert!(client.force_unlock("a").await.unwrap());
    // `a`'s next renewal, a third of its lease in, finds it gone.
    tokio::time::sleep(Duration::from_millis(300)).await;
    holder.release().await.unwrap();
    let outcome = waiting.await.unwrap();
    assert!(matches!(outcome, Err(LockError::Lost { ref key, .. }) if key == "a"), "{outcome:?}");
    assert!(client.lock_info("b").await.unwrap().is_none(), "`b` is still held after the request failed");
}

/// A `wait` too long to add to the clock (`Duration::MAX`) means as long as it takes: the waiter is still
/// waiting three days later, and gets the lock once its holder lets go.
#[tokio::test(start_paused = true)]
async fn a_wait_past_the_clock_s_range_waits_until_the_lock_is_free() {
    let client = Client::builder().memory().build().await.expect("memory");
    let holder = client.lock("k").ttl(Duration::from_secs(7_200)).acquire().await.expect("free");
    let waiter = crate::hooks::spawn({
        let client = client.clone();
        // A long retry step: the test's clock runs three days, and each retry refreshes the waiter's place.
        let step = Duration::from_secs(3_600);
        async move {
            client.lock("k").ttl(step * 24).wait(Duration::MAX).retry(RetryStrategy::Linear { step }).acquire().await
        }
    });
    tokio::time::sleep(Duration::from_secs(3 * 86_400)).await;
    assert!(!waiter.is_finished(), "gave up: {:?}", waiter.await);
    holder.release().await.expect("release");
    let guard = waiter.await.expect("the waiter ran").expect("the waiter gets the lock");
    assert!(!guard.is_lost());
}

/// A client over `store`, so a test can look at the store itself.
fn client_on(store: MemoryBackend) -> Client {
    Client {
        inner: Arc::new(ClientInner {
            backend: Backend::Memory(store),
            prefix: "t:".into(),
            owner: "t".into(),
            renewer: Default::default(),
            shutdown: Default::default(),
            lines: Default::default(),
        }),
    }
}

/// A waiter refreshes its place on its retry strategy's schedule, never in a loop: with the default strategy
/// (25 ms, doubling up to 1 s) about 7 attempts in 600 ms of waiting. (The mutation report's acquire.rs
/// `now + refresh` -> `now - refresh`, and `refresh_interval` -> 0: an attempt as fast as the store answered.)
/// Real time: a paused clock never moves while a task loops without waiting.
#[tokio::test(flavor = "current_thread")]
async fn a_waiter_refreshes_its_place_on_its_retry_schedule_not_in_a_loop() {
    let store = MemoryBackend::new("t".into());
    let client = client_on(store.clone());
    let holder = client.lock("k").acquire().await.unwrap();
    let before = store.acquire_calls();
    let waiter = crate::hooks::spawn({
        let client = client.clone();
        async move { client.lock("k").wait(Duration::from_secs(5)).acquire().await }
    });
    tokio::time::sleep(Duration::from_millis(600)).await;
    let attempts = store.acquire_calls() - before;
    holder.release().await.unwrap();
    let guard = waiter.await.unwrap().expect("the waiter is handed the lock");
    assert!(attempts <= 12, "{attempts} attempts in 600 ms of waiting");
    guard.release().await.unwrap();
}

/// A waiter whose retry delay is long keeps its place between refreshes (its registration outlives three of
/// them), so the first in line is served first even beside a later waiter that refreshes every 10 ms. (The
/// mutation report's `queueing`, `* 3` -> `/ 3`: the slow waiter's place lapsed between its refreshes, and the
/// lock went to the fast one.)
#[tokio::test(start_paused = true)]
async fn a_waiter_with_a_long_retry_delay_keeps_its_place_in_line() {
    let client = Client::builder().memory().build().await.unwrap();
    let holder = client.lock("k").ttl(Duration::from_secs(30)).acquire().await.unwrap();
    let waiter = |step: u64| {
        let request = client.lock("k").wait(Duration::from_secs(10));
        let request = request.retry(RetryStrategy::Linear { step: Duration::from_millis(step) });
        crate::hooks::spawn(request.acquire())
    };
    let first = waiter(1_000);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let second = waiter(10);
    // Before the first waiter's next refresh, which comes at least half its 1 s step (the jitter's fixed half)
    // after its place was taken, at the start.
    tokio::time::sleep(Duration::from_millis(420)).await;
    holder.release().await.unwrap();
    let guard = first.await.unwrap().expect("the first in line is served first");
    assert!(!second.is_finished(), "the later waiter was served too: {:?}", second.await);
    guard.release().await.unwrap();
}

/// Of a client's waiters for one lock only the first refreshes its place (and the client's mark) on its retry
/// schedule; the others register once and then refresh every 15–30 s. Twenty waiters refreshing every 50–100 ms
/// over 10 s would make about 2,700 attempts; here the first makes about 130 and the other 19 one each. All of
/// them keep their places (the client's mark keeps them alive) and are served in the order they came.
#[tokio::test(start_paused = true)]
async fn a_client_s_waiters_behind_its_first_cost_the_store_nothing_while_they_wait() {
    let store = MemoryBackend::new("t".into());
    let client = client_on(store.clone());
    let holder = client.lock("k").ttl(Duration::from_secs(60)).acquire().await.unwrap();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..20 {
        let request = client.lock("k").ttl(Duration::from_secs(60)).wait(Duration::from_secs(60));
        let request = request.retry(RetryStrategy::Linear { step: Duration::from_millis(100) });
        let order = Arc::clone(&order);
        waiters.push(crate::hooks::spawn(async move {
            let guard = request.acquire().await.expect("served");
            order.lock().unwrap().push(i);
            guard.release().await.unwrap();
        }));
        // Queued before the next one comes: arrival order is part of what is tested.
        while client.inner.lines.len(&client.record_key("k")) < i + 1 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = store.acquire_calls();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let attempts = store.acquire_calls() - before;
    assert!((100..=220).contains(&attempts), "{attempts} attempts by 20 waiters in 10 s");
    holder.release().await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), (0..20).collect::<Vec<_>>(), "served out of arrival order");
}

/// The in-process store's side of a client's mark: two clients over one store; the first one's waiters are
/// never polled again once queued (as a frozen process's), so its mark for the lock runs out, and a release
/// hands the lock past all of them to the other client's waiter at once, though each dead place itself lasts
/// 90 s. (tests/queue.rs has the same on the server stores.)
#[tokio::test(start_paused = true)]
async fn a_dead_client_s_waiters_are_all_skipped_at_hand_over() {
    let store = MemoryBackend::new("t".into());
    let (holder_client, dead_client, live_client) =
        (client_on(store.clone()), client_on(store.clone()), client_on(store));
    let holder = holder_client.lock("k").ttl(Duration::from_secs(60)).acquire().await.unwrap();
    let retry = RetryStrategy::Linear { step: Duration::from_millis(100) };
    let mut dead = Vec::new();
    for i in 0..6 {
        let request = dead_client.lock("k").ttl(Duration::from_secs(60)).wait(Duration::from_secs(120)).retry(retry);
        let mut waiter = Box::pin(request.acquire());
        // Polled until it stands in the queue, then never again.
        assert!(tokio::time::timeout(Duration::from_millis(5), &mut waiter).await.is_err(), "the lock is held");
        assert_eq!(holder_client.lock_info("k").await.unwrap().expect("held").waiting, i + 1);
        dead.push(waiter);
    }
    let live = crate::hooks::spawn(async move {
        let guard = live_client.lock("k").ttl(Duration::from_secs(60)).wait(Duration::from_secs(60)).acquire().await;
        (tokio::time::Instant::now(), guard)
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    let info = holder_client.lock_info("k").await.unwrap().expect("held");
    assert_eq!(info.waiting, 7, "six dead places, then the live one");
    // The dead client's mark lasts 0.4 s at most after its last refresh.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(holder_client.lock_waiters("k").await.unwrap().len(), 1, "only the live place is listed");
    let released = tokio::time::Instant::now();
    holder.release().await.unwrap();
    let (served, guard) = live.await.unwrap();
    let guard = guard.expect("the live waiter is served");
    assert!(served - released < Duration::from_millis(50), "served {:?} after the release", served - released);
    guard.release().await.unwrap();
    drop(dead);
}

/// A waiter made first in its client's line whose last attempt is recent (well within the hand-over lease it
/// registered) sends nothing: a hand-over to it is dated from that attempt, so it trusts the announcement. Three
/// waiters served one after another by hand-overs cost no attempt at all once queued.
#[tokio::test(start_paused = true)]
async fn a_waiter_made_first_soon_after_its_last_attempt_sends_nothing() {
    let store = MemoryBackend::new("t".into());
    let client = client_on(store.clone());
    let holder = client.lock("k").ttl(Duration::from_secs(60)).acquire().await.unwrap();
    let mut waiters = Vec::new();
    for i in 0..3 {
        let request = client.lock("k").ttl(Duration::from_secs(60)).wait(Duration::from_secs(60));
        let request = request.retry(RetryStrategy::Linear { step: Duration::from_secs(1) });
        waiters.push(crate::hooks::spawn(async move {
            let guard = request.acquire().await.expect("served");
            // Held a while: the next waiter is made first now, and handed the lock only later.
            tokio::time::sleep(Duration::from_millis(100)).await;
            guard.release().await.unwrap();
        }));
        while client.inner.lines.len(&client.record_key("k")) < i + 1 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    let before = store.acquire_calls();
    holder.release().await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap();
    }
    assert_eq!(store.acquire_calls() - before, 0, "attempts after the release, for three announced hand-overs");
}

/// The other side of that rule: a waiter made first long after its last attempt (more than half the hand-over
/// lease it registered) refreshes its place at once, so that a hand-over to it soon after is dated from a recent
/// send. Without that, the hand-over would be dated from the old attempt, its lease nearly spent (or already,
/// and claimed with one more round trip). (The mutation report's acquire.rs `busy.lease / 2` -> `* 2`.)
#[tokio::test(start_paused = true)]
async fn a_waiter_made_first_long_after_its_last_attempt_refreshes_at_once() {
    let store = MemoryBackend::new("t".into());
    let client = client_on(store.clone());
    let holder = client.lock("k").ttl(Duration::from_secs(60)).acquire().await.unwrap();
    // Refreshes every 0.5–1 s once first, so each registers a hand-over lease of 1.6–3.1 s.
    let request = || {
        let request = client.lock("k").ttl(Duration::from_secs(60)).wait(Duration::from_secs(60));
        request.retry(RetryStrategy::Linear { step: Duration::from_secs(1) })
    };
    let (served, release) = (Arc::new(tokio::sync::Notify::new()), Arc::new(tokio::sync::Notify::new()));
    let first = crate::hooks::spawn({
        let (request, served, release) = (request(), Arc::clone(&served), Arc::clone(&release));
        async move {
            let guard = request.acquire().await.expect("served");
            served.notify_one();
            release.notified().await;
            guard.release().await.unwrap();
        }
    });
    while client.inner.lines.len(&client.record_key("k")) < 1 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let second = crate::hooks::spawn(request().acquire());
    while client.inner.lines.len(&client.record_key("k")) < 2 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // The second's only attempt so far is its first; the second refreshes seldom (every 15–30 s) while not
    // first. 2 s on, past half of its lease (at most 1.55 s) and short of twice it (at least 3.2 s).
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The first is handed the lock, announced and fresh (its last refresh is at most 1 s old), with no attempt.
    let before = store.acquire_calls();
    holder.release().await.unwrap();
    served.notified().await;
    // Less than the second's next scheduled refresh (at least 0.5 s after it was made first).
    tokio::time::sleep(Duration::from_millis(100)).await;
    let at_once = store.acquire_calls() - before;
    release.notify_one();
    first.await.unwrap();
    let guard = second.await.unwrap().expect("the second waiter is handed the lock");
    assert_eq!(at_once, 1, "attempts by the waiter made first, 2 s after its last attempt, in the next 100 ms");
    guard.release().await.unwrap();
}

/// A queued waiter dropped where no withdrawal can be sent (here: on a thread outside the runtime, as when its
/// withdrawal is lost) leaves its place in the store, which lasts 90 s. Its client's next waiter of the lock
/// refreshes the client's mark, which would keep that place alive, and a release would hand the lock to it;
/// instead the line is renamed, the sibling registers again under the new id, and the old mark, with the
/// place, runs out. The simulation's release run found the first version without it (memory seed 2882,
/// redis+replicas 5021); this test puts the lost withdrawal where it matters, every time.
#[tokio::test(start_paused = true)]
async fn a_place_left_without_its_withdrawal_is_not_kept_alive_by_its_client_s_other_waiters() {
    let store = MemoryBackend::new("t".into());
    let (holder_client, client) = (client_on(store.clone()), client_on(store));
    let holder = holder_client.lock("k").ttl(Duration::from_secs(60)).acquire().await.unwrap();
    let retry = RetryStrategy::Linear { step: Duration::from_millis(100) };
    let request = client.lock("k").ttl(Duration::from_secs(60)).wait(Duration::from_secs(120)).retry(retry);
    let mut abandoned = Box::pin(request.acquire());
    // Polled until it stands in the queue, first of its client's line.
    assert!(tokio::time::timeout(Duration::from_millis(5), &mut abandoned).await.is_err(), "the lock is held");
    let sibling = crate::hooks::spawn({
        let request = client.lock("k").ttl(Duration::from_secs(60)).wait(Duration::from_secs(60)).retry(retry);
        async move { (request.acquire().await, tokio::time::Instant::now()) }
    });
    while holder_client.lock_info("k").await.unwrap().expect("held").waiting < 2 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    std::thread::spawn(move || drop(abandoned)).join().unwrap();
    // The old mark lasts 0.4 s at most after its last refresh; the place itself 90 s.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(holder_client.lock_waiters("k").await.unwrap().len(), 1, "only the sibling's place is alive");
    let released = tokio::time::Instant::now();
    holder.release().await.unwrap();
    let (guard, served) = sibling.await.unwrap();
    guard.expect("the sibling is served").release().await.unwrap();
    assert!(served - released < Duration::from_millis(50), "served {:?} after the release", served - released);
}

/// A waiter made first when its client's first waiter is served takes over the client's mark: the served
/// waiter holds the lock longer than the mark lasts without a refresh (0.4 s here), and the next waiter is
/// still handed the lock at once on its release. (The mutation report's line.rs `was_first` `==` -> `!=`: the
/// next waiter was not told it is first, nobody kept the mark, its place died with it, and it got the lock
/// only at its own seldom refresh, 15–30 s later.)
#[tokio::test(start_paused = true)]
async fn the_waiter_made_first_keeps_its_client_s_mark_while_the_lock_is_held() {
    let client = client_on(MemoryBackend::new("t".into()));
    let holder = client.lock("k").ttl(Duration::from_secs(60)).acquire().await.unwrap();
    let retry = RetryStrategy::Linear { step: Duration::from_millis(100) };
    let mut waiters = Vec::new();
    for i in 0..2 {
        let request = client.lock("k").ttl(Duration::from_secs(60)).wait(Duration::from_secs(60)).retry(retry);
        waiters.push(crate::hooks::spawn(async move {
            let guard = request.acquire().await.expect("served");
            let served = tokio::time::Instant::now();
            // Longer than the client's mark lasts unless its new first waiter refreshes it.
            tokio::time::sleep(Duration::from_secs(2)).await;
            let released = tokio::time::Instant::now();
            guard.release().await.unwrap();
            (served, released)
        }));
        while client.inner.lines.len(&client.record_key("k")) < i + 1 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    holder.release().await.unwrap();
    let (_, first_released) = waiters.remove(0).await.unwrap();
    let (second_served, _) = waiters.remove(0).await.unwrap();
    let gap = second_served - first_released;
    assert!(gap < Duration::from_millis(50), "the second waiter was served {gap:?} after the first released");
}

/// A grant handed over to a waiter at the default retry starts with at least a second of lease, dated from the
/// waiter's last attempt, for its first renewal to come back in. It used to be the mark's three early refresh
/// intervals (137–175 ms), and a waiter whose task got no CPU that long (the whole suite on two cores) lost its
/// lock as its body began.
#[tokio::test(start_paused = true)]
async fn a_grant_handed_over_at_the_default_retry_has_a_second_to_renew_in() {
    let client = client_on(MemoryBackend::new("t".into()));
    let holder = client.lock("k").ttl(Duration::from_secs(10)).acquire().await.unwrap();
    let waiter =
        crate::hooks::spawn(client.lock("k").ttl(Duration::from_secs(10)).wait(Duration::from_secs(5)).acquire());
    while client.inner.lines.len(&client.record_key("k")) < 1 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Within the first retry interval (12.5–25 ms), where the mark is shortest.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let released = tokio::time::Instant::now();
    holder.release().await.unwrap();
    let heir = waiter.await.unwrap().expect("handed the lock");
    let lease = heir.deadline() - released;
    assert!(lease >= Duration::from_millis(900), "the heir's lease ends {lease:?} after the hand-over");
    heir.release().await.unwrap();
}
