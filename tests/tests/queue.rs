//! The wait queue, on both backends: waiters are served in arrival order, a release hands the lock straight
//! to the next live waiter, and waiters that give up or are cancelled leave the queue.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{Client, LockError, ReleaseOutcome, RetryStrategy};
use distlock_tests::{eventually, within, Fixture};
use tokio::time::Instant;

distlock_tests::all_backends!(
    waiters_are_served_in_arrival_order,
    release_serves_the_next_waiter_promptly,
    waiter_that_gives_up_leaves_the_queue,
    cancelled_waiter_does_not_stall_the_queue,
    try_acquire_does_not_jump_the_queue,
    force_unlock_frees_the_lock_past_a_dead_waiter,
    a_client_s_later_waiters_keep_their_places_without_refreshing_them,
);
// Two clients of one store, which the in-process backend cannot have (a store per built client; the library's
// unit test `a_dead_client_s_waiters_are_all_skipped_at_hand_over` covers its store): the server stores only.
distlock_tests::backend_tests!(clients_on_redis, redis, a_dead_client_s_waiters_are_all_skipped_at_hand_over);
distlock_tests::backend_tests!(clients_on_postgres, postgres, a_dead_client_s_waiters_are_all_skipped_at_hand_over);
distlock_tests::backend_tests!(clients_on_cluster, cluster, a_dead_client_s_waiters_are_all_skipped_at_hand_over);
distlock_tests::backend_tests!(clients_on_sentinel, sentinel, a_dead_client_s_waiters_are_all_skipped_at_hand_over);

const LIMIT: Duration = Duration::from_secs(10);

/// A retry interval far longer than any test: only a hand-over can serve these waiters in time.
fn slow_retry() -> RetryStrategy {
    RetryStrategy::Linear { step: Duration::from_secs(3) }
}

/// How many requests wait for `key`, as its holder's record reports.
async fn waiting(client: &Client, key: &str) -> usize {
    client.lock_info(key).await.expect("lock_info").map_or(0, |info| info.waiting)
}

async fn waiters_are_served_in_arrival_order(fx: Fixture) {
    const KEY: &str = "fifo";
    let holder = fx.client().lock(KEY).ttl(Duration::from_secs(30)).acquire().await.expect("holder");
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..5 {
        // Separate clients, as separate replicas would be.
        let client = fx.other_client().await;
        let order = Arc::clone(&order);
        waiters.push(tokio::spawn(async move {
            let guard =
                client.lock(KEY).wait(Duration::from_secs(20)).retry(slow_retry()).acquire().await.expect("served");
            order.lock().expect("order").push(i);
            guard.release().await.expect("release");
        }));
        // Arrival order is what is being tested: wait until this one stands in the queue.
        eventually(LIMIT, "waiter queued", || async { waiting(fx.client(), KEY).await == i + 1 }).await;
    }
    holder.release().await.expect("release");
    for waiter in waiters {
        within(LIMIT, "waiter served", waiter).await.expect("no panic");
    }
    assert_eq!(*order.lock().expect("order"), vec![0, 1, 2, 3, 4], "served out of arrival order");
}

async fn release_serves_the_next_waiter_promptly(fx: Fixture) {
    const KEY: &str = "handover";
    let holder = fx.client().lock(KEY).acquire().await.expect("holder");
    let before = holder.fencing_token();
    let client = fx.other_client().await;
    let waiter = tokio::spawn(async move {
        let guard = client.lock(KEY).wait(Duration::from_secs(20)).retry(slow_retry()).acquire().await?;
        Ok::<_, LockError>((Instant::now(), guard.fencing_token(), guard.release().await?))
    });
    eventually(LIMIT, "waiter queued", || async { waiting(fx.client(), KEY).await == 1 }).await;
    let released = Instant::now();
    holder.release().await.expect("release");
    let (served, fence, _) = within(LIMIT, "waiter served", waiter).await.expect("no panic").expect("acquired");
    let handoff = served.duration_since(released);
    // The waiter's next retry is 1.5–3 s away: only the hand-over explains a prompt start.
    assert!(handoff < Duration::from_millis(500), "hand-over took {handoff:?}");
    assert!(fence > before, "the hand-over carries a new fencing token");
}

async fn waiter_that_gives_up_leaves_the_queue(fx: Fixture) {
    const KEY: &str = "gives-up";
    let holder = fx.client().lock(KEY).acquire().await.expect("holder");
    let other = fx.other_client().await;
    let outcome = other.lock(KEY).wait(Duration::from_millis(400)).retry(slow_retry()).acquire().await;
    assert!(matches!(outcome, Err(LockError::NotObtained { .. })), "got {outcome:?}");
    assert_eq!(waiting(fx.client(), KEY).await, 0, "the waiter left the queue when its wait ran out");
    holder.release().await.expect("release");
    // Had the waiter stayed queued, the release would have handed the lock to it.
    let again = other.lock(KEY).try_acquire().await.expect("try_acquire");
    assert!(again.is_some(), "the lock went to a waiter that had given up");
}

async fn cancelled_waiter_does_not_stall_the_queue(fx: Fixture) {
    const KEY: &str = "cancelled";
    let holder = fx.client().lock(KEY).ttl(Duration::from_secs(30)).acquire().await.expect("holder");
    let first = fx.other_client().await;
    let cancelled = tokio::spawn(async move {
        first.lock(KEY).wait(Duration::from_secs(20)).retry(slow_retry()).acquire().await.map(drop)
    });
    eventually(LIMIT, "first waiter queued", || async { waiting(fx.client(), KEY).await == 1 }).await;
    let second = fx.other_client().await;
    let patient = tokio::spawn(async move {
        let guard = second.lock(KEY).wait(Duration::from_secs(20)).retry(slow_retry()).acquire().await?;
        Ok::<_, LockError>((Instant::now(), guard.release().await?))
    });
    eventually(LIMIT, "second waiter queued", || async { waiting(fx.client(), KEY).await == 2 }).await;
    cancelled.abort();
    assert!(cancelled.await.expect_err("aborted").is_cancelled());
    let released = Instant::now();
    holder.release().await.expect("release");
    let (served, _) = within(LIMIT, "second waiter served", patient).await.expect("no panic").expect("acquired");
    let handoff = served.duration_since(released);
    assert!(handoff < Duration::from_secs(1), "a cancelled waiter held up the queue for {handoff:?}");
}

async fn try_acquire_does_not_jump_the_queue(fx: Fixture) {
    const KEY: &str = "no-barging";
    let holder = fx.client().lock(KEY).ttl(Duration::from_secs(30)).acquire().await.expect("holder");
    let client = fx.other_client().await;
    let done = Arc::new(tokio::sync::Notify::new());
    let hold_until = Arc::clone(&done);
    let waiter = tokio::spawn(async move {
        let guard = client.lock(KEY).wait(Duration::from_secs(20)).retry(slow_retry()).acquire().await?;
        // Held until the newcomer has tried, so a free lock cannot explain the newcomer's result.
        hold_until.notified().await;
        guard.release().await
    });
    eventually(LIMIT, "waiter queued", || async { waiting(fx.client(), KEY).await == 1 }).await;
    holder.release().await.expect("release");
    // The release handed the lock to the waiter; a newcomer does not get in ahead of it.
    let newcomer = fx.client().lock(KEY).try_acquire().await.expect("try_acquire");
    assert!(newcomer.is_none(), "a newcomer took the lock ahead of the queued waiter");
    done.notify_one();
    let served = within(LIMIT, "waiter served", waiter).await.expect("no panic");
    assert_eq!(served.expect("the waiter was served"), distlock::ReleaseOutcome::Released);
}

/// An operator frees a stuck lock while the longest waiter is dead: the lock is not handed to that waiter
/// (which would keep it from everyone for as long as the dead waiter's place lasts); the live waiter behind it
/// is woken and gets it at once.
///
/// The dead waiter is a request that queued first and was then never polled again, as a waiter whose task or
/// process froze: its place stays in the queue, and it never claims anything. Places refresh every 10–20 s here,
/// so its place lasts 30 s or more, and the live waiter, woken by nothing but `force_unlock`, waits only 10 s.
async fn force_unlock_frees_the_lock_past_a_dead_waiter(fx: Fixture) {
    const KEY: &str = "stuck";
    let retry = RetryStrategy::Linear { step: Duration::from_secs(20) };
    let ttl = Duration::from_secs(60);
    let holder = fx.client().lock(KEY).ttl(ttl).acquire().await.expect("holder");

    let dead_client = fx.other_client().await;
    let mut dead = Box::pin(dead_client.lock(KEY).ttl(ttl).wait(Duration::from_secs(120)).retry(retry).acquire());
    tokio::select! {
        outcome = &mut dead => panic!("the first waiter finished while the lock was held: {outcome:?}"),
        () = eventually(LIMIT, "first waiter queued", || async { waiting(fx.client(), KEY).await == 1 }) => {}
    }
    // From here on `dead` is never polled.

    let live_client = fx.other_client().await;
    let live = tokio::spawn(async move {
        let guard = live_client.lock(KEY).ttl(ttl).wait(Duration::from_secs(10)).retry(retry).acquire().await?;
        Ok::<_, LockError>((Instant::now(), guard))
    });
    eventually(LIMIT, "second waiter queued", || async { waiting(fx.client(), KEY).await == 2 }).await;

    let forced = Instant::now();
    assert!(fx.client().force_unlock(KEY).await.expect("force_unlock"), "the stuck lock was there");
    let (served, guard) = within(LIMIT, "live waiter served", live)
        .await
        .expect("no panic")
        .expect("the live waiter gets the lock within its wait, although the queue's head is dead");
    // The live waiter's next refresh was 10 s or more away: only the wake-up explains a prompt start.
    let woken = served.duration_since(forced);
    assert!(woken < Duration::from_secs(5), "the live waiter got the lock {woken:?} after force_unlock");
    let info = fx.client().lock_info(KEY).await.expect("lock_info").expect("held by the live waiter");
    assert_eq!(info.fencing_token, guard.fencing_token());
    assert!(guard.fencing_token() > holder.fencing_token());
    assert!(!guard.is_lost());
    // The forced-out holder's release touches nothing of the new holder's.
    let outcome = holder.release().await.expect("release");
    assert!(matches!(outcome, ReleaseOutcome::Expired | ReleaseOutcome::TakenByOther), "{outcome:?}");
    assert_eq!(guard.release().await.expect("release"), ReleaseOutcome::Released);
    drop(dead);
}

/// A retry every 50–100 ms: a place lasts 0.4 s or less unless refreshed, and a client's mark for the lock too.
fn fast_retry() -> RetryStrategy {
    RetryStrategy::Linear { step: Duration::from_millis(100) }
}

/// One client's waiters for one lock: only the first refreshes on its retry schedule (keeping the client's
/// mark), the others only every 15–30 s. Their places outlive many of the first one's refreshes (they last
/// 90 s), and they are served in the order they came.
async fn a_client_s_later_waiters_keep_their_places_without_refreshing_them(fx: Fixture) {
    const KEY: &str = "one-client-line";
    let holder = fx.client().lock(KEY).ttl(Duration::from_secs(30)).acquire().await.expect("holder");
    let client = fx.other_client().await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..4 {
        let request = client.lock(KEY).metadata(format!("w{i}")).wait(Duration::from_secs(20)).retry(fast_retry());
        let order = Arc::clone(&order);
        waiters.push(tokio::spawn(async move {
            let guard = request.acquire().await.expect("served");
            order.lock().expect("order").push(i);
            guard.release().await.expect("release");
        }));
        eventually(LIMIT, "waiter queued", || async { waiting(fx.client(), KEY).await == i + 1 }).await;
    }
    // Five times as long as a place lasts without its refreshes: the later waiters' places live on the
    // first one's refreshes of the client's mark, and their own 90 s. (Time passing is the condition tested.)
    tokio::time::sleep(Duration::from_secs(2)).await;
    let listed = fx.client().lock_waiters(KEY).await.expect("lock_waiters");
    let metadata: Vec<_> = listed.iter().map(|w| w.metadata.as_str()).collect();
    assert_eq!(metadata, ["w0", "w1", "w2", "w3"], "live places, in arrival order");
    holder.release().await.expect("release");
    for waiter in waiters {
        within(LIMIT, "waiter served", waiter).await.expect("no panic");
    }
    assert_eq!(*order.lock().expect("order"), vec![0, 1, 2, 3], "served out of arrival order");
}

/// A client whose waiters all stopped (its process froze or died: their requests are never polled again)
/// stops refreshing its mark for the lock, and every one of its places dies with the mark, although each
/// place itself would last 90 s: a release hands the lock past all of them to a live waiter at once, where
/// handing it to each dead waiter in turn would keep it from everyone for a hand-over lease each.
async fn a_dead_client_s_waiters_are_all_skipped_at_hand_over(fx: Fixture) {
    const KEY: &str = "dead-client";
    let ttl = Duration::from_secs(30);
    let holder = fx.client().lock(KEY).ttl(ttl).acquire().await.expect("holder");
    let dead_client = fx.other_client().await;
    let mut dead = Vec::new();
    for i in 0..6 {
        let mut waiter =
            Box::pin(dead_client.lock(KEY).ttl(ttl).wait(Duration::from_secs(120)).retry(fast_retry()).acquire());
        tokio::select! {
            outcome = &mut waiter => panic!("a waiter finished while the lock was held: {outcome:?}"),
            () = eventually(LIMIT, "dead waiter queued", || async { waiting(fx.client(), KEY).await == i + 1 }) => {}
        }
        // From here on it is never polled.
        dead.push(waiter);
    }
    let live_client = fx.other_client().await;
    let live = tokio::spawn(async move {
        let guard = live_client.lock(KEY).ttl(ttl).wait(Duration::from_secs(20)).retry(slow_retry()).acquire().await?;
        Ok::<_, LockError>((Instant::now(), guard))
    });
    eventually(LIMIT, "live waiter queued", || async { waiting(fx.client(), KEY).await == 7 }).await;
    // The dead client's mark lasts 0.4 s at most after its last refresh.
    eventually(LIMIT, "the dead client's places expire", || async {
        fx.client().lock_waiters(KEY).await.expect("lock_waiters").len() == 1
    })
    .await;
    let released = Instant::now();
    holder.release().await.expect("release");
    let (served, guard) = within(LIMIT, "live waiter served", live).await.expect("no panic").expect("acquired");
    let handoff = served.duration_since(released);
    // Six hand-over leases of 1 s each (the floor), had the dead places been used.
    assert!(handoff < Duration::from_millis(500), "dead waiters held up the queue for {handoff:?}");
    assert_eq!(guard.release().await.expect("release"), ReleaseOutcome::Released);
    drop(dead);
}
