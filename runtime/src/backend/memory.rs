//! The in-process backend: the same semantics as Redis (leases, fencing, the wait queue and hand-overs)
//! inside one process. For tests and single-process programs; it locks nothing across processes.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;
use tokio::time::Instant;

use super::{
    glob_matches, Announcement, Attempt, Capabilities, Fencing, Hold, LockKeys, Place, Queueing, ReleaseWatch, Scan,
    Store, WakeUps, FENCE_RETENTION,
};
use crate::{LockError, LockInfo, LockToken, ReleaseOutcome};

#[derive(Debug, Clone)]
pub(crate) struct MemoryBackend {
    state: Arc<Mutex<MemoryState>>,
    capabilities: Capabilities,
    /// The client's owner name, in every record it writes.
    owner: Arc<str>,
}

/// Everything keyed by the lock's record key.
#[derive(Debug, Default)]
struct MemoryState {
    records: HashMap<String, Record>,
    fences: HashMap<String, Fence>,
    queues: HashMap<String, VecDeque<Waiter>>,
    /// Per lock, each waiting client's mark (`Queueing::register`): until when its waiters' places live.
    marks: HashMap<String, HashMap<u64, Instant>>,
    channels: HashMap<String, Channel>,
    /// How many entries the maps held after the last sweep of expired ones: the next comes when they double.
    after_sweep: usize,
    /// How many acquire attempts reached the store (for the crate's tests).
    #[cfg(test)]
    acquires: u64,
}

/// A lock's last fencing token, kept after its holder is gone (as Redis keeps it in the freed record and
/// `R:last`, see `record.lua`): for the grant's lease plus [`FENCE_RETENTION`].
#[derive(Debug)]
struct Fence {
    last: u64,
    expires_at: Instant,
}

/// Sweeps start once the maps hold this many entries.
const SWEEP_FROM: usize = 1024;

#[derive(Debug)]
struct Record {
    /// `None` while kept by `min_hold` after release: held, by nobody.
    token: Option<String>,
    fence: u64,
    owner: Arc<str>,
    metadata: String,
    /// When the grant (or the hand-over) was made: renewals leave it.
    granted: Instant,
    expires_at: Instant,
}

#[derive(Debug)]
struct Waiter {
    token: String,
    expires_at: Instant,
    lease: Duration,
    /// The ttl it asked for: a hand-over's fencing token is kept that long, though its record may lapse after
    /// the short hand-over `lease`.
    ttl: Duration,
    /// The number of the attempt that last registered it, which a hand-over announces.
    attempt: u64,
    /// Its client (`Queueing::client`), whose mark for the lock must live too.
    client: u64,
    owner: Arc<str>,
    metadata: String,
    /// When it first queued.
    queued_at: Instant,
}

/// Whether `waiter`'s place in `record`'s queue lives: its own registration and its client's mark both last.
fn alive(marks: &HashMap<String, HashMap<u64, Instant>>, record: &str, waiter: &Waiter, now: Instant) -> bool {
    waiter.expires_at > now && marks.get(record).and_then(|m| m.get(&waiter.client)).is_some_and(|&until| until > now)
}

/// A record's owner and metadata.
type Holder<'a> = (&'a Arc<str>, &'a str);

#[derive(Debug)]
struct Channel {
    tx: watch::Sender<Announcement>,
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

    /// `max(last token + 1, the wall clock in µs)`, as the Redis scripts do: tokens keep rising in a new
    /// process, and the last one is kept only for `lease` + [`FENCE_RETENTION`].
    fn next_fence(&mut self, keys: &LockKeys, lease: Duration) -> u64 {
        let now = Instant::now();
        let clock = crate::hooks::wall_clock_micros()
            .unwrap_or_else(|| SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros()));
        let kept = self.fences.get(&keys.record).filter(|f| f.expires_at > now).map_or(0, |f| f.last);
        let fence = (kept + 1).max(u64::try_from(clock).unwrap_or(u64::MAX));
        self.fences.insert(keys.record.clone(), Fence { last: fence, expires_at: now + lease + FENCE_RETENTION });
        self.sweep_if_grown(now);
        fence
    }

    /// Grants the free lock `keys` to `token` for `ttl`; its fencing token.
    fn grant(&mut self, keys: &LockKeys, token: &LockToken, ttl: Duration, owner: &Arc<str>, metadata: &str) -> u64 {
        let fence = self.next_fence(keys, ttl);
        let now = Instant::now();
        let record = Record {
            token: Some(token.as_str().to_owned()),
            fence,
            owner: Arc::clone(owner),
            metadata: metadata.to_owned(),
            granted: now,
            expires_at: now + ttl,
        };
        self.records.insert(keys.record.clone(), record);
        fence
    }

    /// Drops expired records, fences and waiters once the maps have doubled since the last sweep, so locks
    /// nobody touches again leave nothing behind (Redis expires its keys itself); amortized O(1) per grant.
    fn sweep_if_grown(&mut self, now: Instant) {
        let size = || self.records.len() + self.fences.len() + self.queues.len();
        if size() < SWEEP_FROM.max(2 * self.after_sweep) {
            return;
        }
        self.records.retain(|_, r| r.expires_at > now);
        self.fences.retain(|_, f| f.expires_at > now);
        self.queues.retain(|_, q| {
            q.retain(|w| w.expires_at > now);
            !q.is_empty()
        });
        self.marks.retain(|_, m| {
            m.retain(|_, until| *until > now);
            !m.is_empty()
        });
        self.after_sweep = self.records.len() + self.fences.len() + self.queues.len();
    }

    /// Hands the free lock to the longest live waiter and announces it; the heir's token, if any.
    fn hand_over(&mut self, keys: &LockKeys) -> Option<String> {
        let now = Instant::now();
        let heir = loop {
            let queue = self.queues.get_mut(&keys.record)?;
            let Some(waiter) = queue.pop_front() else {
                self.queues.remove(&keys.record);
                return None;
            };
            if alive(&self.marks, &keys.record, &waiter, now) {
                break waiter;
            }
        };
        let fence = self.next_fence(keys, heir.ttl);
        let record = Record {
            token: Some(heir.token.clone()),
            fence,
            owner: heir.owner,
            metadata: heir.metadata,
            granted: now,
            expires_at: now + heir.lease,
        };
        self.records.insert(keys.record.clone(), record);
        if let Some(channel) = self.channels.get(&keys.channel()) {
            let hold = Hold { fence, lease: heir.lease };
            channel.tx.send_replace(Announcement::hand_over(&heir.token, hold, heir.attempt));
        }
        Some(heir.token)
    }

    fn enqueue(&mut self, keys: &LockKeys, token: &LockToken, ttl: Duration, queueing: Queueing, holder: Holder<'_>) {
        let queue = self.queues.entry(keys.record.clone()).or_default();
        let now = Instant::now();
        let expires_at = now + queueing.keep;
        let (owner, metadata) = holder;
        match queue.iter_mut().find(|w| w.token == token.as_str()) {
            Some(waiter) => {
                waiter.expires_at = expires_at;
                waiter.lease = queueing.lease;
                waiter.ttl = ttl;
                waiter.attempt = queueing.attempt;
                waiter.client = queueing.client;
            }
            None => queue.push_back(Waiter {
                token: token.as_str().to_owned(),
                expires_at,
                lease: queueing.lease,
                ttl,
                attempt: queueing.attempt,
                client: queueing.client,
                owner: Arc::clone(owner),
                metadata: metadata.to_owned(),
                queued_at: Instant::now(),
            }),
        }
        self.marks.entry(keys.record.clone()).or_default().insert(queueing.client, now + queueing.register);
    }

    fn withdraw(&mut self, keys: &LockKeys, token: &LockToken) {
        if let Some(queue) = self.queues.get_mut(&keys.record) {
            queue.retain(|w| w.token != token.as_str());
            if queue.is_empty() {
                self.queues.remove(&keys.record);
            }
        }
    }
}

impl MemoryBackend {
    /// An empty store whose records name `owner`.
    pub(crate) fn new(owner: Arc<str>) -> Self {
        let capabilities = Capabilities {
            fair_queue: true,
            wake_ups: WakeUps::Exact,
            fencing: Fencing::Monotonic,
            replica_acks: false,
        };
        Self { state: Arc::default(), capabilities, owner }
    }

    /// How many acquire attempts reached the store.
    #[cfg(test)]
    pub(crate) fn acquire_calls(&self) -> u64 {
        self.state().acquires
    }

    /// Whether anyone is queued for the record `record`.
    #[cfg(test)]
    pub(crate) fn has_queue(&self, record: &str) -> bool {
        self.state().queues.contains_key(record)
    }

    /// The same store claiming fewer guarantees, so the engine's paths for stores without them are tested.
    #[cfg(test)]
    pub(crate) fn with_capabilities(capabilities: Capabilities) -> Self {
        Self { capabilities, ..Self::new("test".into()) }
    }

    /// What the store holds for the record `record` right now, without touching it: the owner's token
    /// (`None`: kept by nobody), fencing token and expiry. The simulation's oracle reads the truth here.
    #[cfg(feature = "simulation")]
    pub(crate) fn peek(&self, record: &str) -> Option<(Option<String>, u64, Instant)> {
        let now = Instant::now();
        let state = self.state();
        state.records.get(record).filter(|r| r.expires_at > now).map(|r| (r.token.clone(), r.fence, r.expires_at))
    }

    fn state(&self) -> MutexGuard<'_, MemoryState> {
        // Every critical section leaves the maps consistent, so a panic elsewhere cannot have broken them.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Store for MemoryBackend {
    type Cursor = ();

    fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    async fn acquire(
        &self,
        keys: &LockKeys,
        token: &LockToken,
        ttl: Duration,
        metadata: &str,
        queueing: Option<Queueing>,
    ) -> Result<Attempt, LockError> {
        let mut state = self.state();
        #[cfg(test)]
        {
            state.acquires += 1;
        }
        if state.live(&keys.record).is_none() {
            state.hand_over(keys);
        }
        if let Some(held) = state.live(&keys.record) {
            if held.token.as_deref() == Some(token.as_str()) {
                // A hand-over to this token, claimed: stretched to the full ttl, as Redis does.
                held.expires_at = Instant::now() + ttl;
                return Ok(Attempt::Granted(Hold { fence: held.fence, lease: ttl }));
            }
            let (fence, remaining) = (held.fence, held.expires_at.saturating_duration_since(Instant::now()));
            if let Some(queueing) = queueing {
                state.enqueue(keys, token, ttl, queueing, (&self.owner, metadata));
            }
            return Ok(Attempt::Busy { fence, remaining: Some(remaining) });
        }
        let fence = state.grant(keys, token, ttl, &self.owner, metadata);
        Ok(Attempt::Granted(Hold { fence, lease: ttl }))
    }

    async fn acquire_free(
        &self,
        locks: &[(&LockKeys, &LockToken)],
        ttl: Duration,
        metadata: &str,
    ) -> Result<Option<Vec<Hold>>, LockError> {
        let mut state = self.state();
        // As ACQUIRE_ALL: a lock held (also by nobody) or with a queue, even of lapsed waiters, is left to
        // `acquire`, which hands it over or claims it.
        for (keys, _) in locks {
            if state.live(&keys.record).is_some() || state.queues.contains_key(&keys.record) {
                return Ok(None);
            }
        }
        let grant = |(keys, token): &(&LockKeys, &LockToken)| Hold {
            fence: state.grant(keys, token, ttl, &self.owner, metadata),
            lease: ttl,
        };
        Ok(Some(locks.iter().map(grant).collect()))
    }

    async fn withdraw(&self, keys: &LockKeys, token: &LockToken) -> Result<Option<Hold>, LockError> {
        let mut state = self.state();
        state.withdraw(keys, token);
        let now = Instant::now();
        Ok(state
            .live(&keys.record)
            .filter(|r| r.token.as_deref() == Some(token.as_str()))
            .map(|r| Hold { fence: r.fence, lease: r.expires_at.saturating_duration_since(now) }))
    }

    async fn renew(&self, keys: &LockKeys, token: &LockToken, ttl: Duration) -> Result<bool, LockError> {
        let mut state = self.state();
        match state.live(&keys.record) {
            Some(r) if r.token.as_deref() == Some(token.as_str()) => {
                r.expires_at = Instant::now() + ttl;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn release(
        &self,
        keys: &LockKeys,
        token: &LockToken,
        _fence: Option<u64>,
        keep: Option<Duration>,
    ) -> Result<ReleaseOutcome, LockError> {
        let mut state = self.state();
        let outcome = match state.live(&keys.record) {
            None => ReleaseOutcome::Expired,
            Some(r) if r.token.is_none() => ReleaseOutcome::Expired,
            Some(r) if r.token.as_deref() != Some(token.as_str()) => ReleaseOutcome::TakenByOther,
            Some(r) => {
                match keep {
                    Some(keep) => {
                        r.token = None;
                        r.expires_at = Instant::now() + keep;
                    }
                    None => {
                        state.records.remove(&keys.record);
                        state.hand_over(keys);
                    }
                }
                ReleaseOutcome::Released
            }
        };
        Ok(outcome)
    }

    async fn remaining(&self, keys: &LockKeys, token: &LockToken) -> Result<Option<Duration>, LockError> {
        let mut state = self.state();
        Ok(match state.live(&keys.record) {
            Some(r) if r.token.as_deref() == Some(token.as_str()) => {
                Some(r.expires_at.saturating_duration_since(Instant::now()))
            }
            _ => None,
        })
    }

    async fn info(&self, keys: &LockKeys) -> Result<Option<LockInfo>, LockError> {
        let mut state = self.state();
        let waiting = state.queues.get(&keys.record).map_or(0, VecDeque::len);
        let now = Instant::now();
        Ok(state.live(&keys.record).map(|r| LockInfo {
            owner: r.owner.to_string(),
            metadata: r.metadata.clone(),
            fencing_token: r.fence,
            held_for: now.saturating_duration_since(r.granted),
            remaining_ttl: r.expires_at.saturating_duration_since(now),
            waiting,
            kept_by_min_hold: r.token.is_none(),
        }))
    }

    async fn force_unlock(&self, keys: &LockKeys) -> Result<bool, LockError> {
        let mut state = self.state();
        let existed = state.live(&keys.record).is_some();
        state.records.remove(&keys.record);
        // No hand-over: the queue head may be a waiter that died. Every waiter retries; the live ones queue again.
        state.queues.remove(&keys.record);
        state.marks.remove(&keys.record);
        if let Some(channel) = state.channels.get(&keys.channel()) {
            channel.tx.send_replace(Announcement::Retry);
        }
        Ok(existed)
    }

    /// Every live matching record at once: the store is this process's own, so it holds as many locks as the
    /// process does.
    async fn scan(&self, scan: &mut Scan<()>, pattern: &str, _count: usize) -> Result<Vec<String>, LockError> {
        let now = Instant::now();
        let state = self.state();
        scan.done = true;
        Ok(state
            .records
            .iter()
            .filter(|(key, record)| record.expires_at > now && glob_matches(pattern.as_bytes(), key.as_bytes()))
            .map(|(key, _)| key.clone())
            .collect())
    }

    async fn waiters(&self, keys: &LockKeys, limit: usize) -> Result<Vec<Place>, LockError> {
        let now = Instant::now();
        let state = self.state();
        let Some(queue) = state.queues.get(&keys.record) else { return Ok(Vec::new()) };
        Ok(queue
            .iter()
            .take(limit)
            .filter(|w| alive(&state.marks, &keys.record, w, now))
            .map(|w| Place {
                owner: w.owner.to_string(),
                metadata: w.metadata.clone(),
                waited: now.saturating_duration_since(w.queued_at),
            })
            .collect())
    }

    async fn watch_releases(&self, keys: &LockKeys, _token: &LockToken) -> Result<ReleaseWatch, LockError> {
        let mut state = self.state();
        let name = keys.channel();
        let channel = state
            .channels
            .entry(name.clone())
            .or_insert_with(|| Channel { tx: watch::Sender::new(Announcement::Nothing), waiters: 0 });
        channel.waiters += 1;
        let rx = channel.tx.subscribe();
        let backend = self.clone();
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

#[cfg(test)]
mod tests;
