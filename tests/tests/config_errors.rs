//! Wrong configurations a new user makes, against a real redis-server with a password: each error says what
//! is wrong and what to do, never shows the password, and prints each cause once however it is printed.

use distlock::{BackendErrorKind, Client, LockError};
use distlock_tests::RedisServer;

const PASSWORD: &str = "sesame-7f3a";

/// The whole chain as anyhow's `{:#}` prints it: each error's message, then its sources'.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}

/// A server started with `--requirepass PASSWORD`.
async fn protected_server() -> RedisServer {
    RedisServer::with_password(PASSWORD)
}

async fn build_error(url: &str) -> LockError {
    match Client::builder().redis(url).build().await {
        Ok(_) => panic!("{url} was accepted"),
        Err(e) => e,
    }
}

/// The error is a backend error of `kind`.
fn assert_kind(e: &LockError, kind: BackendErrorKind) {
    assert!(matches!(e, LockError::Backend(b) if b.kind() == kind), "expected {kind:?}: {e:?}");
}

/// The chain holds `needle` once and never the password or a wrong one.
fn assert_says(e: &LockError, needles: &[&str], secret: &str) {
    let text = chain(e);
    for needle in needles {
        assert!(text.contains(needle), "`{needle}` missing from: {text}");
    }
    assert!(!text.contains(secret), "the password shows in: {text}");
    assert!(!text.contains("other program"), "misleading advice in: {text}");
    // No cause printed twice (a message that also returns its cause from `source()`).
    let server_part = text.split("failed: ").nth(1).map(|rest| rest.split(';').next().unwrap_or(rest).to_owned());
    if let Some(part) = server_part.filter(|p| p.len() > 8) {
        assert_eq!(text.matches(part.as_str()).count(), 1, "a cause printed twice: {text}");
    }
}

#[tokio::test]
async fn a_server_that_needs_a_password_says_how_to_give_it() {
    let server = protected_server().await;
    let e = build_error(&server.url()).await;
    assert_says(&e, &["requires a password", "redis://:PASSWORD@", "redis://USER:PASSWORD@"], PASSWORD);
    assert!(!e.is_transient() && !e.is_busy());
    assert_kind(&e, BackendErrorKind::Refused);
}

#[tokio::test]
async fn a_wrong_password_or_user_says_which_part_to_check() {
    let server = protected_server().await;
    for url in [
        format!("redis://:wrong-pw@127.0.0.1:{}/", server.port()),
        format!("redis://bob:wrong-pw@127.0.0.1:{}/", server.port()),
    ] {
        let e = build_error(&url).await;
        assert_says(&e, &["refused the user name or password", "redis://USER:PASSWORD@", ":***@"], "wrong-pw");
        assert_kind(&e, BackendErrorKind::Refused);
    }
    // The right one works.
    let url = format!("redis://:{PASSWORD}@127.0.0.1:{}/", server.port());
    Client::builder().redis(url).build().await.expect("the right password is accepted");
}

#[tokio::test]
async fn a_database_index_out_of_range_names_the_index_and_the_setting() {
    let server = protected_server().await;
    let e = build_error(&format!("redis://:{PASSWORD}@127.0.0.1:{}/99", server.port())).await;
    assert_says(&e, &["database 99 does not exist", "`databases 16`", "0 to 15"], PASSWORD);
}

#[tokio::test]
async fn a_url_without_scheme_shows_the_accepted_forms() {
    let e = build_error("localhost:6379").await;
    assert!(matches!(e, LockError::InvalidConfig(_)), "{e:?}");
    assert_says(&e, &["did you mean redis://localhost:6379/", "redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]"], "\0");
    // Issue 34: with a trailing slash, the suggestion has one slash, not two.
    let e = build_error("localhost:6390/").await;
    assert_says(&e, &["did you mean redis://localhost:6390/ ?"], "6390//");
    let e = build_error("redis://:pw-secret@[::1").await;
    assert_says(&e, &["accepted forms", "rediss://"], "pw-secret");
}

#[tokio::test]
async fn a_refused_connection_is_transient_and_says_so() {
    let port = distlock_tests::free_port();
    let e = build_error(&format!("redis://:{PASSWORD}@127.0.0.1:{port}/")).await;
    assert_says(&e, &["could not reach the server", "is running"], PASSWORD);
    assert!(e.is_transient(), "a refused connection may succeed later: {e:?}");
    assert_kind(&e, BackendErrorKind::Unreachable);
}
