//! The simulated store: one shared memory store (the truth), and per client a fault layer that every call
//! passes through. A call is carried by a task of its own, as a request on the wire is: it leaves once the
//! client runs, takes its time, is applied once the store runs, and its reply takes its time back; a caller
//! that gives up (times out, is cancelled) does not stop a request already sent. Faults, from the seed: a slow
//! request or reply, a request lost, a command applied and its reply lost (the ambiguous failure), and
//! announcements dropped or delivered late.

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::{short, Tokens, World};
use crate::backend::{
    Announcement, Attempt, Capabilities, HandOver, Hold, LockKeys, MemoryBackend, Place, Queueing, ReleaseWatch, Scan,
    Store,
};
use crate::error::{BackendError, BackendErrorKind};
use crate::{LockError, LockInfo, LockToken, ReleaseOutcome};

tokio::task_local! {
    /// The tokens of the tracked request being polled ([`super::Sim::track`]).
    pub(super) static TRACKED: Tokens;
}

/// One client's view of the simulated store.
#[derive(Debug, Clone)]
pub(crate) struct SimStore {
    world: Arc<World>,
    client: usize,
}

/// What happens to one call, drawn when it is made.
#[derive(Debug, Clone, Copy)]
pub(super) struct Plan {
    pub(super) id: u64,
    /// The connection it goes on, and its place among that connection's calls, which the server applies and
    /// answers in order.
    pub(super) lane: super::Lane,
    pub(super) seq: u64,
    pub(super) request: Duration,
    pub(super) reply: Duration,
    pub(super) lose_request: bool,
    pub(super) lose_reply: bool,
    /// A lost message leaves the caller waiting for its timeout (else the connection resets at once).
    pub(super) blackhole: bool,
}

impl World {
    pub(super) fn plan(&self, lane: super::Lane) -> Plan {
        let config = &self.config;
        let client = lane.0;
        let mut state = self.state();
        state.calls += 1;
        let id = state.calls;
        let issued = state.issued.entry(lane).or_default();
        let seq = *issued;
        *issued += 1;
        let mut faults = 0;
        let mut leg = |state: &mut super::State| {
            if state.rng.f64() < state.chance_of(config.slow) {
                faults += 1;
                Duration::from_millis(state.rng.u64(0..=config.slow_delay.as_millis() as u64))
            } else {
                Duration::from_millis(state.rng.u64(0..=config.normal_delay.as_millis() as u64))
            }
        };
        let (request, reply) = (leg(&mut state), leg(&mut state));
        let lose_request = state.rng.f64() < state.chance_of(config.lose_request);
        let lose_reply = !lose_request && state.rng.f64() < state.chance_of(config.lose_reply);
        faults += u64::from(lose_request) + u64::from(lose_reply);
        let blackhole = state.rng.bool();
        state.faults += faults;
        state.in_flight[client].insert(id, (Instant::now(), request + reply));
        if faults > 0 {
            // Until its reply would have come back at the latest, as the oracle's time bounds see it.
            let now = Instant::now();
            state.disturbed[client].push((now, now + config.response_timeout + 2 * config.slow_delay));
        }
        Plan { id, lane, seq, request, reply, lose_request, lose_reply, blackhole }
    }

    /// Carries one call to the store and its reply back, as `plan` says.
    pub(super) async fn carry<T, Fut>(
        self: Arc<Self>,
        client: usize,
        plan: Plan,
        records: Vec<String>,
        op: Fut,
        reply: oneshot::Sender<Result<T, LockError>>,
    ) where
        T: Debug,
        Fut: Future<Output = Result<T, LockError>>,
    {
        let (id, issued) = (plan.id, Instant::now());
        // The request leaves only when its client runs.
        self.wait_unfrozen(client).await;
        tokio::time::sleep(plan.request).await;
        self.in_turn(plan.seq, |state| state.applied.get(&plan.lane).copied().unwrap_or(0)).await;
        if plan.lose_request {
            self.trace(|| format!("c{client} #{id} request LOST"));
            self.next_turn(|state| *state.applied.entry(plan.lane).or_default() += 1);
            self.next_turn(|state| *state.replied.entry(plan.lane).or_default() += 1);
            self.landed(client, id, issued, issued + self.config.response_timeout);
            return self.lost(plan, reply).await;
        }
        self.wait_unpaused().await;
        let out = op.await;
        self.trace(|| format!("c{client} #{id} applied: {}", shown(&out)));
        self.next_turn(|state| *state.applied.entry(plan.lane).or_default() += 1);
        for record in &records {
            self.check_fence(record);
        }
        self.check("store");
        if plan.lose_reply {
            self.trace(|| format!("c{client} #{id} reply LOST (applied)"));
            self.next_turn(|state| *state.replied.entry(plan.lane).or_default() += 1);
            self.landed(client, id, issued, issued + self.config.response_timeout);
            return self.lost(plan, reply).await;
        }
        tokio::time::sleep(plan.reply).await;
        self.in_turn(plan.seq, |state| state.replied.get(&plan.lane).copied().unwrap_or(0)).await;
        let _ = reply.send(out);
        self.next_turn(|state| *state.replied.entry(plan.lane).or_default() += 1);
        // Slowed, or held up behind a slow call, a pause or a stall: the oracle's time bounds make room for it.
        let took = issued.elapsed();
        if took > plan.request + plan.reply || took > 2 * self.config.normal_delay {
            self.landed(client, id, issued, Instant::now());
        } else {
            self.state().in_flight[client].remove(&id);
        }
    }

    /// Waits until the calls of its client before `seq` have passed the point `done` counts.
    async fn in_turn(&self, seq: u64, done: impl Fn(&super::State) -> u64) {
        loop {
            let turn = self.turn.notified();
            tokio::pin!(turn);
            turn.as_mut().enable();
            if done(&self.state()) >= seq {
                return;
            }
            turn.await;
        }
    }

    fn next_turn(&self, advance: impl FnOnce(&mut super::State)) {
        advance(&mut self.state());
        self.turn.notify_waiters();
    }

    /// A new subscriber to the announcements of `keys`. One hub task per key hears the memory store's and
    /// passes each on to the subscribers in the order they subscribed: tokio's watch wakes many receivers in
    /// an order drawn from its own, unseeded generator, which would make runs unrepeatable.
    async fn subscribe(self: Arc<Self>, keys: LockKeys) -> Result<mpsc::UnboundedReceiver<Announcement>, LockError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let first = {
            let mut state = self.state();
            let subscribers = state.hubs.entry(keys.record.clone()).or_default();
            subscribers.push(tx);
            subscribers.len() == 1
        };
        if first {
            let mut heard = self.memory.watch_releases(&keys, &LockToken::blank()).await?;
            let world = Arc::clone(&self);
            tokio::spawn(async move {
                loop {
                    let announcement = heard.next().await;
                    let subscribers = {
                        let mut state = world.state();
                        let subscribers = state.hubs.entry(keys.record.clone()).or_default();
                        subscribers.retain(|s| !s.is_closed());
                        subscribers.clone()
                    };
                    for subscriber in subscribers {
                        let _ = subscriber.send(announcement.clone());
                    }
                }
            });
        }
        Ok(rx)
    }

    /// Call `id` is no longer on its way; it was hindered from `from` to `to`.
    fn landed(&self, client: usize, id: u64, from: Instant, to: Instant) {
        let mut state = self.state();
        state.in_flight[client].remove(&id);
        state.disturbed[client].push((from, to));
    }

    /// A lost message: the caller waits for its timeout, or its connection resets now.
    async fn lost<T>(&self, plan: Plan, mut reply: oneshot::Sender<T>) {
        if plan.blackhole {
            reply.closed().await;
        }
    }
}

/// A reply as the trace shows it (tokens shortened).
fn shown<T: Debug>(out: &Result<T, LockError>) -> String {
    match out {
        Ok(value) => format!("{value:?}"),
        Err(e) => format!("error: {e}"),
    }
}

fn timed_out(key: &str) -> LockError {
    let source = std::io::Error::from(std::io::ErrorKind::TimedOut);
    let hint = "the simulated store did not answer in time".to_owned();
    LockError::Backend(
        BackendError::new("simulated store", "sim://store", BackendErrorKind::Timeout, hint, source).for_key(Some(key)),
    )
}

impl SimStore {
    pub(super) fn new(world: Arc<World>, client: usize) -> Self {
        Self { world, client }
    }

    /// One call: `op` runs in the store when (and if) the request gets there; the reply, if any comes back
    /// within the response timeout, is seen once this client runs.
    async fn call<T, Fut>(&self, what: String, keys: &LockKeys, op: Fut) -> Result<T, LockError>
    where
        T: Debug + Send + 'static,
        Fut: Future<Output = Result<T, LockError>> + Send + 'static,
    {
        let (world, client) = (&self.world, self.client);
        let plan = world.plan((client, 0));
        let id = plan.id;
        world.trace(|| {
            let mut faults = String::new();
            if plan.lose_request {
                faults.push_str(" [request will be lost]");
            }
            if plan.lose_reply {
                faults.push_str(" [reply will be lost]");
            }
            format!("c{client} #{id} → {what} (legs {:?}/{:?}){faults}", plan.request, plan.reply)
        });
        let (tx, rx) = oneshot::channel();
        // Boxed, as `wire.rs` boxes its calls: spawning copied the few-KB future three times over.
        tokio::spawn(Box::pin(Arc::clone(world).carry(client, plan, vec![keys.record.clone()], op, tx)));
        let reply = tokio::time::timeout(world.config.response_timeout, rx).await;
        // Nothing reaches a stalled client.
        world.wait_unfrozen(client).await;
        match reply {
            Ok(Ok(out)) => {
                world.trace(|| format!("c{client} #{id} ← {}", shown(&out)));
                out
            }
            _ => {
                world.trace(|| format!("c{client} #{id} ← failed (timed out or connection reset)"));
                Err(timed_out(&keys.name))
            }
        }
    }

    fn note(&self, token: &LockToken) {
        let _ = TRACKED.try_with(|tokens| tokens.add(token.as_str()));
        self.world.state().owners.insert(token.as_str().to_owned(), self.client);
    }

    fn memory(&self) -> MemoryBackend {
        self.world.memory.clone()
    }

    /// Forwards the announcements one waiter hears, each dropped, late or on time as the seed says, and none
    /// while the client is stalled.
    async fn forward(self, mut heard: mpsc::UnboundedReceiver<Announcement>, to: watch::Sender<Announcement>) {
        let (world, client) = (&self.world, self.client);
        while let Some(announcement) = heard.recv().await {
            let text = announced(&announcement);
            let (dropped, late) = {
                let mut state = world.state();
                let dropped = state.rng.f64() < state.chance_of(world.config.drop_announcement);
                let late = !dropped && state.rng.f64() < state.chance_of(world.config.drop_announcement);
                state.faults += u64::from(dropped || late);
                let late =
                    late.then(|| Duration::from_millis(state.rng.u64(1..=world.config.slow_delay.as_millis() as u64)));
                (dropped, late)
            };
            if dropped {
                world.trace(|| format!("c{client} announcement DROPPED: {text}"));
                continue;
            }
            if let Some(late) = late {
                world.trace(|| format!("c{client} announcement LATE by {late:?}: {text}"));
                tokio::time::sleep(late).await;
            }
            world.wait_unfrozen(client).await;
            world.trace(|| format!("c{client} hears {text}"));
            to.send_replace(announcement);
        }
    }
}

/// An announcement as the trace shows it (the heir's token shortened).
fn announced(announcement: &Announcement) -> String {
    match announcement {
        Announcement::HandedOver { heir, hand_over } => {
            let HandOver { hold, attempt } = hand_over;
            format!("handed over to {} ({}:{}:{attempt})", short(heir), hold.fence, hold.lease.as_millis())
        }
        other => format!("{other:?}"),
    }
}

impl Store for SimStore {
    type Cursor = ();

    fn capabilities(&self) -> Capabilities {
        self.world.memory.capabilities()
    }

    async fn acquire(
        &self,
        keys: &LockKeys,
        token: &LockToken,
        ttl: Duration,
        metadata: &str,
        queueing: Option<Queueing>,
    ) -> Result<Attempt, LockError> {
        self.note(token);
        let (m, k, t, meta) = (self.memory(), keys.clone(), token.clone(), metadata.to_owned());
        let what = format!("acquire {} by {token} ttl {ttl:?} queue {queueing:?}", keys.name);
        self.call(what, keys, async move { m.acquire(&k, &t, ttl, &meta, queueing).await }).await
    }

    /// The memory store's one-step grant of several free keys (`lock_all`), as one call named after the first
    /// key; every key's fencing token is checked, as after any command on it.
    async fn acquire_free(
        &self,
        locks: &[(&LockKeys, &LockToken)],
        ttl: Duration,
        metadata: &str,
    ) -> Result<Option<Vec<Hold>>, LockError> {
        let Some((first, _)) = locks.first() else { return Ok(None) };
        locks.iter().for_each(|(_, token)| self.note(token));
        let owned: Vec<(LockKeys, LockToken)> = locks.iter().map(|(k, t)| ((*k).clone(), (*t).clone())).collect();
        let names: Vec<&str> = locks.iter().map(|(k, _)| k.name.as_str()).collect();
        let what = format!("acquire_free {names:?} ttl {ttl:?}");
        let (m, world, meta) = (self.memory(), Arc::clone(&self.world), metadata.to_owned());
        self.call(what, first, async move {
            let locks: Vec<(&LockKeys, &LockToken)> = owned.iter().map(|(k, t)| (k, t)).collect();
            let out = m.acquire_free(&locks, ttl, &meta).await;
            // The first key's is checked by `carry`, as for every call.
            owned.iter().skip(1).for_each(|(keys, _)| world.check_fence(&keys.record));
            out
        })
        .await
    }

    async fn withdraw(&self, keys: &LockKeys, token: &LockToken) -> Result<Option<Hold>, LockError> {
        let (m, k, t) = (self.memory(), keys.clone(), token.clone());
        self.call(format!("withdraw {} by {token}", keys.name), keys, async move { m.withdraw(&k, &t).await }).await
    }

    async fn renew(&self, keys: &LockKeys, token: &LockToken, ttl: Duration) -> Result<bool, LockError> {
        let (m, k, t, world) = (self.memory(), keys.clone(), token.clone(), Arc::clone(&self.world));
        let what = format!("renew {} by {token} ttl {ttl:?}", keys.name);
        self.call(what, keys, async move {
            world.applying_renew(&k.record, t.as_str());
            m.renew(&k, &t, ttl).await
        })
        .await
    }

    async fn release(
        &self,
        keys: &LockKeys,
        token: &LockToken,
        fence: Option<u64>,
        keep: Option<Duration>,
    ) -> Result<ReleaseOutcome, LockError> {
        let (m, k, t, world) = (self.memory(), keys.clone(), token.clone(), Arc::clone(&self.world));
        let what = format!("release {} by {token}", keys.name);
        self.world.release_sent(token.as_str());
        // This layer never sends a command again: a lost reply is an error to the engine.
        self.call(what, keys, async move {
            world.applying_release(&k.record, t.as_str(), false, (false, false), 0);
            m.release(&k, &t, fence, keep).await
        })
        .await
    }

    async fn remaining(&self, keys: &LockKeys, token: &LockToken) -> Result<Option<Duration>, LockError> {
        let (m, k, t) = (self.memory(), keys.clone(), token.clone());
        self.call(format!("remaining {} by {token}", keys.name), keys, async move { m.remaining(&k, &t).await }).await
    }

    async fn info(&self, keys: &LockKeys) -> Result<Option<LockInfo>, LockError> {
        let (m, k) = (self.memory(), keys.clone());
        self.call(format!("info {}", keys.name), keys, async move { m.info(&k).await }).await
    }

    async fn force_unlock(&self, keys: &LockKeys) -> Result<bool, LockError> {
        let (m, k, world) = (self.memory(), keys.clone(), Arc::clone(&self.world));
        self.call(format!("force_unlock {}", keys.name), keys, async move {
            world.applying_force_unlock(&k.record, 0);
            m.force_unlock(&k).await
        })
        .await
    }

    /// The memory store's scan, through the fault layer as one call (it has no lock of its own: named after none).
    async fn scan(&self, scan: &mut Scan<()>, pattern: &str, count: usize) -> Result<Vec<String>, LockError> {
        let (m, pattern) = (self.memory(), pattern.to_owned());
        let found = self
            .call(format!("scan {pattern}"), &LockKeys::default(), async move {
                m.scan(&mut Scan::default(), &pattern, count).await
            })
            .await?;
        scan.done = true;
        Ok(found)
    }

    async fn waiters(&self, keys: &LockKeys, limit: usize) -> Result<Vec<Place>, LockError> {
        let (m, k) = (self.memory(), keys.clone());
        self.call(format!("waiters {}", keys.name), keys, async move { m.waiters(&k, limit).await }).await
    }

    async fn watch_releases(&self, keys: &LockKeys, token: &LockToken) -> Result<ReleaseWatch, LockError> {
        let (world, k) = (Arc::clone(&self.world), keys.clone());
        let what = format!("subscribe {} by {token}", keys.name);
        let heard = self.call(what, keys, async move { world.subscribe(k).await }).await?;
        let (tx, rx) = watch::channel(Announcement::Nothing);
        let forwarder = tokio::spawn(self.clone().forward(heard, tx)).abort_handle();
        Ok(ReleaseWatch::new(rx, move || forwarder.abort()))
    }
}
