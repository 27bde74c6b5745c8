//! Issue 34: `--timeout` bounds connecting as `--help` says, against a server stopped with SIGSTOP (its kernel
//! accepts the connection; nothing answers). `distlock ls` took twice the timeout (4 s for the default 2 s).

use std::process::Output;
use std::time::{Duration, Instant};

use common::distlock;
use distlock_tests::sys::Stopped;
use distlock_tests::RedisServer;

mod common;

/// Scheduling slack on a loaded 2-core machine, process start included; less than the second timeout the
/// old bound added.
const SLACK: Duration = Duration::from_secs(1);

/// Runs `distlock ARGS`: its output, and how long it ran.
async fn timed_distlock(args: &[&str]) -> (Output, Duration) {
    let start = Instant::now();
    let output = distlock(args, None).await;
    (output, start.elapsed())
}

/// It failed with exit code 3 (the server could not be reached) after `timeout`, not sooner and not later than
/// `timeout` and the slack, with one line naming the timeout.
fn assert_gave_up_after(what: &str, (output, took): (Output, Duration), timeout: Duration) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(3), "{what}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{what}: {stderr}");
    assert!(stderr.contains(&format!("connect timeout ({timeout:?})")), "{what}: {stderr}");
    assert!(took >= timeout - Duration::from_millis(50), "{what}: exited after {took:?}, before its timeout: {stderr}");
    assert!(took <= timeout + SLACK, "{what}: exited after {took:?}, --timeout {timeout:?}: {stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ls_and_show_give_up_after_the_timeout_on_a_stopped_server() {
    let server = RedisServer::new();
    // Resumed (SIGCONT) when dropped, before the server is killed: also when an assertion fails.
    let _stopped = Stopped::stop(server.pid().expect("running"));
    let url = server.url();
    let (ls_args, show_args) = (["--url", &url, "ls"], ["--url", &url, "--timeout", "700ms", "show", "some-lock"]);
    let (ls, show) = tokio::join!(timed_distlock(&ls_args), timed_distlock(&show_args));
    assert_gave_up_after("ls with the default --timeout", ls, Duration::from_secs(2));
    assert_gave_up_after("show --timeout 700ms", show, Duration::from_millis(700));
}
