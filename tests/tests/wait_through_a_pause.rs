//! Issue 34, item 6: a waiter rides out a server that pauses (SIGSTOP, then SIGCONT ~3 s later) within its
//! `wait`: transient failures are retried on its retry strategy while the wait lasts, and the last one is its
//! error when the wait runs out first. Before, a waiter with `wait = 30s` failed at 2 s, its first attempt's
//! response timeout. Without a wait (`try_acquire`) a failure still answers at once.

use std::time::Duration;

use distlock::{Client, LockError, ReleaseOutcome};
use distlock_tests::sys::Stopped;
use distlock_tests::time::{ms, secs};
use distlock_tests::{eventually, within, RedisServer};
use tokio::time::Instant;

/// How long the server stays stopped: longer than the default response timeout (2 s), as in the issue.
const PAUSE: Duration = Duration::from_secs(3);

/// Scheduling slack on a loaded 2-core machine.
const SLACK: Duration = Duration::from_secs(2);

/// The response timeout of the tests that only wait for failures: short, so that a wait sees several.
const RESPONSE_TIMEOUT: Duration = Duration::from_millis(400);

/// A server, a client of it with [`RESPONSE_TIMEOUT`], and the server stopped (resumed when dropped).
async fn stopped_server() -> (RedisServer, Client, Stopped) {
    let server = RedisServer::new();
    let client =
        Client::builder().redis(server.url()).response_timeout(RESPONSE_TIMEOUT).build().await.expect("client");
    let stopped = Stopped::stop(server.pid().expect("running"));
    (server, client, stopped)
}

/// Waiters that start while the server is stopped (their first attempt times out) get their locks once the
/// server resumes, well within their 30 s wait: one key, and several keys (whose one-call attempt for free
/// keys fails, and which are then taken one by one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_started_during_a_pause_get_the_lock_after_it() {
    let server = RedisServer::new();
    let client = Client::builder().redis(server.url()).build().await.expect("client");
    let stopped = Stopped::stop(server.pid().expect("running"));
    let started = Instant::now();
    let waiters = [vec!["job"], vec!["left", "right"]].map(|keys| {
        let client = client.clone();
        tokio::spawn(async move { client.lock_all(keys).wait(secs(30)).acquire().await })
    });
    tokio::time::sleep(PAUSE).await;
    for waiter in &waiters {
        assert!(!waiter.is_finished(), "a waiter ended while the server was stopped");
    }
    stopped.resume();
    for waiter in waiters {
        let guard = within(secs(30), "a waiter after the resume", waiter)
            .await
            .expect("the waiter task")
            .expect("the waiter gets the lock once the server resumes");
        assert!(started.elapsed() >= PAUSE, "granted during the pause?");
        assert!(!guard.is_lost());
        assert_eq!(guard.release().await.expect("release"), ReleaseOutcome::Released);
    }
}

/// A waiter queued behind a holder keeps its place through the pause, and is served when the holder
/// releases after the server resumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_waiter_rides_out_a_pause_and_is_served() {
    let server = RedisServer::new();
    let client = Client::builder().redis(server.url()).build().await.expect("client");
    let holder = client.lock("report").ttl(secs(20)).acquire().await.expect("holder");
    let waiter = tokio::spawn({
        let client = client.clone();
        async move { client.lock("report").wait(secs(30)).acquire().await }
    });
    // Stopped once the waiter stands in the queue: mid-wait.
    eventually(secs(10), "the waiter queues", || async {
        client.lock_info("report").await.ok().flatten().is_some_and(|info| info.waiting == 1)
    })
    .await;
    let stopped = Stopped::stop(server.pid().expect("running"));
    tokio::time::sleep(PAUSE).await;
    assert!(!waiter.is_finished(), "the waiter ended while the server was stopped: {:?}", waiter.await);
    stopped.resume();
    let fence = holder.fencing_token();
    assert_eq!(within(secs(10), "release", holder.release()).await.expect("release"), ReleaseOutcome::Released);
    let guard = within(secs(30), "the waiter after the release", waiter)
        .await
        .expect("the waiter task")
        .expect("the waiter gets the lock after the pause");
    assert!(guard.fencing_token() > fence, "the waiter's grant is a later one");
    assert_eq!(guard.release().await.expect("release"), ReleaseOutcome::Released);
}

/// A waiter whose wait ends while the server is still stopped fails then (not at its first attempt's
/// timeout, not at the resume), with the last transient failure as its error, which says the wait ran out.
/// Nothing it may have been granted stays held: after the resume, the lock is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_ends_during_the_pause_fails_with_the_transient_cause() {
    let (_server, client, stopped) = stopped_server().await;
    let wait = secs(2);
    let started = Instant::now();
    let outcome = within(secs(30), "the waiter", client.lock("nightly").wait(wait).acquire()).await;
    let took = started.elapsed();
    let error = match outcome {
        Err(LockError::Backend(e)) => e,
        other => panic!("expected the backend's timeout, got {other:?}"),
    };
    assert!(error.is_timeout(), "not a timeout: {error}");
    let message = error.to_string();
    assert!(LockError::Backend(error.clone()).is_transient(), "{message}");
    assert!(message.contains("lock `nightly`"), "{message}");
    assert!(message.contains("the request's wait ran out after"), "{message}");
    assert!(!message.contains("after 1 failed attempt(s)"), "only one attempt in a 2 s wait: {message}");
    // Retried until the wait ran out; the attempt in flight then may take up to one response timeout more.
    assert!(took >= wait - ms(100), "failed after {took:?}, before its wait {wait:?} ran out: {message}");
    assert!(took <= wait + RESPONSE_TIMEOUT + SLACK, "failed after {took:?} (wait {wait:?}): {message}");
    stopped.resume();
    // Whatever an attempt whose reply was lost may have been granted is given back (or expires): the lock is
    // free for another request.
    eventually(secs(40), "the lock is free after the resume", || async {
        client.lock("nightly").try_acquire().await.ok().flatten().is_some()
    })
    .await;
}

/// Without a wait (`try_acquire`, or `acquire` with the default zero wait), a failure answers at once: one
/// attempt, one response timeout, and no word of a wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_wait_a_pause_fails_at_once() {
    let (_server, client, _stopped) = stopped_server().await;
    for what in ["try_acquire", "acquire"] {
        let started = Instant::now();
        let request = client.lock("k");
        let outcome = match what {
            "try_acquire" => within(secs(30), what, request.try_acquire()).await.map(drop),
            _ => within(secs(30), what, request.acquire()).await.map(drop),
        };
        let took = started.elapsed();
        let error = outcome.expect_err("no answer from a stopped server");
        assert!(error.is_transient(), "{what}: {error}");
        assert!(!error.to_string().contains("wait ran out"), "{what}: {error}");
        assert!(took <= RESPONSE_TIMEOUT + SLACK / 2, "{what} failed after {took:?}: retried without a wait?");
    }
}
