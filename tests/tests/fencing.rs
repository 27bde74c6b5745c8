//! Fencing tokens that survive state loss (issue 16): they keep rising across a restart without persistence
//! and a FLUSHALL, stay exact in JSON (below 2^53), and no key distlock writes is kept without an expiry.

use std::time::Duration;

use distlock::Client;
use distlock_tests::time::{ms, secs};
use distlock_tests::RedisServer;

/// The retention README documents for a lock's last fencing token, past its grant's lease: at least this...
const FENCE_RETENTION: Duration = Duration::from_secs(60);
/// ...and on Redis at most two of these longer (a grant sets the key's expiry once per window of the server's
/// clock, and keeps it otherwise).
const FENCE_REFRESH: Duration = Duration::from_secs(100);

async fn pttl(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query_async(conn).await.unwrap()
}

async fn client(server: &RedisServer) -> Client {
    Client::builder().redis(server.url()).build().await.unwrap_or_else(|e| panic!("client: {e}"))
}

/// Takes `key` and gives it back; its fencing token.
async fn fence_of_one_grant(client: &Client, key: &str) -> u64 {
    let guard = client.lock(key).ttl(secs(5)).acquire().await.unwrap_or_else(|e| panic!("acquire {key}: {e}"));
    let fence = guard.fencing_token();
    guard.release().await.expect("release");
    fence
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_rise_across_a_restart_without_persistence() {
    let mut server = RedisServer::new();
    let client = client(&server).await;
    let mut before = Vec::new();
    for _ in 0..3 {
        before.push(fence_of_one_grant(&client, "report:1").await);
    }
    assert!(before.windows(2).all(|w| w[0] < w[1]), "tokens of one key rise: {before:?}");
    server.restart();
    let mut conn = server.connection().await;
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(&mut conn).await.unwrap();
    assert!(keys.is_empty(), "the restarted server kept {keys:?}: not the state loss this test is about");
    // The same client reconnects by itself.
    let after = fence_of_one_grant(&client, "report:1").await;
    assert!(after > *before.last().unwrap(), "token {after} after a restart, {before:?} before it");
    assert!(after < 1 << 53, "tokens stay exact for JSON readers: {after}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_rise_across_flushall() {
    let server = RedisServer::new();
    let client = client(&server).await;
    let before = fence_of_one_grant(&client, "report:2").await;
    let mut conn = server.connection().await;
    let () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
    let after = fence_of_one_grant(&client, "report:2").await;
    assert!(after > before, "token {after} after FLUSHALL, {before} before it");
}

/// Many distinct keys locked (some through the wait queue and hand-overs) and released leave no key without
/// an expiry, none kept for less than its lease plus the documented retention, and none that outlives the
/// documented bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_locks_leave_no_key_without_an_expiry() {
    let server = RedisServer::new();
    let client = client(&server).await;
    let started = std::time::Instant::now();
    let ttl = secs(2);
    let tasks: Vec<_> = (0..500)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let guard = client.lock(format!("report:{i}")).ttl(ttl).acquire().await.expect("acquire");
                guard.release().await.expect("release");
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    // Contended keys: waiters queue, releases hand over.
    let contended: Vec<_> = (0..16)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let request = client.lock(format!("shared:{}", i % 2)).ttl(ttl).wait(secs(10));
                let guard = request.acquire().await.expect("acquire");
                tokio::time::sleep(ms(5)).await;
                guard.release().await.expect("release");
            })
        })
        .collect();
    for task in contended {
        task.await.unwrap();
    }

    let mut conn = server.connection().await;
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(&mut conn).await.unwrap();
    assert!(keys.len() >= 500, "expected the fencing state of 500 keys, found {} keys", keys.len());
    let most = ttl + FENCE_RETENTION + 2 * FENCE_REFRESH;
    // Every grant came after `started`, so its token must still be kept this long from now.
    let least = (ttl + FENCE_RETENTION).saturating_sub(started.elapsed());
    for key in &keys {
        let pttl = pttl(&mut conn, key).await;
        assert!(pttl > 0, "{key} has no expiry (PTTL {pttl})");
        let kept = Duration::from_millis(pttl as u64);
        assert!(kept <= most, "{key} is kept {pttl} ms, past {most:?}");
        assert!(kept >= least, "{key} is kept only {pttl} ms, less than {least:?}");
    }
}

/// A grant soon after another keeps the fencing key's expiry (no new expiry per grant), which still covers
/// its lease plus the retention; a lease as long as the refresh window sets a new one that covers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_expiry_is_kept_within_a_window_and_covers_every_lease() {
    let server = RedisServer::new();
    let client = client(&server).await;
    let fence_key = client.record_key("report:3") + ":fence";
    let mut conn = server.connection().await;

    let first = fence_of_one_grant(&client, "report:3").await;
    let after_first = pttl(&mut conn, &fence_key).await;
    // Time for the kept expiry to show: it runs down, where a new one would start over.
    tokio::time::sleep(ms(300)).await;
    let second = fence_of_one_grant(&client, "report:3").await;
    let after_second = pttl(&mut conn, &fence_key).await;
    assert!(second > first, "tokens rise: {first} then {second}");
    // Set by the first grant to its lease + retention + two windows; kept by the second unless a window of
    // the server's clock began between them (then set again, to the same length).
    assert!(after_first > (secs(5) + FENCE_RETENTION).as_millis() as i64, "first grant: PTTL {after_first}");
    assert!(after_second > (secs(5) + FENCE_RETENTION).as_millis() as i64, "second grant: PTTL {after_second}");
    let window = FENCE_REFRESH.as_micros() as u64;
    assert!(
        after_second <= after_first - 200 || second / window != first / window,
        "the second grant, in the first one's window, set a new expiry: PTTL {after_first} then {after_second}"
    );

    let long = FENCE_REFRESH + secs(1);
    let guard = client.lock("report:3").ttl(long).acquire().await.expect("acquire with a long lease");
    assert!(guard.fencing_token() > second);
    let after_long = pttl(&mut conn, &fence_key).await;
    assert!(
        after_long > (long + FENCE_RETENTION).as_millis() as i64,
        "a {long:?} lease keeps the token only {after_long} ms"
    );
    guard.release().await.expect("release");
}

/// A last token ahead of the server's clock (as after the clock stepped back) is followed by the next number,
/// and one far behind it (a counter an older version left, without expiry) by the clock; either way the key
/// gets an expiry that covers the lease plus the retention.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_follow_a_last_token_ahead_of_the_clock_and_replace_an_old_counter() {
    let server = RedisServer::new();
    let client = client(&server).await;
    let mut conn = server.connection().await;
    let kept_at_least = (secs(5) + FENCE_RETENTION).as_millis() as i64;

    let ahead_key = client.record_key("report:4") + ":fence";
    let ahead: u64 = 9_000_000_000_000_000;
    let () = redis::cmd("SET").arg(&ahead_key).arg(ahead).arg("PX").arg(1000).query_async(&mut conn).await.unwrap();
    assert_eq!(fence_of_one_grant(&client, "report:4").await, ahead + 1);
    assert_eq!(fence_of_one_grant(&client, "report:4").await, ahead + 2);
    assert!(pttl(&mut conn, &ahead_key).await > kept_at_least);

    let counter_key = client.record_key("report:5") + ":fence";
    let () = redis::cmd("SET").arg(&counter_key).arg(7).query_async(&mut conn).await.unwrap();
    let token = fence_of_one_grant(&client, "report:5").await;
    assert!(token > 1_600_000_000_000_000, "the clock's µs, not the counter's next: {token}");
    assert!(pttl(&mut conn, &counter_key).await > kept_at_least);
}
