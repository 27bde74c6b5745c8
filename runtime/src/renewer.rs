//! The watchdog: one scheduler per client renews every held lock a third of a lease after its last renewal.
//! A held lock costs a queue entry, not a task; the renewals that come due together go out from one short
//! task, one pipeline per part of the store (a cluster's node), each applied as soon as it is answered.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::backend::{Renewal, Store};
use crate::grant::{Grant, InFlight, QueueKey};
use crate::lease::{Applied, Lease};
use crate::{observe, LossReason};

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
    /// How many times the scheduler looked at the queue (for the tests).
    #[cfg(test)]
    passes: std::sync::atomic::AtomicU64,
}

#[derive(Debug, Default)]
struct Queue {
    /// (when, sequence) → the grant to renew then. A grant has at most one entry, removed when it finishes.
    due: BTreeMap<QueueKey, Weak<Grant>>,
    sequence: u64,
    task: Option<JoinHandle<()>>,
    /// When the scheduler wakes by itself, as it last planned under this lock (`None`: only when woken). An
    /// entry due no earlier needs no wake-up: a lock taken after the last one was released (one task in a
    /// loop) costs the scheduler nothing.
    wakes_at: Option<Instant>,
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
    queue.due.insert(key, Arc::downgrade(grant));
    // Started on first use, and again if the runtime it ran on has gone.
    if queue.task.as_ref().is_none_or(JoinHandle::is_finished) {
        queue.task = Some(crate::hooks::spawn(run(Arc::clone(shared))));
    } else if queue.wakes_at.is_none_or(|at| when < at) {
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
        #[cfg(test)]
        strong.passes.fetch_add(1, Ordering::Relaxed);
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
            let next = queue.due.first_key_value().map(|(&(when, _), _)| when);
            queue.wakes_at = next;
            next
        };
        due.retain(|grant| !grant.is_finished());
        if !due.is_empty() {
            crate::hooks::spawn(renew_batch(due, Arc::downgrade(&strong)));
        }
        let wake = strong.wake.notified();
        match next {
            Some(when) if when <= Instant::now() => continue,
            Some(when) => {
                tokio::select! {
                    biased;
                    () = wake => {}
                    () = tokio::time::sleep_until(when) => {}
                }
            }
            None => wake.await,
        }
    }
}

/// Renews the grants that came due together, then plans each one's next renewal: one pipeline per part of the
/// store ([`Store::renewal_shard`]: a cluster's node), all at once, each part's outcomes applied as soon as it
/// answers. In one pipeline across a cluster's nodes, a hung node held up the renewals the healthy nodes had
/// already answered until its calls timed out and were retried, past their leases (issue 37).
async fn renew_batch(grants: Vec<Arc<Grant>>, renewer: Weak<Shared>) {
    let sent = Instant::now();
    let mut rounds: Vec<Vec<Sending<'_>>> = Vec::new();
    let mut round_of: HashMap<u64, usize> = HashMap::new();
    for grant in &grants {
        let lease = grant.lease();
        if lease.lost {
            continue;
        }
        if sent >= lease.valid_until {
            grant.mark_lost(LossReason::NotRenewedInTime);
            continue;
        }
        if grant.max_hold_until.is_some_and(|cap| sent >= cap) {
            // max_hold reached: no more renewals; the loss is reported when the lease runs out.
            crate::hooks::spawn(expire(Arc::clone(grant), lease.valid_until));
            continue;
        }
        if let Some(ticket) = grant.begin_renewal() {
            // A renewal sets `ttl` from about now: the lease a claimed hand-over gave may end later (`redis`
            // simulation seed 1857 with the whole-API workload).
            let lease = grant.lower_for(lease.ttl, sent);
            let shard = grant.client.inner.backend.renewal_shard(&grant.keys);
            let round = *round_of.entry(shard).or_insert_with(|| {
                rounds.push(Vec::new());
                rounds.len() - 1
            });
            rounds[round].push((grant, lease, ticket));
        }
    }
    let renewer = &renewer;
    futures_util::future::join_all(rounds.into_iter().map(|round| renew_round(round, sent, renewer))).await;
}

/// A grant whose renewal is being sent: its lease when it was sent, and the mark of its renewal in flight.
type Sending<'a> = (&'a Arc<Grant>, Lease, InFlight<'a>);

/// One pipeline of renewals (sent at `sent`), then each lock's outcome and next renewal.
async fn renew_round(sending: Vec<Sending<'_>>, sent: Instant, renewer: &Weak<Shared>) {
    let Some(&(first, ..)) = sending.first() else { return };
    let items: Vec<Renewal<'_>> = sending
        .iter()
        .map(|(grant, lease, _)| Renewal { keys: &grant.keys, token: &grant.token, ttl: lease.ttl })
        .collect();
    // A reply after the last of the leases ran out can only report losses.
    let latest = sending.iter().map(|(_, lease, _)| lease.valid_until).max().unwrap_or(sent);
    let outcome = tokio::time::timeout_at(latest, first.client.inner.backend.renew_many(&items)).await;
    drop(items);
    let arrived = Instant::now();
    for (index, (grant, lease, ticket)) in sending.into_iter().enumerate() {
        let renewed = match &outcome {
            Ok(Ok(outcomes)) => match outcomes.get(index) {
                Some(Ok(renewed)) => Ok(*renewed),
                Some(Err(e)) => Err(e.to_string()),
                None => Err("no reply".to_owned()),
            },
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("timed out".to_owned()),
        };
        let applied = grant.apply_renewal(renewed, lease.ttl, sent, lease.valid_until);
        observe::renewal(match &applied {
            Applied::Renewed => "renewed",
            Applied::Lost => "lost",
            Applied::Unknown(_) => "failed",
        });
        let next = match applied {
            Applied::Renewed => Some(grant.lease().renew_at),
            Applied::Lost => None,
            Applied::Unknown(error) => {
                tracing::debug!(key = %grant.keys.name, %error, "distlock: renewal failed; retrying");
                let retry = (lease.ttl / 20).max(Duration::from_millis(10));
                Some((arrived + retry).min(lease.valid_until))
            }
        };
        drop(ticket);
        if let (Some(next), Some(shared)) = (next, renewer.upgrade()) {
            schedule(&shared, grant, next);
        }
    }
}

/// Reports the loss of a grant that may no longer be renewed, when its lease runs out.
async fn expire(grant: Arc<Grant>, valid_until: Instant) {
    tokio::time::sleep_until(valid_until).await;
    if !grant.is_finished() {
        grant.mark_lost(LossReason::MaxHold);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::time::Instant;

    use crate::{Client, LossReason};

    /// One task taking and releasing a lock in a loop: each new grant is due after the one the scheduler
    /// already sleeps for, so it is not woken for it (callgrind: about 1.1k of the client's ~50k instructions
    /// per cycle).
    /// Real time: a paused clock would jump to the scheduler's timer whenever the runtime idles.
    #[tokio::test(flavor = "current_thread")]
    async fn a_lock_due_after_the_scheduler_s_wake_up_does_not_wake_it() {
        let client = Client::builder().memory().build().await.expect("client");
        for _ in 0..100 {
            let guard = client.lock("k").ttl(Duration::from_secs(30)).acquire().await.expect("acquire");
            // As a task waiting for Redis's answer to its release would: the scheduler runs if it was woken
            // (the first time, it plans its wake-up for this lock's renewal, 10 s away).
            tokio::task::yield_now().await;
            guard.release().await.expect("release");
        }
        let passes = client.inner.renewer.shared.passes.load(Ordering::Relaxed);
        assert!(passes <= 3, "the scheduler looked at its queue {passes} times for 100 lock cycles");
        // A lock due before that wake-up (10 s away) still wakes it: its lease is renewed a third of a lease in.
        let short = client.lock("short").ttl(Duration::from_millis(300)).acquire().await.expect("acquire");
        let granted_until = short.deadline();
        let renewed = async {
            while short.deadline() <= granted_until {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(5), renewed).await.expect("the short lease was never renewed");
        short.release().await.expect("release");
    }

    /// A stall (the runtime's thread blocked) past a lease, while the scheduler sleeps for a later lock: the
    /// guard reads as lost the moment the thread runs again, before any renewal, and stays lost once the
    /// scheduler has run, while the store gives the lock to the next request.
    #[tokio::test(flavor = "current_thread")]
    async fn a_stall_past_the_lease_leaves_the_guard_lost_and_the_lock_to_the_next_holder() {
        let client = Client::builder().memory().build().await.expect("client");
        // The scheduler plans its wake-up for this lock's renewal, 10 s away, and sleeps.
        let long = client.lock("long").ttl(Duration::from_secs(30)).acquire().await.expect("acquire");
        tokio::task::yield_now().await;
        let short = client.lock("short").ttl(Duration::from_millis(300)).acquire().await.expect("acquire");
        std::thread::sleep(Duration::from_millis(600));
        assert!(short.is_lost(), "a guard whose lease ran out during a stall still reads as held");
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        let next = client.lock("short").try_acquire().await.expect("try_acquire");
        assert!(next.is_some(), "the store still holds a lease that ran out");
        assert!(short.is_lost(), "the stalled guard reads as held beside the next holder");
        drop((next, short));
        long.release().await.expect("release");
    }

    /// A client dropped ends its scheduler task, which holds the queue: nothing of the client outlives it.
    #[tokio::test(flavor = "current_thread")]
    async fn a_dropped_client_ends_its_scheduler() {
        let client = Client::builder().memory().build().await.expect("client");
        let guard = client.lock("k").acquire().await.expect("acquire");
        guard.release().await.expect("release");
        let shared = std::sync::Arc::downgrade(&client.inner.renewer.shared);
        assert!(shared.strong_count() > 1, "the scheduler should be running, holding the queue");
        drop(client);
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(shared.strong_count(), 0, "the scheduler task outlived its client");
    }

    /// A loss marked while a renewal is in flight (shutdown's at the end of its grace, which then waits for the
    /// renewal to come back before it releases) is final: the renewal's reply, though it says renewed in time,
    /// neither clears it nor moves the deadline past now again. (The mutation report's line 232, `||` -> `&&`:
    /// the reply revived the lease, and the guard's deadline lay 30 s ahead of a lost lock.)
    #[tokio::test(flavor = "current_thread")]
    async fn a_renewal_s_reply_does_not_revive_a_lease_lost_while_it_was_in_flight() {
        let client = Client::builder().memory().build().await.expect("client");
        let guard = client.lock("k").ttl(Duration::from_secs(30)).acquire().await.expect("acquire");
        let grants = guard.grants();
        let grant = &grants[0];
        // What the scheduler does for a due grant, then the loss lands before the store answers.
        let sent = Instant::now();
        let ticket = grant.begin_renewal().expect("no renewal in flight yet");
        let lease = grant.lower_for(grant.lease().ttl, sent);
        grant.mark_lost(LossReason::ShutDown);
        let renewer = Arc::downgrade(&client.inner.renewer.shared);
        super::renew_round(vec![(grant, lease, ticket)], sent, &renewer).await;
        let after = grant.lease();
        assert!(after.lost, "a renewal's reply cleared a loss marked while it was in flight");
        assert_eq!(after.why, Some(LossReason::ShutDown), "the loss's reason changed");
        assert!(guard.is_lost(), "the guard reads as held after its loss");
        assert!(guard.deadline() <= Instant::now(), "the lost guard's deadline lies in the future again");
        drop(guard);
    }

    /// A lock whose `max_hold` has stopped its renewals is marked lost (and so reported: the WARN, the metric)
    /// when its lease runs out, also while its holder never looks at the guard. (The mutation report's
    /// `expire` -> `()` and its `delete !`: the guard read lost by the clock alone, and nothing said so.)
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn max_hold_s_end_is_marked_lost_when_the_lease_runs_out_unwatched() {
        let client = Client::builder().memory().build().await.expect("client");
        let ttl = Duration::from_millis(300);
        let guard = client.lock("k").ttl(ttl).max_hold(Duration::from_millis(100)).acquire().await.expect("acquire");
        let grants = guard.grants();
        tokio::time::sleep(ttl * 3).await;
        let lease = grants[0].lease();
        assert!(lease.lost, "the lease ran out after max_hold and nothing marked the grant lost");
        assert_eq!(lease.why, Some(LossReason::MaxHold), "the loss's reason");
        drop(guard);
    }

    /// Two grants due at the same instant (one ttl, taken in one instant) each keep their own queue entry,
    /// which the sequence number tells apart: both are renewed, and neither lease runs out. (The mutation
    /// report's one gap in this file: with the sequence stuck, the second entry replaced the first.)
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn two_grants_due_at_one_instant_are_both_renewed() {
        let client = Client::builder().memory().build().await.expect("client");
        let ttl = Duration::from_millis(300);
        let first = client.lock("first").ttl(ttl).acquire().await.expect("acquire");
        let second = client.lock("second").ttl(ttl).acquire().await.expect("acquire");
        assert_eq!(first.deadline(), second.deadline(), "both grants must be due at one instant");
        tokio::time::sleep(ttl * 5).await;
        assert!(!first.is_lost(), "the first of two grants due at one instant was not renewed");
        assert!(!second.is_lost(), "the second of two grants due at one instant was not renewed");
        first.release().await.expect("release");
        second.release().await.expect("release");
    }
}
