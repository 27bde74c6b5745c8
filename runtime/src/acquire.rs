//! Taking a lock: one round trip when it is free; otherwise the request joins the lock's wait queue, listens
//! for the hand-over that a release makes to the longest waiter, and refreshes its place now and then (which
//! also notices a holder that crashed). Of a client's waiters for one lock, only the first refreshes on its
//! retry schedule; the others seldom ([`line`]).
//!
//! Leases follow the rule written on [`Lease`]: a grant or claim counts from its own attempt's send, for the
//! lease in its reply; an announced hand-over only when it used the registration of the last busy attempt
//! (the announcement names that attempt), so it happened after that attempt's send. What
//! cannot be dated that way is claimed by one more attempt, and a hand-over that lapsed never ends the wait:
//! the waiter keeps its place until `wait` runs out, and gives back any grant it cannot use.

use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Announcement, Attempt, HandOver, LockKeys, Queueing, ReleaseWatch, Store, WakeUps};
use crate::grant::Grant;
use crate::lease::Lease;
use crate::observe;
use crate::shutdown::Activity;
use crate::{held, Client, LockError, LockGuard, LockRequest, LockToken, RetryStrategy};

mod line;
pub(crate) use line::Lines;

/// When to give up if `wait` is effectively forever.
const FOREVER: Duration = Duration::from_secs(100 * 365 * 86_400);

/// The last attempt that found another grant holding the lock. A hand-over to this waiter that announces this
/// attempt's number used the registration this attempt left in the queue, so it happened after this attempt
/// reached the server, so after its send. (Fencing tokens cannot tell: they go back with the server's clock.)
#[derive(Debug, Clone, Copy)]
struct BusyAttempt {
    sent: Instant,
    /// Its number, if it registered a place in the queue.
    queued: Option<u64>,
    /// The hand-over lease it registered (zero if none).
    lease: Duration,
}

/// Takes every key of `request` (one, or several from [`Client::lock_all`](crate::Client::lock_all)) into one
/// guard. Several keys that are all free, with nobody queued, are first tried in one step where the store can
/// ([`Store::acquire_free`]: one script on one server). Otherwise they are taken one by one in sorted order,
/// each with the single-key path below and its own grant, all within the request's one `wait`: as every
/// request takes its keys in the same order, no two requests can each hold a key the other waits for, so
/// waiting cannot deadlock. If a key cannot be had, the
/// keys already taken are released before the error returns (fail closed); if the request is dropped midway,
/// the partial guard's drop releases them in the background. A key the running lock body already holds is
/// nested: used, not taken again, and left to the outer body — unless its grant is lost, which fails the
/// request with [`LockError::Lost`] as a fresh key's loss would (before anything is sent when it is lost
/// already; else giving back the keys taken so far).
pub(crate) async fn acquire_all(mut request: LockRequest) -> Result<LockGuard, LockError> {
    let mut names = std::mem::take(&mut request.keys);
    // Canonical order: what makes waiting for several keys deadlock-free; a key named twice is one lock.
    names.sort_unstable();
    names.dedup();
    // A key the running lock body holds on a lost grant fails the request before anything is sent.
    if let Some(lost) = names.iter().find_map(|name| held::find(&request.client, name).and_then(|g| nested_loss(&g))) {
        return Err(lost);
    }
    let several = names.len() > 1;
    let started = Instant::now();
    let deadline = started.checked_add(request.wait);
    if several {
        if let Some(guard) = acquire_free(&request, &names).await? {
            return Ok(guard);
        }
    }
    let mut guard = LockGuard::assemble(names.len());
    for name in names {
        if let Some(grant) = held::find(&request.client, &name) {
            // Lost while an earlier key was awaited: the keys taken so far are given back.
            if let Some(lost) = nested_loss(&grant) {
                return Err(abandon_partial(guard, lost, started).await);
            }
            guard.push_nested(grant);
            continue;
        }
        let wait = deadline.map_or(request.wait, |d| d.saturating_duration_since(Instant::now()));
        // A wait bounds the whole request, however many keys: once it has run out, a later key is not tried
        // (each try is a round trip), and the request fails as a busy key's would. (Without a wait, as from
        // try_acquire, every key gets its one attempt.)
        if wait.is_zero() && !request.wait.is_zero() && guard.has_any() {
            let ran_out = LockError::NotObtained { key: name, waited: started.elapsed(), holder: None };
            return Err(abandon_partial(guard, ran_out, started).await);
        }
        match acquire(&request, name, wait).await {
            Ok(grant) => guard.push(grant),
            Err(e) => return Err(abandon_partial(guard, e, started).await),
        }
    }
    if several {
        guard.align_renewals();
        // An earlier key may have been lost while a later one was awaited: the guard would be born lost.
        if let Some(lost) = guard.loss() {
            return Err(abandon_partial(guard, lost, started).await);
        }
    }
    Ok(guard)
}

/// [`LockError::Lost`] if `grant`, which the running lock body holds (a nested key), is lost: a nested request
/// checks the outer grant as a fresh request's grant is checked, and never uses a lost one. A loss the clock
/// alone shows is marked, so that the grant reports it (once, however many requests find it).
fn nested_loss(grant: &Grant) -> Option<LockError> {
    if !grant.is_lost() {
        return None;
    }
    grant.mark_lost_by_clock();
    Some(grant.lost_error())
}

/// The fast path for several keys: all of them in one call, if all are free with nobody queued. `None`, with
/// nothing held, when they are not (or the store cannot, or a key is held by the running lock body already, or
/// grants must wait for replicas one by one): the caller then takes them one by one.
async fn acquire_free(request: &LockRequest, names: &[String]) -> Result<Option<LockGuard>, LockError> {
    let backend = &request.client.inner.backend;
    if backend.capabilities().replica_acks || names.iter().any(|name| held::find(&request.client, name).is_some()) {
        return Ok(None);
    }
    let prefix = &request.client.inner.prefix;
    // In flight until the reply says what the store did: dropped before that (cancelled, or an error), each
    // releases its grant, if it got one, in the background.
    let mut pending: Vec<Pending> = names
        .iter()
        .map(|name| {
            let mut p = Pending::new(&request.client, LockKeys::new(prefix, name.clone()), LockToken::random());
            p.in_flight = true;
            p
        })
        .collect();
    let locks: Vec<(&LockKeys, &LockToken)> = pending.iter().map(|p| (&p.keys, &p.token)).collect();
    let sent = Instant::now();
    let holds = match backend.acquire_free(&locks, request.ttl, &request.metadata).await {
        Ok(holds) => holds,
        // A passing failure, with a wait to ride it out in: dropping `pending` gives back what the call may
        // have granted, and the keys are taken one by one, each retrying within the wait.
        Err(e) if e.is_transient() && !request.wait.is_zero() && request.retry != RetryStrategy::None => {
            tracing::debug!(error = %e, "distlock: taking several free keys at once failed; taking them one by one");
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let Some(holds) = holds else {
        pending.iter_mut().for_each(|p| p.in_flight = false); // nothing was granted
        return Ok(None);
    };
    let leases: Vec<Lease> = holds.iter().map(|&hold| Lease::granted(request.ttl, sent, hold.lease)).collect();
    if holds.len() != pending.len() || leases.iter().any(Lease::is_lost) {
        // The reply came too late to use: dropping `pending` gives the grants back; take the keys one by one.
        return Ok(None);
    }
    let mut guard = LockGuard::assemble(names.len());
    for ((p, hold), lease) in pending.into_iter().zip(holds).zip(leases) {
        guard.push(grant(request, p, hold.fence, lease));
    }
    guard.align_renewals();
    Ok(Some(guard))
}

/// A multi-key request failed on a key: gives back the keys it took (by their tokens), then reports the
/// failure, whose wait counts from the start of the whole request.
async fn abandon_partial(guard: LockGuard, error: LockError, started: Instant) -> LockError {
    if guard.owns_any() {
        // Boxed, as give_back's release is: a rare path that would otherwise enlarge every acquisition's future.
        if let Err(e) = Box::pin(guard.release()).await {
            tracing::debug!(error = %e, "distlock: giving back the keys a multi-key request took failed; their leases free them");
        }
    }
    match error {
        LockError::NotObtained { key, holder, .. } => LockError::NotObtained { key, waited: started.elapsed(), holder },
        other => other,
    }
}

/// Takes one key, waiting up to `wait`.
async fn acquire(request: &LockRequest, name: String, wait: Duration) -> Result<Grant, LockError> {
    // The key moves into the lock's names; errors name it from there.
    let keys = LockKeys::new(&request.client.inner.prefix, name);
    let mut pending = Pending::new(&request.client, keys, LockToken::random());
    let backend = &request.client.inner.backend;
    let capabilities = backend.capabilities();
    let started = Instant::now();
    let deadline = started.checked_add(wait).unwrap_or(started + FOREVER);
    let mut releases = None;
    let mut waiting = false;
    // The line's generation its last queued attempt registered under (line.rs).
    let mut registered = 0;
    // Held while waiting, for the `distlock_waiting` gauge (feature `metrics`).
    let mut _waiting_gauge = None;
    // An announcement handed the lock to this waiter, and the next attempt claims it.
    let mut claiming = false;
    let mut last_busy: Option<BusyAttempt> = None;
    let mut retries = 0;
    let mut attempts = 0;
    // Failed attempts in a row, for the retry strategy's delay before the next.
    let mut failures = 0;
    loop {
        attempts += 1;
        // Queue only once waiting, and listening where the store announces (a hand-over announced before that
        // could be missed): once in its client's line, every attempt registers, under the id the line has now.
        let queueing = pending.in_line.as_ref().map(|in_line| {
            let (client, generation) = in_line.naming();
            registered = generation;
            queueing(request, retries + 1, attempts, client)
        });
        pending.queued |= queueing.is_some();
        pending.in_flight = true;
        let sent = Instant::now();
        let attempt =
            match backend.acquire(&pending.keys, &pending.token, request.ttl, &request.metadata, queueing).await {
                Ok(attempt) => attempt,
                // Its outcome is unknown, so `pending` stays in flight: the retry sends the same token, whose
                // script finds and claims a grant the failed attempt made; if the request ends here instead,
                // dropping `pending` gives such a grant back.
                Err(e) => {
                    failures += 1;
                    let pause = retry_after(request, e, failures, last_busy.is_some(), (started, deadline))?;
                    tokio::time::sleep(pause).await;
                    continue;
                }
            };
        failures = 0;
        let remaining = match attempt {
            Attempt::Granted(hold) => {
                let lease = Lease::granted(request.ttl, sent, hold.lease);
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
                return Box::pin(give_back(request, pending, started)).await;
            }
            Attempt::Busy { remaining, .. } => {
                let (queued, lease) = queueing.map_or((None, Duration::ZERO), |q| (Some(q.attempt), q.lease));
                last_busy = Some(BusyAttempt { sent, queued, lease });
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
                match backend.watch_releases(&pending.keys, &pending.token).await {
                    Ok(watch) => releases = Some(watch),
                    // Not listening yet: start waiting afresh after the pause (the next attempt, not queued,
                    // finds the lock busy and subscribes again).
                    Err(e) => {
                        failures += 1;
                        let pause = retry_after(request, e, failures, true, (started, deadline))?;
                        (waiting, _waiting_gauge) = (false, None);
                        tokio::time::sleep(pause).await;
                        continue;
                    }
                }
            }
            if capabilities.fair_queue {
                pending.in_line = Some(request.client.inner.lines.join(&pending.keys.record));
                continue; // take a place in the queue at once
            }
        }
        retries += 1;
        let first = pending.in_line.as_ref().is_none_or(line::InLine::is_first);
        let refresh = refresh_interval(request, retries);
        let mut until = if first {
            (now + remaining.map_or(refresh, |r| refresh.min(r)).max(Duration::from_millis(1))).min(deadline)
        } else {
            // Not first in its client's line: the first keeps the client's mark, and notices a holder that
            // crashed (a hand-over then comes, announced); this one keeps only its own place.
            let seldom = RetryStrategy::Linear { step: line::SELDOM }.delay(1).unwrap_or(line::SELDOM);
            (now + refresh.max(seldom)).min(deadline)
        };
        // Wait for our hand-over, a reason to retry, or the time to refresh our place.
        // `promoted` resolves once this waiter is first, when it was not: it then keeps the client's mark on its
        // retry schedule, and refreshes its place at once if a hand-over using its registration could not be
        // dated (its last attempt more than half its hand-over lease ago: the hand-over would be claimed, one
        // round trip later). Or once the line was renamed: it registers again at once.
        let handed = {
            let in_line = pending.in_line.as_ref();
            let promoted = async {
                match in_line {
                    Some(in_line) => in_line.changed(first, registered).await,
                    None => std::future::pending().await,
                }
            };
            tokio::pin!(promoted);
            let mut was_promoted = false;
            let stale = |now: Instant| last_busy.is_none_or(|busy| now >= busy.sent + busy.lease / 2);
            loop {
                // Biased, as every select! in the engine: ties resolve the same way on every run (tokio's random
                // pick cannot be seeded), so a simulated schedule replays exactly.
                tokio::select! {
                    biased;
                    announcement = next_announcement(&mut releases) => {
                        if let Some(hold) = announcement.handed_to(&pending.token) {
                            break Some(hold);
                        }
                        if announcement == Announcement::Retry {
                            break None;
                        }
                    }
                    () = tokio::time::sleep_until(until) => break None,
                    change = &mut promoted, if !was_promoted => {
                        was_promoted = true;
                        let now = Instant::now();
                        if change == line::Change::Renamed || stale(now) {
                            break None;
                        }
                        until = until.min(now + refresh);
                    }
                }
            }
        };
        // With replica acknowledgement a hand-over is always claimed, as the claim's write must be acknowledged.
        let fresh = handed.filter(|_| !capabilities.replica_acks).and_then(|h| announced(request, last_busy, h));
        if let Some((fence, lease)) = fresh.filter(|(_, lease)| !lease.is_lost()) {
            handed_over(&pending.keys, fence, started, "announced");
            return Ok(grant(request, pending, fence, lease));
        }
        claiming = handed.is_some();
        // Otherwise the next attempt, sent now, claims a live hand-over with a lease dated from its own send, or
        // finds the lock busy and keeps this waiter's place.
    }
}

/// The next announcement `releases` hears; never, for a store without wake-ups.
async fn next_announcement(releases: &mut Option<ReleaseWatch>) -> Announcement {
    match releases {
        Some(releases) => releases.next().await,
        None => std::future::pending().await,
    }
}

/// After the `failures`-th failure in a row, `error`: the pause before the next attempt if the wait allows one,
/// else the request's error. A [transient](LockError::is_transient) failure (a timeout, a dropped connection,
/// replicas behind) is retried on the request's retry strategy while its wait lasts; so is any failure once
/// the lock was found busy (`waiting`: a cluster or a failover settling), as before. Without a wait
/// (`try_acquire`) or with [`RetryStrategy::None`], `error` is the answer at once. When the wait runs out
/// first, a backend error says so in its hint, and for how long the request tried.
fn retry_after(
    request: &LockRequest,
    error: LockError,
    failures: u32,
    waiting: bool,
    (started, deadline): (Instant, Instant),
) -> Result<Duration, LockError> {
    let Some(pause) = request.retry.delay(failures).filter(|_| waiting || error.is_transient()) else {
        return Err(error);
    };
    if Instant::now() + pause < deadline {
        tracing::debug!(error = %error, failures, pause_ms = observe::millis(pause), "distlock: an attempt failed; retrying within the wait");
        return Ok(pause);
    }
    Err(match error {
        LockError::Backend(e) if deadline > started => LockError::Backend(e.with_note(&format!(
            "the request's wait ran out after {failures} failed attempt(s) in a row, {} after it started (this is the last one's error)",
            crate::error::Millis(started.elapsed())
        ))),
        other => other,
    })
}

/// The wait ran out: leave the queue, unless the lock was handed to us at the last moment.
async fn give_up(request: &LockRequest, mut pending: Pending, started: Instant) -> Result<Grant, LockError> {
    if pending.queued {
        let backend = &request.client.inner.backend;
        let sent = Instant::now();
        let handed = backend.withdraw(&pending.keys, &pending.token).await?;
        pending.queued = false;
        if let Some(hold) = handed {
            let lease = Lease::granted(request.ttl, sent, hold.lease);
            // With replica acknowledgement, nobody waited for the hand-over's write: it cannot count.
            if !lease.is_lost() && !backend.capabilities().replica_acks {
                handed_over(&pending.keys, hold.fence, started, "withdrawing");
                return Ok(grant(request, pending, hold.fence, lease));
            }
            return Box::pin(give_back(request, pending, started)).await;
        }
    }
    let (keys, ..) = pending.finish();
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
///
/// Called boxed: a release's future is large, and inline it would enlarge every acquisition's future (which
/// is moved whole, by memcpy, on every call) for a path rarely taken.
async fn give_back(request: &LockRequest, mut pending: Pending, started: Instant) -> Result<Grant, LockError> {
    pending.in_flight = true;
    let backend = &request.client.inner.backend;
    if backend.release(&pending.keys, &pending.token, None, None).await.is_ok() {
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
        waited_ms = observe::millis(started.elapsed()),
        how,
        "distlock: a waiter was handed the lock"
    );
}

fn grant(request: &LockRequest, pending: Pending, fence: u64, lease: Lease) -> Grant {
    let (keys, token, activity) = pending.finish();
    Grant::new(request.client.clone(), keys, token, fence, lease, request.limits, activity)
}

/// A hand-over heard as an announcement, with its lease, if provably fresh: it used the registration of the
/// last busy attempt (the announcement names that attempt), so it happened after that attempt was sent, and
/// its lease counts from there. `None` for a stale one: a hand-over that used an earlier attempt's
/// registration may have lapsed before the last attempt reached the server, whatever its fencing token says
/// (tokens go back with the server's clock).
fn announced(request: &LockRequest, last_busy: Option<BusyAttempt>, handed: HandOver) -> Option<(u64, Lease)> {
    let fresh = |busy: &BusyAttempt| busy.queued == Some(handed.attempt);
    let busy = last_busy.filter(fresh)?;
    let hold = handed.hold;
    Some((hold.fence, Lease::granted(request.ttl, busy.sent, hold.lease)))
}

/// How long between refreshes of a waiter's place: the retry strategy's delay, at most a third of the lease.
fn refresh_interval(request: &LockRequest, retry: u32) -> Duration {
    request.retry.delay(retry).unwrap_or_default().min(request.ttl / 3).max(Duration::from_millis(1))
}

/// The least hand-over lease (unless `ttl` is shorter). A hand-over's lease counts from the heir's last attempt,
/// and its first renewal must come back within it: three early refresh intervals (137–175 ms at the default
/// retry) were missed by a task starved of CPU that long, which lost its lock as it began. A dead heir holds the
/// lock idle this long at most, and only if it died within three intervals before its turn (its mark is gone
/// after that, and it is passed over).
const HAND_OVER_LEASE_FLOOR: Duration = Duration::from_secs(1);

/// The registration sent with attempt number `attempt`: the client's mark outlives two missed refreshes of
/// its first waiter, the place two of its own (seldom, unless first); a hand-over lease as long as the mark,
/// at least [`HAND_OVER_LEASE_FLOOR`], at most `ttl`.
fn queueing(request: &LockRequest, retry: u32, attempt: u64, client: u64) -> Queueing {
    let register = refresh_interval(request, retry) * 3 + Duration::from_millis(100);
    let lease = register.max(HAND_OVER_LEASE_FLOOR).min(request.ttl);
    Queueing { register, keep: register.max(line::KEEP), client, lease, attempt }
}

/// A request under way: its lock names and token. If it is dropped (cancelled) or fails while an attempt
/// may have reached the server, or while it stands in the queue, it cleans up in the background: it leaves
/// the queue and releases, by its token, a grant or hand-over whose reply it never read. The client's shutdown
/// waits for it until then (its activity passes to the grant, or to the clean-up).
#[derive(Debug)]
struct Pending {
    client: Client,
    keys: LockKeys,
    token: LockToken,
    in_flight: bool,
    queued: bool,
    activity: Option<Activity>,
    /// Its place in its client's line for the lock, once it queues.
    in_line: Option<line::InLine>,
}

impl Pending {
    fn new(client: &Client, keys: LockKeys, token: LockToken) -> Self {
        let activity = Some(client.inner.shutdown.activity());
        Self { client: client.clone(), keys, token, in_flight: false, queued: false, activity, in_line: None }
    }

    /// The request ended with an answer: nothing to clean up.
    fn finish(mut self) -> (LockKeys, LockToken, Option<Activity>) {
        self.in_flight = false;
        self.queued = false;
        (std::mem::take(&mut self.keys), std::mem::replace(&mut self.token, LockToken::blank()), self.activity.take())
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.in_flight && !self.queued {
            return;
        }
        if self.queued {
            // Its withdrawal may not reach the store, and its client's other waiters would keep the place alive:
            // they move to a new id instead, so the old one's mark, and the place, run out.
            if let Some(in_line) = self.in_line.as_mut() {
                in_line.abandon();
            }
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let (client, queued, activity) = (self.client.clone(), self.queued, self.activity.take());
        let (keys, token) = (std::mem::take(&mut self.keys), std::mem::replace(&mut self.token, LockToken::blank()));
        crate::hooks::spawn_on(&runtime, async move {
            let _activity = activity; // until the clean-up is done
            let backend = &client.inner.backend;
            let ours = if queued { backend.withdraw(&keys, &token).await.map(|hold| hold.is_some()) } else { Ok(true) };
            // Released only if the record still carries this token; otherwise the script leaves it alone.
            let outcome = match ours {
                Ok(true) => backend.release(&keys, &token, None, None).await.map(drop),
                other => other.map(drop),
            };
            if let Err(e) = outcome {
                tracing::debug!(key = %keys.name, error = %e, "distlock: an acquire that did not finish (it failed or was cancelled) could not withdraw from the queue or give back a grant it may have received; both expire by themselves");
            }
        });
    }
}

#[cfg(test)]
mod tests;
