//! Fencing tokens that survive state loss (issue 16): they keep rising across a restart without persistence
//! and a FLUSHALL, stay exact in JSON (below 2^53), and no key distlock writes is kept without an expiry.

use std::time::Duration;

use distlock::Client;
use distlock_tests::time::{ms, secs};
use distlock_tests::RedisServer;

/// The retention README documents for a lock's last fencing token, past its grant's lease.
const FENCE_RETENTION: Duration = Duration::from_secs(60);

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
/// an expiry, and none that outlives its lease plus the documented retention.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_locks_leave_no_key_without_an_expiry() {
    let server = RedisServer::new();
    let client = client(&server).await;
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
    let bound = ttl + FENCE_RETENTION;
    for key in &keys {
        let pttl: i64 = redis::cmd("PTTL").arg(key).query_async(&mut conn).await.unwrap();
        assert!(pttl > 0, "{key} has no expiry (PTTL {pttl})");
        assert!(Duration::from_millis(pttl as u64) <= bound, "{key} is kept {pttl} ms, past {bound:?}");
    }
}
