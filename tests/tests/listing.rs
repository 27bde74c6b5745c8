//! Listing for operators' tools: `Client::list_locks` (SCAN over record keys, on every primary of a cluster and
//! every Redlock server), `Client::lock_infos` and `Client::lock_waiters`. Each scenario runs on every backend.

use std::time::Duration;

use distlock::Client;
use distlock_tests::time::secs;
use distlock_tests::{eventually, Backend, Fixture};

distlock_tests::all_backends_and_redlock!(
    lists_the_held_locks_matching_a_pattern,
    lists_more_locks_than_one_scan_step_returns,
    lists_the_queue_first_in_line_first,
    a_lock_named_like_the_startup_check_is_listed,
);

/// Every name the listing gives, in its order: on Redlock, once per server holding the lock.
async fn every_listed(client: &Client, pattern: &str) -> Vec<String> {
    let mut listing = client.list_locks(pattern);
    let mut names = Vec::new();
    while let Some(page) = listing.next_page().await.expect("list_locks") {
        assert!(!page.is_empty(), "an empty page");
        names.extend(page);
    }
    names
}

/// Every name the listing gives, sorted, each once.
async fn listed(client: &Client, pattern: &str) -> Vec<String> {
    let mut names = every_listed(client, pattern).await;
    names.sort();
    names.dedup();
    names
}

/// Held locks are listed by name (braces and `%` as the program wrote them), a released one is not, nor the
/// startup probe or any derived key; their records read back in order.
async fn lists_the_held_locks_matching_a_pattern(fx: Fixture) {
    let client = fx.client();
    let mut guards = Vec::new();
    for name in ["list:a", "list:b{1}", "list:100%", "other:x"] {
        guards.push(client.lock(name).ttl(secs(30)).metadata(format!("for {name}")).acquire().await.expect("acquire"));
    }
    let gone = client.lock("list:gone").acquire().await.expect("acquire");
    if fx.backend() == Backend::Redlock {
        // The round returned at a quorum: the last server's grant may still be on its way, and a listing made
        // before it lands would not see the record that the release below then deletes after the wait for it
        // to be gone has ended (seen once under load). So the grant is on every server first.
        let servers = fx.redlock_servers().count();
        eventually(secs(5), "the grant on every server", || async {
            every_listed(client, "list:gone").await.len() == servers
        })
        .await;
    }
    gone.release().await.expect("release");
    // On Redlock a release returns once a majority freed the lock; the last server's record goes a moment
    // later, and until then a listing (which shows what it finds on any server) still names it.
    eventually(secs(5), "the released lock's records are gone", || async {
        !listed(client, "list:gone").await.contains(&"list:gone".to_owned())
    })
    .await;

    let names = listed(client, "list:*").await;
    assert_eq!(names, ["list:100%", "list:a", "list:b{1}"]);
    assert_eq!(listed(client, "list:b{?}").await, ["list:b{1}"]);
    assert_eq!(listed(client, "*").await, ["list:100%", "list:a", "list:b{1}", "other:x"]);
    assert!(listed(client, "nothing:*").await.is_empty());

    let infos = client.lock_infos(&["list:a", "list:gone", "other:x"]).await.expect("lock_infos");
    let a = infos[0].as_ref().expect("list:a is held");
    assert_eq!(a.metadata, "for list:a");
    if fx.gives_fencing_tokens() {
        assert_eq!(a.fencing_token, guards[0].fencing_token());
    }
    assert!(infos[1].is_none(), "released");
    assert_eq!(infos[2].as_ref().expect("other:x is held").metadata, "for other:x");
    for guard in guards {
        guard.release().await.expect("release");
    }
    assert!(listed(client, "*").await.is_empty());
}

/// More locks than a SCAN step asks for (1000): every one is listed.
async fn lists_more_locks_than_one_scan_step_returns(fx: Fixture) {
    const LOCKS: usize = 1500;
    let mut tasks = Vec::with_capacity(LOCKS);
    for i in 0..LOCKS {
        let request = fx.client().lock(format!("many:{i:04}")).ttl(secs(60));
        tasks.push(tokio::spawn(request.acquire()));
    }
    let mut guards = Vec::with_capacity(LOCKS);
    for task in tasks {
        guards.push(task.await.expect("no panic").expect("acquire"));
    }
    let names = listed(fx.client(), "many:*").await;
    assert_eq!(names, (0..LOCKS).map(|i| format!("many:{i:04}")).collect::<Vec<_>>());
    let infos = fx.client().lock_infos(&names).await.expect("lock_infos");
    assert!(infos.iter().all(Option::is_some), "a listed lock read as free");
    drop(guards);
}

/// The queue, first in line first, with each waiter's owner and metadata (never its token); a hand-over takes
/// the head. Redlock has no queue: nobody is listed while a waiter polls.
async fn lists_the_queue_first_in_line_first(fx: Fixture) {
    let holder = fx.client().lock("queued").ttl(secs(30)).acquire().await.expect("acquire");
    let waiter = fx.other_client().await;
    let wait = |metadata: &'static str| {
        let request = waiter.lock("queued").ttl(secs(30)).metadata(metadata).wait(secs(60));
        tokio::spawn(request.acquire())
    };
    let queued = |n: usize| {
        let client = fx.client().clone();
        async move { client.lock_waiters("queued").await.expect("lock_waiters").len() >= n }
    };
    let first = wait("first");
    if fx.backend() == Backend::Redlock {
        tokio::time::sleep(Duration::from_millis(300)).await; // the waiter polls meanwhile
        assert!(fx.client().lock_waiters("queued").await.expect("lock_waiters").is_empty());
        holder.release().await.expect("release");
        first.await.expect("no panic").expect("acquired").release().await.expect("release");
        return;
    }
    eventually(secs(10), "the first waiter queued", || queued(1)).await;
    let second = wait("second");
    eventually(secs(10), "the second waiter queued", || queued(2)).await;
    let waiters = fx.client().lock_waiters("queued").await.expect("lock_waiters");
    let metadata: Vec<&str> = waiters.iter().map(|w| w.metadata.as_str()).collect();
    assert_eq!(metadata, ["first", "second"]);
    assert!(waiters[0].waiting_for >= waiters[1].waiting_for, "{waiters:?}");
    let owner = fx.client().lock_info("queued").await.expect("info").expect("held").owner;
    if fx.backend() != Backend::Memory {
        assert_eq!(waiters[0].owner, owner, "both clients run in this process");
    }

    holder.release().await.expect("release");
    let first = first.await.expect("no panic").expect("handed over");
    let waiters = fx.client().lock_waiters("queued").await.expect("lock_waiters");
    assert_eq!(waiters.iter().map(|w| w.metadata.as_str()).collect::<Vec<_>>(), ["second"]);
    first.release().await.expect("release");
    second.await.expect("no panic").expect("handed over").release().await.expect("release");
}

/// Issue 36: the startup check's lock lives outside the locks' key space, so a lock whose name merely starts
/// as the check's once did (`distlock-startup-probe:`) is a lock like any other: listed, its record read.
async fn a_lock_named_like_the_startup_check_is_listed(fx: Fixture) {
    let client = fx.client();
    let name = "distlock-startup-probe:mine";
    let guard = client.lock(name).ttl(secs(30)).acquire().await.expect("acquire");
    assert_eq!(listed(client, "*").await, [name], "a user's lock is hidden from the listing");
    assert!(client.lock_info(name).await.expect("lock_info").is_some());
    guard.release().await.expect("release");
    // Building a client runs the startup check: it leaves nothing a listing shows.
    let _other = fx.other_client().await;
    assert!(listed(client, "*").await.is_empty());
}
