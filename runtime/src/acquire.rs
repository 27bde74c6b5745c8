//! Taking a lock: one round trip when it is free; otherwise the request joins the lock's wait queue, listens
//! for the hand-over that a release makes to the longest waiter, and refreshes its place now and then (which
//! also notices a holder that crashed).
//!
//! Leases follow the rule written on [`Lease`]: a grant or claim counts from its own attempt's send, for the
//! lease in its reply; an announced hand-over only when it is provably newer than the last busy attempt. What
//! cannot be dated that way is claimed by one more attempt, and a hand-over that lapsed never ends the wait:
//! the waiter keeps its place until `wait` runs out, and gives back any grant it cannot use.

use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Announcement, Attempt, Hold, LockKeys, Queueing, Store, WakeUps};
use crate::grant::{Grant, Lease};
use crate::hooks::{reverted, Fix};
use crate::observe;
use crate::{Client, LockError, LockGuard, LockRequest, LockToken, RetryStrategy};

/// The pause before trying again after an attempt failed while waiting.
const RETRY_AFTER_ERROR: Duration = Duration::from_millis(50);

/// When to give up if `wait` is effectively forever.
const FOREVER: Duration = Duration::from_secs(100 * 365 * 86_400);

/// The last attempt that found another grant holding the lock. A hand-over to this waiter with a higher
/// fencing token than that grant's happened after this attempt reached the server, so after its send.
#[derive(Debug, Clone, Copy)]
struct BusyAttempt {
    sent: Instant,
    fence: u64,
}

pub(crate) async fn acquire(mut request: LockRequest) -> Result<LockGuard, LockError> {
    // The key moves into the lock's names; errors name it from there.
    let keys = LockKeys::new(&request.client.inner.prefix, std::mem::take(&mut request.key));
    let mut pending = Pending::new(&request.client, keys, LockToken::random());
    let backend = &request.client.inner.backend;
    let capabilities = backend.capabilities();
    let started = Instant::now();
    let deadline = started.checked_add(request.wait).unwrap_or(started + FOREVER);
    let mut releases = None;
    let mut waiting = false;
    // Held while waiting, for the `distlock_waiting` gauge (feature `metrics`).
    let mut _waiting_gauge = None;
    // An announcement handed the lock to this waiter, and the next attempt claims it.
    let mut claiming = false;
    let mut last_busy: Option<BusyAttempt> = None;
    let mut retries = 0;
    loop {
        // Queue only once waiting, and listening where the store announces: a hand-over announced before
        // that could be missed.
        let queueing = (waiting && capabilities.fair_queue).then(|| queueing(&request, retries + 1));
        pending.queued |= queueing.is_some();
        pending.in_flight = true;
        let sent = Instant::now();
        let attempt = match backend
            .acquire(&pending.keys, &pending.token, request.ttl, &request.metadata, queueing)
            .await
        {
            Ok(attempt) => attempt,
            // While waiting, a passing failure (a reconnect) costs a retry, not the request. The same token
            // is sent again, so a grant the failed attempt made is found and claimed.
            Err(e) if last_busy.is_some() && Instant::now() + RETRY_AFTER_ERROR < deadline => {
                tracing::debug!(key = %pending.keys.name, error = %e, "distlock: attempt failed while waiting; retrying");
                tokio::time::sleep(RETRY_AFTER_ERROR).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        let remaining = match attempt {
            Attempt::Granted(hold) => {
                let lease = Lease::granted(request.ttl, sent, reported(&request, hold));
                if !lease.is_lost() {
                    if claiming {
                        handed_over(&pending.keys, hold.fence, started, "claimed");
                    }
                    return Ok(grant(request, pending, hold.fence, lease));
                }
                // The reply came too late to use (this task stalled while it was on its way), yet the server
                // holds the lock for this token: the next attempt claims it afresh, if the wait allows.
                if Instant::now() < deadline && request.retry != RetryStrategy::None {
                    continue;
                }
                return give_back(request, pending, started).await;
            }
            Attempt::Busy { fence, remaining } => {
                last_busy = Some(BusyAttempt { sent, fence });
                remaining
            }
        };
        pending.in_flight = false;
        let now = Instant::now();
        if now >= deadline || request.retry == RetryStrategy::None {
            return give_up(request, pending, started).await;
        }
        if !waiting {
            waiting = true;
            _waiting_gauge = Some(observe::Waiting::start());
            if capabilities.wake_ups == WakeUps::Exact {
                releases = Some(backend.watch_releases(&pending.keys, &pending.token).await?);
            }
            if capabilities.fair_queue {
                continue; // take a place in the queue at once
            }
        }
        retries += 1;
        let refresh = refresh_interval(&request, retries);
        let until = (now + remaining.map_or(refresh, |r| refresh.min(r)).max(Duration::from_millis(1))).min(deadline);
        // Wait for our hand-over, a reason to retry, or the time to refresh our place.
        let handed = match releases.as_mut() {
            Some(releases) => loop {
                // Biased, as every select! in the engine: ties resolve the same way on every run (tokio's
                // random pick cannot be seeded), so a simulated schedule replays exactly.
                tokio::select! {
                    biased;
                    announcement = releases.next() => {
                        if let Some(hold) = announcement.handed_to(&pending.token) {
                            break Some(hold);
                        }
                        if announcement == Announcement::Retry {
                            break None;
                        }
                    }
                    () = tokio::time::sleep_until(until) => break None,
                }
            },
            None => {
                tokio::time::sleep_until(until).await;
                None
            }
        };
        // With replica acknowledgement a hand-over is always claimed, as the claim's write must be acknowledged.
        let fresh = handed.filter(|_| !capabilities.replica_acks).and_then(|h| announced(&request, last_busy, h));
        if let Some((fence, lease)) = fresh.filter(|(_, lease)| !lease.is_lost()) {
            handed_over(&pending.keys, fence, started, "announced");
            return Ok(grant(request, pending, fence, lease));
        }
        claiming = handed.is_some();
        // Otherwise the next attempt, sent now, claims a live hand-over with a lease dated from its own send, or
        // finds the lock busy and keeps this waiter's place.
    }
}

/// The wait ran out: leave the queue, unless the lock was handed to us at the last moment.
async fn give_up(request: LockRequest, mut pending: Pending, started: Instant) -> Result<LockGuard, LockError> {
    if pending.queued {
        let backend = &request.client.inner.backend;
        let sent = Instant::now();
        let handed = backend.withdraw(&pending.keys, &pending.token).await?;
        pending.queued = false;
        if let Some(hold) = handed {
            let lease = Lease::granted(request.ttl, sent, reported(&request, hold));
            // With replica acknowledgement, nobody waited for the hand-over's write: it cannot count.
            if !lease.is_lost() && !backend.capabilities().replica_acks {
                handed_over(&pending.keys, hold.fence, started, "withdrawing");
                return Ok(grant(request, pending, hold.fence, lease));
            }
            return give_back(request, pending, started).await;
        }
    }
    let (keys, _) = pending.finish();
    let waited = started.elapsed();
    // Who kept it, for the caller's error: one more call, on the failure path only.
    let holder = if request.describe_holder {
        request.client.inner.backend.info(&keys).await.ok().flatten().map(Box::new)
    } else {
        None
    };
    Err(LockError::NotObtained { key: keys.name, waited, holder })
}

/// The server holds the lock for this request, which cannot use it (the reply came too late, or it needs an
/// acknowledgement nobody waited for): release it, by token, so it is not left held, and report the wait lost.
async fn give_back(request: LockRequest, mut pending: Pending, started: Instant) -> Result<LockGuard, LockError> {
    pending.in_flight = true;
    let backend = &request.client.inner.backend;
    if reverted(Fix::ReleaseLostByClock) || backend.release(&pending.keys, &pending.token, None).await.is_ok() {
        pending.in_flight = false;
    }
    // If the release failed, dropping `pending` tries once more in the background.
    let key = pending.keys.name.clone();
    drop(pending);
    Err(LockError::NotObtained { key, waited: started.elapsed(), holder: None })
}

/// The DEBUG event of a waiter handed the lock by a release: `how` it learnt of it (`announced`: heard it;
/// `claimed`: its attempt after the announcement claimed it; `withdrawing`: it came as the wait ran out).
fn handed_over(keys: &LockKeys, fence: u64, started: Instant, how: &'static str) {
    tracing::debug!(
        key = %keys.name,
        fencing_token = fence,
        waited_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        how,
        "distlock: a waiter was handed the lock"
    );
}

fn grant(request: LockRequest, pending: Pending, fence: u64, lease: Lease) -> LockGuard {
    let (keys, token) = pending.finish();
    LockGuard::new(Grant::new(request.client, keys, token, fence, lease, request.limits))
}

/// A hand-over heard as an announcement, with its lease, if provably fresh: its fencing token is above that of
/// the grant the last busy attempt found, so it happened after that attempt was sent, and its lease counts
/// from there. `None` for a stale one (a hand-over that lapsed before that attempt reached the server).
fn announced(request: &LockRequest, last_busy: Option<BusyAttempt>, hold: Hold) -> Option<(u64, Lease)> {
    let busy = last_busy.filter(|busy| hold.fence > busy.fence || reverted(Fix::FreshAnnouncement))?;
    Some((hold.fence, Lease::granted(request.ttl, busy.sent, reported(request, hold))))
}

/// The lease the server reported for a hold (the full `ttl` asked for only where the simulation reverted that
/// fix, to show what assuming it breaks).
fn reported(request: &LockRequest, hold: Hold) -> Duration {
    if reverted(Fix::LeaseFromServer) {
        request.ttl
    } else {
        hold.lease
    }
}

/// How long between refreshes of a waiter's place: the retry strategy's delay, at most a third of the lease.
fn refresh_interval(request: &LockRequest, retry: u32) -> Duration {
    request.retry.delay(retry).unwrap_or_default().min(request.ttl / 3).max(Duration::from_millis(1))
}

/// The registration sent with an attempt: it outlives two missed refreshes; a hand-over lease no longer.
fn queueing(request: &LockRequest, retry: u32) -> Queueing {
    let register = refresh_interval(request, retry) * 3 + Duration::from_millis(100);
    Queueing { register, lease: register.min(request.ttl) }
}

/// A request under way: its lock names and token. If it is dropped (cancelled) or fails while an attempt
/// may have reached the server, or while it stands in the queue, it cleans up in the background: it leaves
/// the queue and releases, by its token, a grant or hand-over whose reply it never read.
#[derive(Debug)]
struct Pending {
    client: Client,
    keys: LockKeys,
    token: LockToken,
    in_flight: bool,
    queued: bool,
}

impl Pending {
    fn new(client: &Client, keys: LockKeys, token: LockToken) -> Self {
        Self { client: client.clone(), keys, token, in_flight: false, queued: false }
    }

    /// The request ended with an answer: nothing to clean up.
    fn finish(mut self) -> (LockKeys, LockToken) {
        self.in_flight = false;
        self.queued = false;
        (std::mem::take(&mut self.keys), std::mem::replace(&mut self.token, LockToken::blank()))
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.in_flight && !self.queued {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let (client, queued) = (self.client.clone(), self.queued);
        let (keys, token) = (std::mem::take(&mut self.keys), std::mem::replace(&mut self.token, LockToken::blank()));
        runtime.spawn(async move {
            let backend = &client.inner.backend;
            let ours = if queued { backend.withdraw(&keys, &token).await.map(|hold| hold.is_some()) } else { Ok(true) };
            // Released only if the record still carries this token; otherwise the script leaves it alone.
            let outcome = match ours {
                Ok(true) => backend.release(&keys, &token, None).await.map(drop),
                other => other.map(drop),
            };
            if let Err(e) = outcome {
                tracing::debug!(key = %keys.name, error = %e, "distlock: an acquire that did not finish (it failed or was cancelled) could not withdraw from the queue or give back a grant it may have received; both expire by themselves");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use crate::backend::{Backend, Capabilities, Fencing, MemoryBackend, WakeUps};
    use crate::client::ClientInner;
    use crate::{Client, RetryStrategy};

    /// A store without a wait queue or announcements (as Redlock will be): waiters poll on their retry
    /// strategy, never queue, and still get the lock once it is free, within their wait.
    #[tokio::test(start_paused = true)]
    async fn without_queue_or_wake_ups_waiters_poll() {
        let bare = Capabilities {
            fair_queue: false,
            wake_ups: WakeUps::None,
            fencing: Fencing::Monotonic,
            replica_acks: false,
        };
        let store = MemoryBackend::with_capabilities(bare);
        let client = Client {
            inner: Arc::new(ClientInner {
                backend: Backend::Memory(store.clone()),
                prefix: "t:".into(),
                renewer: Default::default(),
            }),
        };
        let holder = client.lock("k").ttl(Duration::from_secs(10)).acquire().await.unwrap();
        let waiter = client
            .lock("k")
            .wait(Duration::from_secs(5))
            .retry(RetryStrategy::Linear { step: Duration::from_millis(100) })
            .acquire();
        let waiter = tokio::spawn(waiter);
        tokio::time::sleep(Duration::from_millis(350)).await;
        assert!(!store.has_queue("t:{k}"), "a waiter queued on a store without a fair queue");
        holder.release().await.unwrap();
        let guard = waiter.await.unwrap().expect("the waiter gets the lock by polling");
        assert!(!guard.is_lost());
    }
}
