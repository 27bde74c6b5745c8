//! Taking a lock: one round trip when it is free; otherwise the request joins the lock's wait queue, listens
//! for the hand-over that a release makes to the longest waiter, and refreshes its place now and then (which
//! also notices a holder that crashed).

use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Attempt, LockKeys, Queueing};
use crate::grant::{Grant, Lease};
use crate::{Client, LockError, LockGuard, LockRequest, LockToken, RetryStrategy};

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
    let backend = &request.client.inner.backend;
    let token = LockToken::random();
    let started = Instant::now();
    let deadline = started.checked_add(request.wait).unwrap_or(started + FOREVER);
    let mut releases = None;
    let mut queued: Option<QueuedWaiter> = None;
    let mut last_busy: Option<BusyAttempt> = None;
    let mut retries = 0;
    loop {
        // Queue only once listening: a hand-over announced before that could be missed.
        let queueing = releases.is_some().then(|| queueing(&request, retries + 1));
        if queueing.is_some() && queued.is_none() {
            queued = Some(QueuedWaiter::new(&request.client, &keys, &token));
        }
        let sent = Instant::now();
        let remaining = match backend.acquire(&keys, &token, request.ttl, &request.metadata, queueing).await? {
            Attempt::Granted { fence } => {
                defuse(queued);
                let lease = Lease::starting(request.ttl, sent);
                return grant(request, keys, token, fence, lease, started);
            }
            Attempt::HandedOver { fence } => {
                defuse(queued);
                let lease = handed_over_lease(&request, last_busy, sent);
                return grant(request, keys, token, fence, lease, started);
            }
            Attempt::Busy { remaining } => remaining,
        };
        last_busy = Some(BusyAttempt { sent, queueing });
        let now = Instant::now();
        if now >= deadline || request.retry == RetryStrategy::None {
            return give_up(request, keys, token, queued, last_busy, started).await;
        }
        let Some(releases) = releases.as_mut() else {
            releases = Some(backend.watch_releases(&keys).await?);
            continue;
        };
        retries += 1;
        let refresh = refresh_interval(&request, retries);
        let until = (now + remaining.map_or(refresh, |r| refresh.min(r)).max(Duration::from_millis(1))).min(deadline);
        // Wait for our hand-over, a reason to retry, or the time to refresh our place.
        let handed = loop {
            tokio::select! {
                announcement = releases.next() => {
                    if let Some(fence) = announcement.handed_to(&token) {
                        break Some(fence);
                    }
                    if announcement == crate::backend::Announcement::Retry {
                        break None;
                    }
                }
                () = tokio::time::sleep_until(until) => break None,
            }
        };
        if let Some(fence) = handed {
            defuse(queued);
            let lease = handed_over_lease(&request, last_busy, Instant::now());
            return grant(request, keys, token, fence, lease, started);
        }
    }
}

/// The wait ran out: leave the queue, unless the lock was handed to us at the last moment.
async fn give_up(
    request: LockRequest,
    keys: LockKeys,
    token: LockToken,
    queued: Option<QueuedWaiter>,
    last_busy: Option<BusyAttempt>,
    started: Instant,
) -> Result<LockGuard, LockError> {
    if queued.is_some() {
        let handed = request.client.inner.backend.withdraw(&keys, &token).await;
        defuse(queued);
        if let Some(fence) = handed? {
            let lease = handed_over_lease(&request, last_busy, Instant::now());
            return grant(request, keys, token, fence, lease, started);
        }
    }
    Err(LockError::NotObtained { key: keys.name, waited: started.elapsed() })
}

fn grant(
    request: LockRequest,
    keys: LockKeys,
    token: LockToken,
    fence: u64,
    lease: Lease,
    started: Instant,
) -> Result<LockGuard, LockError> {
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

/// A waiter in the queue. If the request is dropped (cancelled) while queued, it leaves the queue in the
/// background, and releases the lock if a hand-over reached it meanwhile.
#[derive(Debug)]
struct QueuedWaiter {
    client: Client,
    keys: LockKeys,
    token: LockToken,
    runtime: Option<tokio::runtime::Handle>,
}

impl QueuedWaiter {
    fn new(client: &Client, keys: &LockKeys, token: &LockToken) -> Self {
        Self {
            client: client.clone(),
            keys: keys.clone(),
            token: token.clone(),
            runtime: tokio::runtime::Handle::try_current().ok(),
        }
    }
}

/// The request ended normally: no clean-up needed.
fn defuse(queued: Option<QueuedWaiter>) {
    if let Some(mut waiter) = queued {
        waiter.runtime = None;
    }
}

impl Drop for QueuedWaiter {
    fn drop(&mut self) {
        let Some(runtime) = self.runtime.take() else { return };
        let (client, keys, token) = (self.client.clone(), self.keys.clone(), self.token.clone());
        runtime.spawn(async move {
            let backend = &client.inner.backend;
            match backend.withdraw(&keys, &token).await {
                Ok(Some(_)) => {
                    if let Err(e) = backend.release(&keys, &token, None).await {
                        tracing::warn!(key = %keys.name, error = %e, "distlock: a cancelled waiter was handed the lock and could not give it back; it frees when its short hand-over lease runs out");
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::debug!(key = %keys.name, error = %e, "distlock: a cancelled waiter could not leave the queue; its place expires by itself");
                }
            }
        });
    }
}
