//! Run-time behaviour of the code `#[distributed_lock]` generates, on the in-process backend (no Redis).
//!
//! Every test scopes its own client with `with_client`; nothing here calls `install`, so a call outside
//! `with_client` sees `NotConfigured`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use distlock::{distributed_lock, with_client, Client, LockError, LockInfo};

#[derive(Debug)]
enum AppError {
    Lock(LockError),
    Parse(std::num::ParseIntError),
}

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError::Lock(e)
    }
}

impl From<std::num::ParseIntError> for AppError {
    fn from(e: std::num::ParseIntError) -> Self {
        AppError::Parse(e)
    }
}

async fn memory() -> Client {
    Client::builder().memory().build().await.expect("memory client")
}

/// What the lock looks like from inside the body, looked up by the key the test expects.
async fn info(key: &str) -> Result<Option<LockInfo>, LockError> {
    distlock::current_client()?.lock_info(key).await
}

#[distributed_lock(key = "report:<id>")]
async fn report(id: u64, expected_key: &str) -> Result<Option<LockInfo>, LockError> {
    let _ = id;
    info(expected_key).await
}

#[tokio::test]
async fn key_is_rendered_like_a_plain_lock_and_released_on_return() {
    let client = memory().await;
    let seen = with_client(client.clone(), report(42, "report:42")).await.expect("runs");
    let seen = seen.expect("the body runs holding `report:42`");
    assert_eq!(seen.metadata, concat!(module_path!(), "::report"));
    assert!(client.lock_info("report:42").await.expect("lookup").is_none(), "released before returning");
}

#[distributed_lock(key = "pair:<a>:<b>")]
async fn pair(a: &str, b: &str, expected_key: &str) -> Result<bool, LockError> {
    let _ = (a, b);
    Ok(info(expected_key).await?.is_some())
}

#[tokio::test]
async fn placeholder_values_are_escaped() {
    let client = memory().await;
    assert!(with_client(client.clone(), pair("1:2", "3", "pair:1%3A2:3")).await.expect("runs"));
    assert!(with_client(client, pair("1", "2:3", "pair:1:2%3A3")).await.expect("runs"));
}

struct Tenant {
    name: String,
}

struct Req<'a> {
    tenant: &'a Tenant,
    ids: (u32, u32),
}

impl Tenant {
    #[distributed_lock(key = "tenant:<self.name>:<req.ids.1>", metadata = "tenant <self.name>: job <req.ids.0> <<x>>")]
    async fn job(&self, req: &Req<'_>, expected_key: &str) -> Result<Option<LockInfo>, LockError> {
        assert_eq!(req.tenant.name, self.name);
        info(expected_key).await
    }
}

#[tokio::test]
async fn field_paths_and_metadata() {
    let client = memory().await;
    let tenant = Tenant { name: "acme".into() };
    let req = Req { tenant: &tenant, ids: (1, 7) };
    let seen = with_client(client, tenant.job(&req, "tenant:acme:7")).await.expect("runs");
    assert_eq!(seen.expect("held").metadata, "tenant acme: job 1 <x>");
}

#[distributed_lock(key = "parse:<input>")]
async fn parse(input: &str) -> Result<u64, AppError> {
    if input.is_empty() {
        return Ok(0);
    }
    let n: u64 = input.parse()?;
    Ok(n * 2)
}

#[tokio::test]
async fn question_mark_and_return_behave_as_without_the_attribute() {
    let client = memory().await;
    assert_eq!(with_client(client.clone(), parse("21")).await.expect("parses"), 42);
    assert_eq!(with_client(client.clone(), parse("")).await.expect("early return"), 0);
    let err = with_client(client.clone(), parse("x")).await.expect_err("not a number");
    assert!(matches!(err, AppError::Parse(ref e) if !e.to_string().is_empty()), "{err:?}");
    assert!(client.lock_info("parse:x").await.expect("lookup").is_none(), "released after an error");
}

static RAN: AtomicBool = AtomicBool::new(false);

#[distributed_lock(key = "unconfigured")]
async fn unconfigured() -> Result<(), AppError> {
    RAN.store(true, Ordering::SeqCst);
    Ok(())
}

#[tokio::test]
async fn without_a_client_the_body_never_runs() {
    let err = unconfigured().await.expect_err("no client installed in this test binary");
    assert!(matches!(err, AppError::Lock(LockError::NotConfigured)), "{err:?}");
    assert!(!RAN.load(Ordering::SeqCst));
}

#[distributed_lock(key = "busy:<id>")]
async fn no_wait(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(key = "busy:<id>", wait = "5s")]
async fn with_wait(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[tokio::test]
async fn busy_lock_is_not_obtained_without_wait_and_obtained_with_it() {
    let client = memory().await;
    let guard = client.lock("busy:1").acquire().await.expect("first holder");
    let err = with_client(client.clone(), no_wait(1)).await.expect_err("busy");
    assert!(matches!(err, LockError::NotObtained { ref key, .. } if key == "busy:1"), "{err:?}");

    let waiter = tokio::spawn(with_client(client.clone(), with_wait(1)));
    tokio::time::sleep(Duration::from_millis(100)).await;
    guard.release().await.expect("release");
    waiter.await.expect("task").expect("obtained after the release");
}

#[distributed_lock(key = "tick", ttl = "10s", min_hold = "2s")]
async fn tick() -> Result<(), LockError> {
    Ok(())
}

#[tokio::test]
async fn min_hold_keeps_the_lock_after_return() {
    let client = memory().await;
    with_client(client.clone(), tick()).await.expect("first tick runs");
    assert!(client.lock_info("tick").await.expect("lookup").is_some(), "still held for min_hold");
    let err = with_client(client, tick()).await.expect_err("a second replica skips this tick");
    assert!(matches!(err, LockError::NotObtained { .. }), "{err:?}");
}

#[distributed_lock(key = "hangs", ttl = "200ms", max_hold = "300ms")]
async fn hangs() -> Result<(), LockError> {
    std::future::pending::<()>().await;
    Ok(())
}

#[tokio::test]
async fn max_hold_stops_a_body_that_hangs() {
    let client = memory().await;
    let outcome = tokio::time::timeout(Duration::from_secs(10), with_client(client.clone(), hangs()))
        .await
        .expect("max_hold ended the call");
    assert!(matches!(outcome, Err(LockError::Lost { ref key, .. }) if key == "hangs"), "{outcome:?}");
    let again = client.lock("hangs").wait(Duration::from_secs(5)).acquire().await;
    assert!(again.is_ok(), "the lock frees once the capped lease runs out: {again:?}");
}

#[distributed_lock(key = "single", retry = "none")]
async fn single_attempt() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "spaced", wait = "5s", retry = "linear 50ms")]
async fn spaced() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "spaced", wait = "5s", retry = "exponential 10ms..100ms")]
async fn growing() -> Result<(), LockError> {
    Ok(())
}

#[tokio::test]
async fn retry_strategies_reach_the_request() {
    let client = memory().await;
    let held = client.lock("single").acquire().await.expect("holder");
    let err = with_client(client.clone(), single_attempt()).await.expect_err("busy");
    assert!(matches!(err, LockError::NotObtained { .. }), "{err:?}");
    held.release().await.expect("release");
    with_client(client.clone(), single_attempt()).await.expect("free");

    for linear in [true, false] {
        let held = client.lock("spaced").acquire().await.expect("holder");
        let waiter = if linear {
            tokio::spawn(with_client(client.clone(), spaced()))
        } else {
            tokio::spawn(with_client(client.clone(), growing()))
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        held.release().await.expect("release");
        waiter.await.expect("task").expect("obtained after the release");
    }
}
