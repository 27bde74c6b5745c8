//! Redis-only behaviour: lock holders in other processes that crash or are killed, a server restart, an
//! unreachable server — what an in-process backend cannot show.

use std::time::Duration;

use distlock::{Client, LockError, ReleaseOutcome};
use distlock_tests::time::{ms, secs};
use distlock_tests::{acquire_after_recovery, free_port, within, Backend, Fixture};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::time::Instant;

/// Spawns `hold_lock` on `key` and waits for its `ACQUIRED <token>` line.
async fn spawn_holder(fx: &Fixture, key: &str, ttl: Duration, mode: &str) -> (tokio::process::Child, u64) {
    let url = fx.server().expect("redis fixture").url();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_hold_lock"))
        .args([url.as_str(), key, &ttl.as_millis().to_string(), mode])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn hold_lock");
    let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
    let mut line = String::new();
    within(secs(20), "hold_lock's ACQUIRED line", stdout.read_line(&mut line)).await.expect("read hold_lock's stdout");
    // Keep reading: a closed pipe would make the child's next report fail and end it while it should hold.
    tokio::spawn(async move {
        let mut rest = String::new();
        while stdout.read_line(&mut rest).await.is_ok_and(|n| n > 0) {
            rest.clear();
        }
    });
    let token = line
        .trim()
        .strip_prefix("ACQUIRED ")
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("unexpected line from hold_lock: {line:?}"));
    (child, token)
}

/// A process that aborts while holding the lock (no release, no destructors) frees it within about one
/// ttl: the lease runs out, and a waiter notices without being told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_crashed_process_frees_lock_within_ttl() {
    const KEY: &str = "crash";
    let ttl = ms(1500);
    let fx = Fixture::redis().await;
    let (mut child, token) = spawn_holder(&fx, KEY, ttl, "abort").await;
    let status = within(secs(10), "hold_lock aborts", child.wait()).await.expect("wait");
    let aborted_at = Instant::now();
    assert!(!status.success(), "hold_lock was meant to abort: {status}");

    let info = fx.client().lock_info(KEY).await.unwrap().expect("an aborted holder does not release");
    assert_eq!(info.fencing_token, token);

    let guard =
        fx.client().lock(KEY).wait(secs(15)).acquire().await.expect("free once the dead holder's lease ran out");
    let freed = aborted_at.elapsed();
    assert!(freed <= ttl + ms(1500), "freed {freed:?} after the crash, ttl {ttl:?}");
    assert!(guard.fencing_token() > token);
}

/// Another process keeps its 1 s lease alive with its watchdog for several leases; once it is killed
/// (SIGKILL), the lock is free within about one ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_process_frees_lock_within_ttl() {
    const KEY: &str = "killed";
    let ttl = secs(1);
    let fx = Fixture::redis().await;
    let (mut child, token) = spawn_holder(&fx, KEY, ttl, "hold").await;

    // Work time, not an outcome: the child's watchdog must carry the lease past 2.5 ttl.
    tokio::time::sleep(ms(2500)).await;
    let info = fx.client().lock_info(KEY).await.unwrap().expect("the live holder's watchdog renews");
    assert_eq!(info.fencing_token, token);
    assert!(fx.client().lock(KEY).try_acquire().await.unwrap().is_none());

    child.kill().await.expect("kill hold_lock");
    let killed_at = Instant::now();
    let guard =
        fx.client().lock(KEY).wait(secs(15)).acquire().await.expect("free once the killed holder's lease ran out");
    let freed = killed_at.elapsed();
    assert!(freed <= ttl + ms(1500), "freed {freed:?} after the kill, ttl {ttl:?}");
    assert!(guard.fencing_token() > token);
}

/// The server restarts (losing every key) while a guard holds a lock: the guard reports the loss, and the
/// same client reconnects and can lock again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_server_restart_loses_lock_and_client_recovers() {
    distlock_tests::wall_clock::again_if_the_wall_clock_stepped(|| async {
        const KEY: &str = "restart";
        let mut fx = Fixture::redis().await;
        let guard = fx.client().lock(KEY).ttl(secs(1)).acquire().await.expect("acquire");
        let before = guard.fencing_token();
        fx.server_mut().expect("redis fixture").restart();

        within(secs(5), "the guard notices the restart", guard.lost()).await;
        assert!(guard.is_lost());
        drop(guard);

        let recovered = acquire_after_recovery(Instant::now() + secs(10), "after the server restarted", || {
            fx.client().lock(KEY).wait(secs(5))
        });
        let again = within(secs(20), "lock after the restart", recovered).await;
        // The counter went with the data; a new grant still works and is reported consistently.
        let info = fx.client().lock_info(KEY).await.unwrap().expect("held");
        assert_eq!(info.fencing_token, again.fencing_token());
        eprintln!("fencing token {before} before the restart, {} after", again.fencing_token());
        assert!(matches!(again.release().await.expect("release"), ReleaseOutcome::Released));
    })
    .await
}

/// An unreachable server gives a backend error naming the server, with the password redacted.
#[tokio::test]
async fn redis_unreachable_server_error_names_url_without_password() {
    let port = free_port();
    let url = format!("redis://user:secret@127.0.0.1:{port}/");
    let result =
        within(secs(20), "connecting to a closed port", Client::builder().redis(url).connect_timeout(secs(2)).build())
            .await;
    let err = result.expect_err("nothing listens on the port");
    let text = err.to_string();
    let debug = format!("{err:?}");
    assert!(matches!(err, LockError::Backend(_)), "{debug}");
    assert!(text.contains(&format!("127.0.0.1:{port}")), "the error does not name the server: {text}");
    assert!(!text.contains("secret"), "password in the error text: {text}");
    assert!(!debug.contains("secret"), "password in the error's Debug: {debug}");
}

/// The two test fixtures really are the two backends.
#[tokio::test]
async fn fixtures_use_the_named_backends() {
    let fx = Fixture::redis().await;
    assert_eq!(fx.backend(), Backend::Redis);
    let guard = fx.client().lock("where").acquire().await.unwrap();
    let mut conn = fx.redis_connection().unwrap();
    let exists: i64 = redis::cmd("EXISTS").arg(fx.client().record_key("where")).query_async(&mut conn).await.unwrap();
    assert_eq!(exists, 1, "the redis fixture's lock is not in its server");
    drop(guard);

    let fx = Fixture::memory().await;
    assert_eq!(fx.backend(), Backend::Memory);
    assert!(fx.server().is_none());
}
