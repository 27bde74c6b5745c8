//! Issue 34, item 2: what a web handler answers for a `LockError` — `http_status()`, `retry_after()` and, with
//! the feature `axum`, the response itself — for busy locks (running holders, finished ones kept by `min_hold`,
//! a queue), a client shutting down, a stopped server, a lost lock and a bad key, on a real redis-server and
//! on the in-process store.

use std::time::Duration;

use axum_core::response::{IntoResponse, Response};
use distlock::{LockError, LossReason};
use distlock_tests::sys::Stopped;
use distlock_tests::time::{ms, secs};
use distlock_tests::{both_backends, eventually, within, Fixture};
use http_body_util::BodyExt;

/// A response's status, its `Retry-After` (if any) and its body.
async fn answer(error: LockError) -> (u16, Option<String>, String) {
    let response: Response = error.into_response();
    let status = response.status().as_u16();
    let retry_after = response.headers().get("retry-after").map(|v| v.to_str().expect("ASCII").to_owned());
    let body = response.into_body().collect().await.expect("body").to_bytes();
    (status, retry_after, String::from_utf8(body.to_vec()).expect("UTF-8"))
}

/// `d` rounded up to whole seconds, as the header carries it.
fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// A lock just taken, with a long lease: 409, and `Retry-After: 1` (the holder has held it for a moment, which
/// is all that is known of how long it needs), not the 30 s lease. The body names neither key nor holder.
async fn a_busy_lock_just_taken_answers_409_retry_after_one_second(fx: Fixture) {
    let client = fx.client();
    let holder = client.lock("http:fresh").ttl(secs(30)).acquire().await.expect("free");
    let busy = client.lock("http:fresh").acquire().await.unwrap_err();
    let owner = busy.holder().expect("the holder, looked up").owner.clone();
    assert_eq!(busy.http_status(), 409, "{busy}");
    assert_eq!(busy.retry_after(), Some(secs(1)), "{busy}");
    let (status, retry_after, body) = answer(busy).await;
    assert_eq!((status, retry_after.as_deref()), (409, Some("1")));
    assert!(!body.contains("http:fresh") && !body.contains(&owner), "the body shows the lock: {body}");
    holder.release().await.expect("release");
}

/// A holder at work for a while, with two requests queued ahead: the estimate is its time held (below its
/// lease left), once for it and once for each queued request, rounded up.
async fn retry_after_counts_the_holder_s_time_and_the_queue_ahead(fx: Fixture) {
    let client = fx.client().clone();
    let holder = client.lock("http:queue").ttl(secs(30)).acquire().await.expect("free");
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let request = client.lock("http:queue").ttl(secs(30)).wait(secs(60));
            // Each gives its turn on to the next.
            tokio::spawn(async move { request.acquire().await?.release().await })
        })
        .collect();
    eventually(secs(10), "two waiters queue", || async {
        client.lock_info("http:queue").await.expect("info").is_some_and(|info| info.waiting == 2)
    })
    .await;
    // Held 1.5 s at least by the time of the busy answer.
    tokio::time::sleep(ms(1500)).await;
    let busy = client.lock("http:queue").acquire().await.unwrap_err();
    let seen = busy.holder().expect("the holder, looked up").clone();
    assert_eq!((seen.waiting, seen.kept_by_min_hold), (2, false), "{seen:?}");
    assert!(seen.held_for >= ms(1500) && seen.held_for < seen.remaining_ttl, "{seen:?}");
    let expected = ceil_secs(seen.held_for * 3);
    assert_eq!(busy.retry_after(), Some(secs(expected)), "{busy}");
    assert!(expected >= 5, "3 × 1.5 s at least: {expected}");
    assert_eq!(answer(busy).await.1, Some(expected.to_string()));
    holder.release().await.expect("release");
    for waiter in waiters {
        within(secs(10), "a waiter's turn", waiter).await.expect("task").expect("its turn");
    }
}

/// A holder that finished, with `min_hold` keeping the lock: the lock frees when its lease left runs out, and
/// that is the estimate.
async fn a_finished_lock_kept_by_min_hold_answers_its_lease_left(fx: Fixture) {
    let client = fx.client();
    client.lock("http:kept").ttl(secs(10)).min_hold(secs(20)).run(async {}).await.expect("ran");
    let busy = client.lock("http:kept").acquire().await.unwrap_err();
    let seen = busy.holder().expect("the holder, looked up").clone();
    assert!(seen.kept_by_min_hold, "{seen:?}");
    assert!(seen.remaining_ttl > secs(15) && seen.remaining_ttl <= secs(20), "{seen:?}");
    assert_eq!(busy.retry_after(), Some(secs(ceil_secs(seen.remaining_ttl))), "{busy}");
    assert_eq!(busy.http_status(), 409);
}

/// A client shutting down: 503, `Retry-After: 1`.
async fn a_client_shutting_down_answers_503(fx: Fixture) {
    let client = fx.client_with(|b| b).await;
    client.shutdown(secs(5)).await;
    let stopping = client.lock("http:stopping").acquire().await.unwrap_err();
    assert!(matches!(stopping, LockError::ShuttingDown), "{stopping:?}");
    assert_eq!((stopping.http_status(), stopping.retry_after()), (503, Some(secs(1))));
    let (status, retry_after, body) = answer(stopping).await;
    assert_eq!((status, retry_after.as_deref()), (503, Some("1")), "{body}");
}

/// A lock lost under its body (force-unlocked: the next renewal is refused) and a bad key: 500, no
/// `Retry-After` (a retry would not cure either).
async fn a_lost_lock_and_a_bad_key_answer_500(fx: Fixture) {
    let client = fx.client().clone();
    let c = client.clone();
    let body = async move {
        assert!(c.force_unlock("http:lost").await.expect("force unlock"));
        distlock::current_lock().expect("in the body").lost().await;
    };
    let lost = within(secs(10), "the loss", client.lock("http:lost").ttl(ms(900)).run(body)).await.unwrap_err();
    assert!(matches!(lost, LockError::Lost { reason: LossReason::Refused, .. }), "{lost:?}");
    assert_eq!((lost.http_status(), lost.retry_after()), (500, None));
    let (status, retry_after, body) = answer(lost).await;
    assert_eq!((status, retry_after, body.as_str()), (500, None, "internal error\n"));

    let bad = client.lock("http:\u{7}").acquire().await.unwrap_err();
    assert!(matches!(bad, LockError::InvalidKey { .. }), "{bad:?}");
    assert_eq!((bad.http_status(), bad.retry_after()), (500, None));
}

both_backends!(
    a_busy_lock_just_taken_answers_409_retry_after_one_second,
    retry_after_counts_the_holder_s_time_and_the_queue_ahead,
    a_finished_lock_kept_by_min_hold_answers_its_lease_left,
    a_client_shutting_down_answers_503,
    a_lost_lock_and_a_bad_key_answer_500,
);

/// A stopped (SIGSTOPped) server: the call times out, a transient error, 503 with `Retry-After: 1`; the body
/// shows neither the server's address nor the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_answers_503() {
    let fx = Fixture::redis().await;
    let client = fx.client_with(|b| b.response_timeout(ms(300))).await;
    let server = fx.server().expect("a redis-server");
    let stopped = Stopped::stop(server.pid().expect("running"));
    let down = within(secs(30), "the call times out", client.lock("http:down").acquire()).await.unwrap_err();
    stopped.resume();
    assert!(down.is_transient(), "{down:?}");
    assert_eq!((down.http_status(), down.retry_after()), (503, Some(secs(1))), "{down}");
    let port = server.port().to_string();
    let (status, retry_after, body) = answer(down).await;
    assert_eq!((status, retry_after.as_deref()), (503, Some("1")));
    assert!(!body.contains(&port) && !body.contains("http:down"), "the body shows the server or key: {body}");
}

/// Not configured: 500, no `Retry-After`.
#[tokio::test]
async fn no_client_answers_500() {
    let error = distlock::current_client().unwrap_err();
    assert_eq!((error.http_status(), error.retry_after()), (500, None));
    assert_eq!(answer(error).await.0, 500);
}
