//! Renewals on a Redlock group: every server renews the lock, or, where the token's record is gone, takes the
//! lock again, so that a holder stands on every server that answers.
//!
//! A server can lose a holder's record while the holder keeps its lease: a restart without persistence or a
//! flush, a record that expired while the server could not be reached, or one that was never written because
//! the server was busy with a record a release had missed (it lapses later). Renewing only where the record
//! survives leaves the holder on fewer servers at every such loss, until one more loses it the lock. So where a
//! server answers the renewal with "not this token's", the same server is asked for the lock by the same token
//! (the plain acquire: granted if free or already this token's, busy if another token holds it). Taking a free
//! server never admits a second holder: the take only puts the holder's record where nobody's is.
//!
//! What a renewal counts toward its majority is stricter: a server that renewed (its record was the token's
//! all along), or one taken again while its lock state is younger than the ttl (it lost every key since it
//! last had the record, and no acquirer has been able to count it since: restart.rs). Between two renewals
//! that succeed, such a majority held the lock for the token, or could have been counted by nobody else; a take
//! on a server whose state is old (the record lapsed or was deleted there, or was never written) says nothing
//! of the time in between, when another holder may have used that server, so it adds the server without
//! counting it. A lock whose record vanished from a majority is therefore lost, as on one server, however many
//! servers take it again. The engine dates the renewed lease from before the round was sent; a take made
//! after it sets a lease that ends later.
//!
//! A round whose lock is lost gives back, by token, what it renewed or took, so a lost lock leaves no record
//! of its token on a minority. A server that answers after the round was decided still takes, while the lock
//! is held ([`Live`]); a release waits on each server for a take under way there to be over
//! ([`Unfinished::over`](super::round::Unfinished::over)), so no take lands after the release.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::watch;

use super::round::{clone_error, count_in, Batch};
use super::RedlockBackend;
use crate::backend::redis::errors::redis_error;
use crate::backend::redis::timeout_error;
use crate::backend::{Attempt, LockKeys, Renewal, Store};
use crate::{LockError, LockToken};

/// What one server did about one lock in a renewal round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kept {
    /// Its record was this token's, and is renewed: it counts.
    Renewed,
    /// Its record was gone, lost with every key less than a ttl ago, and the lock is this token's again: it
    /// counts (nobody could count the server meanwhile).
    Restored,
    /// Its record was gone (or freed) on a server whose state is old, and the lock is this token's again: one
    /// more server holding it, which does not count.
    Added,
    /// Another token holds it there (or the lock is no longer held, and nothing was taken).
    Not,
}

/// One server's answers for a batch of locks: each lock's, or the batch's error.
type BatchKept = Batch<Kept>;

/// The locks this client holds on the group, by token (each grant has its own), with their metadata (for the
/// records renewals take again: the engine renews by names and token only). Entered when an acquire
/// succeeds; left on release, and when a renewal finds the lock lost. No `Debug`: it holds tokens.
#[derive(Clone, Default)]
pub(super) struct Live(Arc<Mutex<HashMap<LockToken, Option<Arc<str>>>>>);

impl Live {
    pub(super) fn enter(&self, token: &LockToken, metadata: &str) {
        let metadata = (!metadata.is_empty()).then(|| metadata.into());
        self.map().insert(token.clone(), metadata);
    }

    pub(super) fn leave(&self, token: &LockToken) {
        self.map().remove(token);
    }

    /// The lock's metadata, if it is still held.
    fn metadata(&self, token: &LockToken) -> Option<Arc<str>> {
        self.map().get(token).map(|m| m.clone().unwrap_or_else(|| "".into()))
    }

    #[cfg(test)]
    pub(super) fn is_held(&self, token: &LockToken) -> bool {
        self.map().contains_key(token)
    }

    fn map(&self) -> MutexGuard<'_, HashMap<LockToken, Option<Arc<str>>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl RedlockBackend {
    /// The renewal round for a batch of locks (a single lock's, [`Store::renew`](crate::backend::Store::renew),
    /// is a batch of one): each server renews the whole batch in one round trip, and takes again, in one more
    /// (its takes share a script call), the locks whose record it no longer has. A lock is renewed when a
    /// majority counts for it (renewed, or restored on a server that lost its keys), lost when too many
    /// servers do not for a majority to be reached; otherwise its outcome is the first error. The round waits
    /// for a server two per-server timeouts (a take is a second call).
    pub(super) async fn renew_round(&self, items: &[Renewal<'_>]) -> Vec<Result<bool, LockError>> {
        let owned: Arc<[(LockKeys, LockToken, std::time::Duration)]> =
            items.iter().map(|r| (r.keys.clone(), r.token.clone(), r.ttl)).collect();
        // Per lock, once the round is over: whether it is still this token's (false: given back).
        let (verdict, told) = watch::channel::<Option<Arc<[bool]>>>(None);
        let mut rx = self.fan_out(|server, tx, i| {
            let (owned, mut told) = (Arc::clone(&owned), told.clone());
            let (live, unfinished, health) = (self.live.clone(), self.unfinished.clone(), Arc::clone(&self.health));
            async move {
                let items: Vec<Renewal<'_>> =
                    owned.iter().map(|(keys, token, ttl)| Renewal { keys, token, ttl: *ttl }).collect();
                // A server's renewal (and its takes) ends with its round: sent again after the round (a
                // NOSCRIPT answered by EVAL, a reset connection), it could land after a later renewal or extend
                // of the same token and set its older, maybe shorter, lease over theirs, and the holder's
                // deadline would lie past the server's expiry (found by the simulation: redlock seed 308).
                // What was already sent is applied before anything sent later on that server's connection.
                // An earlier acquire of the same token still under way on this server (its reply late) gives
                // back what it may have granted once its round failed, and that release can land after this
                // renewal: a record renewed there then is one more server holding the lock, not one that
                // counts (found by the simulation: redlock seed 3550). Looked at before the renewal is sent: a
                // give-back over before then was applied before it. A call of the round that succeeded gives
                // nothing back (`UnderWay::kept`), however late its grant: counting no server whose call was under way
                // lost a lock renewed right after its acquire (CI: the round's calls had not yet seen it succeed).
                let giving_back: Vec<bool> = owned.iter().map(|(_, token, _)| unfinished.may_give_back(i, token)).collect();
                let work = async {
                    let kept: BatchKept = match server.renew_many(&items).await {
                        Err(e) => Err(e),
                        Ok(renewed) => {
                            let calls = renewed.into_iter().zip(owned.iter()).zip(giving_back).map(|((renewed, (keys, token, ttl)), giving_back)| {
                                let (server, live, unfinished) = (&server, &live, &unfinished);
                                async move {
                                    match renewed {
                                        Ok(true) if giving_back => Ok(Kept::Added),
                                        Ok(true) => Ok(Kept::Renewed),
                                        Ok(false) => {
                                            // Marked under way before the lock is looked up: a release either
                                            // finds the take under way and waits for it, or left first, and
                                            // nothing is taken. A call already under way (an acquire's) takes
                                            // nothing either.
                                            let Some(_under_way) = unfinished.begin(i, token) else {
                                                return Ok(Kept::Not);
                                            };
                                            let Some(metadata) = live.metadata(token) else { return Ok(Kept::Not) };
                                            Ok(match server.acquire_plain(keys, token, *ttl, &metadata).await? {
                                                (Attempt::Granted(_), age) if age < *ttl => Kept::Restored,
                                                (Attempt::Granted(_), _) => Kept::Added,
                                                (Attempt::Busy { .. }, _) => Kept::Not,
                                            })
                                        }
                                        Err(e) => Err(e),
                                    }
                                }
                            });
                            Ok(futures_util::future::join_all(calls).await)
                        }
                    };
                    kept
                };
                let mut over = told.clone();
                let kept: BatchKept = tokio::select! {
                    biased;
                    kept = work => {
                        health.note(i, &kept);
                        kept
                    }
                    _ = over.wait_for(Option::is_some) => {
                        let late = timeout_error("no answer before the renewal round was over");
                        Err(redis_error(server.server(), None, late).into())
                    }
                };
                // Where this server may hold a lock for its token: renewed, taken, or unknown.
                let maybe_held: Vec<bool> = match &kept {
                    Ok(locks) => locks.iter().map(|k| !matches!(k, Ok(Kept::Not))).collect(),
                    Err(_) => vec![true; owned.len()],
                };
                let _ = tx.send((i, kept));
                // No verdict (the round's caller went away): the engine tries the renewal again; keep it all.
                let Ok(Some(verdict)) = told.wait_for(Option::is_some).await.map(|v| v.clone()) else { return };
                for ((keys, token, _), (still, maybe)) in owned.iter().zip(verdict.iter().zip(maybe_held)) {
                    if !still && maybe {
                        if let Err(e) = server.release(keys, token, None, None).await {
                            tracing::debug!(key = %keys.name, error = %e, "distlock: redlock could not give back a lost lock's record; it expires by itself");
                        }
                    }
                }
            }
        });
        let (n, quorum) = (self.servers.len(), self.quorum());
        let (counts, not) =
            (|k: &Kept| matches!(k, Kept::Renewed | Kept::Restored), |k: &Kept| matches!(k, Kept::Added | Kept::Not));
        let decided = |r: &[Option<BatchKept>]| {
            (0..items.len()).all(|j| count_in(r, j, counts) >= quorum || count_in(r, j, not) > n - quorum)
        };
        let shortest = items.iter().map(|r| r.ttl).min();
        let key = items.first().map_or("", |r| r.keys.name.as_str());
        let replies = self.collect(&mut rx, self.per_server(shortest) * 2, key, decided).await;
        let wrapped: Vec<Option<BatchKept>> = replies.into_iter().map(Some).collect();
        let outcomes: Vec<Result<bool, LockError>> = (0..items.len())
            .map(|j| {
                let held = count_in(&wrapped, j, counts);
                if held >= quorum {
                    return Ok(true);
                }
                if count_in(&wrapped, j, not) > n - quorum {
                    return Ok(false);
                }
                // This lock's own reply from each server: its outcome, or the server's error for the batch.
                let mine = wrapped
                    .iter()
                    .flatten()
                    .map(|s| match s {
                        Ok(locks) => locks.get(j).map_or(Ok(Kept::Not), |k| k.as_ref().copied().map_err(clone_error)),
                        Err(e) => Err(clone_error(e)),
                    })
                    .collect();
                Err(self.no_quorum("renewed", held, mine))
            })
            .collect();
        let still: Arc<[bool]> = outcomes.iter().map(|o| !matches!(o, Ok(false))).collect();
        for (item, _) in items.iter().zip(&*still).filter(|(_, still)| !**still) {
            self.live.leave(item.token);
        }
        let _ = verdict.send(Some(still));
        outcomes
    }
}
