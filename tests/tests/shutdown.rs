//! `Client::shutdown` (issue 13, section 4) on every backend: requests made or waiting when it starts fail with
//! `ShuttingDown` and leave their queues, bodies get the grace period to finish, the locks still held then are
//! lost and released, and when it resolves no body runs and nothing of the client is left on the server but
//! fencing keys, which expire.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use distlock::{LockError, ReleaseOutcome};
use distlock_tests::time::{ms, secs};
use distlock_tests::{eventually, within, Backend, Fixture};
use tokio::sync::watch;

distlock_tests::all_backends_and_redlock!(
    shutdown_stops_waiters_releases_holders_and_leaves_nothing,
    shutdown_without_locks_does_not_wait_for_the_grace_period,
);

/// Lock bodies running when shutdown starts.
const HELD: usize = 50;
/// Of those, how many end by themselves within the grace period; the others never would.
const FINISHING: usize = 25;
/// Requests waiting for a held lock when shutdown starts.
const WAITING: usize = 10;
/// Long enough for the finishing bodies on a loaded machine; the others hold shutdown up for all of it.
const GRACE: std::time::Duration = secs(5);

/// Adds one to its counter when dropped: a body that ended or was dropped.
struct CountOnDrop(Arc<AtomicUsize>);

impl Drop for CountOnDrop {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// What the bodies record.
#[derive(Default)]
struct Bodies {
    /// Holders' bodies that started.
    started: AtomicUsize,
    /// Holders' bodies that ended or were dropped.
    ended: Arc<AtomicUsize>,
    /// Set as soon as `shutdown` has returned.
    shutdown_returned: AtomicBool,
    /// Polls of any body after that: must stay zero.
    ran_after_shutdown: AtomicUsize,
    /// Bodies of requests that were waiting or made after shutdown started: must stay zero.
    should_never_run: AtomicUsize,
}

impl Bodies {
    fn check_not_after_shutdown(&self) {
        if self.shutdown_returned.load(Ordering::SeqCst) {
            self.ran_after_shutdown.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// 50 bodies hold locks (25 end within the grace period when told, 25 never would), 10 requests of the same
/// client wait for 10 of those locks, and a guard is held outside any body. Shutdown starts: new requests and
/// the waiters fail with `ShuttingDown`, and the waiters' bodies never run. The 25 finishing bodies return
/// their values; after the grace period the other 25 get `Lost`, and the guard reads lost. When shutdown
/// resolves every body has ended, no body runs afterwards, every lock is free, and the only keys of the client
/// left on the server are fencing keys with an expiry.
async fn shutdown_stops_waiters_releases_holders_and_leaves_nothing(fx: Fixture) {
    let client = fx.client().clone();
    let bodies = Arc::new(Bodies::default());
    let (finish, finish_signal) = watch::channel(false);
    let key = |i: usize| format!("shutdown:{i}");

    let mut holders = Vec::new();
    for i in 0..HELD {
        let (client, bodies, mut finish_signal) = (client.clone(), Arc::clone(&bodies), finish_signal.clone());
        holders.push(tokio::spawn(async move {
            client
                .lock(key(i))
                .ttl(secs(10))
                .run(async move {
                    let _ended = CountOnDrop(Arc::clone(&bodies.ended));
                    bodies.started.fetch_add(1, Ordering::SeqCst);
                    if i < FINISHING {
                        finish_signal.wait_for(|finish| *finish).await.expect("the test keeps the sender");
                        bodies.check_not_after_shutdown();
                        return i;
                    }
                    loop {
                        tokio::time::sleep(ms(20)).await;
                        bodies.check_not_after_shutdown();
                    }
                })
                .await
        }));
    }
    eventually(secs(20), "every holder's body started", || {
        let bodies = Arc::clone(&bodies);
        async move { bodies.started.load(Ordering::SeqCst) == HELD }
    })
    .await;
    let guard = client.lock("shutdown:guard").ttl(secs(10)).acquire().await.expect("a free lock");

    // Waiters on the client's own held locks: half on finishing bodies' keys, half on the others'.
    let waited_keys: Vec<usize> = (0..WAITING / 2).chain(FINISHING..FINISHING + WAITING / 2).collect();
    let mut waiters = Vec::new();
    for &i in &waited_keys {
        let (client, bodies) = (client.clone(), Arc::clone(&bodies));
        waiters.push(tokio::spawn(async move {
            let request = client.lock(key(i)).ttl(secs(10)).wait(secs(60));
            request.run(async move { bodies.should_never_run.fetch_add(1, Ordering::SeqCst) }).await
        }));
    }
    if fx.backend() == Backend::Redlock {
        // No queue to observe on Redlock: waiters poll. Give their first attempts time to find the locks busy.
        tokio::time::sleep(ms(300)).await;
    } else {
        for &i in &waited_keys {
            eventually(secs(10), "a waiter queued", || {
                let client = client.clone();
                async move { client.lock_info(&key(i)).await.expect("lock_info").is_some_and(|info| info.waiting > 0) }
            })
            .await;
        }
    }

    let shutdown = client.shutdown(GRACE);
    tokio::pin!(shutdown);
    // One poll starts it.
    assert!(tokio::time::timeout(ms(0), &mut shutdown).await.is_err(), "resolved although bodies hold locks");

    // At once: new requests fail, whatever their form, and their bodies never run.
    let fresh = client.lock("shutdown:fresh").acquire().await;
    assert!(matches!(fresh, Err(LockError::ShuttingDown)), "{fresh:?}");
    assert!(matches!(client.lock("shutdown:fresh").try_acquire().await, Err(LockError::ShuttingDown)));
    let never = client.lock("shutdown:fresh").run(async { bodies.should_never_run.fetch_add(1, Ordering::SeqCst) });
    assert!(matches!(never.await, Err(LockError::ShuttingDown)));
    // The waiters stop waiting.
    for waiter in waiters {
        let outcome = within(secs(10), "a waiter stops", waiter).await.expect("waiter task");
        assert!(matches!(outcome, Err(LockError::ShuttingDown)), "{outcome:?}");
    }

    // The finishing bodies end within the grace period; shutdown then waits out the rest of it.
    finish.send_replace(true);
    within(GRACE * 4, "shutdown resolves", &mut shutdown).await;
    bodies.shutdown_returned.store(true, Ordering::SeqCst);
    assert_eq!(bodies.ended.load(Ordering::SeqCst), HELD, "a body was still there when shutdown returned");

    for (i, holder) in holders.into_iter().enumerate() {
        let outcome = within(secs(10), "a holder's run returns", holder).await.expect("holder task");
        match outcome {
            Ok(value) => assert!(i < FINISHING && value == i, "body {i} returned {value}"),
            Err(LockError::Lost { key: lost, .. }) => {
                assert!(i >= FINISHING && lost == key(i), "body {i}: lost {lost}")
            }
            Err(e) => panic!("body {i}: {e}"),
        }
    }
    assert!(guard.is_lost(), "a guard held through the grace period does not read lost");
    within(secs(1), "the guard's lost() resolves", guard.lost()).await;
    assert_eq!(guard.release().await.expect("release"), ReleaseOutcome::Expired, "shutdown released it already");

    // Nothing held, nothing queued; on a server, only freed records (each keeping its last fencing token) and,
    // where a release handed a lock over, its `:last` (the heir's token, kept for the heir's ttl), which expire.
    for i in 0..HELD {
        assert!(client.lock_info(&key(i)).await.expect("lock_info").is_none(), "lock {i} still held");
    }
    assert!(client.lock_info("shutdown:guard").await.expect("lock_info").is_none(), "the guard's lock still held");
    if let Some(left) = fx.keys_left().await {
        let records: Vec<String> = (0..HELD).map(|i| client.record_key(&key(i))).collect();
        for (name, pttl) in &left {
            let record = name.strip_suffix(":last").unwrap_or(name);
            let freed = records.iter().any(|r| r == record) || record == client.record_key("shutdown:guard");
            assert!(freed && *pttl > 0, "left on the server: {name} (pttl {pttl}); all: {left:?}");
        }
        if fx.gives_fencing_tokens() {
            assert!(!left.is_empty(), "no freed record left: the scan looks in the wrong place");
        }
    }
    // Still shut down; no body ran after it returned, nor any body of a request it stopped.
    assert!(matches!(client.lock("shutdown:later").acquire().await, Err(LockError::ShuttingDown)));
    tokio::time::sleep(ms(100)).await; // the looping bodies would have polled again by now
    assert_eq!(bodies.ran_after_shutdown.load(Ordering::SeqCst), 0, "a body ran after shutdown returned");
    assert_eq!(bodies.should_never_run.load(Ordering::SeqCst), 0, "a stopped or refused request's body ran");
}

/// A client that holds nothing and runs no body shuts down at once, not after the grace period.
async fn shutdown_without_locks_does_not_wait_for_the_grace_period(fx: Fixture) {
    let client = fx.client();
    client.lock("shutdown:idle").run(async {}).await.expect("run");
    within(secs(10), "shutdown of an idle client", client.shutdown(secs(600))).await;
    assert!(matches!(client.lock("shutdown:idle").acquire().await, Err(LockError::ShuttingDown)));
    // A second call waits for the same nothing.
    within(secs(10), "shutdown again", client.shutdown(secs(600))).await;
}
