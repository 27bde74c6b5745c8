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
use distlock_tests::time::secs;
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

/// Runs `call` (spawned) with its replies lost: once `ran` says the server shows its work done, the proxy
/// passes traffic again (resetting the connection that lost the reply), and the client's resend answers.
async fn with_lost_reply<T: Send + 'static, F: std::future::Future<Output = bool>>(
    proxy: &FaultProxy,
    call: impl std::future::Future<Output = T> + Send + 'static,
    ran: impl FnMut() -> F,
) -> T {
    proxy.set_fault(Fault::DropReplies);
    let call: JoinHandle<T> = tokio::spawn(call);
    eventually(secs(5), "the call ran on the server", ran).await;
    eventually(secs(5), "the call's reply was dropped", || async { proxy.stats().dropped_reply_bytes > 0 }).await;
    proxy.set_fault(Fault::Pass);
    within(secs(10), "the call, sent again", call).await.expect("the call's task")
}

/// Releases `guard` with its reply lost, once `done` says the record shows the release done.
async fn release_with_lost_reply(
    fx: &Fixture,
    proxy: &FaultProxy,
    guard: LockGuard,
    record: &str,
    done: impl Fn(Option<&str>) -> bool,
) -> ReleaseOutcome {
    let ran = || async { done(record_value(fx, record).await.as_deref()) };
    with_lost_reply(proxy, guard.release(), ran).await.expect("release")
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
    // The heir takes it and frees it before the resend: the heir's FREED record no longer names H.
    let heir = tokio::sync::Mutex::new(Some(heir));
    let heir_freed = || async {
        if let Some(heir) = heir.lock().await.take() {
            let heir = within(secs(5), "the heir", heir).await.expect("heir task").expect("the heir's lock");
            assert_eq!(heir.release().await.expect("heir's release"), ReleaseOutcome::Released);
        }
        freed(record_value(&fx, &record).await.as_deref())
    };
    let outcome = with_lost_reply(&proxy, guard.release(), heir_freed).await.expect("release");
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
    let both_freed = || async {
        let mut all = true;
        for record in &records {
            all &= freed(record_value(&fx, record).await.as_deref());
        }
        all
    };
    let outcome = with_lost_reply(&proxy, guard.release(), both_freed).await.expect("release");
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
    // Once the release has run, its record and trace go before the resend arrives.
    let gone = || async {
        if !freed(record_value(&fx, &record).await.as_deref()) {
            return false;
        }
        let mut admin = fx.redis_connection().expect("redis");
        let () = redis::cmd("DEL").arg(&record).arg(format!("{record}:last")).query_async(&mut admin).await.unwrap();
        true
    };
    let outcome = with_lost_reply(&proxy, guard.release(), gone).await.expect("release");
    assert_eq!(outcome, ReleaseOutcome::Unconfirmed, "a resend without a trace claimed to know");
}

/// Releases that shared a call, sent again without a trace of their first run: each says `Unconfirmed`, as a
/// lone one does (the shared call marks each release sent again, 's'; the mutation report's batch.rs
/// `Op::letter`: without the mark they claimed `Expired`). 16 locks released at once, their replies lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s31_5_resent_releases_sharing_a_call_without_a_trace_report_unconfirmed() {
    const LOCKS: usize = 16;
    let fx = Fixture::redis().await;
    let (client, proxy) = client_through_proxy(&fx).await;
    let names: Vec<String> = (0..LOCKS).map(|i| format!("s31-5-shared-{i}")).collect();
    let mut guards = Vec::new();
    for name in &names {
        guards.push(client.lock(name).ttl(secs(10)).acquire().await.expect("acquire"));
    }
    let records: Vec<String> = names.iter().map(|name| client.record_key(name)).collect();
    // Once every release has run, the records and their traces go before the resends arrive.
    let gone = || async {
        for record in &records {
            if !freed(record_value(&fx, record).await.as_deref()) {
                return false;
            }
        }
        let mut admin = fx.redis_connection().expect("redis");
        for record in &records {
            let () = redis::cmd("DEL").arg(record).arg(format!("{record}:last")).query_async(&mut admin).await.unwrap();
        }
        true
    };
    // All issued in one poll of one task, so they go in at most two calls (the first alone, the rest queued
    // behind it), within the coalescer's window: issued by tasks of their own, on a loaded machine, they could
    // take more calls than the window holds, and the rest waited for a slot that only a reply (lost here)
    // frees, so their releases never ran and the calls sent timed out (CI, once).
    let releases = futures_util::future::join_all(guards.into_iter().map(|guard| async move {
        let key = guard.key().to_owned();
        (key, guard.release().await)
    }));
    for (key, outcome) in with_lost_reply(&proxy, releases, gone).await {
        assert_eq!(
            outcome.expect("release"),
            ReleaseOutcome::Unconfirmed,
            "lock {key}: a resend without a trace claimed to know"
        );
    }
}

/// An extend whose reply is lost after it ran is sent again, finds its own token and extends again: `Ok`, and
/// the guard stays valid with the longer lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s31_5_a_resent_extend_succeeds_and_keeps_the_guard_valid() {
    let fx = Fixture::redis().await;
    let (client, proxy) = client_through_proxy(&fx).await;
    let record = client.record_key("s31-5-extend");
    let guard = client.lock("s31-5-extend").ttl(secs(10)).acquire().await.expect("acquire");
    let extend = async move {
        let extended = guard.extend(secs(30)).await;
        (extended, guard)
    };
    let extended_on_server = || async {
        let mut admin = fx.redis_connection().expect("redis");
        let pttl: i64 = redis::cmd("PTTL").arg(&record).query_async(&mut admin).await.expect("PTTL");
        pttl > 20_000
    };
    let (extended, guard) = with_lost_reply(&proxy, extend, extended_on_server).await;
    extended.expect("the resent extend");
    assert!(!guard.is_lost(), "the guard reads lost after its extend was sent again");
    assert!(guard.deadline() > tokio::time::Instant::now() + secs(20), "the longer lease is not counted");
    assert_eq!(guard.release().await.expect("release"), ReleaseOutcome::Released);
}

/// A release names its grant's fencing token, and only that grant's trace reads as its own (found by the
/// simulation, redis+replicas seed 11244, issue 32): a token granted twice — its first grant given back, as a
/// grant the replicas did not acknowledge is — whose second grant expired must release as `Expired`, not read
/// the first release's trace in `R:last` as its own. The production scripts, run by EVAL on a real server.
#[tokio::test]
async fn a_release_reads_only_its_own_grant_s_trace() {
    use distlock::simulation::redis::production_scripts;
    let fx = Fixture::redis().await;
    let mut admin = fx.redis_connection().expect("redis");
    let scripts: std::collections::HashMap<String, &str> = production_scripts().into_iter().collect();
    let (acquire, release) = (scripts["ACQUIRE"], scripts["RELEASE"]);
    let (record, token) = ("{twice}", "0123456789abcdef0123456789abcdef");
    let fence_of = |reply: &redis::Value| match reply {
        redis::Value::BulkString(fence) => String::from_utf8_lossy(fence).into_owned(),
        redis::Value::Array(parts) => match parts.get(1) {
            Some(redis::Value::BulkString(fence)) => String::from_utf8_lossy(fence).into_owned(),
            other => panic!("no fence in {other:?}"),
        },
        other => panic!("not a grant: {other:?}"),
    };
    let eval = |script: &str, args: &[&str]| {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(script).arg(1).arg(record).arg(args);
        cmd
    };
    // The first grant, released under min_hold for 50 ms: R:last keeps the last token and who released it.
    let first: redis::Value =
        eval(acquire, &[token, "5000", "5:owner"]).query_async(&mut admin).await.expect("ACQUIRE");
    let first = fence_of(&first);
    // Another grant's release (another fencing token, as after a failover to a replica that saw this grant's
    // release but not the grant it names) does not take this grant's trace for its own: its grant is over,
    // and the record freed by another, EXPIRED.
    let mut on_freed = redis::cmd("EVAL");
    on_freed.arg(acquire).arg(1).arg("{freed}").arg(&[token, "5000", "5:owner"]);
    let freed = fence_of(&on_freed.query_async(&mut admin).await.expect("ACQUIRE"));
    let release_freed = |fence: &str, again: &str| {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(release).arg(1).arg("{freed}").arg(&[token, fence, "0", again]);
        cmd
    };
    let released: i64 = release_freed(&freed, "0").query_async(&mut admin).await.expect("RELEASE");
    assert_eq!(released, 1, "released");
    let other = (freed.parse::<u64>().expect("a fence") + 1).to_string();
    let outcome: i64 = release_freed(&other, "0").query_async(&mut admin).await.expect("RELEASE");
    assert_eq!(outcome, 0, "another grant's release read the freed record as its own: EXPIRED expected");
    let again: i64 = release_freed(&freed, "1").query_async(&mut admin).await.expect("RELEASE");
    assert_eq!(again, 1, "this grant's release, sent again, finds the record it freed: RELEASED");
    let kept: i64 = eval(release, &[token, &first, "50"]).query_async(&mut admin).await.expect("RELEASE");
    assert_eq!(kept, 1, "released");
    let gone = || {
        let mut admin = fx.redis_connection().expect("redis");
        async move {
            let value: Option<String> = redis::cmd("GET").arg(record).query_async(&mut admin).await.expect("GET");
            value.is_none()
        }
    };
    eventually(secs(5), "the kept record lapses", gone).await;
    // The same token granted again, for 100 ms, then expired.
    let second: redis::Value =
        eval(acquire, &[token, "100", "5:owner"]).query_async(&mut admin).await.expect("ACQUIRE");
    let second = fence_of(&second);
    assert_ne!(second, first, "a new grant, a new fencing token");
    eventually(secs(5), "the second grant expires", gone).await;
    let outcome: i64 = eval(release, &[token, &second, "0"]).query_async(&mut admin).await.expect("RELEASE");
    assert_eq!(outcome, 0, "the second grant expired: EXPIRED, not the first grant's release");
    // The first grant's release sent again still finds its own work done.
    let again: i64 = eval(release, &[token, &first, "0", "1"]).query_async(&mut admin).await.expect("RELEASE");
    assert_eq!(again, 1, "the first grant's release, sent again: RELEASED");
}
