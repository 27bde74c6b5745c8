//! Issue 34: the connect timeout bounds connecting, as documented, against servers that accept connections and
//! never answer — stopped with SIGSTOP, whose kernel still completes the TCP handshake. `build()` took twice the
//! connect timeout (4 s for the documented 2 s) before. The response timeout's bound on each call is checked
//! on a frozen server by `faults_server.rs` (scenario 4).

use std::time::Duration;

use distlock::{Client, ClientBuilder, LockError};
use distlock_tests::sys::Stopped;
use distlock_tests::time::{ms, secs};
use distlock_tests::{within, RedisServer};
use tokio::time::Instant;

/// The documented default connect timeout.
const DEFAULT_CONNECT: Duration = Duration::from_secs(2);

/// Scheduling slack on a loaded 2-core machine; less than one more timeout, which the old bound added.
const SLACK: Duration = Duration::from_secs(1);

/// Builds a client, and how long `build()` took.
async fn timed_build(builder: ClientBuilder) -> (Result<Client, LockError>, Duration) {
    let start = Instant::now();
    let result = within(secs(30), "build()", builder.build()).await;
    (result, start.elapsed())
}

/// `build()` failed with a connect timeout after `timeout` (not sooner: nothing else ended it; not later than
/// `timeout` and the slack), with a message that names the timeout and `server`.
fn assert_connect_timeout(
    what: &str,
    (result, took): (Result<Client, LockError>, Duration),
    timeout: Duration,
    server: &str,
) {
    let error = match result {
        Ok(_) => panic!("{what}: build() succeeded against stopped servers"),
        Err(LockError::Backend(e)) => e,
        Err(other) => panic!("{what}: expected a backend timeout, got {other:?}"),
    };
    assert!(error.is_timeout(), "{what}: not a timeout: {error}");
    assert_eq!(error.kind(), distlock::BackendErrorKind::Timeout, "{what}");
    let message = error.to_string();
    assert!(message.contains(&format!("connect timeout ({timeout:?})")), "{what}: {message}");
    assert!(message.contains(server), "{what}: {server} is not named: {message}");
    assert!(
        took >= timeout - ms(50),
        "{what}: failed after {took:?}, before its connect timeout {timeout:?}: {message}"
    );
    assert!(took <= timeout + SLACK, "{what}: failed after {took:?}, connect timeout {timeout:?}");
}

/// Every kind of store, with the documented default: one server, a cluster seed, a sentinel, a Redlock group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_gives_up_after_the_default_connect_timeout_on_stopped_servers() {
    let servers = [RedisServer::new(), RedisServer::new(), RedisServer::new()];
    // Resumed (SIGCONT) when dropped, before the servers are killed: also when an assertion fails.
    let _stopped: Vec<Stopped> = servers.iter().map(|s| Stopped::stop(s.pid().expect("running"))).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let url = urls[0].clone();
    // A sentinel that answers, naming a primary that is stopped.
    let sentinel = RedisServer::sentinel(servers[1].port(), "locks", 1);
    let (one, cluster, redlock, silent_sentinel, named_primary) = tokio::join!(
        timed_build(Client::builder().redis(url.clone())),
        timed_build(Client::builder().redis_cluster([url.clone()])),
        timed_build(Client::builder().redlock(urls.clone())),
        timed_build(Client::builder().redis_sentinel([url.clone()], "locks")),
        timed_build(Client::builder().redis_sentinel([sentinel.url()], "locks")),
    );
    // (Redlock's error is its first server's.)
    for (what, built) in [("redis", one), ("redis_cluster", cluster), ("redlock", redlock)] {
        assert_connect_timeout(what, built, DEFAULT_CONNECT, &url);
    }
    // Behind Sentinel the redis crate's own connections (to each sentinel, and its check of the primary they
    // name) have shorter timeouts of their own, which may end build() sooner; never later.
    for (what, (result, took)) in [("a stopped sentinel", silent_sentinel), ("a stopped primary", named_primary)] {
        let message = result.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("no answer from the sentinels, or from the primary"), "{what}: {message}");
        assert!(took <= DEFAULT_CONNECT + SLACK, "{what} behind Sentinel: build() failed after {took:?}: {message}");
    }
}

/// A connect timeout set shorter than the default bounds `build()` as well, over TCP and over a unix socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_gives_up_after_a_set_connect_timeout() {
    let server = RedisServer::new();
    let _stopped = Stopped::stop(server.pid().expect("running"));
    let timeout = ms(700);
    let builder = |url: String| Client::builder().redis(url).connect_timeout(timeout);
    let (tcp, socket) = tokio::join!(timed_build(builder(server.url())), timed_build(builder(server.unix_url())));
    assert_connect_timeout("redis over TCP", tcp, timeout, &server.url());
    assert_connect_timeout("redis over a unix socket", socket, timeout, &server.unix_url());
}

/// A server refused while stopped is accepted once resumed: the timeout judged only its silence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_server_is_accepted() {
    let server = RedisServer::new();
    let stopped = Stopped::stop(server.pid().expect("running"));
    let builder = || Client::builder().redis(server.url()).connect_timeout(ms(500));
    assert_connect_timeout("stopped", timed_build(builder()).await, ms(500), &server.url());
    stopped.resume();
    let (client, took) = timed_build(builder()).await;
    let client = client.expect("a client of the resumed server");
    assert!(took < secs(5), "build() after the resume took {took:?}");
    let guard = client.lock("after-resume").acquire().await.expect("a lock on the resumed server");
    guard.release().await.expect("release");
}
