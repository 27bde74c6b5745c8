//! `#[distributed_lock]` against a real redis-server: exclusion, waiting, parallel keys, field paths, loss,
//! panic, cancellation and reentrancy, each through the attribute as users write it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock::{distributed_lock, with_client, Client, LockError};
use distlock_tests::RedisServer;
use redis::AsyncCommands;
use tokio::sync::{Barrier, Notify};
use tokio::time::{timeout, Instant};

/// Far above anything these tests need: a hang fails the test instead of stalling the suite.
const BOUND: Duration = Duration::from_secs(10);

async fn client(server: &RedisServer) -> Client {
    Client::builder().redis(server.url()).build().await.expect("client on the test server")
}

/// Holds `report:<id>` until `release` is notified.
#[distributed_lock(key = "report:<id>", ttl = "5s")]
async fn hold_no_wait(id: u64, entered: Arc<Notify>, release: Arc<Notify>) -> Result<(), LockError> {
    entered.notify_one();
    release.notified().await;
    Ok(())
}

#[distributed_lock(key = "report:<id>", ttl = "5s")]
async fn try_no_wait(id: u64, ran: Arc<AtomicBool>) -> Result<(), LockError> {
    ran.store(true, Ordering::SeqCst);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_call_without_wait_is_not_obtained_and_never_runs() {
    let server = RedisServer::new();
    let client = client(&server).await;
    let (entered, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let holder = tokio::spawn(with_client(client.clone(), hold_no_wait(7, Arc::clone(&entered), Arc::clone(&release))));
    timeout(BOUND, entered.notified()).await.expect("the first call entered its body");

    let ran = Arc::new(AtomicBool::new(false));
    let second = with_client(client.clone(), try_no_wait(7, Arc::clone(&ran))).await;
    assert!(matches!(&second, Err(LockError::NotObtained { key, .. }) if key == "report:7"), "got {second:?}");
    assert!(!ran.load(Ordering::SeqCst), "the body ran without the lock");

    release.notify_one();
    timeout(BOUND, holder).await.expect("holder ends").expect("no panic").expect("holder Ok");
    // Released on return: the same call now runs.
    with_client(client, try_no_wait(7, Arc::clone(&ran))).await.expect("free after the holder returned");
    assert!(ran.load(Ordering::SeqCst));
}

/// A read-sleep-write on a Redis counter: correct only if bodies never overlap.
#[distributed_lock(key = "counter:<name>", ttl = "5s", wait = "20s")]
async fn increment(
    name: &str,
    conn: redis::aio::MultiplexedConnection,
    inside: Arc<AtomicUsize>,
) -> Result<u64, LockError> {
    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two bodies overlapped");
    let mut conn = conn;
    let current: u64 = conn.get::<_, Option<u64>>("attr-counter").await.expect("GET").unwrap_or(0);
    tokio::time::sleep(Duration::from_millis(5)).await;
    let () = conn.set("attr-counter", current + 1).await.expect("SET");
    inside.fetch_sub(1, Ordering::SeqCst);
    Ok(current + 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_with_wait_all_run_in_turn() {
    let server = RedisServer::new();
    let inside = Arc::new(AtomicUsize::new(0));
    let mut calls = Vec::new();
    for _ in 0..3 {
        // Separate clients: separate owners, as separate replicas would be.
        let client = client(&server).await;
        for _ in 0..4 {
            let conn = server.connection().await;
            let inside = Arc::clone(&inside);
            calls.push(tokio::spawn(with_client(
                client.clone(),
                async move { increment("shared", conn, inside).await },
            )));
        }
    }
    for call in calls {
        timeout(BOUND * 3, call).await.expect("call ends").expect("no panic").expect("obtained within wait");
    }
    let mut conn = server.connection().await;
    let total: u64 = conn.get("attr-counter").await.expect("GET");
    assert_eq!(total, 12, "lost updates: bodies overlapped");
}

#[distributed_lock(key = "job:<id>", ttl = "5s")]
async fn meet(id: u64, barrier: Arc<Barrier>) -> Result<u64, LockError> {
    // Both bodies must be inside at once for either to pass.
    timeout(BOUND, barrier.wait()).await.map_err(|_| LockError::InvalidConfig("bodies did not overlap".into()))?;
    Ok(id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_keys_run_in_parallel() {
    let server = RedisServer::new();
    let client = client(&server).await;
    let barrier = Arc::new(Barrier::new(2));
    let a = tokio::spawn(with_client(client.clone(), meet(1, Arc::clone(&barrier))));
    let b = tokio::spawn(with_client(client.clone(), meet(2, Arc::clone(&barrier))));
    assert_eq!(a.await.expect("no panic").expect("job 1"), 1);
    assert_eq!(b.await.expect("no panic").expect("job 2"), 2);
}

struct Tenant {
    tenant: String,
}

struct User {
    id: u32,
}

struct Request {
    user: User,
}

impl Tenant {
    #[distributed_lock(key = "tenant:<self.tenant>:user:<req.user.id>", metadata = "field-paths")]
    async fn held_key(&self, req: &Request) -> Result<Option<distlock::LockInfo>, LockError> {
        let lock = distlock::current_lock().expect("inside the body");
        assert_eq!(lock.key(), "tenant:acme:user:42");
        distlock::current_client()?.lock_info("tenant:acme:user:42").await
    }
}

#[tokio::test]
async fn field_path_keys_render_to_the_plain_lock_name() {
    let server = RedisServer::new();
    let client = client(&server).await;
    let tenant = Tenant { tenant: "acme".into() };
    let req = Request { user: User { id: 42 } };
    let info = with_client(client.clone(), tenant.held_key(&req)).await.expect("call").expect("held while running");
    assert_eq!(info.metadata, "field-paths");
    assert!(client.lock_info("tenant:acme:user:42").await.expect("info").is_none(), "released on return");
}

/// Sets its flag when dropped: tells whether the body future was dropped before it finished.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[distributed_lock(key = "lossy:<id>", ttl = "1s")]
async fn long_body_abort(
    id: u64,
    entered: Arc<Notify>,
    dropped: Arc<AtomicBool>,
    finished: Arc<AtomicBool>,
) -> Result<(), LockError> {
    let _flag = DropFlag(dropped);
    entered.notify_one();
    tokio::time::sleep(Duration::from_secs(8)).await;
    finished.store(true, Ordering::SeqCst);
    Ok(())
}

#[distributed_lock(key = "lossy:<id>", ttl = "1s", on_lost = "continue")]
async fn long_body_continue(id: u64, entered: Arc<Notify>, proceed: Arc<Notify>) -> Result<&'static str, LockError> {
    entered.notify_one();
    proceed.notified().await;
    let lock = distlock::current_lock().expect("inside the body");
    timeout(BOUND, lock.lost()).await.map_err(|_| LockError::InvalidConfig("loss not noticed".into()))?;
    Ok("finished")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_lock_drops_the_body_and_returns_lost() {
    let server = RedisServer::new();
    let client = client(&server).await;
    let (entered, dropped, finished) =
        (Arc::new(Notify::new()), Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let call = tokio::spawn(with_client(
        client.clone(),
        long_body_abort(1, Arc::clone(&entered), Arc::clone(&dropped), Arc::clone(&finished)),
    ));
    timeout(BOUND, entered.notified()).await.expect("body entered");
    let mut conn = server.connection().await;
    let removed: u32 = conn.del(client.record_key("lossy:1")).await.expect("DEL");
    assert_eq!(removed, 1, "the record existed while the body ran");
    let started = Instant::now();
    let outcome = timeout(BOUND, call).await.expect("call ends well before the body would").expect("no panic");
    assert!(matches!(&outcome, Err(LockError::Lost { key, .. }) if key == "lossy:1"), "got {outcome:?}");
    assert!(started.elapsed() < Duration::from_secs(3), "loss noticed within about a renewal interval");
    assert!(dropped.load(Ordering::SeqCst), "the body future was dropped");
    assert!(!finished.load(Ordering::SeqCst), "the body ran to completion without the lock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_lost_continue_lets_the_body_finish() {
    let server = RedisServer::new();
    let client = client(&server).await;
    let (entered, proceed) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let call =
        tokio::spawn(with_client(client.clone(), long_body_continue(2, Arc::clone(&entered), Arc::clone(&proceed))));
    timeout(BOUND, entered.notified()).await.expect("body entered");
    let mut conn = server.connection().await;
    let removed: u32 = conn.del(client.record_key("lossy:2")).await.expect("DEL");
    assert_eq!(removed, 1);
    proceed.notify_one();
    let outcome = timeout(BOUND, call).await.expect("call ends").expect("no panic");
    assert_eq!(outcome.expect("continue returns the body's output"), "finished");
}

#[distributed_lock(key = "fragile:<id>", ttl = "30s")]
async fn panicking(id: u64) -> Result<(), LockError> {
    panic!("body panics while holding fragile:{id}");
}

#[distributed_lock(key = "fragile:<id>", ttl = "30s")]
async fn slow(id: u64, entered: Arc<Notify>) -> Result<(), LockError> {
    entered.notify_one();
    std::future::pending::<()>().await;
    Ok(())
}

/// The lock is free again long before its 30 s lease would end.
async fn freed_promptly(client: &Client, key: &str) {
    let started = Instant::now();
    let guard = client.lock(key).wait(Duration::from_secs(5)).acquire().await.expect("free again");
    assert!(started.elapsed() < Duration::from_secs(5), "freed in {:?}", started.elapsed());
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panic_in_the_body_releases_promptly() {
    let server = RedisServer::new();
    let client = client(&server).await;
    let call = tokio::spawn(with_client(client.clone(), panicking(1)));
    assert!(call.await.expect_err("the panic propagates").is_panic());
    freed_promptly(&client, "fragile:1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_call_releases_promptly() {
    let server = RedisServer::new();
    let client = client(&server).await;
    let entered = Arc::new(Notify::new());
    let call = tokio::spawn(with_client(client.clone(), slow(2, Arc::clone(&entered))));
    timeout(BOUND, entered.notified()).await.expect("body entered");
    assert!(client.lock_info("fragile:2").await.expect("info").is_some(), "held while the body runs");
    call.abort();
    assert!(call.await.expect_err("aborted").is_cancelled());
    freed_promptly(&client, "fragile:2").await;
}

#[distributed_lock(key = "account:<id>", ttl = "5s")]
async fn outer(id: u64) -> Result<(u64, u64), LockError> {
    let outer_token = distlock::current_lock().expect("held").fencing_token();
    let inner_token = inner(id).await?;
    // The inner call returned: the outer hold must still be in place.
    let info = distlock::current_client()?.lock_info(&format!("account:{id}")).await?.expect("still held after inner");
    assert_eq!(info.fencing_token, outer_token);
    Ok((outer_token, inner_token))
}

#[distributed_lock(key = "account:<id>", ttl = "5s")]
async fn inner(id: u64) -> Result<u64, LockError> {
    Ok(distlock::current_lock().expect("held").fencing_token())
}

#[tokio::test]
async fn nested_calls_on_the_same_key_are_reentrant() {
    let server = RedisServer::new();
    let client = client(&server).await;
    let (outer_token, inner_token) =
        timeout(BOUND, with_client(client.clone(), outer(9))).await.expect("no self-deadlock").expect("both ran");
    assert_eq!(outer_token, inner_token, "the inner call shares the outer grant");
    assert!(client.lock_info("account:9").await.expect("info").is_none(), "released once the outer returned");
}
