//! Fencing tokens that survive state loss (issue 16): they keep rising across a restart without persistence
//! and a FLUSHALL, stay exact in JSON (below 2^53), and no key distlock writes is kept without an expiry: a
//! released lock leaves only its freed record, which keeps its last token for the rest of its lease.

use std::time::Duration;

use distlock::Client;
use distlock_tests::time::{ms, secs};
use distlock_tests::{freed_fence, freed_record, RedisServer, FREED};

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
/// an expiry: only their freed records, each keeping its last token no longer than the rest of its lease; once
/// the leases have run out, nothing of them is left.
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
    assert!(keys.len() >= 500, "expected the freed records of 500 keys, found {} keys", keys.len());
    for key in &keys {
        // A lock handed over to a waiter has the waiter's short hand-over lease (1 s, or three refreshes of its place),
        // so its freed record may expire while this loop reads the others: gone is no key without an expiry.
        let pttl = pttl(&mut conn, key).await;
        if pttl == -2 {
            continue;
        }
        assert!(pttl > 0, "{key} has no expiry (PTTL {pttl})");
        let value: Option<String> = redis::cmd("GET").arg(key).query_async(&mut conn).await.unwrap();
        let Some(value) = value else { continue };
        if key.rsplit_once(":client:").is_some_and(|(_, id)| id.len() == 16) {
            // A waiting client's mark: it lasts three of its first waiter's refreshes (each at most a third of
            // the ttl) and 100 ms, from the last one.
            assert_eq!(value, "1", "{key} is not a client's mark");
            let most = ttl + ms(100);
            assert!(Duration::from_millis(pttl as u64) <= most, "{key} is kept {pttl} ms, past {most:?}");
            continue;
        }
        assert!(Duration::from_millis(pttl as u64) <= ttl, "{key} is kept {pttl} ms, past its lease of {ttl:?}");
        if key.ends_with(":last") {
            // A hand-over's last token, kept for the heir's ttl: `<fence>:<the releasing token's second half>:<the
            // released grant's fence>`.
            let fields: Vec<&str> = value.split(':').collect();
            let [fence, half, released] = fields[..] else { panic!("{key} is not a last token: {value:?}") };
            let digits = fence.parse::<u64>().is_ok() && released.parse::<u64>().is_ok();
            let half_token = half.len() <= 16 && half.bytes().all(|b| b.is_ascii_hexdigit());
            assert!(digits && half_token, "{key} is not a last token: {value:?}");
            continue;
        }
        assert!(freed_fence(&value).is_some(), "{key} is not a freed record: {value:?}");
    }
    // Redis expires them by itself (its active expiry samples keys ten times a second).
    let deadline = tokio::time::Instant::now() + ttl + secs(20);
    loop {
        let left: u64 = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
        if left == 0 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{left} keys left {:?} after their leases", ttl + secs(20));
        tokio::time::sleep(ms(100)).await;
    }
}

/// A released lock's record is freed in place: FREED over its token, the last token and the lease's expiry
/// kept (SETRANGE writes no new expiry), and the next grant follows that token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_freed_record_keeps_the_last_token_for_the_rest_of_its_lease() {
    let server = RedisServer::new();
    let client = client(&server).await;
    let record = client.record_key("report:3");
    let mut conn = server.connection().await;

    let guard = client.lock("report:3").ttl(secs(5)).acquire().await.expect("acquire");
    let first = guard.fencing_token();
    // Time for the lease to run down, so that a kept expiry shows against a new one.
    tokio::time::sleep(ms(300)).await;
    guard.release().await.expect("release");
    let value: String = redis::cmd("GET").arg(&record).query_async(&mut conn).await.unwrap();
    assert!(value.starts_with(FREED), "FREED over the holder's token: {value:?}");
    assert_eq!(freed_fence(&value), Some(first), "the freed record keeps the last token: {value:?}");
    let left = pttl(&mut conn, &record).await;
    assert!(left > 0 && left <= 4_700, "the freed record keeps the lease's expiry: PTTL {left}");
    assert!(client.lock_info("report:3").await.expect("lock_info").is_none(), "a freed lock reads as free");
    let listed = client.list_locks("*").next_page().await.expect("list_locks");
    assert_eq!(listed, None, "a freed lock is listed as held");

    let second = fence_of_one_grant(&client, "report:3").await;
    assert!(second > first, "tokens rise: {first} then {second}");
    client.lock("report:3").ttl(secs(5)).acquire().await.expect("acquire").release().await.expect("release");
    assert!(!client.force_unlock("report:3").await.expect("force_unlock"), "a freed lock reads as held");
}

/// A last token ahead of the server's clock (as after the clock stepped back) is followed by the next number,
/// and one far behind it by the clock; a key of an earlier design (`:fence`) is neither read nor written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_follow_a_last_token_ahead_of_the_clock_and_the_clock_past_an_old_one() {
    let server = RedisServer::new();
    let client = client(&server).await;
    let mut conn = server.connection().await;

    let ahead_record = client.record_key("report:4");
    let ahead: u64 = 9_000_000_000_000_000;
    let freed = freed_record(ahead);
    let () = redis::cmd("SET").arg(&ahead_record).arg(freed).arg("PX").arg(5000).query_async(&mut conn).await.unwrap();
    assert_eq!(fence_of_one_grant(&client, "report:4").await, ahead + 1);
    assert_eq!(fence_of_one_grant(&client, "report:4").await, ahead + 2);

    let old_record = client.record_key("report:5");
    let freed = freed_record(7);
    let () = redis::cmd("SET").arg(&old_record).arg(freed).arg("PX").arg(5000).query_async(&mut conn).await.unwrap();
    let old_fence_key = format!("{old_record}:fence");
    let () = redis::cmd("SET").arg(&old_fence_key).arg(9_100_000_000_000_000u64).query_async(&mut conn).await.unwrap();
    let token = fence_of_one_grant(&client, "report:5").await;
    assert!((1_600_000_000_000_000..9_000_000_000_000_000).contains(&token), "the clock's µs, not 8: {token}");
    assert_eq!(pttl(&mut conn, &old_fence_key).await, -1, "the old key was touched");
}
