//! Failover behind Redis Sentinel (a primary, two replicas, three sentinels, `down-after-milliseconds 1000`):
//! the primary is killed (SIGKILL) while a lock is held with replica acknowledgement and waited for. The
//! client follows the sentinels to the promoted replica: calls work again soon after the switch, the waiter
//! is served with a higher fencing token, and never while the holder's guard is valid.

use std::time::Duration;

use distlock::{Client, ReleaseOutcome, RetryStrategy};
use distlock_tests::sentinel::{SentinelGroup, SERVICE};
use distlock_tests::sys::Stopped;
use distlock_tests::{eventually, RedisServer};
use tokio::time::Instant;

async fn client(group: &SentinelGroup) -> Client {
    Client::builder()
        .redis_sentinel(group.sentinel_urls(), SERVICE)
        .wait_for_replicas(1, Duration::from_millis(200))
        .response_timeout(Duration::from_millis(500))
        .build()
        .await
        .expect("client through the sentinels")
}

/// When a lock on `key` (held by nobody) is first taken through `client` after the switch at `switched_at`:
/// its calls work again. Fails if they still fail 5 s after the switch.
async fn calls_work_again(client: &Client, key: &str, switched_at: Instant) -> Instant {
    loop {
        match client.lock(key).try_acquire().await {
            Ok(Some(guard)) => {
                let _ = guard.release().await;
                return Instant::now();
            }
            Ok(None) => panic!("nobody holds {key}"),
            Err(e) => {
                assert!(switched_at.elapsed() < Duration::from_secs(5), "calls still fail 5 s after the switch: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_is_followed_to_the_promoted_replica() {
    // Two replicas: the promoted one still has a replica to acknowledge grants.
    let mut group = SentinelGroup::start(2).await;
    let holder_client = client(&group).await;
    let waiter_client = client(&group).await;
    let key = "sentinel:held";
    let holder = holder_client.lock(key).ttl(Duration::from_secs(3)).acquire().await.expect("holder");
    let waiter = tokio::spawn({
        let client = waiter_client.clone();
        async move {
            let guard = client.lock(key).ttl(Duration::from_secs(10)).wait(Duration::from_secs(30)).acquire().await;
            (guard, Instant::now())
        }
    });
    eventually(Duration::from_secs(5), "the waiter queued", || async {
        holder_client.lock_info(key).await.ok().flatten().is_some_and(|info| info.waiting == 1)
    })
    .await;

    let old = group.primary_port().await.expect("a primary");
    group.servers.iter_mut().find(|s| s.port() == old).expect("the primary").kill();
    let killed_at = Instant::now();
    eventually(Duration::from_secs(20), "the sentinels switched the primary", || async {
        group.primary_port().await.is_some_and(|port| port != old)
    })
    .await;
    let switched_at = Instant::now();
    eprintln!("primary switched {:?} after the kill", switched_at - killed_at);

    let works_again = calls_work_again(&holder_client, "sentinel:other", switched_at).await;
    let recovered = works_again.saturating_duration_since(switched_at);
    eprintln!("calls work again {recovered:?} after the switch");
    assert!(recovered < Duration::from_secs(2), "calls worked again only {recovered:?} after the switch");

    let holder_fence = holder.fencing_token();
    let released_at = Instant::now();
    let was_valid = !holder.is_lost();
    let outcome = holder.release().await;
    let (guard, got_at) = tokio::time::timeout(Duration::from_secs(30), waiter).await.expect("waiter").expect("task");
    let guard = guard.expect("the waiter got the lock after the failover");
    assert!(guard.fencing_token() > holder_fence, "fencing went back across the failover");
    assert!(got_at >= released_at || !was_valid, "the waiter held the lock while the holder's guard was valid");
    let waited = got_at.saturating_duration_since(released_at);
    eprintln!("holder's release {outcome:?}; waiter served {waited:?} after it");
    assert!(waited < Duration::from_secs(4), "the waiter was served {waited:?} after the release ({outcome:?})");
    assert!(guard.release().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_service_name_is_a_clear_error() {
    let group = SentinelGroup::shared().await;
    match Client::builder().redis_sentinel(group.sentinel_urls(), "no-such-service").build().await {
        Err(distlock::LockError::InvalidConfig(message)) => {
            assert!(message.contains("no-such-service") && message.contains("SENTINEL MASTERS"), "{message}")
        }
        other => panic!("an unknown service was accepted: {other:?}"),
    }
}

/// A primary that requires a password, behind a sentinel that does not: the sentinels' URLs carry no password,
/// the primary's is given with `sentinel_primary_password`. Without it the error says where it goes; with it
/// locks work; no message or `Debug` shows it; and it is refused beside any other store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_that_needs_a_password_is_reached_with_sentinel_primary_password() {
    const PASSWORD: &str = "pr1mary-s3cret";
    let primary = RedisServer::with_password(PASSWORD);
    let sentinel = RedisServer::sentinel(primary.port(), "guarded", 1);
    let mut conn = sentinel.connection().await;
    let _: () = redis::cmd("SENTINEL")
        .arg("SET")
        .arg("guarded")
        .arg("auth-pass")
        .arg(PASSWORD)
        .query_async(&mut conn)
        .await
        .expect("SENTINEL SET auth-pass");
    let sentinels = vec![sentinel.url()];

    let refused =
        Client::builder().redis_sentinel(sentinels.clone(), "guarded").build().await.expect_err("no password");
    let message = refused.to_string();
    assert!(message.contains("sentinel_primary_password"), "{message}");

    let builder =
        Client::builder().redis_sentinel(sentinels.clone(), "guarded").sentinel_primary_password(None, PASSWORD);
    assert!(!format!("{builder:?}").contains(PASSWORD), "{builder:?}");
    let client = builder.build().await.expect("client with the primary's password");
    let guard = client.lock("guarded-key").acquire().await.expect("a lock on the guarded primary");
    guard.release().await.expect("release");

    let wrong = Client::builder()
        .redis_sentinel(sentinels.clone(), "guarded")
        .sentinel_primary_password(None, "not-it")
        .build()
        .await
        .expect_err("a wrong password");
    assert!(!wrong.to_string().contains("not-it"), "{wrong}");
    assert!(wrong.to_string().contains("sentinel_primary_password"), "{wrong}");

    let elsewhere = Client::builder()
        .redis(primary.url())
        .sentinel_primary_password(None, PASSWORD)
        .build()
        .await
        .expect_err("not sentinel");
    assert!(matches!(elsewhere, distlock::LockError::InvalidConfig(_)), "{elsewhere:?}");
    assert!(!elsewhere.to_string().contains(PASSWORD), "{elsewhere}");
}

/// Issue 37 behind Sentinel: one primary holds every lock, so a hung one (SIGSTOP) holds up all their renewals
/// until the sentinels switch; no lock outlives that but by its lease. With a lease longer than the switch
/// (9 s: renewed every 3 s), every guard stays valid through it, is renewed on the promoted replica soon after
/// the switch, and releases `Released` after the old primary is resumed (as a replica, or still believing
/// itself the primary until the sentinels demote it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_primary_s_locks_with_a_lease_longer_than_the_switch_stay_valid() {
    const TTL: Duration = Duration::from_secs(9);
    let group = SentinelGroup::start(2).await;
    let client = Client::builder()
        .redis_sentinel(group.sentinel_urls(), SERVICE)
        .wait_for_replicas(1, Duration::from_millis(500))
        .response_timeout(Duration::from_secs(1))
        .build()
        .await
        .expect("client through the sentinels");
    let mut held = Vec::new();
    for i in 0..4 {
        let key = format!("sentinel:hung-{i}");
        let guard = client.lock(&key).ttl(TTL).acquire().await.expect("acquire");
        held.push((key, guard));
    }
    let old = group.primary_port().await.expect("a primary");
    let pid = group.servers.iter().find(|s| s.port() == old).and_then(|s| s.pid()).expect("the primary's pid");
    let hung = Stopped::stop(pid);
    let stopped_at = Instant::now();
    eventually(Duration::from_secs(20), "the sentinels switched the primary", || async {
        group.primary_port().await.is_some_and(|port| port != old)
    })
    .await;
    let switched_at = Instant::now();
    eprintln!("primary switched {:?} after the SIGSTOP", switched_at - stopped_at);
    // Every lock renewed on the new primary: its deadline past any the old primary could have given.
    let before = held.iter().map(|(_, g)| g.deadline()).max().expect("a lock");
    eventually(Duration::from_secs(10), "every lock renewed after the switch", || async {
        held.iter().all(|(key, g)| {
            assert!(!g.is_lost(), "the lock {key} was lost");
            g.deadline() > before
        })
    })
    .await;
    let renewed = switched_at.elapsed();
    eprintln!("every lock renewed {renewed:?} after the switch");
    assert!(renewed < Duration::from_secs(4), "the locks were renewed only {renewed:?} after the switch");
    hung.resume();
    distlock_tests::renewals::renewed_again(&held, TTL, 1).await;
    for (key, guard) in held {
        assert!(!guard.is_lost(), "the lock {key} was lost");
        assert_eq!(guard.release().await.expect("release"), ReleaseOutcome::Released, "{key}");
    }
}

/// Waiters that send nothing through a switch still hear their hand-overs on the promoted replica. A hung
/// primary (SIGSTOP) drops no connection, so no disconnection tells them anything; with a slow retry strategy
/// (a refresh every 40–80 s) and a holder whose lease (60 s) outlasts the test, they make no call of their own
/// until the hand-over is announced. Their client's rebuild, after calls of its own failed, must subscribe
/// again on the new connection and make them retry; without that, each hand-over would be announced where
/// nobody listens and wait for the heir's next refresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_silent_through_the_switch_are_handed_the_lock_on_the_promoted_replica() {
    let group = SentinelGroup::start(2).await;
    let holder_client = client(&group).await;
    let waiter_client = client(&group).await;
    let key = "sentinel:silent";
    let holder = holder_client.lock(key).ttl(Duration::from_secs(60)).acquire().await.expect("holder");
    let (served_tx, mut served) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = Vec::new();
    for n in 1..=2 {
        let (client, served_tx) = (waiter_client.clone(), served_tx.clone());
        waiters.push(tokio::spawn(async move {
            let request = client.lock(key).ttl(Duration::from_secs(240)).wait(Duration::from_secs(180));
            let guard = request.retry(RetryStrategy::Linear { step: Duration::from_secs(80) }).acquire().await;
            let guard = guard.unwrap_or_else(|e| panic!("waiter {n}: {e}"));
            served_tx.send((n, Instant::now(), guard.fencing_token())).expect("the test listens");
            guard.release().await.unwrap_or_else(|e| panic!("waiter {n}'s release: {e}"));
        }));
        // One after the other: the second is second in the queue and in its client's line.
        eventually(Duration::from_secs(5), "the waiter queued", || async {
            holder_client.lock_info(key).await.ok().flatten().is_some_and(|info| info.waiting == n)
        })
        .await;
    }

    let old = group.primary_port().await.expect("a primary");
    let pid = group.servers.iter().find(|s| s.port() == old).and_then(|s| s.pid()).expect("the primary's pid");
    // Stopped until the test ends: resumed, the old primary would be demoted and its clients' connections
    // dropped, which tells every waiter to retry.
    let _hung = Stopped::stop(pid);
    eventually(Duration::from_secs(20), "the sentinels switched the primary", || async {
        group.primary_port().await.is_some_and(|port| port != old)
    })
    .await;
    let switched_at = Instant::now();
    // Both clients follow the switch once calls of theirs failed (not the waiters').
    calls_work_again(&holder_client, "sentinel:silent-holder's", switched_at).await;
    calls_work_again(&waiter_client, "sentinel:silent-waiters'", switched_at).await;

    let fence = holder.fencing_token();
    let released_at = Instant::now();
    assert_eq!(holder.release().await.expect("the holder's release"), ReleaseOutcome::Released);
    let mut last = (released_at, fence);
    for expected in 1..=2 {
        let (n, at, token) = tokio::time::timeout(Duration::from_secs(30), served.recv())
            .await
            .unwrap_or_else(|_| panic!("waiter {expected} was not served within 30 s of the release before it"))
            .expect("a waiter's report");
        assert_eq!(n, expected, "the waiters were served out of their order");
        assert!(token > last.1, "waiter {n}'s fencing token {token} is not above {}", last.1);
        let waited = at.saturating_duration_since(last.0);
        eprintln!("waiter {n} served {waited:?} after the release before it");
        // Its own refresh would come 40–80 s after its last.
        assert!(waited < Duration::from_secs(4), "waiter {n} was served {waited:?} after the release before it");
        last = (at, token);
    }
    for waiter in waiters {
        waiter.await.expect("a waiter's task");
    }
}
