//! The stepped-clock redis-server (issue 31's test infrastructure): the `LD_PRELOAD` shim starts promptly under
//! Redis's jemalloc, `TIME` and key expiry follow the steps back and forward, and a restart keeps the shim and
//! the offset. Each test skips, printing why, when there is no C compiler to build the shim with.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use distlock_tests::time::secs;
use distlock_tests::{within, RedisServer};
use redis::aio::MultiplexedConnection;

/// How far the server's clock may be from the real clock plus the offset: the shim is exact, so this only
/// covers the time between reading the local clock and the server answering on a loaded machine.
const SLACK_US: i64 = 500_000;

/// The real wall clock, in microseconds since the epoch.
fn local_us() -> i64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).expect("after the epoch");
    i64::try_from(now.as_micros()).expect("fits")
}

/// The server's `TIME`, in microseconds since the epoch.
async fn server_us(conn: &mut MultiplexedConnection) -> i64 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(conn).await.expect("TIME");
    secs * 1_000_000 + micros
}

/// Asserts the server's clock reads the real time plus `offset_ms`, within [`SLACK_US`].
async fn assert_clock(conn: &mut MultiplexedConnection, offset_ms: i64, when: &str) {
    let before = local_us();
    let server = server_us(conn).await;
    let after = local_us();
    let offset = offset_ms * 1000;
    assert!(
        before + offset - SLACK_US <= server && server <= after + offset + SLACK_US,
        "{when}: TIME is {server} µs, expected {offset_ms} ms from the real time ({before}..{after} µs): \
         {} ms off",
        (server - (before + after) / 2 - offset) / 1000
    );
}

async fn pttl(conn: &mut MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query_async(conn).await.expect("PTTL")
}

#[tokio::test]
async fn starts_promptly_and_time_follows_the_steps() {
    // libfaketime hangs here at start-up (jemalloc); the shim must not. `with_stepped_clock` itself gives up
    // after 10 s without a PING answer; this bounds the whole start, compiling the shim included.
    let started = Instant::now();
    let server = within(secs(20), "start of a stepped-clock redis-server", async {
        tokio::task::spawn_blocking(RedisServer::with_stepped_clock).await.expect("start thread")
    })
    .await;
    let Some(server) = server else { return };
    eprintln!("compiled the shim and started redis-server in {:?}", started.elapsed());
    let mut conn = server.connection().await;

    assert_eq!(server.clock_offset(), 0);
    assert_clock(&mut conn, 0, "at start").await;

    server.step_clock(-2000);
    assert_eq!(server.clock_offset(), -2000);
    assert_clock(&mut conn, -2000, "stepped back 2 s").await;

    server.step_clock(2000);
    assert_clock(&mut conn, 0, "stepped forward 2 s again").await;

    server.step_clock(3500);
    assert_clock(&mut conn, 3500, "stepped forward 3.5 s more").await;

    server.set_clock_offset(-86_400_000);
    assert_eq!(server.clock_offset(), -86_400_000);
    assert_clock(&mut conn, -86_400_000, "set a day back").await;
}

#[tokio::test]
async fn keys_expire_by_the_stepped_clock() {
    let Some(server) = RedisServer::with_stepped_clock() else { return };
    let mut conn = server.connection().await;
    let () = redis::cmd("SET").arg("short").arg("v").arg("PX").arg(5000).query_async(&mut conn).await.expect("SET");
    let () = redis::cmd("SET").arg("long").arg("v").arg("PX").arg(60_000).query_async(&mut conn).await.expect("SET");

    // The remaining time to live is the expiry minus the server's clock: it moves with every step.
    server.step_clock(3000);
    let left = pttl(&mut conn, "short").await;
    assert!((1000..=2000).contains(&left), "3 s forward: PTTL {left} ms, expected about 2000");

    server.step_clock(-10_000);
    let left = pttl(&mut conn, "short").await;
    assert!((11_000..=12_000).contains(&left), "then 10 s back: PTTL {left} ms, expected about 12000");

    // 9 s ahead of the real clock: past the 5 s key's expiry, not the 60 s key's.
    server.step_clock(16_000);
    let short: Option<String> = redis::cmd("GET").arg("short").query_async(&mut conn).await.expect("GET");
    assert_eq!(short, None, "a PX 5000 key after the clock stepped 9 s ahead");
    let left = pttl(&mut conn, "long").await;
    assert!((50_000..=51_000).contains(&left), "9 s ahead: the PX 60000 key's PTTL {left} ms, expected about 51000");
}

#[tokio::test]
async fn restart_keeps_the_shim_and_the_offset() {
    let Some(mut server) = RedisServer::with_stepped_clock() else { return };
    let mut conn = server.connection().await;
    let () = redis::cmd("SET").arg("plain").arg("v").query_async(&mut conn).await.expect("SET");
    server.step_clock(-5000);
    let before = server.pid().expect("running");

    server.restart();
    let pid = server.pid().expect("running");
    assert_ne!(pid, before, "restart starts a new process");
    // Not /proc/PID/environ: redis-server writes its process title over it.
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("the new process's memory map");
    assert!(maps.contains("/clockshim.so"), "the restarted redis-server runs without the shim:\n{maps}");

    let mut conn = server.connection().await;
    let plain: Option<String> = redis::cmd("GET").arg("plain").query_async(&mut conn).await.expect("GET");
    assert_eq!(plain, None, "a restart persists nothing");
    assert_eq!(server.clock_offset(), -5000);
    assert_clock(&mut conn, -5000, "restarted 5 s back").await;
    server.step_clock(5000);
    assert_clock(&mut conn, 0, "restarted, then stepped forward 5 s").await;
}

#[test]
#[should_panic(expected = "this redis-server has no stepped clock")]
fn a_plain_server_has_no_clock_to_step() {
    RedisServer::new().step_clock(1000);
}

/// The offset is read on every clock call, so a step is seen at once, also by a server busy with commands.
#[tokio::test]
async fn steps_are_seen_at_once() {
    let Some(server) = RedisServer::with_stepped_clock() else { return };
    let mut conn = server.connection().await;
    for step in 1..=20 {
        server.set_clock_offset(step * 60_000);
        assert_clock(&mut conn, step * 60_000, &format!("step {step}")).await;
    }
}
