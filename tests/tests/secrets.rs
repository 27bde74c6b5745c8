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

/// Issue 36, defect 5: another program's value at a lock's key. Every request for the lock fails with an error
/// that names the key, says distlock did not write the value, and how to clear it; nothing says an ACL refused
/// anything, and `lock_info`'s message has no stray `"the":`. `force_unlock` deletes it and says so (WARN).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_data_at_a_lock_s_key_gives_an_error_that_says_so() {
    let logs = distlock_tests::logs::capture();
    let server = RedisServer::new();
    let client = Client::builder().redis(server.url()).build().await.expect("client");
    let mut conn = server.connection().await;
    let (string, list) = (client.record_key("foreign:string"), client.record_key("foreign:list"));
    let () = redis::cmd("SET").arg(&string).arg("hello").query_async(&mut conn).await.unwrap();
    let _: i64 = redis::cmd("RPUSH").arg(&list).arg("a").query_async(&mut conn).await.unwrap();
    for key in ["foreign:string", "foreign:list"] {
        let acquired = client.lock(key).acquire().await.expect_err("another program's value is no lock");
        let info = client.lock_info(key).await.expect_err("another program's value is no lock");
        for error in [acquired.to_string(), info.to_string()] {
            assert!(error.contains(&format!("`{key}`")), "the key is not named: {error}");
            assert!(error.contains("distlock did not write"), "{error}");
            assert!(error.contains("force_unlock") && error.contains("key_prefix"), "no way out: {error}");
            assert!(!error.contains("ACL") && !error.contains("\"the\":"), "{error}");
        }
        assert!(client.force_unlock(key).await.expect("force_unlock"), "the value was there");
        let warned = logs.matching(tracing::Level::WARN, &["did not write"]);
        assert!(warned.iter().any(|line| format!("{line:?}").contains(key)), "force_unlock deleted it silently");
        let guard = client.lock(key).acquire().await.expect("the lock works once the value is gone");
        guard.release().await.expect("release");
    }
}

/// Issue 36: every URL form the builder accepts, with `@ / % : ? #` in the password, as typed and
/// percent-encoded: no four bytes of the password appear in the builder's `Debug`, the build error's `Display`
/// or `Debug`, or the captured log. (The CLI's stderr: `a_wrong_password_in_any_url_form_is_never_echoed` in
/// cli/tests/cli.rs.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_url_form_shows_its_password() {
    let logs = distlock_tests::logs::capture();
    let server = RedisServer::with_password("the-right-one");
    let port = server.port();
    let socket = server.unix_socket();
    let socket = socket.display();
    let passwords =
        ["sEcr3t@Qx", "sEcr3t/Qx", "sEcr3t%Qx", "sEcr3t:Qx", "sEcr3t?Qx", "sEcr3t#Qx", "sEcr3t%40Qx%2F%3F%23k"];
    for password in passwords {
        let forms = [
            format!("redis://:{password}@127.0.0.1:{port}/"),
            format!("redis://user:{password}@127.0.0.1:{port}/"),
            format!("redis://{password}@127.0.0.1:{port}/"),
            format!("rediss://:{password}@127.0.0.1:{port}/"),
            format!("redis+unix://{socket}?pass={password}"),
            format!("redis+unix://{socket}?user=u&pass={password}"),
        ];
        for url in forms {
            let builder = Client::builder().redis(url.clone());
            let mut texts = vec![format!("{builder:?}")];
            match builder.build().await {
                Ok(_) => panic!("{url}: a wrong password was accepted"),
                Err(e) => texts.extend([e.to_string(), format!("{e:?}")]),
            }
            for text in &texts {
                for piece in password.as_bytes().windows(4) {
                    let piece = String::from_utf8_lossy(piece);
                    assert!(!text.contains(piece.as_ref()), "{url}: `{piece}` of its password in {text}");
                }
            }
        }
    }
    let logged = logs.dump();
    for password in passwords {
        for piece in password.as_bytes().windows(4) {
            let piece = String::from_utf8_lossy(piece);
            assert!(!logged.contains(piece.as_ref()), "`{piece}` of a password in the log");
        }
    }
}
