//! The in-process backend: the same semantics as Redis (leases, fencing, wake-ups) inside one process.
//! For tests and single-process programs; it locks nothing across processes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::{Attempt, LockKeys, ReleaseWatch};
use crate::{LockError, LockInfo, LockToken, ReleaseOutcome};

#[derive(Debug, Default, Clone)]
pub(crate) struct MemoryBackend {
    state: Arc<Mutex<MemoryState>>,
}

#[derive(Debug, Default)]
struct MemoryState {
    records: HashMap<String, Record>,
    fences: HashMap<String, u64>,
    channels: HashMap<String, Channel>,
}

#[derive(Debug)]
struct Record {
    /// `None` while kept by `hold_at_least` after release: held, by nobody.
    token: Option<String>,
    fence: u64,
    metadata: String,
    expires_at: Instant,
}

#[derive(Debug)]
struct Channel {
    tx: watch::Sender<u64>,
    waiters: usize,
}

impl MemoryState {
    /// The live record of `key`, dropping it first if its lease has run out (Redis expires keys the same way).
    fn live(&mut self, key: &str) -> Option<&mut Record> {
        let now = Instant::now();
        if self.records.get(key).is_some_and(|r| r.expires_at <= now) {
            self.records.remove(key);
        }
        self.records.get_mut(key)
    }

    fn announce_release(&self, keys: &LockKeys) {
        if let Some(channel) = self.channels.get(&keys.channel()) {
            channel.tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

impl MemoryBackend {
    fn state(&self) -> MutexGuard<'_, MemoryState> {
        // Every critical section leaves the maps consistent, so a panic elsewhere cannot have broken them.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) async fn acquire(
        &self,
        keys: &LockKeys,
        token: &LockToken,
        ttl: Duration,
        metadata: &str,
    ) -> Result<Attempt, LockError> {
        let mut state = self.state();
        if let Some(held) = state.live(&keys.record) {
            let remaining = held.expires_at.saturating_duration_since(Instant::now());
            return Ok(Attempt::Busy { remaining: Some(remaining) });
        }
        let fence = state.fences.entry(keys.fence()).or_insert(0);
        *fence += 1;
        let fence = *fence;
        let record = Record {
            token: Some(token.as_str().to_owned()),
            fence,
            metadata: metadata.to_owned(),
            expires_at: Instant::now() + ttl,
        };
        state.records.insert(keys.record.clone(), record);
        Ok(Attempt::Granted { fence })
    }

    pub(crate) async fn renew(&self, keys: &LockKeys, token: &LockToken, ttl: Duration) -> Result<bool, LockError> {
        let mut state = self.state();
        match state.live(&keys.record) {
            Some(r) if r.token.as_deref() == Some(token.as_str()) => {
                r.expires_at = Instant::now() + ttl;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    pub(crate) async fn release(
        &self,
        keys: &LockKeys,
        token: &LockToken,
        keep: Option<Duration>,
    ) -> Result<ReleaseOutcome, LockError> {
        let mut state = self.state();
        let outcome = match state.live(&keys.record) {
            None => ReleaseOutcome::Expired,
            Some(r) if r.token.as_deref() != Some(token.as_str()) => ReleaseOutcome::TakenByOther,
            Some(r) => {
                match keep {
                    Some(keep) => {
                        r.token = None;
                        r.expires_at = Instant::now() + keep;
                    }
                    None => {
                        state.records.remove(&keys.record);
                        state.announce_release(keys);
                    }
                }
                ReleaseOutcome::Released
            }
        };
        Ok(outcome)
    }

    pub(crate) async fn remaining(&self, keys: &LockKeys, token: &LockToken) -> Result<Option<Duration>, LockError> {
        let mut state = self.state();
        Ok(match state.live(&keys.record) {
            Some(r) if r.token.as_deref() == Some(token.as_str()) => {
                Some(r.expires_at.saturating_duration_since(Instant::now()))
            }
            _ => None,
        })
    }

    pub(crate) async fn info(&self, keys: &LockKeys) -> Result<Option<LockInfo>, LockError> {
        let mut state = self.state();
        Ok(state.live(&keys.record).map(|r| LockInfo {
            metadata: r.metadata.clone(),
            fencing_token: r.fence,
            remaining_ttl: r.expires_at.saturating_duration_since(Instant::now()),
        }))
    }

    pub(crate) async fn force_unlock(&self, keys: &LockKeys) -> Result<bool, LockError> {
        let mut state = self.state();
        let existed = state.live(&keys.record).is_some();
        state.records.remove(&keys.record);
        if existed {
            state.announce_release(keys);
        }
        Ok(existed)
    }

    pub(crate) async fn watch_releases(&self, keys: &LockKeys) -> Result<ReleaseWatch, LockError> {
        let mut state = self.state();
        let channel =
            state.channels.entry(keys.channel()).or_insert_with(|| Channel { tx: watch::Sender::new(0), waiters: 0 });
        channel.waiters += 1;
        let rx = channel.tx.subscribe();
        let backend = self.clone();
        let name = keys.channel();
        Ok(ReleaseWatch::new(rx, move || {
            let mut state = backend.state();
            if let Some(channel) = state.channels.get_mut(&name) {
                channel.waiters -= 1;
                if channel.waiters == 0 {
                    state.channels.remove(&name);
                }
            }
        }))
    }
}
