//! Taking a lock: one round trip when it is free; otherwise the request joins the lock's wait queue, listens
//! for the hand-over that a release makes to the longest waiter, and refreshes its place now and then (which
//! also notices a holder that crashed).

use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Announcement, Attempt, LockKeys, Queueing};
use crate::grant::{Grant, Lease};
use crate::{Client, LockError, LockGuard, LockRequest, LockToken, RetryStrategy};

/// The pause before trying again after an attempt failed while waiting.
const RETRY_AFTER_ERROR: Duration = Duration::from_millis(50);

/// When to give up if `wait` is effectively forever.
const FOREVER: Duration = Duration::from_secs(100 * 365 * 86_400);

/// The last attempt that found the lock busy: a hand-over to this waiter happened after it was sent, so its
/// send time is a safe start for the handed-over lease.
#[derive(Debug, Clone, Copy)]
struct BusyAttempt {
    sent: Instant,
    queueing: Option<Queueing>,
}

pub(crate) async fn acquire(mut request: LockRequest) -> Result<LockGuard, LockError> {
    // The key moves into the lock's names; errors name it from there.
    let keys = LockKeys::new(&request.client.inner.prefix, std::mem::take(&mut request.key));
    let mut pending = Pending::new(&request.client, keys, LockToken::random());
    let backend = &request.client.inner.backend;
    let started = Instant::now();
    let deadline = started.checked_add(request.wait).unwrap_or(started + FOREVER);
    let mut releases = None;
    let mut last_busy: Option<BusyAttempt> = None;
    let mut retries = 0;
    loop {
        // Queue only once listening: a hand-over announced before that could be missed.
        let queueing = releases.is_some().then(|| queueing(&request, retries + 1));
        pending.queued |= queueing.is_some();
        pending.in_flight = true;
        let sent = Instant::now();
        let attempt = match backend
            .acquire(&pending.keys, &pending.token, request.ttl, &request.metadata, queueing)
            .await
        {
            Ok(attempt) => attempt,
            // While waiting, a passing failure (a reconnect) costs a retry, not the request. The same token
            // is sent again, so a grant the failed attempt made is found and used.
            Err(e) if last_busy.is_some() && Instant::now() + RETRY_AFTER_ERROR < deadline => {
                tracing::debug!(key = %pending.keys.name, error = %e, "distlock: attempt failed while waiting; retrying");
                tokio::time::sleep(RETRY_AFTER_ERROR).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        pending.in_flight = false;
        let remaining = match attempt {
            Attempt::Granted { fence } => {
                let lease = Lease::starting(request.ttl, sent);
                return grant(request, pending, fence, lease, started);
            }
            Attempt::HandedOver { fence } => {
                let lease = handed_over_lease(&request, last_busy, sent);
                return grant(request, pending, fence, lease, started);
            }
            Attempt::Busy { remaining } => remaining,
        };
        last_busy = Some(BusyAttempt { sent, queueing });
        let now = Instant::now();
        if now >= deadline || request.retry == RetryStrategy::None {
            return give_up(request, pending, last_busy, started).await;
        }
        let Some(releases) = releases.as_mut() else {
            releases = Some(backend.watch_releases(&pending.keys, &pending.token).await?);
            continue;
        };
        retries += 1;
        let refresh = refresh_interval(&request, retries);
        let until = (now + remaining.map_or(refresh, |r| refresh.min(r)).max(Duration::from_millis(1))).min(deadline);
        // Wait for our hand-over, a reason to retry, or the time to refresh our place.
        let handed = loop {
            tokio::select! {
                announcement = releases.next() => {
                    if let Some(fence) = announcement.handed_to(&pending.token) {
                        break Some(fence);
                    }
                    if announcement == Announcement::Retry {
                        break None;
                    }
                }
                () = tokio::time::sleep_until(until) => break None,
            }
        };
        if let Some(fence) = handed {
            // With replica acknowledgement the hand-over is claimed by the next attempt instead, whose write
            // the replicas must acknowledge.
            if !backend.waits_for_replicas() {
                let lease = handed_over_lease(&request, last_busy, Instant::now());
                return grant(request, pending, fence, lease, started);
            }
        }
    }
}

/// The wait ran out: leave the queue, unless the lock was handed to us at the last moment.
async fn give_up(
    request: LockRequest,
    mut pending: Pending,
    last_busy: Option<BusyAttempt>,
    started: Instant,
) -> Result<LockGuard, LockError> {
    if pending.queued {
        let backend = &request.client.inner.backend;
        let handed = backend.withdraw(&pending.keys, &pending.token).await?;
        pending.queued = false;
        if let Some(mut fence) = handed {
            if backend.waits_for_replicas() {
                // Claimed by one more attempt, whose write the replicas must acknowledge.
                pending.in_flight = true;
                let (keys, token) = (&pending.keys, &pending.token);
                let claim = backend.acquire(keys, token, request.ttl, &request.metadata, None).await?;
                pending.in_flight = false;
                match claim {
                    Attempt::Granted { fence: f } | Attempt::HandedOver { fence: f } => fence = f,
                    Attempt::Busy { .. } => {
                        return Err(LockError::NotObtained { key: keys.name.clone(), waited: started.elapsed() })
                    }
                }
            }
            let lease = handed_over_lease(&request, last_busy, Instant::now());
            return grant(request, pending, fence, lease, started);
        }
    }
    let (keys, _) = pending.finish();
    Err(LockError::NotObtained { key: keys.name, waited: started.elapsed() })
}

fn grant(
    request: LockRequest,
    pending: Pending,
    fence: u64,
    lease: Lease,
    started: Instant,
) -> Result<LockGuard, LockError> {
    let (keys, token) = pending.finish();
    let grant = Grant::new(request.client, keys, token, fence, lease, request.limits);
    // A guard is made even when the grant came too late to use, so that dropping it releases.
    let guard = LockGuard::new(grant);
    if guard.is_lost() {
        let key = guard.key().to_owned();
        drop(guard);
        return Err(LockError::NotObtained { key, waited: started.elapsed() });
    }
    Ok(guard)
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

/// The lease of a hand-over: it started after the last busy attempt was sent, and lasts the hand-over lease
/// that attempt registered; the first renewal (due at once) restores the full `ttl`.
fn handed_over_lease(request: &LockRequest, last_busy: Option<BusyAttempt>, fallback: Instant) -> Lease {
    let (since, lease) = match last_busy {
        Some(BusyAttempt { sent, queueing: Some(q) }) => (sent, q.lease),
        Some(BusyAttempt { sent, queueing: None }) => (sent, request.ttl),
        None => (fallback, request.ttl),
    };
    Lease::handed_over(request.ttl, lease, since)
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
            let ours = if queued { backend.withdraw(&keys, &token).await.map(|fence| fence.is_some()) } else { Ok(true) };
            // Released only if the record still carries this token; otherwise the script leaves it alone.
            let outcome = match ours {
                Ok(true) => backend.release(&keys, &token, None).await.map(drop),
                other => other.map(drop),
            };
            if let Err(e) = outcome {
                tracing::debug!(key = %keys.name, error = %e, "distlock: a cancelled request could not clean up; its place and any orphan grant expire by themselves");
            }
        });
    }
}
