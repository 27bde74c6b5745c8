//! Running the `distlock` binary, as the CLI's test binaries share it (each includes this module).

use std::process::{Output, Stdio};
use std::time::Duration;

use tokio::io::AsyncWriteExt;

/// `distlock ARGS` as the tests start it: without `$REDIS_URL`, standard input `/dev/null` (never a terminal),
/// standard output and error piped.
pub fn command(args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_distlock"));
    cmd.args(args).env_remove("REDIS_URL").stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd
}

/// Runs `distlock ARGS` to its end, with `stdin` as its standard input (none: `/dev/null`).
pub async fn distlock(args: &[&str], stdin: Option<&str>) -> Output {
    let mut cmd = command(args);
    if stdin.is_some() {
        cmd.stdin(Stdio::piped());
    }
    let mut child = cmd.spawn().expect("run distlock");
    if let Some(text) = stdin {
        let mut pipe = child.stdin.take().expect("stdin");
        pipe.write_all(text.as_bytes()).await.expect("write stdin");
    }
    tokio::time::timeout(Duration::from_secs(60), child.wait_with_output()).await.expect("distlock hung").expect("wait")
}
