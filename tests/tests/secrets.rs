//! Issue 36: secrets stay hidden when a server's error echoes what it was sent.

use distlock::Client;
use distlock_tests::RedisServer;

/// Whether `text` holds a whole lock token: a run of exactly 32 hex digits.
fn has_whole_token(text: &str) -> bool {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let run = bytes[i..].iter().take_while(|b| b.is_ascii_hexdigit()).count();
        if run == 32 {
            return true;
        }
        i += run.max(1);
    }
    false
}

/// A server without EVALSHA answers every lock script with "unknown command 'EVALSHA', with args beginning
/// with: …", the startup check's token among them. The build fails with that error, and neither its text nor
/// its `Debug` nor the captured log shows a whole token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_error_echoing_script_arguments_shows_no_whole_token() {
    let logs = distlock_tests::logs::capture();
    let server = RedisServer::with_args(["--rename-command", "EVALSHA", ""]);
    let url = server.url();
    let failed = Client::builder().redis(url.clone()).build().await.expect_err("no EVALSHA, no locks");
    let (shown, debug) = (failed.to_string(), format!("{failed:?}"));
    assert!(shown.contains("EVALSHA"), "the server's error is not in the message: {shown}");
    assert!(!has_whole_token(&shown), "a token in the error: {shown}");
    assert!(!has_whole_token(&debug), "a token in the error's Debug: {debug}");
    let port = server.port().to_string();
    for line in logs.lines().iter().filter(|line| format!("{line:?}").contains(&port)) {
        assert!(!has_whole_token(&format!("{line:?}")), "a token in the log: {line:?}");
    }
}
