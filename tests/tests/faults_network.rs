//! Network faults between a client and its Redis server, injected by the fault proxy: the proxy itself,
//! connection resets (scenario 6), a partition (scenario 7) and lost acquire replies (scenario 8).

use std::sync::Arc;
use std::time::Duration;

use distlock::{Client, LockError, ReleaseOutcome, RetryStrategy};
use distlock_tests::events::{EventLog, Kind};
use distlock_tests::proxy::{Fault, FaultProxy};
use distlock_tests::time::{ms, secs};
use distlock_tests::{acquire_after_recovery, eventually, raw_connection, serial, within, Fixture, RedisServer};
use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

/// Scheduling slack on a loaded 2-core machine, on top of every bound below.
const SLACK: Duration = Duration::from_millis(250);

async fn client_via(url: &str, response: Duration) -> Client {
    Client::builder().redis(url).connect_timeout(response).response_timeout(response).build().await.expect("client")
}

async fn ping(conn: &mut MultiplexedConnection) -> redis::RedisResult<String> {
    redis::cmd("PING").query_async(conn).await
}

/// How many connections are subscribed to `channel`.
async fn subscribers(conn: &mut MultiplexedConnection, channel: &str) -> i64 {
    let (_, n): (String, i64) = redis::cmd("PUBSUB").arg("NUMSUB").arg(channel).query_async(conn).await.unwrap();
    n
}

async fn wait_subscribers(conn: &mut MultiplexedConnection, channel: &str, n: i64) {
    let start = Instant::now();
    while subscribers(conn, channel).await != n {
        if start.elapsed() > secs(10) {
            let clients: String = redis::cmd("CLIENT").arg("LIST").query_async(conn).await.unwrap();
            panic!("not {n} subscriber(s) on {channel} after 10 s; clients:\n{clients}");
        }
        tokio::time::sleep(ms(10)).await;
    }
}

/// Spawns a waiter on `key` that retries only every 10-20 s: within a second, only a release announcement
/// can wake it.
fn spawn_deaf_waiter(client: &Client, key: &'static str) -> tokio::task::JoinHandle<Result<u64, LockError>> {
    let client = client.clone();
    tokio::spawn(async move {
        let guard = client.lock(key).wait(secs(60)).retry(RetryStrategy::Linear { step: secs(20) }).acquire().await?;
        Ok(guard.fencing_token())
    })
}

// ---------------------------------------------------------------------------------------------------------
// The proxy itself
// ---------------------------------------------------------------------------------------------------------

/// Every fault of the proxy does what it says, and switches at run time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_faults_do_what_they_say() {
    let server = RedisServer::new();
    let proxy = FaultProxy::to_port(server.port()).await;
    let mut direct = server.connection().await;
    let mut conn = raw_connection(&proxy.url(), Some(ms(300))).await;
    assert_eq!(ping(&mut conn).await.unwrap(), "PONG");

    // Delay: each direction waits, so a round trip takes at least twice the delay.
    proxy.set_fault(Fault::Delay(ms(60)));
    let start = Instant::now();
    assert_eq!(ping(&mut conn).await.unwrap(), "PONG");
    assert!(start.elapsed() >= ms(120), "round trip {:?} under a 60 ms delay", start.elapsed());

    // Blackhole: nothing arrives; what was held is delivered after healing.
    proxy.set_fault(Fault::Blackhole);
    let r: redis::RedisResult<()> = redis::cmd("SET").arg("proxy:held").arg(1).query_async(&mut conn).await;
    assert!(r.unwrap_err().is_timeout());
    let held: Option<i64> = redis::cmd("GET").arg("proxy:held").query_async(&mut direct).await.unwrap();
    assert_eq!(held, None, "a blackholed write reached the server");
    proxy.set_fault(Fault::Pass);
    within(secs(5), "the held write arrives after healing", async {
        loop {
            let v: Option<i64> = redis::cmd("GET").arg("proxy:held").query_async(&mut direct).await.unwrap();
            if v == Some(1) {
                break;
            }
            tokio::time::sleep(ms(5)).await;
        }
    })
    .await;
    assert_eq!(ping(&mut conn).await.unwrap(), "PONG");

    // DropReplies: the server executes, the client hears nothing; leaving the fault resets the connection.
    proxy.set_fault(Fault::DropReplies);
    let r: redis::RedisResult<()> = redis::cmd("SET").arg("proxy:unanswered").arg(1).query_async(&mut conn).await;
    assert!(r.unwrap_err().is_timeout());
    let done: Option<i64> = redis::cmd("GET").arg("proxy:unanswered").query_async(&mut direct).await.unwrap();
    assert_eq!(done, Some(1), "the request did not reach the server");
    assert!(proxy.stats().dropped_reply_bytes > 0);
    let resets = proxy.stats().reset;
    proxy.set_fault(Fault::Pass);
    within(secs(5), "the connection that lost a reply is reset", async {
        while proxy.stats().reset == resets {
            tokio::time::sleep(ms(5)).await;
        }
    })
    .await;
    assert!(ping(&mut conn).await.is_err(), "a reset connection still answered");

    // Reset: live connections are reset once; new ones too while the fault lasts.
    let mut conn = raw_connection(&proxy.url(), Some(ms(300))).await;
    assert_eq!(ping(&mut conn).await.unwrap(), "PONG");
    proxy.reset_all();
    within(secs(5), "the reset", async {
        while proxy.live_connections() > 0 {
            tokio::time::sleep(ms(5)).await;
        }
    })
    .await;
    assert!(ping(&mut conn).await.is_err());
    proxy.set_fault(Fault::Reset);
    let client = redis::Client::open(proxy.url()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await;
    if let Ok(c) = c.as_mut() {
        assert!(ping(c).await.is_err(), "a connection accepted under Reset answered");
    }

    // Refuse: the port is closed; it opens again afterwards, on the same port.
    proxy.set_fault(Fault::Refuse);
    within(secs(5), "the port closes", async {
        while tokio::net::TcpStream::connect(proxy.addr()).await.is_ok() {
            tokio::time::sleep(ms(5)).await;
        }
    })
    .await;
    proxy.set_fault(Fault::Pass);
    within(secs(5), "the port opens again", async {
        while tokio::net::TcpStream::connect(proxy.addr()).await.is_err() {
            tokio::time::sleep(ms(5)).await;
        }
    })
    .await;
    let mut conn = raw_connection(&proxy.url(), Some(ms(300))).await;
    assert_eq!(ping(&mut conn).await.unwrap(), "PONG");
}

// ---------------------------------------------------------------------------------------------------------
// Scenario 6: connection reset
// ---------------------------------------------------------------------------------------------------------

async fn kill_all_client_connections(admin: &mut MultiplexedConnection) {
    for kind in ["normal", "pubsub"] {
        let _: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg(kind)
            .arg("SKIPME")
            .arg("yes")
            .query_async(admin)
            .await
            .unwrap();
    }
}

/// Scenario 6 with `CLIENT KILL`: every client connection is killed three times within 1.5 leases. The
/// holder keeps its 1.5 s lock — its renewals reconnect in time — and its client works afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s06_client_kill_reconnects_holder_not_lost() {
    const KEY: &str = "killed-connections";
    let ttl = ms(1500);
    let _serial = serial().await;
    let fx = Fixture::redis().await;
    let mut admin = fx.redis_connection().unwrap();
    let holder = fx.client().lock(KEY).ttl(ttl).acquire().await.expect("holder");
    let fence = holder.fencing_token();
    for _ in 0..3 {
        kill_all_client_connections(&mut admin).await;
        // Work time between the kills: half a lease.
        tokio::time::sleep(ttl / 2).await;
        assert!(!holder.is_lost(), "the holder lost its lock to a connection reset");
    }
    let info = fx.other_client().await.lock_info(KEY).await.unwrap().expect("still held");
    assert_eq!(info.fencing_token, fence);
    assert!(holder.remaining_ttl().await.unwrap().expect("ours") > ttl / 3);
    assert_eq!(holder.release().await.unwrap(), ReleaseOutcome::Released);
    let again = fx.client().lock(KEY).acquire().await.expect("the client works after the resets");
    assert_eq!(again.release().await.unwrap(), ReleaseOutcome::Released);
}

/// Scenario 6 with `CLIENT KILL`, the waiter's side: a waiter's release subscription is killed three
/// times within a second; once reconnected it is subscribed again, and a release wakes it at once (it
/// retries only every 10-20 s on its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s06_client_kill_waiter_resubscribed_and_woken_by_release() {
    const KEY: &str = "killed-subscription";
    let _serial = serial().await;
    let fx = Fixture::redis().await;
    let mut admin = fx.redis_connection().unwrap();
    let holder = fx.client().lock(KEY).ttl(secs(30)).acquire().await.expect("holder");
    let waiter_client = fx.other_client().await;
    waiter_survives_three_disruptions(&fx, &mut admin, holder, &waiter_client, KEY, async |admin| {
        kill_all_client_connections(admin).await;
    })
    .await;
}

/// The waiter's side of scenario 6: a deaf waiter (it retries only every 10-20 s) is subscribed; `disrupt`
/// hits its connections three times; once it is subscribed again, a release must wake it at once.
async fn waiter_survives_three_disruptions(
    fx: &Fixture,
    admin: &mut MultiplexedConnection,
    holder: distlock::LockGuard,
    waiter_client: &Client,
    key: &'static str,
    mut disrupt: impl AsyncFnMut(&mut MultiplexedConnection),
) {
    let waiter = spawn_deaf_waiter(waiter_client, key);
    let channel = format!("{}:released", fx.client().record_key(key));
    wait_subscribers(admin, &channel, 1).await;
    for _ in 0..3 {
        disrupt(admin).await;
        tokio::time::sleep(ms(300)).await;
    }
    wait_subscribers(admin, &channel, 1).await;
    let released = Instant::now();
    assert_eq!(holder.release().await.unwrap(), ReleaseOutcome::Released);
    within(secs(30), "the waiter", waiter).await.unwrap().expect("the waiter gets the lock");
    assert!(released.elapsed() < secs(1), "the waiter was woken only {:?} after the release", released.elapsed());
}

/// Scenario 6 through the proxy: the holder's connection is reset three times, then new connections are
/// refused for 600 ms (shorter than the lease's remaining validity) right after a reset. The holder is
/// never lost: it reconnects and renews in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s06_proxy_reset_and_refusal_within_validity_not_lost() {
    const KEY: &str = "reset-connections";
    let ttl = ms(1500);
    let _serial = serial().await;
    let fx = Fixture::redis().await;
    let proxy = FaultProxy::to_port(fx.server().unwrap().port()).await;
    let client = client_via(&proxy.url(), ms(500)).await;
    let holder = client.lock(KEY).ttl(ttl).acquire().await.expect("holder");
    let fence = holder.fencing_token();
    for _ in 0..3 {
        proxy.reset_all();
        tokio::time::sleep(ttl / 2).await;
        assert!(!holder.is_lost(), "the holder lost its lock to a connection reset");
    }
    proxy.set_fault(Fault::Refuse);
    proxy.reset_all();
    tokio::time::sleep(ms(600)).await;
    proxy.set_fault(Fault::Pass);
    // Two more renewal periods.
    tokio::time::sleep(ttl * 2 / 3).await;
    assert!(!holder.is_lost(), "the holder lost its lock to a 600 ms refusal");
    let info = fx.client().lock_info(KEY).await.unwrap().expect("still held");
    assert_eq!(info.fencing_token, fence);
    assert!(info.remaining_ttl > ttl / 3, "not renewed after the refusal: {:?} left", info.remaining_ttl);
    assert_eq!(holder.release().await.unwrap(), ReleaseOutcome::Released);
}

/// Scenario 6 through the proxy, the waiter's side: the waiter's connections are reset three times; once
/// reconnected it is subscribed again, and a release wakes it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s06_proxy_reset_waiter_resubscribed_and_woken_by_release() {
    const KEY: &str = "reset-subscription";
    let _serial = serial().await;
    let fx = Fixture::redis().await;
    let mut admin = fx.redis_connection().unwrap();
    let proxy = FaultProxy::to_port(fx.server().unwrap().port()).await;
    let waiter_client = client_via(&proxy.url(), ms(500)).await;
    let holder = fx.client().lock(KEY).ttl(secs(30)).acquire().await.expect("holder");
    waiter_survives_three_disruptions(&fx, &mut admin, holder, &waiter_client, KEY, async |_| proxy.reset_all()).await;
}

// ---------------------------------------------------------------------------------------------------------
// Scenario 7: partition
// ---------------------------------------------------------------------------------------------------------

/// Scenario 7. Client A (behind the proxy) runs a lock body on one key and holds a guard on another; the
/// proxy blackholes A for twice the lease. Client B (direct) waits for both keys. A's body is dropped
/// before B's grant of that key (the event log shows no overlap, fences rise), A's guard already reports
/// lost when B gets the other key, and after the partition heals — A's held renewals reaching the server
/// late — A's release reports not-held and B's locks are intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s07_partition_a_cancelled_before_b_granted_a_release_not_held_b_intact() {
    const RUN_KEY: &str = "partition-run";
    const GUARD_KEY: &str = "partition-guard";
    let ttl = secs(2);
    let _serial = serial().await;
    let fx = Fixture::redis().await;
    let proxy = FaultProxy::to_port(fx.server().unwrap().port()).await;
    let a = client_via(&proxy.url(), ms(500)).await;
    let b = fx.other_client().await;
    let log = EventLog::new();

    let a_run = tokio::spawn({
        let (a, log) = (a.clone(), Arc::clone(&log));
        async move {
            let fence = a.lock_info(RUN_KEY);
            a.lock(RUN_KEY)
                .ttl(ttl)
                .run(async move {
                    let fence = fence.await.unwrap().expect("held").fencing_token;
                    log.record("A", Kind::Entered { fence });
                    let _end = EndOnDrop(Arc::clone(&log), "A", fence);
                    std::future::pending::<()>().await;
                })
                .await
        }
    });
    log.wait_for("A", secs(10), |k| matches!(k, Kind::Entered { .. })).await;
    let a_guard = a.lock(GUARD_KEY).ttl(ttl).acquire().await.expect("A's guard");

    proxy.set_fault(Fault::Blackhole);
    let partitioned = Instant::now();
    let b_run = async {
        let guard = b.lock(RUN_KEY).ttl(secs(30)).wait(ttl * 3).acquire().await.expect("B gets the run key");
        let fence = guard.fencing_token();
        log.record("B", Kind::Entered { fence });
        guard
    };
    let b_guard = async {
        let guard = b.lock(GUARD_KEY).ttl(secs(30)).wait(ttl * 3).acquire().await.expect("B gets the guard key");
        // At B's grant, A's guard must already know it is no longer valid (S1).
        assert!(a_guard.is_lost(), "A's guard still valid when B was granted the same key");
        guard
    };
    let (b_run_guard, b_guard) = tokio::join!(b_run, b_guard);
    let a_result = within(secs(5), "A's run ends", a_run).await.unwrap();
    assert!(matches!(a_result, Err(LockError::Lost { .. })), "A's run returned {a_result:?}");
    // A dropped its body before B entered: the sections do not overlap, and fences rise.
    log.check_no_overlap().unwrap_or_else(|e| panic!("{e}"));

    // Heal after twice the lease; A's held traffic (renewals with A's tokens) reaches the server now.
    tokio::time::sleep_until(partitioned + ttl * 2).await;
    proxy.set_fault(Fault::Pass);
    let outcome = within(secs(10), "A's release after healing", a_guard.release()).await;
    match outcome {
        Ok(ReleaseOutcome::TakenByOther) | Ok(ReleaseOutcome::Expired) => {}
        other => panic!("A's release after the partition must report not-held, got {other:?}"),
    }
    for (key, guard) in [(RUN_KEY, &b_run_guard), (GUARD_KEY, &b_guard)] {
        let info = fx.client().lock_info(key).await.unwrap().expect("B still holds it");
        assert_eq!(info.fencing_token, guard.fencing_token(), "{key}");
        assert!(info.remaining_ttl > secs(20), "{key}: B's lease was cut to {:?}", info.remaining_ttl);
        assert!(!guard.is_lost());
    }
    assert_eq!(b_run_guard.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(b_guard.release().await.unwrap(), ReleaseOutcome::Released);
}

/// Records `Dropped` when A's body is dropped.
struct EndOnDrop(Arc<EventLog>, &'static str, u64);

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        self.0.record(self.1, Kind::Dropped { fence: self.2 });
    }
}

// ---------------------------------------------------------------------------------------------------------
// Scenario 8: lost acquire reply
// ---------------------------------------------------------------------------------------------------------

/// Scenario 8. The server grants A's acquire but the reply is lost (the proxy drops replies; the connection
/// is then reset, as a real lost reply implies). A's call, which retries such failures within its wait (issue
/// 34), returns an error when the wait runs out — never Ok, and `run` never runs its body. The orphaned grant
/// is cleaned by its token or expires: the key is free for B at most one ttl after A's last attempt. A's
/// client works again afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s08_lost_acquire_reply_is_an_error_never_ok_orphan_freed_within_ttl() {
    const KEY: &str = "lost-reply";
    let ttl = secs(2);
    let timeout = ms(500);
    let _serial = serial().await;
    let fx = Fixture::redis().await;
    let proxy = FaultProxy::to_port(fx.server().unwrap().port()).await;
    let a = client_via(&proxy.url(), timeout).await;
    let b = fx.other_client().await;

    proxy.set_fault(Fault::DropReplies);
    let sent = Instant::now();
    let wait = secs(1);
    let result = within(secs(10), "A's acquire", a.lock(KEY).ttl(ttl).wait(wait).acquire()).await;
    let failed = Instant::now();
    // Retried within the wait; the attempt in flight at its end may take one response timeout more.
    let took = failed - sent;
    assert!(took <= wait + timeout + SLACK, "the lost replies were given up on only after {took:?}");
    match &result {
        Err(LockError::Backend(e)) => {
            assert!(e.is_timeout(), "{e}");
            assert!(e.to_string().contains("the request's wait ran out"), "{e}");
        }
        other => panic!("a lost acquire reply must be an error, got {other:?}"),
    }
    let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let run = a.lock("lost-reply-run").ttl(ttl).run({
        let ran = Arc::clone(&ran);
        async move { ran.store(true, std::sync::atomic::Ordering::SeqCst) }
    });
    assert!(within(secs(10), "A's run", run).await.is_err(), "run succeeded without a reply");
    assert!(!ran.load(std::sync::atomic::Ordering::SeqCst), "the body ran without a grant");
    proxy.set_fault(Fault::Pass);

    // The server did grant it: an orphan nobody will release... until its token cleans it or it expires.
    let guard = within(ttl * 2, "B gets the key", b.lock(KEY).ttl(secs(10)).wait(ttl * 2).acquire())
        .await
        .expect("the orphan grant is freed");
    let freed = failed.elapsed();
    assert!(freed <= ttl + SLACK, "the orphan held the key {freed:?} after A gave up (ttl {ttl:?})");
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);

    let again = within(secs(10), "A locks again", acquire_after_recovery(sent + secs(8), "A", || a.lock(KEY))).await;
    assert_eq!(again.release().await.unwrap(), ReleaseOutcome::Released);
}

// ---------------------------------------------------------------------------------------------------------
// A hand-over that lands while a waiter gives up (acquire.rs `give_up`)
// ---------------------------------------------------------------------------------------------------------

const HANDED_LATE: &str = "handed-while-withdrawing";

/// A waiter through a proxy that delays each direction by 500 ms, waiting 1.5 s: its first attempt is answered
/// busy after 1 s, within the wait; its queued attempt (sent after the subscription's round trip) reaches Redis,
/// the holder releases and the lock is handed to it, and that attempt's busy reply arrives only after the wait
/// ran out. Its withdrawal then finds the hand-over. Returns the waiter's answer, the direct client, and the
/// holder's fencing token.
async fn handed_the_lock_while_giving_up(
    server: &RedisServer,
    replicas: u32,
) -> (Result<distlock::LockGuard, LockError>, Client, FaultProxy, u64) {
    let direct = Client::builder().redis(server.url()).build().await.expect("direct client");
    let proxy = FaultProxy::to_port(server.port()).await;
    let mut builder = Client::builder().redis(proxy.url()).connect_timeout(secs(5)).response_timeout(secs(5));
    if replicas > 0 {
        builder = builder.wait_for_replicas(replicas, ms(300));
    }
    let through_proxy = builder.build().await.expect("client through the proxy");
    let holder = direct.lock(HANDED_LATE).ttl(secs(30)).acquire().await.expect("free");
    let holders_token = holder.fencing_token();

    proxy.set_fault(Fault::Delay(ms(500)));
    // A seldom refresh: the hand-over lease it registers (a third of the ttl, times three) outlasts the test.
    let seldom = RetryStrategy::Linear { step: secs(20) };
    let request = through_proxy.lock(HANDED_LATE).ttl(secs(30)).wait(ms(1500)).retry(seldom);
    let waiter = tokio::spawn(request.acquire());
    eventually(secs(10), "the waiter's queued attempt reaches Redis", || async {
        direct.lock_info(HANDED_LATE).await.expect("info").is_some_and(|info| info.waiting >= 1)
    })
    .await;
    // Its reply is still on its way (500 ms): this release hands the lock to the waiter, unheard.
    assert_eq!(holder.release().await.expect("release"), ReleaseOutcome::Released);
    let answer = within(secs(20), "the waiter's answer", waiter).await.expect("the waiter's task");
    proxy.set_fault(Fault::Pass);
    (answer, direct, proxy, holders_token)
}

/// The withdrawal at the end of a wait finds that a release handed the lock to this waiter meanwhile: the
/// waiter takes it (never leaving it held by nobody's guard), with a DEBUG event saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_found_by_the_withdrawal_at_the_end_of_the_wait_is_taken() {
    let _serial = serial().await;
    let logs = distlock_tests::logs::capture();
    let server = RedisServer::new();
    let (answer, direct, _proxy, holders_token) = handed_the_lock_while_giving_up(&server, 0).await;
    let guard = answer.expect("the hand-over found while withdrawing is the waiter's");
    assert!(guard.fencing_token() > holders_token, "a hand-over is a new grant");
    let handed: Vec<_> = logs
        .matching(tracing::Level::DEBUG, &["a waiter was handed the lock"])
        .into_iter()
        .filter(|l| l.fields.get("key").map(String::as_str) == Some(HANDED_LATE))
        .collect();
    let [handed] = handed.as_slice() else { panic!("one hand-over event: {handed:?}\n{}", logs.dump()) };
    assert_eq!(handed.fields["how"], "withdrawing", "{handed:?}");
    let info = direct.lock_info(HANDED_LATE).await.expect("info").expect("held");
    assert_eq!(info.fencing_token, guard.fencing_token());
    assert_eq!(guard.release().await.expect("release"), ReleaseOutcome::Released);
}

/// The same hand-over under replica acknowledgement: nobody waited for its write to reach the replica, so it
/// cannot count. The waiter gives it back and fails; the lock is left free, not held by nobody's guard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_replica_acks_a_hand_over_found_while_withdrawing_is_given_back() {
    let _serial = serial().await;
    let server = RedisServer::new();
    let _replica = RedisServer::replica_of(server.port()).await;
    let (answer, direct, _proxy, _) = handed_the_lock_while_giving_up(&server, 1).await;
    match answer {
        Err(LockError::NotObtained { key, .. }) => assert_eq!(key, HANDED_LATE),
        other => panic!("an unacknowledged hand-over was kept: {other:?}"),
    }
    eventually(secs(10), "the hand-over given back", || async {
        direct.lock_info(HANDED_LATE).await.expect("info").is_none()
    })
    .await;
}

/// A request whose attempt failed (timed out: the server unreachable) is not retried when the pause before the
/// retry would end past its wait: it fails at once, saying so, rather than sleeping past the wait its caller
/// gave it and answering late. (The mutation report's acquire.rs `now + pause` → `now - pause`: the request
/// slept 5–10 s here, past its wait of 2 s.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_attempt_is_not_retried_past_the_wait() {
    let server = RedisServer::new();
    let proxy = FaultProxy::to_port(server.port()).await;
    let client = client_via(&proxy.url(), ms(200)).await;
    proxy.set_fault(Fault::Blackhole);
    let wait = secs(2);
    let started = Instant::now();
    let request = client.lock("unreachable").wait(wait).retry(RetryStrategy::Linear { step: secs(10) });
    let error = request.acquire().await.expect_err("the server is unreachable");
    let took = started.elapsed();
    assert!(took < wait, "answered {took:?} after it started, past its wait of {wait:?}: {error}");
    assert!(error.to_string().contains("wait ran out after 1 failed attempt"), "the error does not say so: {error}");
    proxy.set_fault(Fault::Pass);
}
