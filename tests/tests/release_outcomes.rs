//! Issue 31, schedule 5: a release whose reply is lost reports the true outcome.
//!
//! The release runs in Redis (the lock is freed, kept by `min_hold`, or handed to a waiter), the connection
//! drops before the reply, and the client sends the release again after it reconnects. The second run finds
//! the record freed or handed over; it must recognise its own completed release (the freed record keeps the
//! second half of the releasing token, a hand-over keeps it in `R:last`) and answer `Released`, not `Expired`
//! or `TakenByOther`, which read as "the lock was lost while I held it".
//!
//! Each test holds a lock through a [`FaultProxy`] that throws the replies away
//! ([`Fault::DropReplies`]), waits until the server shows the release done, then heals the proxy, which
//! resets the connection: the client's resend runs the script a second time.

use distlock::{Client, LockGuard, ReleaseOutcome};
use distlock_tests::proxy::{Fault, FaultProxy};
use distlock_tests::time::{ms, secs};
use distlock_tests::{eventually, within, Fixture, FREED};
use tokio::task::JoinHandle;

/// The record's value on the server, read by the test's own connection.
async fn record_value(fx: &Fixture, record: &str) -> Option<String> {
    let mut admin = fx.redis_connection().expect("redis");
    redis::cmd("GET").arg(record).query_async(&mut admin).await.expect("GET")
}

/// A client whose every connection goes through a new proxy to the fixture's server.
async fn client_through_proxy(fx: &Fixture) -> (Client, FaultProxy) {
    let proxy = FaultProxy::to_port(fx.server().expect("redis").port()).await;
    let client = Client::builder().redis(proxy.url()).response_timeout(secs(5)).build().await.expect("client");
    (client, proxy)
}

/// Releases `guard` with its replies lost: once `done` says the server's record shows the release done, the
/// proxy passes traffic again (resetting the connection that lost the reply), and the client's resend answers.
async fn release_with_lost_reply(
    fx: &Fixture,
    proxy: &FaultProxy,
    guard: LockGuard,
    record: &str,
    done: impl Fn(Option<&str>) -> bool,
) -> ReleaseOutcome {
    proxy.set_fault(Fault::DropReplies);
    let release: JoinHandle<_> = tokio::spawn(guard.release());
    eventually(secs(5), "the release ran on the server", || async { done(record_value(fx, record).await.as_deref()) })
        .await;
    eventually(secs(5), "the release's reply was dropped", || async { proxy.stats().dropped_reply_bytes > 0 }).await;
    proxy.set_fault(Fault::Pass);
    within(secs(10), "the release, sent again", release).await.expect("release task").expect("release")
}

fn freed(value: Option<&str>) -> bool {
    value.is_some_and(|v| v.starts_with(FREED))
}

/// A lock freed by its release: the resend finds FREED over the first half of its own token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s31_5_a_resent_release_of_a_freed_lock_reports_released() {
    let fx = Fixture::redis().await;
    let (client, proxy) = client_through_proxy(&fx).await;
    let record = client.record_key("s31-5-free");
    let guard = client.lock("s31-5-free").ttl(secs(10)).acquire().await.expect("acquire");
    let outcome = release_with_lost_reply(&fx, &proxy, guard, &record, freed).await;
    assert_eq!(outcome, ReleaseOutcome::Released, "the resent release did not recognise its own");
}

/// A lock kept by `min_hold`: the resend finds NOBODY over the first half of its own token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s31_5_a_resent_release_of_a_lock_kept_by_min_hold_reports_released() {
    let fx = Fixture::redis().await;
    let (client, proxy) = client_through_proxy(&fx).await;
    let record = client.record_key("s31-5-kept");
    let guard = client.lock("s31-5-kept").ttl(secs(10)).min_hold(secs(5)).acquire().await.expect("acquire");
    let kept = |value: Option<&str>| value.is_some_and(|v| v.starts_with("----------------"));
    let outcome = release_with_lost_reply(&fx, &proxy, guard, &record, kept).await;
    assert_eq!(outcome, ReleaseOutcome::Released, "the resent release did not recognise its own");
    assert!(fx.client().lock("s31-5-kept").try_acquire().await.expect("try").is_none(), "min_hold still keeps it");
}

/// A lock handed to a waiter: the resend finds the heir's record, and the hand-over's `R:last` names the
/// releasing token. With `heir_releases`, the heir has also released it before the resend arrives.
async fn handed_over(key: &str, heir_releases: bool) {
    let fx = Fixture::redis().await;
    let (client, proxy) = client_through_proxy(&fx).await;
    let record = client.record_key(key);
    let guard = client.lock(key).ttl(secs(10)).acquire().await.expect("acquire");
    let holder = guard.token().expose_secret().to_owned();
    let heir_client = fx.other_client().await;
    let heir = tokio::spawn({
        let request = heir_client.lock(key).ttl(secs(10)).wait(secs(20));
        async move { request.acquire().await }
    });
    eventually(secs(5), "the heir queued", || async {
        fx.client().lock_info(key).await.expect("info").is_some_and(|info| info.waiting == 1)
    })
    .await;
    let handed = |value: Option<&str>| value.is_some_and(|v| !v.starts_with(&holder) && !v.starts_with(FREED));
    if !heir_releases {
        let outcome = release_with_lost_reply(&fx, &proxy, guard, &record, handed).await;
        assert_eq!(outcome, ReleaseOutcome::Released, "the resent release did not recognise its hand-over");
        let heir = within(secs(5), "the heir", heir).await.expect("heir task").expect("the heir's lock");
        assert!(!heir.is_lost());
        assert_eq!(heir.release().await.expect("heir's release"), ReleaseOutcome::Released);
        return;
    }
    proxy.set_fault(Fault::DropReplies);
    let release = tokio::spawn(guard.release());
    let heir = within(secs(5), "the heir", heir).await.expect("heir task").expect("the heir's lock");
    assert_eq!(heir.release().await.expect("heir's release"), ReleaseOutcome::Released);
    assert!(freed(record_value(&fx, &record).await.as_deref()), "setup: the heir's release freed the lock");
    eventually(secs(5), "the release's reply was dropped", || async { proxy.stats().dropped_reply_bytes > 0 }).await;
    proxy.set_fault(Fault::Pass);
    let outcome = within(secs(10), "the release, sent again", release).await.expect("task").expect("release");
    assert_eq!(outcome, ReleaseOutcome::Released, "the resent release did not recognise its hand-over");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s31_5_a_resent_release_of_a_lock_handed_over_reports_released() {
    handed_over("s31-5-handed", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s31_5_a_resent_release_of_a_lock_handed_over_and_freed_by_the_heir_reports_released() {
    handed_over("s31-5-handed-freed", true).await;
}

/// `lock_all`'s release: every key's resend recognises its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s31_5_a_resent_release_of_several_keys_reports_released() {
    let fx = Fixture::redis().await;
    let (client, proxy) = client_through_proxy(&fx).await;
    let records = [client.record_key("s31-5-a"), client.record_key("s31-5-b")];
    let guard = client.lock_all(["s31-5-a", "s31-5-b"]).ttl(secs(10)).acquire().await.expect("acquire");
    proxy.set_fault(Fault::DropReplies);
    let release = tokio::spawn(guard.release());
    eventually(secs(5), "both releases ran on the server", || async {
        let mut all = true;
        for record in &records {
            all &= freed(record_value(&fx, record).await.as_deref());
        }
        all
    })
    .await;
    eventually(secs(5), "the replies were dropped", || async { proxy.stats().dropped_reply_bytes > 0 }).await;
    // Long enough for the second release's reply to be dropped too, if it went in a call of its own.
    tokio::time::sleep(ms(50)).await;
    proxy.set_fault(Fault::Pass);
    let outcome = within(secs(10), "the releases, sent again", release).await.expect("task").expect("release");
    assert_eq!(outcome, ReleaseOutcome::Released, "the resent releases did not recognise their own");
}

/// A resend that finds neither its grant nor a trace of its first run (here the record and `:last` were
/// deleted between the two, as when both expire before the reconnect): the outcome cannot be known, and the
/// release says so instead of claiming `Expired`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s31_5_a_resent_release_without_a_trace_reports_unconfirmed() {
    let fx = Fixture::redis().await;
    let (client, proxy) = client_through_proxy(&fx).await;
    let record = client.record_key("s31-5-gone");
    let guard = client.lock("s31-5-gone").ttl(secs(10)).acquire().await.expect("acquire");
    proxy.set_fault(Fault::DropReplies);
    let release = tokio::spawn(guard.release());
    eventually(secs(5), "the release ran on the server", || async {
        freed(record_value(&fx, &record).await.as_deref())
    })
    .await;
    eventually(secs(5), "the release's reply was dropped", || async { proxy.stats().dropped_reply_bytes > 0 }).await;
    let mut admin = fx.redis_connection().expect("redis");
    let () = redis::cmd("DEL").arg(&record).arg(format!("{record}:last")).query_async(&mut admin).await.unwrap();
    proxy.set_fault(Fault::Pass);
    let outcome = within(secs(10), "the release, sent again", release).await.expect("task").expect("release");
    assert_eq!(outcome, ReleaseOutcome::Unconfirmed, "a resend without a trace claimed to know");
}

/// An extend whose reply is lost after it ran is sent again, finds its own token and extends again: `Ok`, and
/// the guard stays valid with the longer lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s31_5_a_resent_extend_succeeds_and_keeps_the_guard_valid() {
    let fx = Fixture::redis().await;
    let (client, proxy) = client_through_proxy(&fx).await;
    let record = client.record_key("s31-5-extend");
    let guard = client.lock("s31-5-extend").ttl(secs(10)).acquire().await.expect("acquire");
    proxy.set_fault(Fault::DropReplies);
    let extend = tokio::spawn(async move {
        let extended = guard.extend(secs(30)).await;
        (extended, guard)
    });
    eventually(secs(5), "the extend ran on the server", || async {
        let mut admin = fx.redis_connection().expect("redis");
        let pttl: i64 = redis::cmd("PTTL").arg(&record).query_async(&mut admin).await.expect("PTTL");
        pttl > 20_000
    })
    .await;
    eventually(secs(5), "the extend's reply was dropped", || async { proxy.stats().dropped_reply_bytes > 0 }).await;
    proxy.set_fault(Fault::Pass);
    let (extended, guard) = within(secs(10), "the extend, sent again", extend).await.expect("task");
    extended.expect("the resent extend");
    assert!(!guard.is_lost(), "the guard reads lost after its extend was sent again");
    assert!(guard.deadline() > tokio::time::Instant::now() + secs(20), "the longer lease is not counted");
    assert_eq!(guard.release().await.expect("release"), ReleaseOutcome::Released);
}
