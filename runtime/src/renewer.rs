//! The watchdog: one scheduler per client renews every held lock a third of a lease after its last renewal.
//! A held lock costs a queue entry, not a task; each renewal is a short task of its own, so renewals of many
//! locks travel pipelined on the shared connection.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::grant::{Grant, Lease, QueueKey};

/// Schedules renewals for the grants of one client.
#[derive(Debug, Default)]
pub(crate) struct Renewer {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    queue: Mutex<Queue>,
    /// Wakes the scheduler when an entry earlier than all others arrives, or the client is gone.
    wake: Notify,
    /// The client is gone: the scheduler ends.
    closed: AtomicBool,
}

#[derive(Debug, Default)]
struct Queue {
    /// (when, sequence) → the grant to renew then. A grant has at most one entry, removed when it finishes.
    due: BTreeMap<QueueKey, Weak<Grant>>,
    sequence: u64,
    task: Option<JoinHandle<()>>,
}

impl Shared {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        // Every critical section leaves the queue consistent, so a panic elsewhere cannot have broken it.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Most renewals started per scheduler wake-up; the rest follow at once on the next turn.
const BATCH: usize = 1024;

impl Renewer {
    /// Plans the next renewal of `grant` at `when`, replacing any plan made before.
    pub(crate) fn schedule(&self, grant: &Arc<Grant>, when: Instant) {
        schedule(&self.shared, grant, when);
    }

    /// Removes the grant's entry, if it has one: it will not be renewed again.
    pub(crate) fn cancel(&self, grant: &Grant) {
        let mut queue = self.shared.queue();
        if let Some(key) = grant.queued().take() {
            queue.due.remove(&key);
        }
    }
}

/// Puts the grant's entry at `when`, replacing the one it had.
fn schedule(shared: &Arc<Shared>, grant: &Arc<Grant>, when: Instant) {
    let mut queue = shared.queue();
    if grant.is_finished() {
        return;
    }
    queue.sequence += 1;
    let key = (when, queue.sequence);
    if let Some(old) = grant.queued().replace(key) {
        queue.due.remove(&old);
    }
    let earliest = queue.due.first_key_value().is_none_or(|(&first, _)| key < first);
    queue.due.insert(key, Arc::downgrade(grant));
    // Started on first use, and again if the runtime it ran on has gone.
    if queue.task.as_ref().is_none_or(JoinHandle::is_finished) {
        queue.task = Some(tokio::spawn(run(Arc::clone(shared))));
    } else if earliest {
        drop(queue);
        shared.wake.notify_one();
    }
}

impl Drop for Renewer {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.wake.notify_one();
    }
}

/// The scheduler: sleeps until the earliest entry is due, starts the due renewals, repeats. Ends when its
/// client is gone.
async fn run(strong: Arc<Shared>) {
    loop {
        if strong.closed.load(Ordering::Acquire) {
            return;
        }
        let now = Instant::now();
        let mut due = Vec::new();
        let next = {
            let mut queue = strong.queue();
            while due.len() < BATCH {
                match queue.due.first_entry() {
                    Some(entry) if entry.key().0 <= now => {
                        let (key, grant) = entry.remove_entry();
                        if let Some(grant) = grant.upgrade() {
                            let mut queued = grant.queued();
                            if *queued == Some(key) {
                                *queued = None;
                            }
                            drop(queued);
                            due.push(grant);
                        }
                    }
                    _ => break,
                }
            }
            queue.due.first_key_value().map(|(&(when, _), _)| when)
        };
        for grant in due {
            if !grant.is_finished() {
                tokio::spawn(renew(grant, Arc::downgrade(&strong)));
            }
        }
        let wake = strong.wake.notified();
        match next {
            Some(when) if when <= Instant::now() => continue,
            Some(when) => {
                tokio::select! {
                    () = wake => {}
                    () = tokio::time::sleep_until(when) => {}
                }
            }
            None => wake.await,
        }
    }
}

/// One renewal of one grant, then the plan for the next.
async fn renew(grant: Arc<Grant>, renewer: Weak<Shared>) {
    let lease = grant.lease();
    if lease.lost {
        return;
    }
    let now = Instant::now();
    if now >= lease.valid_until {
        grant.mark_lost("no renewal succeeded before the lease ran out");
        return;
    }
    if grant.max_hold_until.is_some_and(|cap| now >= cap) {
        // max_hold reached: no more renewals; the loss is reported when the lease runs out.
        tokio::time::sleep_until(lease.valid_until).await;
        if !grant.is_finished() {
            grant.mark_lost("max_hold reached: renewals stopped and the lease ran out");
        }
        return;
    }
    let next = match tokio::time::timeout_at(lease.valid_until, grant.renew(lease.ttl)).await {
        Ok(None) => return, // finished meanwhile
        Ok(Some(Ok(true))) => {
            let renewed = Lease::starting(lease.ttl, now);
            grant.lease.send_if_modified(|l| {
                // An extend sent after this renewal has set a newer lease: keep it.
                let newer = l.lost || l.renewed_from > now;
                if !newer {
                    *l = renewed;
                }
                !newer
            });
            grant.lease().renew_at()
        }
        Ok(Some(Ok(false))) => {
            grant.mark_lost("a renewal found the lock gone or taken by another owner");
            return;
        }
        Ok(Some(Err(e))) => {
            tracing::debug!(key = %grant.keys.name, error = %e, "distlock: renewal failed; retrying");
            let retry = (lease.ttl / 20).max(std::time::Duration::from_millis(10));
            (Instant::now() + retry).min(lease.valid_until)
        }
        Err(_) => {
            grant.mark_lost("no renewal succeeded before the lease ran out");
            return;
        }
    };
    if let Some(shared) = renewer.upgrade() {
        schedule(&shared, &grant, next);
    }
}
