//! Who holds a lock, and for how long (issue 17): the owner every record names (`ClientBuilder::owner`, by
//! default `<hostname>:<pid>`), how long the grant has been held by the store's clock (renewals and extensions
//! leave it, a hand-over starts a new grant of the heir's), the same in `LockError::holder`, and the attribute's
//! `metadata` template rendered into the record. Each scenario runs on every backend; the record's layout on
//! the server is checked on a private redis-server.

use std::fmt;
use std::time::Duration;

use distlock::{distributed_lock, with_client, Client, LockError, LockInfo};
use distlock_tests::time::{ms, secs};
use distlock_tests::{eventually, within, Backend, Fixture, RedisServer};
use tokio::time::Instant;

distlock_tests::all_backends!(
    owner_is_host_and_pid_unless_set,
    held_for_counts_from_the_grant_through_renewals,
    hand_over_is_a_new_grant_of_the_heirs,
    busy_error_names_the_holders_owner_and_hold_time,
    a_finished_lock_kept_by_min_hold_says_so,
    attribute_metadata_templates_render_into_the_record,
);

/// How far the store's clock (a redis-server's wall clock) and this process's monotonic clock may drift apart
/// over a few seconds on one machine, with room for a loaded one.
const CLOCKS: Duration = ms(100);

async fn info(client: &Client, key: &str) -> LockInfo {
    client.lock_info(key).await.expect("lock_info").unwrap_or_else(|| panic!("{key} is held"))
}

/// The hostname as the OS reports it (uname's nodename, which the `gethostname` crate also reads on Unix).
fn hostname() -> String {
    rustix::system::uname().nodename().to_string_lossy().into_owned()
}

/// Without `owner`, records name `<hostname>:<pid>`; with it, exactly the text given, whatever separators and
/// digits it holds.
async fn owner_is_host_and_pid_unless_set(fx: Fixture) {
    let guard = fx.client().lock("owned:default").acquire().await.expect("acquire");
    let default = info(fx.client(), "owned:default").await;
    assert_eq!(default.owner, format!("{}:{}", hostname(), std::process::id()));
    guard.release().await.expect("release");

    // The record's own separators, and a number that could pass for a length, in the owner and the metadata.
    let owner = "12:replica-b (eu-west):7";
    let named = fx.client_with(|b| b.owner(owner)).await;
    let guard = named.lock("owned:set").metadata("3:job:42").acquire().await.expect("acquire");
    let seen = info(&named, "owned:set").await;
    assert_eq!((seen.owner.as_str(), seen.metadata.as_str()), (owner, "3:job:42"));
    assert_eq!(seen.fencing_token, guard.fencing_token());
    if fx.backend() != Backend::Memory {
        // Any client reads it, as an operator's tool would.
        assert_eq!(info(fx.client(), "owned:set").await.owner, owner);
    }
    guard.release().await.expect("release");
}

#[tokio::test]
async fn an_empty_owner_is_refused() {
    let empty = Client::builder().memory().owner("").build().await.expect_err("an empty owner");
    assert!(matches!(empty, LockError::InvalidConfig(ref m) if m.contains("owner")), "{empty:?}");
}

/// With a 300 ms ttl the watchdog renews every 100 ms: after a second the lock is still held, its lease still
/// at most 300 ms (renewed, not lengthened), and `held_for` has grown from the grant, not from the last
/// renewal; an extension leaves it too.
async fn held_for_counts_from_the_grant_through_renewals(fx: Fixture) {
    const KEY: &str = "held-for";
    let client = fx.client();
    let before_grant = Instant::now();
    let guard = client.lock(KEY).ttl(ms(300)).acquire().await.expect("acquire");
    let first = info(client, KEY).await;
    assert!(first.held_for <= before_grant.elapsed() + CLOCKS, "{first:?}");

    eventually(secs(20), "held for a second", || async { info(client, KEY).await.held_for >= secs(1) }).await;
    let renewed = info(client, KEY).await;
    assert!(!guard.is_lost(), "renewals kept the lock");
    assert!(renewed.remaining_ttl <= ms(300), "renewed to the ttl, no more: {renewed:?}");
    assert!(renewed.held_for > first.held_for, "{renewed:?} after {first:?}");
    assert!(renewed.held_for <= before_grant.elapsed() + CLOCKS, "{renewed:?} within {:?}", before_grant.elapsed());
    assert_eq!(renewed.fencing_token, guard.fencing_token(), "the same grant");

    guard.extend(secs(30)).await.expect("extend");
    let extended = info(client, KEY).await;
    assert!(extended.remaining_ttl > secs(20), "{extended:?}");
    assert!(extended.held_for >= renewed.held_for, "an extension keeps the grant's time: {extended:?}");
    guard.release().await.expect("release");
}

/// A release hands the lock to the waiter: the record then names the heir's owner and metadata, and its
/// `held_for` starts again.
async fn hand_over_is_a_new_grant_of_the_heirs(fx: Fixture) {
    const KEY: &str = "handed";
    let alpha = fx.client_with(|b| b.owner("alpha")).await;
    // On the in-process backend every built client is a store of its own: there the heir shares alpha's client
    // (the memory store's unit tests hand over between two owners).
    let (beta, heir) = match fx.backend() {
        Backend::Memory => (alpha.clone(), "alpha"),
        _ => (fx.client_with(|b| b.owner("beta")).await, "beta"),
    };
    let held = alpha.lock(KEY).ttl(secs(30)).metadata("first").acquire().await.expect("acquire");
    eventually(secs(20), "held for a second", || async { info(&alpha, KEY).await.held_for >= secs(1) }).await;
    let waiter =
        tokio::spawn(async move { beta.lock(KEY).ttl(secs(30)).wait(secs(20)).metadata("second").acquire().await });
    eventually(secs(10), "the waiter queued", || async { info(&alpha, KEY).await.waiting == 1 }).await;
    let before = info(&alpha, KEY).await;
    assert_eq!((before.owner.as_str(), before.metadata.as_str()), ("alpha", "first"));

    let released = Instant::now();
    held.release().await.expect("release");
    let guard = within(secs(20), "the hand-over", waiter).await.expect("waiter task").expect("handed the lock");
    let after = info(&alpha, KEY).await;
    assert_eq!((after.owner.as_str(), after.metadata.as_str()), (heir, "second"));
    assert_eq!(after.fencing_token, guard.fencing_token());
    assert!(after.held_for < before.held_for, "a new grant: {after:?} after {before:?}");
    assert!(after.held_for <= released.elapsed() + CLOCKS, "counted from the hand-over: {after:?}");
    guard.release().await.expect("release");
}

/// A busy error's holder names the holder's owner and how long it had held the lock when the wait ended.
async fn busy_error_names_the_holders_owner_and_hold_time(fx: Fixture) {
    const KEY: &str = "busy-owner";
    let holder = fx.client_with(|b| b.owner("holder-a")).await;
    let other = match fx.backend() {
        Backend::Memory => holder.clone(),
        _ => fx.client_with(|b| b.owner("other")).await,
    };
    let before_grant = Instant::now();
    let held = holder.lock(KEY).metadata("job 42").ttl(secs(30)).acquire().await.expect("acquire");
    let error = other.lock(KEY).wait(ms(300)).acquire().await.expect_err("held");
    let seen = error.holder().expect("who held it");
    assert_eq!((seen.owner.as_str(), seen.metadata.as_str()), ("holder-a", "job 42"));
    assert_eq!(seen.fencing_token, held.fencing_token());
    assert!(seen.held_for + CLOCKS >= ms(300), "held through the whole wait: {seen:?}");
    assert!(seen.held_for <= before_grant.elapsed() + CLOCKS, "{seen:?} within {:?}", before_grant.elapsed());
    assert!(!seen.kept_by_min_hold, "{seen:?}");
    // Issue 34: the message names the holder too.
    let message = error.to_string();
    assert!(
        message.starts_with("lock `busy-owner` is held by \"holder-a\" (for ")
            && message.contains(", lease left ")
            && message.contains("; gave up after waiting "),
        "{message}"
    );
    held.release().await.expect("release");
}

/// Issue 34: a lock whose holder finished, kept by `min_hold`, reads as such (`LockInfo::kept_by_min_hold`),
/// and a busy error's message says so instead of naming it held; a running one does not.
async fn a_finished_lock_kept_by_min_hold_says_so(fx: Fixture) {
    const KEY: &str = "kept";
    let client = fx.client_with(|b| b.owner("cron-a")).await;
    let running = client.lock(KEY).ttl(secs(30)).min_hold(secs(20)).acquire().await.expect("acquire");
    assert!(!info(&client, KEY).await.kept_by_min_hold, "running");
    running.release().await.expect("release");
    let kept = info(&client, KEY).await;
    assert!(kept.kept_by_min_hold && kept.remaining_ttl <= secs(20), "{kept:?}");
    assert_eq!(kept.owner, "cron-a");
    let busy = client.lock(KEY).acquire().await.expect_err("kept");
    let message = busy.to_string();
    assert!(message.starts_with("lock `kept` was released by \"cron-a\" and min_hold keeps it "), "{message}");
    assert!(client.force_unlock(KEY).await.expect("force unlock"));
}

/// A job, shown in keys by its name.
struct Job {
    name: &'static str,
    attempt: u32,
}

impl fmt::Display for Job {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

#[distributed_lock(
    key = "replica-job:<job>",
    metadata = "replica <replica> runs <job.name>, attempt <job.attempt> <<#>>"
)]
async fn replica_job(job: &Job, replica: &str) -> Result<(String, LockInfo), LockError> {
    let _ = (job, replica);
    // The key as rendered (escaped: `nightly%3Areport`), from the lock this body holds.
    let key = distlock::current_lock().expect("inside the body").key().to_owned();
    let info = distlock::current_client()?.lock_info(&key).await?.expect("held while the body runs");
    Ok((key, info))
}

/// The attribute's metadata template is rendered from the call's arguments, values as they are (unlike a key's,
/// nothing is escaped), and the record holds exactly that.
async fn attribute_metadata_templates_render_into_the_record(fx: Fixture) {
    let job = Job { name: "nightly:report", attempt: 3 };
    let (key, seen) = with_client(fx.client().clone(), replica_job(&job, "eu-west:b")).await.expect("runs");
    assert_eq!(key, "replica-job:nightly%3Areport", "the key's values are escaped");
    assert_eq!(seen.metadata, "replica eu-west:b runs nightly:report, attempt 3 <#>");
    let other = Job { name: "cleanup", attempt: 1 };
    let (_, seen) = with_client(fx.client().clone(), replica_job(&other, "us")).await.expect("runs");
    assert_eq!(seen.metadata, "replica us runs cleanup, attempt 1 <#>");
}

/// On the server the record reads `<token>:<fence>:<granted µs>:<owner length>:<owner><metadata>`, as
/// `record.lua` documents it, with the server's clock at the grant; a value there that is no lock record makes
/// `lock_info` an error that names the key, not a made-up holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_record_on_the_server_is_as_documented() {
    let server = RedisServer::new();
    let client = Client::builder().redis(server.url()).owner("host-a:99").build().await.expect("client");
    let mut conn = server.connection().await;
    let time = |conn: &mut redis::aio::MultiplexedConnection| {
        let mut conn = conn.clone();
        async move {
            let (s, us): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.expect("TIME");
            s * 1_000_000 + us
        }
    };
    let before = time(&mut conn).await;
    let guard = client.lock("layout").metadata("m:1").acquire().await.expect("acquire");
    let after = time(&mut conn).await;
    let record: String = redis::cmd("GET").arg(client.record_key("layout")).query_async(&mut conn).await.expect("GET");
    let fields: Vec<&str> = record.splitn(4, ':').collect();
    let [token, fence, granted, holder] = fields[..] else { panic!("{record}") };
    assert_eq!(token.len(), 32, "{record}");
    assert_eq!(fence.parse::<u64>().ok(), Some(guard.fencing_token()), "{record}");
    let granted: u64 = granted.parse().unwrap_or_else(|_| panic!("{record}"));
    assert!((before..=after).contains(&granted), "{granted} not between {before} and {after}");
    assert_eq!(holder, "9:host-a:99m:1");
    guard.release().await.expect("release");

    let () =
        redis::cmd("SET").arg(client.record_key("foreign")).arg("x".repeat(40)).query_async(&mut conn).await.unwrap();
    let error = client.lock_info("foreign").await.expect_err("not a lock record");
    assert!(error.to_string().contains("foreign"), "{error}");
}
