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

/// Per lock record, the client's line.
type ByLock = HashMap<String, Line>;

/// One lock's line: the waiters by when they joined, each with the bell that tells it it is first or must
/// register again; and the generation of the id its places name, drawn from the client's one counter, so a
/// line never reuses an id an earlier line of the same lock had (whose mark may keep an abandoned place).
#[derive(Debug)]
struct Line {
    members: BTreeMap<u64, Arc<Notify>>,
    generation: u64,
}

/// What changed for a waiter in its line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Change {
    /// It is first now.
    First,
    /// A waiter left without its place surely gone (a cancelled request, whose withdrawal may not reach the
    /// store): the line's places name a new id now, so the old one's mark, which would keep that place alive,
    /// runs out. Every waiter registers again at once, under the new id.
    Renamed,
}

/// Every line of one client.
#[derive(Debug)]
pub(crate) struct Lines {
    /// The client's id, random: its waiters' places name it (renamed per line, `InLine::naming`), and the
    /// store keeps its mark per lock.
    id: u64,
    by_lock: Arc<Mutex<ByLock>>,
    /// Gives every join and every generation a number of its own.
    counter: Arc<AtomicU64>,
}

impl Default for Lines {
    fn default() -> Self {
        let id = crate::hooks::random_u64().or_else(|| getrandom::u64().ok()).unwrap_or_else(|| {
            // No OS randomness: any id distinct from the other clients' will do; these rarely collide.
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            (nanos.as_nanos() as u64) ^ u64::from(std::process::id()).rotate_left(32)
        });
        Self { id, by_lock: Arc::default(), counter: Arc::default() }
    }
}

fn lock(by_lock: &Mutex<ByLock>) -> MutexGuard<'_, ByLock> {
    // Every critical section leaves the map consistent, so a panic elsewhere cannot have broken it.
    by_lock.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Lines {
    /// Joins the line of the lock `record`, last.
    pub(super) fn join(&self, record: &str) -> InLine {
        let order = self.counter.fetch_add(1, Ordering::Relaxed);
        let bell = Arc::new(Notify::new());
        let mut by_lock = lock(&self.by_lock);
        let line =
            by_lock.entry(record.to_owned()).or_insert_with(|| Line { members: BTreeMap::new(), generation: order });
        line.members.insert(order, Arc::clone(&bell));
        InLine {
            by_lock: Arc::clone(&self.by_lock),
            counter: Arc::clone(&self.counter),
            id: self.id,
            record: record.to_owned(),
            order,
            bell,
            abandoned: false,
        }
    }

    /// How many of this client's waiters wait for the lock `record` (for the crate's tests).
    #[cfg(test)]
    pub(super) fn len(&self, record: &str) -> usize {
        lock(&self.by_lock).get(record).map_or(0, |line| line.members.len())
    }
}

/// A waiter's place in its client's line for one lock; leaving it (dropped) makes the next one first.
#[derive(Debug)]
pub(super) struct InLine {
    by_lock: Arc<Mutex<ByLock>>,
    counter: Arc<AtomicU64>,
    /// The client's id.
    id: u64,
    record: String,
    order: u64,
    bell: Arc<Notify>,
    /// Left without its place surely gone: the line is renamed when it leaves.
    abandoned: bool,
}

impl InLine {
    /// Whether this waiter is its client's first for the lock, and the line's generation.
    pub(super) fn state(&self) -> (bool, u64) {
        let by_lock = lock(&self.by_lock);
        let line = by_lock.get(&self.record);
        (line.and_then(|l| l.members.keys().next()) == Some(&self.order), line.map_or(0, |l| l.generation))
    }

    /// Whether this waiter is its client's first for the lock.
    pub(super) fn is_first(&self) -> bool {
        self.state().0
    }

    /// The id the line's places name now, and the line's generation: the client's id, renamed by each
    /// generation.
    pub(super) fn naming(&self) -> (u64, u64) {
        let generation = self.state().1;
        (self.id.wrapping_add(generation), generation)
    }

    /// Resolves once this waiter is first, if it was not (`was_first`), or the line is renamed past
    /// `generation`.
    pub(super) async fn changed(&self, was_first: bool, generation: u64) -> Change {
        // The bell keeps a ring that came before this wait (`notify_one`), so none is missed.
        loop {
            let (first, now) = self.state();
            if now != generation {
                return Change::Renamed;
            }
            if first && !was_first {
                return Change::First;
            }
            self.bell.notified().await;
        }
    }

    /// This waiter leaves without its place surely gone from the store (its request was cancelled, or its
    /// withdrawal failed).
    pub(super) fn abandon(&mut self) {
        self.abandoned = true;
    }
}

impl Drop for InLine {
    fn drop(&mut self) {
        let mut by_lock = lock(&self.by_lock);
        let Some(line) = by_lock.get_mut(&self.record) else { return };
        let was_first = line.members.keys().next() == Some(&self.order);
        line.members.remove(&self.order);
        if line.members.is_empty() {
            // Nobody refreshes its mark now: it runs out, and with it any place left behind.
            by_lock.remove(&self.record);
        } else if self.abandoned {
            line.generation = self.counter.fetch_add(1, Ordering::Relaxed);
            line.members.values().for_each(|bell| bell.notify_one());
        } else if let (true, Some(next)) = (was_first, line.members.values().next()) {
            next.notify_one();
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
        let generation = c.state().1;
        let change = tokio::time::timeout(std::time::Duration::from_secs(5), c.changed(false, generation)).await;
        assert_eq!(change.expect("c is first"), super::Change::First);
        let mut d = lines.join("r");
        d.abandon();
        let (first, generation) = c.state();
        assert!(first);
        let id = c.naming().0;
        drop(d);
        let (_, renamed) = c.state();
        assert_ne!(renamed, generation, "a waiter that abandons its place renames the line");
        assert_ne!(c.naming().0, id);
        drop(c);
        let e = lines.join("r");
        assert!(![generation, renamed].contains(&e.state().1), "a new line of the lock reuses no generation");
        drop(e);
        assert_eq!(lines.len("r"), 0, "an empty line is removed");
        assert_eq!(lines.len("s"), 1);
    }
}
