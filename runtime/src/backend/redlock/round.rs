//! The machinery of a Redlock round: the call on every server at once, the replies collected until the
//! outcome is certain, and the bookkeeping that keeps a give-back away from a later round's grants.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

use super::RedlockBackend;
use crate::backend::redis::errors::redis_error_with_hint;
use crate::backend::redis::timeout_error;
use crate::backend::RedisBackend;
use crate::{LockError, LockToken};

/// One server's answer in a round: its index and what it replied.
pub(super) type Reply<T> = (usize, Result<T, LockError>);

/// The (server, token) pairs whose acquire call on that server is not over: its reply has not come, or the
/// grant it made is still being given back. A renewal's take (renewal.rs) is such a call too.
///
/// The engine retries a failed acquire with the same token, and a give-back is a release by that token: sent
/// to a server after the next round's acquire there, it would delete the grant that round counted in its
/// quorum. So a server whose previous call for the token is not over sits the next round out (a failed vote);
/// the give-back, when it comes, then touches no grant a quorum relies on. The other way round, a release
/// waits on each server for the token's call there to be over ([`over`](Self::over)), so that a grant or a
/// take that reaches the server late cannot land after the release and stay for a lease.
///
/// A call of a round that succeeded gives nothing back: the round marks its calls kept
/// ([`UnderWay::kept`]) before it returns, so that a renewal counts a server whose grant is still on its way
/// ([`may_give_back`](Self::may_give_back)). That grant either lands before the renewal, which then renews the
/// token's record, or after it (sent again as EVAL, or after a reconnect), and the renewal found no record
/// there and counts nothing; an attempt that lands twice never shortens the lease the renewal set
/// (acquire_plain_fn.lua). No `Debug`: it holds tokens.
#[derive(Clone, Default)]
pub(super) struct Unfinished(Arc<Calls>);

/// The calls under way, and a wake-up for whoever waits for one to be over.
#[derive(Default)]
pub(super) struct Calls {
    /// Each call's flag: set once its round kept its grants.
    under_way: Mutex<HashMap<(usize, LockToken), Arc<AtomicBool>>>,
    over: Notify,
}

impl Unfinished {
    /// Marks server `i`'s call for `token` under way, unless one already is.
    pub(super) fn begin(&self, i: usize, token: &LockToken) -> Option<UnderWay> {
        let entry = (i, token.clone());
        let kept = Arc::new(AtomicBool::new(false));
        let mut set = self.set();
        if set.contains_key(&entry) {
            return None;
        }
        set.insert(entry.clone(), Arc::clone(&kept));
        Some(UnderWay { set: self.clone(), entry, kept })
    }

    /// Whether a call for `token` is under way on server `i` that may yet give back a grant: one whose round
    /// did not keep its grants.
    pub(super) fn may_give_back(&self, i: usize, token: &LockToken) -> bool {
        self.set().get(&(i, token.clone())).is_some_and(|kept| !kept.load(Ordering::Acquire))
    }

    /// Once no call for `token` is under way on server `i` (at once, mostly).
    pub(super) async fn over(&self, i: usize, token: &LockToken) {
        let entry = (i, token.clone());
        loop {
            let ended = self.0.over.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if !self.set().contains_key(&entry) {
                return;
            }
            ended.await;
        }
    }

    fn set(&self) -> MutexGuard<'_, HashMap<(usize, LockToken), Arc<AtomicBool>>> {
        self.0.under_way.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A call marked under way in [`Unfinished`]; over when dropped.
pub(super) struct UnderWay {
    set: Unfinished,
    entry: (usize, LockToken),
    kept: Arc<AtomicBool>,
}

impl UnderWay {
    /// The flag by which this call's round, if it succeeds, says the call gives nothing back.
    pub(super) fn kept(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.kept)
    }
}

impl Drop for UnderWay {
    fn drop(&mut self) {
        self.set.set().remove(&self.entry);
        self.set.0.over.notify_waiters();
    }
}

impl RedlockBackend {
    /// Starts `call` on every server at once, all in one task of their own (so each finishes even after the
    /// round resolved; one task rather than one per server, as spawning is much of a round's client time);
    /// replies arrive on the returned channel as they come.
    pub(super) fn fan_out<T, F, Fut>(&self, call: F) -> mpsc::UnboundedReceiver<Reply<T>>
    where
        T: Send + 'static,
        F: Fn(Arc<RedisBackend>, mpsc::UnboundedSender<Reply<T>>, usize) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (tx, rx) = mpsc::unbounded_channel();
        let calls: Vec<Fut> =
            self.servers.iter().enumerate().map(|(i, server)| call(Arc::clone(server), tx.clone(), i)).collect();
        crate::hooks::spawn(futures_util::future::join_all(calls));
        rx
    }

    /// As [`fan_out`](Self::fan_out) for a call with nothing to do after the round.
    pub(super) fn ask_all<T, F, Fut>(&self, call: F) -> mpsc::UnboundedReceiver<Reply<T>>
    where
        T: Send + 'static,
        F: Fn(Arc<RedisBackend>) -> Fut,
        Fut: Future<Output = Result<T, LockError>> + Send + 'static,
    {
        self.fan_out(|server, tx, i| {
            let (call, health) = (call(server), Arc::clone(&self.health));
            async move {
                let reply = call.await;
                health.note(i, &reply);
                let _ = tx.send((i, reply));
            }
        })
    }

    /// Collects replies until `settled` says the outcome is certain, every server answered, or `limit` passed;
    /// a server silent by then counts as timed out.
    pub(super) async fn collect<T>(
        &self,
        rx: &mut mpsc::UnboundedReceiver<Reply<T>>,
        limit: Duration,
        key: &str,
        settled: impl Fn(&[Option<Result<T, LockError>>]) -> bool,
    ) -> Vec<Result<T, LockError>> {
        let deadline = Instant::now() + limit;
        let mut replies: Vec<Option<Result<T, LockError>>> = self.servers.iter().map(|_| None).collect();
        for _ in 0..self.servers.len() {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some((i, reply))) => replies[i] = Some(reply),
                Ok(None) | Err(_) => break,
            }
            if settled(&replies) {
                break;
            }
        }
        replies
            .into_iter()
            .zip(&self.servers)
            .map(|(reply, server)| {
                reply.unwrap_or_else(|| {
                    let silent = timeout_error("no answer within redlock's per-server timeout");
                    // Not the response timeout's hint: a round waits less than that for each server.
                    let hint = format!(
                        "redlock waits {limit:?} for each server's reply (a twentieth of the ttl when taking a lock, \
                         at most the response timeout): check that the server is up and not overloaded; a longer \
                         ttl or ClientBuilder::response_timeout gives it longer"
                    );
                    Err(redis_error_with_hint(server.server(), hint, silent).for_key(Some(key)).into())
                })
            })
            .collect()
    }

    /// The error of a round that reached no quorum: the first server error, with the count.
    pub(super) fn no_quorum<T>(&self, what: &str, yes: usize, replies: Vec<Result<T, LockError>>) -> LockError {
        let note = format!(
            "redlock: only {yes} of {} servers ({}) {what}, {} needed; the first failure is shown",
            self.servers.len(),
            self.names,
            self.quorum()
        );
        match replies.into_iter().find_map(Result::err) {
            Some(LockError::Backend(e)) => LockError::Backend(e.with_note(&note)),
            Some(other) => other,
            None => LockError::InvalidConfig(note),
        }
    }
}

/// How many servers replied with a value for which `yes` holds.
pub(super) fn count<T>(replies: &[Option<Result<T, LockError>>], yes: impl Fn(&T) -> bool) -> usize {
    replies.iter().filter(|r| matches!(r, Some(Ok(t)) if yes(t))).count()
}

/// One server's reply for a batch of locks: each lock's, or the batch's error.
pub(super) type Batch<T> = Result<Vec<Result<T, LockError>>, LockError>;

/// How many servers replied, for lock `j` of a batch, with a value for which `yes` holds.
pub(super) fn count_in<T>(replies: &[Option<Batch<T>>], j: usize, yes: impl Fn(&T) -> bool) -> usize {
    replies.iter().filter(|s| matches!(s, Some(Ok(locks)) if matches!(locks.get(j), Some(Ok(t)) if yes(t)))).count()
}

/// A copy of a per-server error for one lock of a batch (the batch's error is shared by all of its locks).
pub(super) fn clone_error(e: &LockError) -> LockError {
    match e {
        LockError::Backend(b) => LockError::Backend(b.clone()),
        other => LockError::InvalidConfig(other.to_string()),
    }
}
