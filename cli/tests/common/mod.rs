//! What the CLI's test binaries share: running `distlock`, reading its output, a client holding locks.

// Each test binary uses its own part of these.
#![allow(dead_code)]

use std::process::{Output, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The lease of the locks the tests hold: longer than any test.
pub const TTL: Duration = Duration::from_secs(30);

/// `distlock ARGS` with its output piped, and no `$REDIS_URL` from the test's environment.
fn command(args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_distlock"));
    cmd.args(args).env_remove("REDIS_URL").stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd
}

/// Runs `distlock ARGS`, with `stdin` as its standard input (none: `/dev/null`, so never a terminal).
pub async fn distlock(args: &[&str], stdin: Option<&str>) -> Output {
    let mut cmd = command(args);
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    let mut child = cmd.spawn().expect("run distlock");
    if let Some(text) = stdin {
        let mut pipe = child.stdin.take().expect("stdin");
        pipe.write_all(text.as_bytes()).await.expect("write stdin");
    }
    tokio::time::timeout(Duration::from_secs(60), child.wait_with_output()).await.expect("distlock hung").expect("wait")
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The exit code, with the output in the message when it is not `expected`.
pub fn assert_exit(output: &Output, expected: i32) {
    assert_eq!(
        output.status.code(),
        Some(expected),
        "exit status {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        stdout(output),
        stderr(output)
    );
}

/// A failure prints exactly one line on stderr, and nothing on stdout.
pub fn assert_one_error_line(output: &Output) -> String {
    let err = stderr(output);
    assert_eq!(err.lines().count(), 1, "stderr: {err}");
    assert!(err.starts_with("distlock: "), "stderr: {err}");
    assert!(output.stdout.is_empty(), "stdout: {}", stdout(output));
    err
}

/// Starts `distlock ARGS` (a `watch`) with piped output, and reads until its output shows `needle`: the child,
/// its standard output and what was read so far.
pub async fn watch_until(args: &[&str], needle: &str) -> (tokio::process::Child, tokio::process::ChildStdout, Vec<u8>) {
    let mut child = command(args).stdin(Stdio::null()).spawn().expect("run distlock watch");
    let mut out = child.stdout.take().expect("stdout");
    let mut seen = Vec::new();
    read_until(&mut out, &mut seen, needle).await;
    (child, out, seen)
}

/// Reads `out` into `seen` until `seen` shows `needle` (30 s at most for each read).
pub async fn read_until(out: &mut tokio::process::ChildStdout, seen: &mut Vec<u8>, needle: &str) {
    while !String::from_utf8_lossy(seen).contains(needle) {
        let mut buf = [0; 4096];
        let n = tokio::time::timeout(Duration::from_secs(30), out.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("no {needle:?} within 30 s in: {}", String::from_utf8_lossy(seen)))
            .unwrap();
        assert!(n > 0, "watch ended before {needle:?}: {}", String::from_utf8_lossy(seen));
        seen.extend_from_slice(&buf[..n]);
    }
}

/// A client on `url` whose records name `owner`.
pub async fn client(url: &str, owner: &str) -> distlock::Client {
    distlock::Client::builder().redis(url).owner(owner).build().await.expect("client")
}
