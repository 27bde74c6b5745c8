//! Redlock: one lock over N independent Redis servers, held while a quorum (N/2+1) of them holds it.
//!
//! Each server is a standalone [`RedisBackend`] (its own connection, coalescing and scripts); this store only
//! fans each operation out to all of them and counts the votes. No lock logic lives here: every per-server
//! step is the driver's own [`Store`] method.
//!
//! A round resolves as soon as its outcome is certain (a quorum for, or too many against to reach one), or
//! when the per-server timeout runs out, whichever comes first; the calls still in flight finish in the
//! background, so a hung server costs a round nothing while a quorum answers without it.
//!
//! Two rules keep a server that lost its keys (a restart without persistence, a flush) from handing a lock to
//! a second holder while the first counts on it: an acquire counts a grant only from a server whose lock
//! state is at least the ttl old (restart.rs: a delayed restart, kept by the client), and a renewal takes the
//! lock again by the same token wherever a server no longer has its record (renewal.rs), so a holder stands
//! on every server that answers.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use self::health::Health;
pub(crate) use self::listing::RedlockCursor;
use self::renewal::Live;
use self::restart::Vote;
use self::round::{count, Unfinished};
use super::{Attempt, Capabilities, ConnectSettings, Fencing, Hold, LockKeys, Queueing, RedisBackend, ReleaseWatch};
use super::{Place, Renewal, Scan, Store, WakeUps};
use crate::backend::redis::errors::redis_error_with_hint;
use crate::error::redact_url;

mod health;
mod listing;
mod renewal;
mod restart;
mod round;
use crate::lease::drift;
use crate::{LockError, LockInfo, LockToken, ReleaseOutcome};

/// The least time a server gets to answer a lock operation, however short the ttl.
const MIN_PER_SERVER: Duration = Duration::from_millis(10);

/// The fencing token Redlock reports: none is sound across independent servers (see [`Fencing::None`]).
const NO_FENCE: u64 = 0;

pub(crate) struct RedlockBackend {
    servers: Vec<Arc<RedisBackend>>,
    /// Acquire calls not yet over on their server (see [`Unfinished`]).
    unfinished: Unfinished,
    /// The locks held through this client, for renewals that take a lock again (renewal.rs).
    live: Live,
    /// The servers' URLs, passwords redacted, for messages.
    names: String,
    response: Duration,
    /// Which servers answer (health.rs).
    health: Arc<Health>,
}

impl std::fmt::Debug for RedlockBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedlockBackend").field("servers", &self.names).finish_non_exhaustive()
    }
}

/// What a round's caller decided, told to the calls still in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Pending,
    /// The acquire succeeded: grants that come in late stay (they only add to the quorum).
    Keep,
    /// The acquire failed (or was cancelled): every server that may hold a grant for the token gives it back.
    GiveBack,
}

impl RedlockBackend {
    /// Connects to every server in `urls` (each checked as [`RedisBackend::connect`] checks one); a minority that
    /// cannot be reached is connected to later (a warning names each). Refuses a count that is not odd and at
    /// least 3, a URL given twice (it would vote twice), `wait_for_replicas` (the servers are independent
    /// primaries), and a group of which no majority answers (the first silent server's error).
    pub(crate) async fn connect(urls: &[String], settings: ConnectSettings<'_>) -> Result<Self, LockError> {
        let names = urls.iter().map(|u| redact_url(u)).collect::<Vec<_>>().join(", ");
        if urls.len() < 3 || urls.len().is_multiple_of(2) {
            return Err(LockError::InvalidConfig(format!(
                "redlock needs an odd number of at least 3 independent Redis servers, got {} ({names}): a lock is \
                 held while a majority holds it, and an even count tolerates no more failures than one server fewer",
                urls.len()
            )));
        }
        for (i, url) in urls.iter().enumerate() {
            if urls[..i].iter().any(|u| u.trim() == url.trim()) {
                return Err(LockError::InvalidConfig(format!(
                    "redlock was given {} twice: each server must appear once, or it would vote twice",
                    redact_url(url)
                )));
            }
        }
        if settings.replicas.is_some() {
            return Err(LockError::InvalidConfig(format!(
                "redlock ({names}): wait_for_replicas does not apply; Redlock's servers are independent primaries \
                 and its quorum replaces replication. Remove wait_for_replicas"
            )));
        }
        let connected =
            futures_util::future::join_all(urls.iter().map(|url| RedisBackend::connect_or_later(url, settings))).await;
        let mark = restart::mark_key(settings.prefix);
        let (mut servers, mut silent, mut silent_at) = (Vec::with_capacity(urls.len()), Vec::new(), Vec::new());
        for (i, server) in connected.into_iter().enumerate() {
            let server = match server? {
                Ok(server) => server,
                Err((server, error)) => {
                    silent.push(error);
                    silent_at.push(i);
                    server
                }
            };
            servers.push(Arc::new(server.plain(&mark)));
        }
        let answered = urls.len() - silent.len();
        let quorum = urls.len() / 2 + 1;
        if answered < quorum {
            let note = format!(
                "{answered} of {} Redlock servers answered, and a client is built while a majority ({quorum}) does",
                urls.len()
            );
            return Err(silent.swap_remove(0).with_note(&note).into());
        }
        for error in &silent {
            // A minority down is what Redlock is for: the client counts on the others, and connects to this one
            // at each call until it answers.
            tracing::warn!(
                server = %error.server(),
                %error,
                "distlock: a Redlock server did not answer while the client was built; locks are taken on the \
                 others, and this one counts again once it answers"
            );
        }
        restart::mark_fresh_group(&servers, !silent.is_empty()).await?;
        let (unfinished, live) = (Unfinished::default(), Live::default());
        let health = Arc::new(Health::new(servers.iter().map(|s| s.server().to_owned()).collect(), &silent_at));
        Ok(Self { servers, unfinished, live, names, response: settings.timeouts.response, health })
    }

    /// A group of simulated servers (deterministic simulation, tests only), each already marked as a group
    /// set up fresh (the simulation writes the marks, as [`connect`](Self::connect) would).
    #[cfg(feature = "simulation")]
    pub(crate) fn simulated(servers: Vec<RedisBackend>, prefix: &str, response: Duration) -> Self {
        let mark = restart::mark_key(prefix);
        let servers: Vec<Arc<RedisBackend>> = servers.into_iter().map(|server| Arc::new(server.plain(&mark))).collect();
        let (unfinished, live) = (Unfinished::default(), Live::default());
        let health = Arc::new(Health::new(servers.iter().map(|s| s.server().to_owned()).collect(), &[]));
        Self { servers, unfinished, live, names: "sim://redlock".into(), response, health }
    }

    fn quorum(&self) -> usize {
        self.servers.len() / 2 + 1
    }

    /// How long a round waits for a server: a twentieth of the lease (as redsync), so that a hung server
    /// cannot eat much of it, at least [`MIN_PER_SERVER`], at most the response timeout.
    fn per_server(&self, ttl: Option<Duration>) -> Duration {
        ttl.map_or(self.response, |ttl| (ttl / 20).max(MIN_PER_SERVER).min(self.response))
    }
}

/// The lease to report for a grant whose round started at `start` and whose granting servers answered with
/// `leases` (each the PTTL that server had left when it answered, so it counts from after `start`), or `None`
/// when the quorum came too late to use.
///
/// The engine dates a grant as `send + lease − drift(lease)` with its send taken just before this store's
/// round (grant.rs, `Lease::granted`). Reporting the smallest lease of the quorum makes that instant no later
/// than the first expiry among the servers that make up the quorum, minus the drift allowance: until then a
/// majority holds the lock for this token. It is also no later than Redlock's own validity, `start + ttl −
/// drift(ttl)`, as every lease is at most the ttl. A quorum whose validity already ran out when it was
/// reached is a failure, as in Redlock.
fn quorum_lease(start: Instant, now: Instant, leases: &[Duration]) -> Option<Duration> {
    let lease = leases.iter().copied().min()?;
    (start + lease.saturating_sub(drift(lease)) > now).then_some(lease)
}

/// The duration for which at least `quorum` of `remaining` (one per server still holding) hold: the
/// quorum-th longest.
fn quorum_remaining(mut remaining: Vec<Duration>, quorum: usize) -> Option<Duration> {
    remaining.sort_unstable_by(|a, b| b.cmp(a));
    remaining.get(quorum - 1).copied()
}

/// A release's outcome as a quorum of its servers' `replies` tells it, or `Err(released)` (how many released)
/// when the servers that failed could hide a quorum that still held the lock.
fn release_verdict(replies: &[Result<ReleaseOutcome, LockError>], quorum: usize) -> Result<ReleaseOutcome, usize> {
    let said = |outcome: ReleaseOutcome| replies.iter().filter(|r| matches!(r, Ok(o) if *o == outcome)).count();
    let released = said(ReleaseOutcome::Released);
    if released >= quorum {
        return Ok(ReleaseOutcome::Released);
    }
    // A release sent again on a server that then found no trace of its first run: that run may have freed it.
    let unconfirmed = said(ReleaseOutcome::Unconfirmed);
    if released + unconfirmed >= quorum {
        return Ok(ReleaseOutcome::Unconfirmed);
    }
    if said(ReleaseOutcome::TakenByOther) > 0 {
        return Ok(ReleaseOutcome::TakenByOther);
    }
    // Errors could hide a quorum that still held it, with those that released it or may have.
    if released + unconfirmed + replies.iter().filter(|r| r.is_err()).count() >= quorum {
        return Err(released);
    }
    Ok(ReleaseOutcome::Expired)
}

impl Store for RedlockBackend {
    type Cursor = RedlockCursor;

    /// No fair queue: per-server queues would pick different heirs, and an order across independent servers
    /// needs consensus. No announcements: waiters poll on their retry strategy. No fencing token: the maximum
    /// of per-server counters is not monotonic (a grant that reached only one server raises that server's
    /// counter alone, and a later quorum may not include it).
    fn capabilities(&self) -> Capabilities {
        Capabilities { fair_queue: false, wake_ups: WakeUps::None, fencing: Fencing::None, replica_acks: false }
    }

    /// One Redlock round: the acquire on every server at once (never queued), resolved at a quorum of grants,
    /// or once a quorum can no longer grant, or at the per-server timeout. A grant by a server whose lock
    /// state is younger than the ttl (it lost its keys since: restart.rs) does not count. A round that fails
    /// gives back every grant it may have made, also those that arrive later; so does a round whose caller went
    /// away.
    async fn acquire(
        &self,
        keys: &LockKeys,
        token: &LockToken,
        ttl: Duration,
        metadata: &str,
        _queueing: Option<Queueing>,
    ) -> Result<Attempt, LockError> {
        let start = Instant::now();
        let (verdict, told) = watch::channel(Verdict::Pending);
        let (keys_shared, metadata): (Arc<LockKeys>, Arc<str>) = (Arc::new(keys.clone()), metadata.into());
        // This round's calls' flags, set if it succeeds (fan_out calls the closure before it returns).
        let began = std::cell::RefCell::new(Vec::new());
        let mut rx = self.fan_out(|server, tx, i| {
            let (keys, token, metadata, mut told) =
                (Arc::clone(&keys_shared), token.clone(), metadata.clone(), told.clone());
            let health = Arc::clone(&self.health);
            let under_way = self.unfinished.begin(i, &token);
            if let Some(call) = &under_way {
                began.borrow_mut().push(call.kept());
            }
            async move {
                let Some(_under_way) = under_way else {
                    // Passing, like the timeout that usually left the call unfinished: the call ends within the
                    // response timeout, so a request retries within its wait instead of failing at once (found by
                    // the simulation's liveness check: every server's call still waiting behind a lost reply).
                    let source = redis::RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::ResourceBusy,
                        "the previous attempt's call for this lock is not over on this server",
                    ));
                    let hint = "it sits this round out, so that giving back that attempt's grant cannot delete \
                                this round's; nothing to do unless it persists, then check the server's health"
                        .to_owned();
                    let _ = tx.send((i, Err(redis_error_with_hint(server.server(), hint, source).into())));
                    return;
                };
                let reply = server.acquire_plain(&keys, &token, ttl, &metadata).await.map(|a| Vote::of(a, ttl));
                health.note(i, &reply);
                // Busy: another token holds it there, so this one holds nothing to give back.
                let maybe_ours = !matches!(reply, Ok(Vote::Busy(_)));
                let _ = tx.send((i, reply));
                if !maybe_ours {
                    return;
                }
                // No verdict (the round's caller was dropped) counts as failed.
                let give_back = told.wait_for(|v| *v != Verdict::Pending).await.map_or(true, |v| *v == Verdict::GiveBack);
                if give_back {
                    if let Err(e) = server.release(&keys, &token, None, None).await {
                        tracing::debug!(key = %keys.name, error = %e, "distlock: redlock could not give back a grant of a failed round; it expires by itself");
                    }
                }
            }
        });
        let (n, quorum) = (self.servers.len(), self.quorum());
        let replies = self
            .collect(&mut rx, self.per_server(Some(ttl)), &keys.name, |r| {
                let granted = count(r, |v| matches!(v, Vote::Granted(_)));
                let against = r.iter().flatten().count() - granted;
                granted >= quorum || against > n - quorum
            })
            .await;
        let leases: Vec<Duration> = replies
            .iter()
            .filter_map(|r| match r {
                Ok(Vote::Granted(hold)) => Some(hold.lease),
                _ => None,
            })
            .collect();
        if leases.len() >= quorum {
            if let Some(lease) = quorum_lease(start, Instant::now(), &leases) {
                self.live.enter(token, &metadata);
                // Before the caller can renew: its calls still under way give nothing back, so a renewal there counts.
                began.into_inner().iter().for_each(|kept| kept.store(true, std::sync::atomic::Ordering::Release));
                let _ = verdict.send(Verdict::Keep);
                return Ok(Attempt::Granted(Hold { fence: NO_FENCE, lease }));
            }
            tracing::debug!(key = %keys.name, "distlock: redlock reached a quorum after the lease's validity ran out; giving it back");
        }
        let _ = verdict.send(Verdict::GiveBack);
        // Held elsewhere: a lost race, tried again on the retry strategy; if no server said so, the servers
        // failed and the error says which.
        let remaining = replies
            .iter()
            .filter_map(|r| match r {
                Ok(Vote::Busy(remaining)) => Some(*remaining),
                _ => None,
            })
            .collect::<Vec<_>>();
        if leases.len() >= quorum || !remaining.is_empty() {
            return Ok(Attempt::Busy { fence: NO_FENCE, remaining: remaining.into_iter().flatten().min() });
        }
        let young: Vec<Duration> = replies
            .iter()
            .filter_map(|r| match r {
                Ok(Vote::Young(age)) => Some(*age),
                _ => None,
            })
            .collect();
        if let Some(youngest) = young.iter().min() {
            let what = format!(
                "granted (and {} more whose lock state began {youngest:?} ago or later: a restart without \
                 persistence, a flush, or a group first used by a client built while one of its servers was down; \
                 such a server counts for a new holder once its lock state is as old as the ttl, {ttl:?})",
                young.len()
            );
            return Err(match self.no_quorum(&what, leases.len(), replies) {
                // Every server answered: no server's error to show. Passing, not a configuration error: the young
                // servers count once their lock state is a ttl old, so a request with a wait retries within it
                // (found by the simulation's liveness check: two of three servers restarted, and every request
                // failed at once, "invalid configuration", until they were a ttl old).
                LockError::InvalidConfig(note) => {
                    let source = redis::RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::ResourceBusy,
                        "too few servers old enough to vote",
                    ));
                    let hint = "retry once they are a ttl old (a request with a wait does)".to_owned();
                    LockError::Backend(redis_error_with_hint(&self.names, hint, source).with_note(&note))
                }
                other => other,
            });
        }
        Err(self.no_quorum("granted", leases.len(), replies))
    }

    /// Redlock never queues (no fair queue), so there is never a place to leave.
    async fn withdraw(&self, _keys: &LockKeys, _token: &LockToken) -> Result<Option<Hold>, LockError> {
        Ok(None)
    }

    /// Renewed when a majority counts for the token: servers that renewed, and servers that lost every key
    /// since and were given the lock again (renewal.rs). Wherever else the record is gone and the lock free (a
    /// lapse while unreachable, a server busy at the grant), it is taken too, without counting. Lost when too
    /// many servers do not count for a majority to be reached.
    async fn renew(&self, keys: &LockKeys, token: &LockToken, ttl: Duration) -> Result<bool, LockError> {
        let outcome = self.renew_round(&[Renewal { keys, token, ttl }]).await;
        outcome.into_iter().next().unwrap_or(Ok(false))
    }

    /// Each server renews the whole batch in one round trip (and takes again, in one more, the locks whose
    /// record it lost); each lock is then counted as [`renew`](Self::renew) counts it.
    async fn renew_many(&self, items: &[Renewal<'_>]) -> Result<Vec<Result<bool, LockError>>, LockError> {
        Ok(self.renew_round(items).await)
    }

    /// Released on every server; `Released` when a quorum released (the lock is then free), as soon as it
    /// did. The releases still in flight finish in the background.
    async fn release(
        &self,
        keys: &LockKeys,
        token: &LockToken,
        fence: Option<u64>,
        keep: Option<Duration>,
    ) -> Result<ReleaseOutcome, LockError> {
        self.live.leave(token);
        let shared = Arc::new(keys.clone());
        let mut rx = self.fan_out(|server, tx, i| {
            let (keys, token, unfinished) = (Arc::clone(&shared), token.clone(), self.unfinished.clone());
            let health = Arc::clone(&self.health);
            async move {
                // After this token's acquire or take on the server, if one is under way: never before it.
                unfinished.over(i, &token).await;
                let reply = server.release(&keys, &token, fence, keep).await;
                health.note(i, &reply);
                let _ = tx.send((i, reply));
            }
        });
        let quorum = self.quorum();
        let decided =
            |r: &[Option<Result<ReleaseOutcome, LockError>>]| count(r, |o| *o == ReleaseOutcome::Released) >= quorum;
        let replies = self.collect(&mut rx, self.per_server(None), &keys.name, decided).await;
        release_verdict(&replies, quorum).map_err(|released| self.no_quorum("confirmed the release", released, replies))
    }

    /// The lease a quorum still has for `token`: the quorum-th longest among the servers.
    async fn remaining(&self, keys: &LockKeys, token: &LockToken) -> Result<Option<Duration>, LockError> {
        let shared = Arc::new(keys.clone());
        let mut rx = self.ask_all(|server| {
            let (keys, token) = (Arc::clone(&shared), token.clone());
            async move { server.remaining(&keys, &token).await }
        });
        let (n, quorum) = (self.servers.len(), self.quorum());
        let decided = |r: &[Option<Result<Option<Duration>, LockError>>]| {
            count(r, Option::is_some) >= quorum || count(r, Option::is_none) > n - quorum
        };
        let replies = self.collect(&mut rx, self.per_server(None), &keys.name, decided).await;
        let held: Vec<Duration> = replies.iter().filter_map(|r| r.as_ref().ok().copied().flatten()).collect();
        if held.len() >= quorum {
            return Ok(quorum_remaining(held, quorum));
        }
        if replies.iter().filter(|r| matches!(r, Ok(None))).count() > n - quorum {
            return Ok(None);
        }
        Err(self.no_quorum("answered", held.len(), replies))
    }

    /// The quorum's view: a holder when a quorum of servers has a record (the one whose lease is the
    /// quorum-th longest), free when too few have one. Its fencing token is 0: Redlock has none.
    async fn info(&self, keys: &LockKeys) -> Result<Option<LockInfo>, LockError> {
        let mut rx = self.ask_all(|server| {
            let keys = keys.clone();
            async move { server.info(&keys).await }
        });
        let (n, quorum) = (self.servers.len(), self.quorum());
        let decided = |r: &[Option<Result<Option<LockInfo>, LockError>>]| {
            count(r, Option::is_some) >= quorum || count(r, Option::is_none) > n - quorum
        };
        let replies = self.collect(&mut rx, self.per_server(None), &keys.name, decided).await;
        let mut held: Vec<LockInfo> = replies.iter().filter_map(|r| r.as_ref().ok().cloned().flatten()).collect();
        if held.len() >= quorum {
            held.sort_unstable_by_key(|info| std::cmp::Reverse(info.remaining_ttl));
            let mut info = held.swap_remove(quorum - 1);
            info.fencing_token = NO_FENCE;
            return Ok(Some(info));
        }
        if replies.iter().filter(|r| matches!(r, Ok(None))).count() > n - quorum {
            return Ok(None);
        }
        Err(self.no_quorum("answered", held.len(), replies))
    }

    /// Deleted on every server (those still in flight when a quorum has answered finish in the background);
    /// true if any that answered had a record. An error unless a quorum answered.
    async fn force_unlock(&self, keys: &LockKeys) -> Result<bool, LockError> {
        let mut rx = self.ask_all(|server| {
            let keys = keys.clone();
            async move { server.force_unlock(&keys).await }
        });
        let quorum = self.quorum();
        let decided = |r: &[Option<Result<bool, LockError>>]| count(r, |_| true) >= quorum;
        let replies = self.collect(&mut rx, self.per_server(None), &keys.name, decided).await;
        let answered = replies.iter().filter(|r| r.is_ok()).count();
        if answered < self.quorum() {
            return Err(self.no_quorum("answered", answered, replies));
        }
        Ok(replies.iter().any(|r| matches!(r, Ok(true))))
    }

    /// Every server in turn: a lock held by a quorum shows up once per server holding it (callers that need
    /// each lock once sort and deduplicate, or ask [`info`](Self::info), which counts the quorum). A minority
    /// of servers that do not answer is passed over (listing.rs).
    async fn scan(
        &self,
        scan: &mut Scan<RedlockCursor>,
        pattern: &str,
        count: usize,
    ) -> Result<Vec<String>, LockError> {
        listing::scan(self, scan, pattern, count).await
    }

    /// Redlock never queues: nobody waits in line.
    async fn waiters(&self, _keys: &LockKeys, _limit: usize) -> Result<Vec<Place>, LockError> {
        Ok(Vec::new())
    }

    /// Never called: the engine listens only on stores whose wake-ups are exact, and Redlock has none.
    async fn watch_releases(&self, keys: &LockKeys, _token: &LockToken) -> Result<ReleaseWatch, LockError> {
        Err(LockError::InvalidConfig(format!(
            "redlock announces no releases (lock `{}`): waiters poll on their retry strategy",
            keys.name
        )))
    }
}

#[cfg(test)]
mod tests;
