//! Graceful shutdown of a client ([`Client::shutdown`](crate::Client::shutdown)): what of the client may still
//! be on the server or still run a lock body, so that shutdown can stop it, release it and wait for it.
//!
//! Everything that may leave something on the server or run a body holds an [`Activity`]: a request under way
//! (from its first attempt to its clean-up, also a clean-up in the background after a cancellation), a grant
//! (until its release has been sent), and a whole [`run`](crate::LockRequest::run) call (so no body outlives
//! the shutdown). Shutdown waits for the count of activities to reach zero. Grants are also registered, so that
//! shutdown can find the ones still held when the grace period ends and release them itself.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use tokio::sync::{watch, Notify};

use crate::grant::Grant;

/// A client's shutdown state: whether it started, what is still active, the live grants.
#[derive(Debug)]
pub(crate) struct Shutdown {
    tracker: Arc<Tracker>,
}

#[derive(Debug)]
struct Tracker {
    /// True once shutdown started: new requests fail, waiters stop.
    started: watch::Sender<bool>,
    /// How many [`Activity`]s are alive.
    active: AtomicUsize,
    /// Woken when `active` drops to zero.
    idle: Notify,
    /// Every grant alive, by id, so that shutdown can release those still held.
    grants: Mutex<Grants>,
}

#[derive(Debug, Default)]
struct Grants {
    live: HashMap<u64, Weak<Grant>>,
    next_id: u64,
}

impl Default for Shutdown {
    fn default() -> Self {
        let tracker = Tracker {
            started: watch::Sender::new(false),
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
        self.tracker.started.send_replace(true);
    }

    pub(crate) fn is_started(&self) -> bool {
        *self.tracker.started.borrow()
    }

    /// Resolves once shutdown has started.
    pub(crate) async fn started(&self) {
        let mut started = self.tracker.started.subscribe();
        // The sender lives as long as the client this is called through, so this cannot fail.
        let _ = started.wait_for(|started| *started).await;
    }

    /// Marks something that shutdown must wait for, until the returned value is dropped.
    pub(crate) fn activity(&self) -> Activity {
        self.tracker.active.fetch_add(1, Ordering::AcqRel);
        Activity(Arc::clone(&self.tracker))
    }

    /// Resolves when no [`Activity`] is alive.
    pub(crate) async fn idle(&self) {
        loop {
            let idle = self.tracker.idle.notified();
            tokio::pin!(idle);
            // Registered before reading, so that the last activity ending in between is not missed.
            idle.as_mut().enable();
            if self.tracker.active.load(Ordering::Acquire) == 0 {
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
        if self.0.active.fetch_sub(1, Ordering::AcqRel) == 1 {
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
        shutdown.idle().await;
        let (first, second) = (shutdown.activity(), shutdown.activity());
        drop(first);
        assert!(tokio::time::timeout(Duration::from_secs(1), shutdown.idle()).await.is_err(), "one is left");
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            drop(second);
        });
        tokio::time::timeout(Duration::from_secs(10), shutdown.idle()).await.expect("idle once the last ends");
    }

    /// `started` resolves once `start` is called, also for a waiter that subscribed before.
    #[tokio::test(start_paused = true)]
    async fn started_resolves_on_start() {
        let shutdown = std::sync::Arc::new(Shutdown::default());
        assert!(!shutdown.is_started());
        let waiter = tokio::spawn({
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
