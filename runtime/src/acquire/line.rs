//! A client's waiters of each lock, in the order they started waiting. The first of them refreshes its place
//! on its retry schedule, and with it the client's mark for the lock, which keeps every place of the client
//! alive; the others refresh only their own places, seldom. So a client with 10,000 waiters on a lock costs the
//! store about one refresh per retry interval, not 10,000, and a client that dies still leaves the queue, every
//! waiter of it, when its mark runs out (`Queueing::register`).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;

/// How often a waiter that is not first in its client's line refreshes its own place (the retry strategy's
/// jitter on top: every 15–30 s), unless its retry schedule is slower still.
pub(super) const SELDOM: Duration = Duration::from_secs(30);

/// How long such a place lasts unless refreshed: three of its refreshes, so two missed ones cost nothing. A
/// waiter of a live client that vanished without leaving the queue (its withdrawal lost) stays in line at
/// most this long; if the lock comes to it first, its hand-over lease runs out unclaimed, as a dead waiter's.
pub(super) const KEEP: Duration = Duration::from_millis(3 * 30_000 + 100);

/// Per lock record, the client's waiters by when they joined, each with the bell that tells it it is first.
type ByLock = HashMap<String, BTreeMap<u64, Arc<Notify>>>;

/// Every line of one client.
#[derive(Debug)]
pub(crate) struct Lines {
    /// The client's id, random: its waiters' places name it, and the store keeps its mark per lock.
    pub(crate) id: u64,
    by_lock: Arc<Mutex<ByLock>>,
    joined: AtomicU64,
}

impl Default for Lines {
    fn default() -> Self {
        let id = crate::hooks::random_u64().or_else(|| getrandom::u64().ok()).unwrap_or_else(|| {
            // No OS randomness: any id distinct from the other clients' will do; these rarely collide.
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            (nanos.as_nanos() as u64) ^ u64::from(std::process::id()).rotate_left(32)
        });
        Self { id, by_lock: Arc::default(), joined: AtomicU64::new(0) }
    }
}

fn lock(by_lock: &Mutex<ByLock>) -> MutexGuard<'_, ByLock> {
    // Every critical section leaves the map consistent, so a panic elsewhere cannot have broken it.
    by_lock.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Lines {
    /// Joins the line of the lock `record`, last.
    pub(super) fn join(&self, record: &str) -> InLine {
        let order = self.joined.fetch_add(1, Ordering::Relaxed);
        let bell = Arc::new(Notify::new());
        lock(&self.by_lock).entry(record.to_owned()).or_default().insert(order, Arc::clone(&bell));
        InLine { by_lock: Arc::clone(&self.by_lock), record: record.to_owned(), order, bell }
    }

    /// How many of this client's waiters wait for the lock `record` (for the crate's tests).
    #[cfg(test)]
    pub(super) fn len(&self, record: &str) -> usize {
        lock(&self.by_lock).get(record).map_or(0, BTreeMap::len)
    }
}

/// A waiter's place in its client's line for one lock; leaving it (dropped) makes the next one first.
#[derive(Debug)]
pub(super) struct InLine {
    by_lock: Arc<Mutex<ByLock>>,
    record: String,
    order: u64,
    bell: Arc<Notify>,
}

impl InLine {
    /// Whether this waiter is its client's first for the lock.
    pub(super) fn is_first(&self) -> bool {
        let by_lock = lock(&self.by_lock);
        by_lock.get(&self.record).and_then(|line| line.keys().next()) == Some(&self.order)
    }

    /// Resolves once this waiter is first (at once if it is).
    pub(super) async fn first(&self) {
        // The bell keeps a ring that came before this wait (`notify_one`), so none is missed.
        while !self.is_first() {
            self.bell.notified().await;
        }
    }
}

impl Drop for InLine {
    fn drop(&mut self) {
        let mut by_lock = lock(&self.by_lock);
        let Some(line) = by_lock.get_mut(&self.record) else { return };
        let was_first = line.keys().next() == Some(&self.order);
        line.remove(&self.order);
        match line.values().next() {
            Some(next) if was_first => next.notify_one(),
            Some(_) => {}
            None => {
                by_lock.remove(&self.record);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Lines;

    #[tokio::test]
    async fn the_next_waiter_is_first_once_the_first_leaves() {
        let lines = Lines::default();
        let (a, b, c) = (lines.join("r"), lines.join("r"), lines.join("r"));
        let other = lines.join("s");
        assert!(a.is_first() && !b.is_first() && !c.is_first());
        assert!(other.is_first(), "each lock has a line of its own");
        drop(b);
        assert!(!c.is_first(), "a waiter behind the first leaving changes nothing");
        drop(a);
        // The bell rang before anyone listened: it is kept.
        tokio::time::timeout(std::time::Duration::from_secs(5), c.first()).await.expect("c is first");
        drop(c);
        assert_eq!(lines.len("r"), 0, "an empty line is removed");
        assert_eq!(lines.len("s"), 1);
    }
}
