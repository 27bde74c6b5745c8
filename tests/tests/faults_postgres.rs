//! Fault injection on the PostgreSQL store, each on a private server: frozen (every server process stopped),
//! killed -9 and restarted (crash recovery), its sessions reset (terminated by the server), and replies lost
//! after the statement committed (a proxy that forwards requests and drops the replies, then resets).

use std::time::Duration;

use distlock::{Client, LockError, ReleaseOutcome};
use distlock_tests::proxy::{Fault, FaultProxy};
use distlock_tests::sys::Stopped;
use distlock_tests::time::{ms, secs};
use distlock_tests::{acquire_after_recovery, serial, within, PostgresServer};
use tokio::time::Instant;

/// Scheduling slack on a loaded 2-core machine, on top of every bound below.
const SLACK: Duration = Duration::from_millis(250);

async fn client_on(url: &str, timeout: Duration) -> Client {
    // A connect timeout of its own: a session's start (a process forked on the server) is the slow part on a
    // loaded machine, and no test here times it.
    let builder = Client::builder().postgres(url).connect_timeout(secs(2)).response_timeout(timeout);
    builder.build().await.unwrap_or_else(|e| panic!("client on {url}: {e}"))
}

async fn private_server() -> PostgresServer {
    tokio::task::spawn_blocking(PostgresServer::new).await.expect("postgres start")
}

/// Frozen: every call ends within its timeout, the running body is cancelled by its lease's deadline (and not
/// long before the lease could have run out), nobody else gets the lock meanwhile, and once the server runs
/// again the lock is taken with a higher fencing token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_server_calls_end_in_time_body_cancelled_at_deadline_then_recovers() {
    const KEY: &str = "frozen";
    let (ttl, timeout) = (secs(2), ms(500));
    let _serial = serial().await;
    let server = private_server().await;
    let client = client_on(&server.url(), timeout).await;
    let guard = client.lock(KEY).ttl(ttl).acquire().await.expect("acquire");
    let before = guard.fencing_token();
    let other = client_on(&server.url(), timeout).await;
    // Its session for the key opened now: on a frozen server, opening one takes the connect timeout.
    assert!(other.lock_info(KEY).await.expect("lock_info").is_some());

    let frozen: Vec<Stopped> = server.pids().into_iter().map(Stopped::stop).collect();
    let froze = Instant::now();
    let started = Instant::now();
    // With the test's ttl: its statement, too, waits in the socket and may run when the server resumes, after
    // the client gave up on it (and on giving it back); its grant then lasts one ttl (the default would be 30 s).
    let r = within(secs(5), "try_acquire on a frozen server", other.lock(KEY).ttl(ttl).try_acquire()).await;
    assert!(r.is_err(), "a frozen server granted the lock: {r:?}");
    assert!(started.elapsed() <= timeout + SLACK, "try_acquire took {:?}", started.elapsed());
    within(ttl * 2, "the holder learns its lease may have run out", guard.lost()).await;
    let noticed = froze.elapsed();
    assert!(noticed <= ttl + SLACK, "loss noticed {noticed:?} after the freeze (ttl {ttl:?})");
    assert!(noticed >= ttl * 2 / 3 - ms(200), "loss noticed only {noticed:?} after the freeze: too early");
    drop(frozen);

    // The holder's last renewal and the other client's try_acquire, sent while the server was frozen, run when
    // it resumes (their bytes waited in the socket); either may keep the lock on the server for one more ttl,
    // with nobody using it: wait longer than that.
    let recovered =
        acquire_after_recovery(Instant::now() + secs(10), "after the freeze", || other.lock(KEY).wait(ttl * 3));
    let again = within(secs(20), "the lock after the server resumed", recovered).await;
    assert!(again.fencing_token() > before, "fencing token {} after {before}", again.fencing_token());
    assert!(
        matches!(guard.release().await, Ok(ReleaseOutcome::TakenByOther)),
        "the lost grant's release must not free the new holder's lock"
    );
    assert_eq!(again.release().await.expect("release"), ReleaseOutcome::Released);
}

/// Killed with SIGKILL and restarted on the same data: the committed grant survives (leases are kept on the
/// server, by its clock), the holder's renewals carry on once it is back, nobody else gets the lock, and
/// later grants' fencing tokens are higher than every earlier one (the sequence is WAL-logged).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_and_restarted_server_keeps_the_grant_and_tokens_keep_rising() {
    const KEY: &str = "restarted";
    let ttl = secs(10);
    let _serial = serial().await;
    let mut server = private_server().await;
    let client = client_on(&server.url(), secs(1)).await;
    let guard = client.lock(KEY).ttl(ttl).acquire().await.expect("acquire");
    let before = guard.fencing_token();

    tokio::task::block_in_place(|| server.restart());
    let other = client_on(&server.url(), secs(1)).await;
    let busy = other.lock(KEY).try_acquire().await.expect("try_acquire after the restart");
    assert!(busy.is_none(), "the grant did not survive the restart");
    // Past the ttl since the grant: only renewals sent after the restart can have kept it.
    tokio::time::sleep(ttl + secs(1)).await;
    assert!(!guard.is_lost(), "the holder lost a lock the restarted server still kept for it");
    let info = other.lock_info(KEY).await.expect("lock_info").expect("still held");
    assert_eq!(info.fencing_token, before);

    assert_eq!(guard.release().await.expect("release"), ReleaseOutcome::Released);
    let again = other.lock(KEY).acquire().await.expect("acquire after the release");
    assert!(again.fencing_token() > before, "fencing token {} after {before}", again.fencing_token());
    let elsewhere = other.lock("another key").acquire().await.expect("acquire");
    assert!(elsewhere.fencing_token() > again.fencing_token(), "tokens rise across keys too");
}

/// Every session reset by the server (`pg_terminate_backend`): the holder's calls and renewals reconnect,
/// and a waiter whose listening session was cut still hears the hand-over (it is told to try again, and
/// listens again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_sessions_reconnect_and_a_waiter_still_gets_the_lock() {
    distlock_tests::wall_clock::again_if_the_wall_clock_stepped(|| async {
        const KEY: &str = "reset";
        let _serial = serial().await;
        let server = private_server().await;
        let holder = client_on(&server.url(), secs(1)).await;
        let waiter = client_on(&server.url(), secs(1)).await;
        let guard = holder.lock(KEY).ttl(secs(2)).acquire().await.expect("acquire");
        let waiting = tokio::spawn({
            let waiter = waiter.clone();
            async move { waiter.lock(KEY).ttl(secs(5)).wait(secs(30)).acquire().await }
        });
        within(secs(10), "the waiter queues", async {
            while holder.lock_info(KEY).await.expect("lock_info").is_some_and(|i| i.waiting == 0) {
                tokio::time::sleep(ms(20)).await;
            }
        })
        .await;

        let cut = server.psql(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'",
        );
        assert!(cut.parse::<u32>().expect("a count") >= 3, "sessions terminated: {cut}");
        // Through a renewal or two: the holder reconnects and keeps the lock.
        tokio::time::sleep(secs(3)).await;
        assert!(!guard.is_lost(), "the holder lost its lock to a reset of its sessions");

        let released = Instant::now();
        assert_eq!(guard.release().await.expect("release"), ReleaseOutcome::Released);
        let next =
            within(secs(10), "the waiter's acquire", waiting).await.expect("task").expect("the waiter gets the lock");
        assert!(
            released.elapsed() < secs(2),
            "the waiter got the lock only {:?} after the release",
            released.elapsed()
        );
        assert_eq!(next.release().await.expect("release"), ReleaseOutcome::Released);
    })
    .await
}

/// Replies lost after the statement committed: an acquire whose grant committed unseen is retried and finds
/// the grant its own (one grant, not two, not a leak); a renewal's loss is retried within the lease; a release
/// whose reply was lost reads as released when sent again (the row remembers who released it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_lost_after_commit_are_sent_again_and_read_right() {
    const KEY: &str = "lost replies";
    let timeout = ms(500);
    let _serial = serial().await;
    let server = private_server().await;
    let proxy = FaultProxy::to_port(server.port()).await;
    let url = format!("postgres://postgres@{}/postgres", proxy.addr());
    let client = client_on(&url, timeout).await;
    let observer = client_on(&server.url(), secs(1)).await;

    // Acquire: the first attempt commits, its reply is lost; the retry after the reset finds it granted.
    proxy.set_fault(Fault::DropReplies);
    let acquiring = tokio::spawn({
        let client = client.clone();
        async move { client.lock(KEY).ttl(secs(3)).wait(secs(10)).acquire().await }
    });
    within(secs(5), "the lost grant commits", async {
        while observer.lock_info(KEY).await.expect("lock_info").is_none() {
            tokio::time::sleep(ms(20)).await;
        }
    })
    .await;
    let committed = observer.lock_info(KEY).await.expect("lock_info").expect("held").fencing_token;
    tokio::time::sleep(timeout * 2).await;
    proxy.set_fault(Fault::Pass);
    let guard = within(secs(10), "the acquire", acquiring).await.expect("task").expect("acquired");
    assert_eq!(guard.fencing_token(), committed, "the retry took the grant its lost reply was about");

    // Renewals: lost for less than the lease, then answered again; the lock is kept.
    proxy.set_fault(Fault::DropReplies);
    tokio::time::sleep(secs(1)).await;
    proxy.set_fault(Fault::Pass);
    tokio::time::sleep(secs(3)).await;
    assert!(!guard.is_lost(), "lost to renewal replies dropped for a third of the lease");
    let info = observer.lock_info(KEY).await.expect("lock_info").expect("still held");
    assert_eq!(info.fencing_token, committed, "still the one grant");

    // Release: the first reply is lost; the outcome must not claim a release that did not happen, and the
    // lock must be free afterwards.
    proxy.set_fault(Fault::DropReplies);
    let releasing = tokio::spawn(guard.release());
    tokio::time::sleep(timeout * 2).await;
    proxy.set_fault(Fault::Pass);
    let outcome = within(secs(10), "the release", releasing).await.expect("task");
    assert!(
        matches!(outcome, Ok(ReleaseOutcome::Released | ReleaseOutcome::Unconfirmed) | Err(LockError::Backend(_))),
        "release with its reply lost: {outcome:?}"
    );
    let free = within(secs(10), "the lock is free", observer.lock(KEY).wait(secs(5)).acquire()).await;
    assert!(free.expect("acquire after the release").fencing_token() > committed);
}
