//! Graceful shutdown of a client ([`Client::shutdown`](crate::Client::shutdown)): what of the client may still
//! be on the server or still run a lock body, so that shutdown can stop it, release it and wait for it.
//!
//! Everything that may leave something on the server or run a body holds an [`Activity`]: a request under way
//! (from its first attempt to its clean-up, also a clean-up in the background after a cancellation), a grant
//! (until its release has been sent), and a whole [`run`](crate::LockRequest::run) call (so no body outlives
//! the shutdown). Shutdown waits for the count of activities to reach zero. Grants are also registered, so that
//! shutdown can find the ones still held when the grace period ends and release them itself.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::Notify;

use crate::grant::Grant;
use crate::Client;

impl Client {
    /// Shuts this client down gracefully, for the end of a process (a SIGTERM): stops taking locks, gives the
    /// lock bodies under way `grace` to finish, then releases every lock the client still holds, and resolves
    /// when nothing of the client is left on the server and none of its lock bodies runs any more.
    ///
    /// - **At once**: every new request ([`acquire`](crate::LockRequest::acquire), `try_acquire`, `run`, the
    ///   attribute) fails with [`ShuttingDown`](crate::LockError::ShuttingDown), and so does every request
    ///   still waiting for a lock: it leaves the wait queue. A request granted while shutdown starts gives the
    ///   grant back. A nested (reentrant) request inside a running body still succeeds: it asks the server for
    ///   nothing.
    /// - **During `grace`**: bodies and guards keep their locks, renewed as usual. If all of them end sooner,
    ///   shutdown goes on at once.
    /// - **After `grace`**: every lock still held is *lost*: [`LockGuard::is_lost`](crate::LockGuard::is_lost)
    ///   turns true and [`LockGuard::lost`](crate::LockGuard::lost) resolves before the lock is released, so a
    ///   body under [`OnLost::Abort`](crate::OnLost::Abort) (the default) is dropped and its `run` returns
    ///   [`Lost`](crate::LockError::Lost), as for any lost lock. Then each is released on the server by
    ///   compare-and-delete of its own token (a lock taken with [`min_hold`](crate::LockRequest::min_hold)
    ///   stays kept by nobody until its `min_hold` is up, as after any release).
    /// - **Resolves** once every request's clean-up is done (queue places withdrawn, grants given back), every
    ///   release has been sent and every [`run`](crate::LockRequest::run) (and annotated function) of this
    ///   client has returned: no lock body of this client starts or runs after it. A body under
    ///   [`OnLost::Continue`](crate::OnLost::Continue) is told its lock is lost and awaited like the others,
    ///   so it should stop on [`LockGuard::lost`](crate::LockGuard::lost); code that holds a
    ///   [`LockGuard`](crate::LockGuard) itself, outside `run`, is told and not awaited.
    ///
    /// What stays on the server is what outlives any release by design, each with its lease's expiry: a freed
    /// lock's record, which keeps only its last fencing token so that tokens keep rising (the README's "What is
    /// stored in Redis" gives its life), and records kept by `min_hold`. If the server cannot be
    /// reached, a release or withdrawal that fails is logged and what it would have removed expires by itself
    /// (records with their lease, queue places within three retry intervals); shutdown still resolves.
    ///
    /// Shutdown is for good: the client, all its clones and the client [`install`](crate::install)ed as the
    /// global one (if it is one of them) refuse lock requests from then on, and `install` cannot replace it;
    /// [`lock_info`](Client::lock_info) and [`force_unlock`](Client::force_unlock) still work. Calling it again
    /// waits again for the same things. Do not await it inside one of this client's lock bodies: it waits
    /// for that body to end.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// use std::time::Duration;
    /// let client = distlock::Client::builder().memory().build().await?;
    /// let job = tokio::spawn({
    ///     let client = client.clone();
    ///     async move { client.lock("job").run(std::future::pending::<()>()).await } // a body that never ends
    /// });
    /// while client.lock_info("job").await?.is_none() { tokio::task::yield_now().await }
    /// client.shutdown(Duration::from_millis(200)).await;
    /// assert!(matches!(job.await.unwrap(), Err(distlock::LockError::Lost { .. })));
    /// assert!(client.lock_info("job").await?.is_none(), "released");
    /// assert!(matches!(client.lock("job").acquire().await, Err(distlock::LockError::ShuttingDown)));
    /// # Ok(()) }
    /// ```
    pub async fn shutdown(&self, grace: Duration) {
        let shutdown = &self.inner.shutdown;
        shutdown.start();
        // Bodies and guards may finish in the grace period; if all do, there is nothing to wait for.
        let _ = tokio::time::timeout(grace, shutdown.idle()).await;
        let held = shutdown.live_grants().into_iter().filter(|grant| grant.is_unsettled());
        futures_util::future::join_all(held.map(|grant| async move { grant.release_for_shutdown().await })).await;
        // Withdrawals, give-backs and releases under way elsewhere, and the `run` calls whose bodies are being
        // dropped.
        shutdown.idle().await;
    }
}

/// A client's shutdown state: whether it started, what is still active, the live grants.
#[derive(Debug)]
pub(crate) struct Shutdown {
    tracker: Arc<Tracker>,
}

#[derive(Debug)]
struct Tracker {
    /// True once shutdown started: new requests fail, waiters stop.
    started: AtomicBool,
    /// Woken when shutdown starts. Not a watch channel: its receivers wait on one of eight slots that tokio
    /// draws from an unseeded generator, so the requests waiting when shutdown starts were woken in a random
    /// order, and a simulated schedule with a shutdown did not replay exactly.
    starting: Notify,
    /// How many [`Activity`]s are alive.
    active: AtomicUsize,
    /// Woken when `active` drops to zero.
    idle: Notify,
    /// Every grant alive, by id, so that shutdown can release those still held.
    grants: Mutex<Grants>,
}

#[derive(Debug, Default)]
struct Grants {
    /// Ordered by id, which rises: a BTreeMap hashes nothing, where a HashMap's SipHash cost every grant about
    /// 300 client instructions (registered and unregistered once each).
    live: BTreeMap<u64, Weak<Grant>>,
    next_id: u64,
}

impl Default for Shutdown {
    fn default() -> Self {
        let tracker = Tracker {
            started: AtomicBool::new(false),
            starting: Notify::new(),
            active: AtomicUsize::new(0),
            idle: Notify::new(),
            grants: Mutex::default(),
        };
        Self { tracker: Arc::new(tracker) }
    }
}

impl Shutdown {
    /// Starts the shutdown (again: does nothing). From now on new requests fail and waiters stop.
    pub(crate) fn start(&self) {
        // SeqCst, as the last activity's drop (which reads it) and `idle` (which reads `active` after it).
        self.tracker.started.store(true, Ordering::SeqCst);
        self.tracker.starting.notify_waiters();
    }

    pub(crate) fn is_started(&self) -> bool {
        self.tracker.started.load(Ordering::Acquire)
    }

    /// Resolves once shutdown has started.
    pub(crate) async fn started(&self) {
        let starting = self.tracker.starting.notified();
        tokio::pin!(starting);
        // Registered before reading, so a start in between is not missed.
        starting.as_mut().enable();
        if !self.is_started() {
            starting.await;
        }
    }

    /// Marks something that shutdown must wait for, until the returned value is dropped.
    pub(crate) fn activity(&self) -> Activity {
        self.tracker.active.fetch_add(1, Ordering::AcqRel);
        Activity(Arc::clone(&self.tracker))
    }

    /// Resolves when no [`Activity`] is alive. Only after [`start`](Self::start): until then the last activity
    /// to end tells nobody.
    pub(crate) async fn idle(&self) {
        debug_assert!(self.is_started(), "idle is awaited only once shutdown started");
        loop {
            let idle = self.tracker.idle.notified();
            tokio::pin!(idle);
            // Registered before reading, so that the last activity ending in between is not missed.
            idle.as_mut().enable();
            if self.tracker.active.load(Ordering::SeqCst) == 0 {
                return;
            }
            idle.await;
        }
    }

    /// A new grant's id in the registry.
    pub(crate) fn next_grant_id(&self) -> u64 {
        let mut grants = self.grants();
        grants.next_id += 1;
        grants.next_id
    }

    pub(crate) fn register(&self, id: u64, grant: &Arc<Grant>) {
        self.grants().live.insert(id, Arc::downgrade(grant));
    }

    pub(crate) fn unregister(&self, id: u64) {
        self.grants().live.remove(&id);
    }

    /// The grants alive now.
    pub(crate) fn live_grants(&self) -> Vec<Arc<Grant>> {
        self.grants().live.values().filter_map(Weak::upgrade).collect()
    }

    fn grants(&self) -> MutexGuard<'_, Grants> {
        // Only map inserts and removals happen under it: a panic elsewhere cannot leave it half-written.
        self.tracker.grants.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Something shutdown waits for, while this value lives.
#[derive(Debug)]
pub(crate) struct Activity(Arc<Tracker>);

impl Drop for Activity {
    fn drop(&mut self) {
        // Only shutdown waits for idleness, and only once started: before that, the last activity ending
        // wakes nobody, and skips the Notify's lock (every lone lock cycle ends one). SeqCst on both sides: a
        // shutdown that starts as this activity ends either sees `active` at 0 or is seen to have started.
        if self.0.active.fetch_sub(1, Ordering::SeqCst) == 1 && self.0.started.load(Ordering::SeqCst) {
            self.0.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::Shutdown;

    /// `idle` waits for the last activity, and is ready at once when there is none.
    #[tokio::test(start_paused = true)]
    async fn idle_waits_for_the_last_activity() {
        let shutdown = Shutdown::default();
        shutdown.start();
        shutdown.idle().await;
        let (first, second) = (shutdown.activity(), shutdown.activity());
        drop(first);
        assert!(tokio::time::timeout(Duration::from_secs(1), shutdown.idle()).await.is_err(), "one is left");
        crate::hooks::spawn(async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            drop(second);
        });
        tokio::time::timeout(Duration::from_secs(10), shutdown.idle()).await.expect("idle once the last ends");
    }

    /// A grant leaves the registry of live grants when it is dropped: a client that takes and gives back locks
    /// for months keeps no entry per lock it ever held.
    #[tokio::test]
    async fn a_dropped_grant_leaves_the_registry() {
        let client = crate::Client::builder().memory().build().await.expect("memory");
        let live = || client.inner.shutdown.grants().live.len();
        for i in 0..10 {
            let guard = client.lock(format!("k{i}")).acquire().await.expect("acquire");
            assert_eq!(live(), 1, "the held grant is registered");
            guard.release().await.expect("release");
        }
        let dropped = client.lock("dropped").acquire().await.expect("acquire");
        drop(dropped);
        // The dropped guard's release runs in the background: its grant goes once that is done.
        for _ in 0..100 {
            if live() == 0 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(live(), 0, "grants no longer alive are still registered");
    }

    /// `started` resolves once `start` is called, also for a waiter that subscribed before.
    #[tokio::test(start_paused = true)]
    async fn started_resolves_on_start() {
        let shutdown = std::sync::Arc::new(Shutdown::default());
        assert!(!shutdown.is_started());
        let waiter = crate::hooks::spawn({
            let shutdown = std::sync::Arc::clone(&shutdown);
            async move { shutdown.started().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        shutdown.start();
        tokio::time::timeout(Duration::from_secs(1), waiter).await.expect("resolved").expect("no panic");
        assert!(shutdown.is_started());
        shutdown.started().await; // after the start: at once
    }
}
