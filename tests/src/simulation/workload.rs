//! The workload of issue 32: the whole public API under the simulation, on any store model behind [`Sim`].
//!
//! One schedule: three clients (four or five in a fifth of the schedules, as the runner draws them) with one to
//! three tasks each (one or two with more clients) lock one to four keys. Each task does a few of:
//! - `acquire` or `try_acquire` of one key or of several (`lock_all`, key sets overlapping across tasks, a key
//!   named twice now and then), with varied ttls, waits, retry strategies, `min_hold`, `max_hold`; it holds
//!   the guard, looking at it and extending it to longer and shorter leases, then releases it (the outcome
//!   checked), drops it, cancels the release, or sends an extend and cancels it just before the release;
//! - `run` of one key or several under either `OnLost` (`bodies.rs`), whose body looks at its lock and extends it, and now
//!   and then makes nested requests: the same key again through the same client (reentrant `acquire`,
//!   `try_acquire` and `run`), another key, or several keys of which some are held; at its end a body may
//!   spawn an extend that races the release; a body may let its guard escape;
//! - cancellation of any of these at a random point: after the first poll (a deadline of 0), after a few
//!   polls (sent, not yet applied), or at a random moment (`try_acquire` half the time).
//!
//! Beside them an operator calls `force_unlock` now and then, a client shuts down mid-schedule now and then, and
//! the nemesis stalls clients, pauses the store and crashes a client. Every result the workload gets is
//! handed to the oracle ([`Sim`]'s checks) at the moment it gets it.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Poll;
use std::time::Duration;

use distlock::simulation::{Model, Sim};
use distlock::{Client, LockError, LockGuard, LockRequest, OnLost, RetryStrategy};
use tokio::task::{AbortHandle, JoinHandle};
use tokio::time::{sleep, Instant};

/// The longest lease a workload may set (ttls up to 1 s, extends up to 3 s): a crashed client's locks are
/// free by then.
pub(super) const MAX_LEASE: Duration = Duration::from_secs(3);

/// How deep lock bodies nest: a body, a request inside it, and one more inside that.
pub(super) const MAX_DEPTH: u32 = 2;

/// Per client, the tasks to abort when it crashes.
type Aborts = Arc<Mutex<Vec<Vec<AbortHandle>>>>;

/// A lock body's future: boxed, as bodies nest.
pub(super) type Body<'a> = Pin<Box<dyn Future<Output = Option<LockGuard>> + Send + 'a>>;

/// The lock bodies around the running one and itself, innermost last: each one's `current_lock()` guard, the
/// keys its request named, and its `on_lost`.
pub(super) type Chain<'a> = [(&'a LockGuard, &'a [String], OnLost)];

/// One schedule's workload: the clients' tasks, an operator, a shutdown and the nemesis; every task must end
/// (or be aborted by its client's crash), none may panic.
pub async fn workload(sim: Sim) {
    let clients = sim.config().clients;
    let keys = match sim.below(20) {
        0..=10 => 1,
        11..=15 => 2,
        16..=17 => 3,
        _ => 4,
    };
    let handles: Vec<Client> = (0..clients).map(|c| sim.client(c)).collect();
    let aborts: Aborts = Arc::new(Mutex::new(vec![Vec::new(); clients]));
    let mut tasks: Vec<JoinHandle<()>> = Vec::new();
    let mut spawn = |c: usize, task: JoinHandle<()>| {
        aborts.lock().unwrap_or_else(PoisonError::into_inner)[c].push(task.abort_handle());
        tasks.push(task);
    };
    let per_client = if clients > 3 { 2 } else { 3 };
    for (c, client) in handles.iter().enumerate() {
        for t in 0..1 + sim.below(per_client) {
            let user = User { sim: sim.clone(), client: client.clone(), c, keys };
            spawn(c, sim.spawn(c, user.tasks(format!("c{c}t{t}"))));
        }
    }
    if sim.chance(0.2) {
        let c = sim.below(clients as u64) as usize;
        spawn(c, sim.spawn(c, operator(sim.clone(), handles[c].clone(), c, keys)));
    }
    let mut shut = None;
    if sim.chance(0.15) {
        let c = sim.below(clients as u64) as usize;
        spawn(c, sim.spawn(c, shutdown(sim.clone(), handles[c].clone(), c)));
        shut = Some(c);
    }
    let nemesis = tokio::spawn(nemesis(sim.clone(), Arc::clone(&aborts)));
    super::join_users(&sim, tasks).await;
    nemesis.abort();
    served_once_calm(&sim, &handles, keys, shut).await;
}

/// Liveness: once every fault has ended and every task is over, a request on each key is served within the
/// longest anything left over can keep it — a crashed client's lock (its lease, `MAX_LEASE`) or its place in
/// a queue, a `min_hold`, a restarted Redlock server's wait of one ttl — and a server clock stepped back
/// lengthens that. A request that is never served, or gives up too soon, breaks no safety rule; this is what
/// catches it. Each guard is then held for [`CALM_HOLD`], several leases, and must still be held and release
/// `Released`: a lock lost while nothing fails is lost for nothing, which no safety rule catches either.
async fn served_once_calm(sim: &Sim, handles: &[Client], keys: u64, shut: Option<usize>) {
    let stepped_back = sim.calm().await;
    let live: Vec<usize> = (0..handles.len()).filter(|&c| Some(c) != shut && !sim.crashed(c)).collect();
    if live.is_empty() {
        return;
    }
    if let Model::Redlock(n) = sim.model() {
        // Half the time a minority of the group fails for good, each server hung (silent) or down (refusing at
        // once): a free lock must still be served, held and released by the servers that answer. (A round that
        // gives up while a quorum could still grant is caught here and nowhere else in the simulation.)
        if sim.chance(0.5) {
            let first = sim.below(n as u64) as usize;
            (0..(n - 1) / 2).for_each(|i| sim.fail_server((first + i) % n, sim.chance(0.5)));
        }
    }
    let wait = 3 * MAX_LEASE + stepped_back + Duration::from_secs(2);
    for k in 0..keys {
        let c = live[k as usize % live.len()];
        let key = format!("k{k}");
        sim.trace(|| format!("c{c} liveness: {key} requested"));
        match handles[c].lock(&key).ttl(CALM_TTL).wait(wait).acquire().await {
            Ok(guard) => {
                if held_once_calm(sim, guard, &format!("c{c} liveness: {key}")).await {
                    served_at_once(sim, &handles[c], c, &key).await;
                }
            }
            Err(e) => sim.violation(format!("c{c} liveness: {key} not served within {wait:?} once calm: {e}")),
        }
    }
    if keys > 1 {
        // Every key at once (a multi-key request must not give up while its keys come free one by one).
        let c = live[keys as usize % live.len()];
        let all: Vec<String> = (0..keys).map(|k| format!("k{k}")).collect();
        sim.trace(|| format!("c{c} liveness: {all:?} requested together"));
        match handles[c].lock_all(all).ttl(CALM_TTL).wait(wait).acquire().await {
            Ok(guard) => {
                held_once_calm(sim, guard, &format!("c{c} liveness: every key")).await;
            }
            Err(e) => {
                sim.violation(format!("c{c} liveness: every key at once not served within {wait:?} once calm: {e}"))
            }
        }
    }
}

/// The lease of the requests made once calm.
const CALM_TTL: Duration = Duration::from_secs(1);

/// How long a guard served once calm is held: three leases, kept only by renewals.
const CALM_HOLD: Duration = Duration::from_secs(3);

/// Holds `guard` for [`CALM_HOLD`]: it must stay held throughout and release `Released`. Whether it did.
async fn held_once_calm(sim: &Sim, guard: LockGuard, what: &str) -> bool {
    sleep(CALM_HOLD).await;
    // Once lost, a guard reads lost for good.
    if guard.is_lost() {
        if !sim.force_unlocked(&guard) {
            // (a force_unlock is by design, and it may have been sent before calm)
            sim.violation(format!("{what}: the guard was lost while held once calm"));
        }
        return false;
    }
    match guard.release().await {
        Ok(distlock::ReleaseOutcome::Released) => return true,
        Ok(other) => sim.violation(format!("{what}: released once calm as {other:?}")),
        Err(e) => sim.violation(format!("{what}: releasing once calm failed: {e}")),
    }
    false
}

/// `key` was just released, nobody else asks for it, and its servers answer (on Redlock, a quorum of them):
/// a request without a wait must be served at its first attempt, the guard and `lock_info` must say how long
/// it is held, and once released `lock_info` must say free; taken again and force-unlocked, its guard's
/// `remaining_ttl` must say gone and its release `Expired`. (A retry within a wait hides a rule that gives up
/// a round too soon: the round-resolution mutants of `redlock/mod.rs` passed every liveness check above.)
async fn served_at_once(sim: &Sim, client: &Client, c: usize, key: &str) {
    let what = format!("c{c} liveness: {key} free, asked again without a wait");
    let guard = match client.lock(key).ttl(CALM_TTL).try_acquire().await {
        Ok(Some(guard)) => guard,
        Ok(None) => return sim.violation(format!("{what}: refused as held")),
        Err(e) => return sim.violation(format!("{what}: failed: {e}")),
    };
    match guard.remaining_ttl().await {
        Ok(Some(left)) if !left.is_zero() && left <= CALM_TTL => {}
        other => sim.violation(format!("{what}: its guard's remaining_ttl read {other:?}")),
    }
    match client.lock_info(key).await {
        Ok(Some(info)) if !info.remaining_ttl.is_zero() && info.remaining_ttl <= CALM_TTL => {}
        other => sim.violation(format!("{what}: lock_info while held read {other:?}")),
    }
    match guard.release().await {
        Ok(distlock::ReleaseOutcome::Released) => {}
        Ok(other) => return sim.violation(format!("{what}: released as {other:?}")),
        Err(e) => return sim.violation(format!("{what}: releasing failed: {e}")),
    }
    match client.lock_info(key).await {
        Ok(None) => {}
        other => return sim.violation(format!("{what}: lock_info once released read {other:?}")),
    }
    // Taken once more and freed under its guard by an operator: the guard's remaining_ttl reads `None` (on
    // Redlock, decided by the servers that say so, as lock_info's free answer above).
    let guard = match client.lock(key).ttl(CALM_TTL).try_acquire().await {
        Ok(Some(guard)) => guard,
        other => return sim.violation(format!("{what}, then once more: {:?}", other.map(|g| g.is_some()))),
    };
    match client.force_unlock(key).await {
        Ok(true) => {}
        other => return sim.violation(format!("{what}: force_unlock of the held key read {other:?}")),
    }
    match guard.remaining_ttl().await {
        Ok(None) => {}
        other => sim.violation(format!("{what}: remaining_ttl once force-unlocked read {other:?}")),
    }
    match guard.release().await {
        Ok(distlock::ReleaseOutcome::Expired) => {}
        other => sim.violation(format!("{what}: released once force-unlocked as {other:?}")),
    }
}

/// Stalls clients (their own tasks stop), pauses the store, now and then crashes a client (aborting its
/// tasks), and on the models with simulated redis-servers, faults a server.
async fn nemesis(sim: Sim, aborts: Aborts) {
    let clients = sim.config().clients as u64;
    for _ in 0..sim.below(7) {
        sleep(sim.millis(0, 800)).await;
        let c = sim.below(clients) as usize;
        let servers = sim.model().servers() as u64;
        if servers > 0 && sim.chance(0.4) {
            server_fault(&sim, servers);
            continue;
        }
        match sim.below(20) {
            0..=11 => sim.stall(c, sim.millis(20, 700)),
            12..=18 => sim.pause_store(sim.millis(20, 600)),
            _ => {
                sim.crash(c, MAX_LEASE);
                aborts.lock().unwrap_or_else(PoisonError::into_inner)[c].iter().for_each(AbortHandle::abort);
            }
        }
    }
}

/// A fault of one simulated server: a restart without persistence, a pause, a clock step (within every
/// lease's drift allowance, beyond it, or back), or, with replicas, a failover to the most advanced replica.
pub(super) fn server_fault(sim: &Sim, servers: u64) {
    let server = sim.below(servers) as usize;
    match sim.below(10) {
        0 | 1 if sim.model() == Model::RedisReplicas => sim.fail_over(),
        0 | 1 => sim.restart_server(server),
        2..=4 => sim.pause_server(server, sim.millis(20, 600)),
        // Within the smallest drift allowance (2 ms): every promise still holds.
        5 | 6 => sim.step_clock(server, sim.below(2_001) as i64),
        7 => sim.step_clock(server, 1_000 * sim.millis(5, 2_000).as_millis() as i64),
        _ => sim.step_clock(server, -1_000 * sim.millis(1, 2_000).as_millis() as i64),
    }
}

/// An operator frees a key or two with `force_unlock`, whoever holds it.
async fn operator(sim: Sim, client: Client, c: usize, keys: u64) {
    for _ in 0..1 + sim.below(2) {
        sleep(sim.millis(0, 1500)).await;
        let key = format!("k{}", sim.below(keys));
        let outcome = client.force_unlock(&key).await;
        sim.trace(|| format!("c{c} operator: force_unlock {key}: {outcome:?}"));
    }
}

/// Client `c` shuts down mid-schedule; afterwards nothing of it is left held, and a new request fails at once.
async fn shutdown(sim: Sim, client: Client, c: usize) {
    sleep(sim.millis(50, 1500)).await;
    let grace = sim.millis(0, 600);
    sim.shutting_down(c, grace);
    let started = Instant::now();
    client.shutdown(grace).await;
    sim.shut_down(c, started, grace, MAX_LEASE);
    match client.lock("k0").acquire().await {
        Err(LockError::ShuttingDown) => {}
        other => sim.violation(format!("c{c}: a request after shutdown ended with {other:?}")),
    }
}

/// A request's settings, as the oracle needs them.
#[derive(Debug, Clone, Copy)]
pub(super) struct Opts {
    /// The lease asked for.
    pub(super) ttl: Duration,
    /// How long the request may wait.
    pub(super) wait: Duration,
    /// What its `run` body does when the lock is lost.
    pub(super) on_lost: OnLost,
    /// Only where the request takes a grant of its own (a reentrant one shares the outer grant).
    pub(super) max_hold: Option<Duration>,
    /// How it retries within its wait.
    pub(super) retry: RetryStrategy,
}

/// One user task of client `c`, on keys `k0`..`k{keys-1}`.
#[derive(Debug, Clone)]
pub(super) struct User {
    /// The schedule's world.
    pub(super) sim: Sim,
    /// Its client (process).
    pub(super) client: Client,
    /// The client's index, for messages and the oracle.
    pub(super) c: usize,
    /// How many keys the schedule has.
    pub(super) keys: u64,
}

impl User {
    /// A few lock operations with pauses in between.
    async fn tasks(self, name: String) {
        for i in 0..2 + self.sim.below(4) {
            sleep(self.sim.millis(0, 100)).await;
            let name = format!("{name}.{i}");
            match self.sim.below(20) {
                0..=5 => self.hold(self.one(), &name, false).await,
                6..=7 => self.hold(self.one(), &name, true).await,
                8..=12 => self.run(self.one(), &name).await,
                13 => self.escape(self.one(), &name).await,
                14..=16 => self.hold(self.several(), &name, false).await,
                _ => self.run(self.several(), &name).await,
            }
        }
    }

    /// One key.
    pub(super) fn one(&self) -> Vec<String> {
        vec![format!("k{}", self.sim.below(self.keys))]
    }

    /// Two or more keys in a random order (overlapping other tasks' sets), a key named twice now and then; one
    /// key named twice where the schedule has only one.
    pub(super) fn several(&self) -> Vec<String> {
        let mut all: Vec<String> = (0..self.keys).map(|k| format!("k{k}")).collect();
        // Fisher–Yates from the schedule's generator.
        for i in (1..all.len()).rev() {
            all.swap(i, self.sim.below(i as u64 + 1) as usize);
        }
        all.truncate(2 + self.sim.below(self.keys.saturating_sub(1)) as usize);
        if all.len() == 1 || self.sim.chance(0.1) {
            all.push(all[0].clone());
        }
        all
    }

    /// A request for `keys` with a random ttl, wait, retry strategy, `on_lost`, and now and then `min_hold`
    /// or `max_hold`.
    pub(super) fn request(&self, keys: &[String], try_only: bool) -> (LockRequest, Opts) {
        let sim = &self.sim;
        let ttl = sim.millis(100, 1000);
        let ms = ttl.as_millis() as u64;
        let wait = match sim.below(4) {
            _ if try_only => Duration::ZERO,
            0 => Duration::ZERO,
            1 => sim.millis(10, 300),
            _ => sim.millis(300, 3000),
        };
        let retry = match sim.below(7) {
            0..=1 => RetryStrategy::default(),
            2..=3 => RetryStrategy::Linear { step: sim.millis(5, 100) },
            4..=5 => RetryStrategy::Exponential { base: sim.millis(5, 50), max: sim.millis(100, 1000) },
            _ => RetryStrategy::None,
        };
        let mut request = match keys {
            [key] => self.client.lock(key.clone()),
            keys => self.client.lock_all(keys.iter().cloned()),
        };
        request = request.ttl(ttl).wait(wait).retry(retry);
        if sim.chance(0.1) {
            request = request.min_hold(sim.millis(0, 2 * ms));
        }
        let max_hold = sim.chance(0.1).then(|| sim.millis(ms / 4 + 1, 2 * ms));
        if let Some(max_hold) = max_hold {
            request = request.max_hold(max_hold);
        }
        let on_lost = if sim.chance(0.5) { OnLost::Abort } else { OnLost::Continue };
        (request.on_lost(on_lost), Opts { ttl, wait, on_lost, max_hold, retry })
    }

    /// How long to hold a lock: up to two ttls; under `max_hold`, half the time until past the cap and a lease
    /// (the guard must read lost by then).
    pub(super) fn until(&self, opts: Opts) -> Instant {
        let sim = &self.sim;
        let held = sim.millis(0, 2 * opts.ttl.as_millis() as u64);
        let capped = opts.max_hold.filter(|_| sim.chance(0.5)).map(|m| m + opts.ttl + sim.millis(0, 100));
        Instant::now() + held.max(capped.unwrap_or_default())
    }

    /// Runs `op`, cancelled with chance `p`: right after its first poll (a deadline of 0), after a few polls
    /// (sent, not yet applied), or at a random moment within `within`; `None` when cancelled.
    pub(super) async fn maybe_cancelled<F: Future>(&self, p: f64, within: Duration, op: F) -> Option<F::Output> {
        let sim = &self.sim;
        if !sim.chance(p) {
            return Some(op.await);
        }
        let mut op = std::pin::pin!(op);
        match sim.below(4) {
            polls @ 0..=1 => {
                let polls = if polls == 0 { 1 } else { 2 + sim.below(3) };
                for _ in 0..polls {
                    if let Poll::Ready(out) = std::future::poll_fn(|cx| Poll::Ready(op.as_mut().poll(cx))).await {
                        return Some(out);
                    }
                    tokio::task::yield_now().await;
                }
                None
            }
            _ => {
                let at = sim.millis(0, within.as_millis() as u64);
                tokio::select! {
                    biased;
                    out = &mut op => Some(out),
                    () = sleep(at) => None,
                }
            }
        }
    }

    /// The holder of `tokens` on `keys` is gone; with `cancelled`, whatever it left must also free within
    /// `max_lease`.
    pub(super) fn left(&self, keys: &[String], tokens: Vec<String>, cancelled: Option<Duration>) {
        let mut keys = keys.to_vec();
        keys.sort_unstable();
        keys.dedup();
        for key in &keys {
            self.sim.gone(self.c, key, tokens.clone());
        }
        if let Some(max_lease) = cancelled {
            self.sim.cancelled(self.c, &keys, tokens, max_lease);
        }
    }

    /// `acquire` (or `try_acquire`) of `keys`, then hold the lock a while looking at it and extending it,
    /// then release it (checking the outcome), drop it, or cancel the release or an extend just before it.
    pub(super) async fn hold(&self, keys: Vec<String>, name: &str, try_only: bool) {
        let (sim, c) = (&self.sim, self.c);
        let (request, opts) = self.request(&keys, try_only);
        let started = Instant::now();
        let (tokens, acquiring) = sim.track(async move {
            if try_only {
                request.try_acquire().await
            } else {
                request.acquire().await.map(Some)
            }
        });
        let (p, within) =
            if try_only { (0.5, Duration::from_millis(10)) } else { (0.2, opts.wait + Duration::from_millis(100)) };
        let Some(outcome) = self.maybe_cancelled(p, within, acquiring).await else {
            sim.trace(|| format!("c{c} {name}: acquire of {keys:?} cancelled"));
            return self.left(&keys, tokens.get(), Some(opts.ttl));
        };
        sim.check_wait_keys(c, started, opts.wait, &keys, name);
        if let Err(e) = &outcome {
            sim.check_gave_up(c, started, (opts.wait, opts.retry), e, name);
        }
        let guard = match outcome {
            Ok(Some(guard)) => guard,
            other => {
                sim.trace(|| format!("c{c} {name}: acquire of {keys:?} ended with {other:?}"));
                return self.left(&keys, tokens.get(), None);
            }
        };
        sim.watch_guard(c, &guard, name, opts.max_hold, opts.ttl);
        let until = self.until(opts);
        while Instant::now() < until {
            sleep(sim.millis(1, 50)).await;
            if !sim.look(c, &guard, name) {
                break;
            }
            if sim.chance(0.15) {
                self.extend(&guard, opts.ttl, name).await;
            }
        }
        match sim.below(4) {
            0 => drop(guard),
            1 => self.release(guard, name).await,
            2 => {
                let releasing = sim.releasing(&guard);
                if let Some(outcome) = self.maybe_cancelled(0.5, Duration::from_millis(5), guard.release()).await {
                    sim.released(c, releasing, &outcome, name);
                }
            }
            _ => {
                // An extend sent and cancelled (its renewal goes out at once), racing the release.
                let to = sim.millis(100, 3000);
                {
                    let mut extend = std::pin::pin!(guard.extend(to));
                    let _ = std::future::poll_fn(|cx| Poll::Ready(extend.as_mut().poll(cx))).await;
                }
                sim.extended(&guard, to);
                self.release(guard, name).await;
            }
        }
        self.left(&keys, tokens.get(), None);
    }

    /// Releases `guard`, checking the outcome.
    pub(super) async fn release(&self, guard: LockGuard, name: &str) {
        let releasing = self.sim.releasing(&guard);
        let outcome = guard.release().await;
        self.sim.released(self.c, releasing, &outcome, name);
    }

    /// `extend` to a longer or a shorter lease, maybe cancelled.
    pub(super) async fn extend(&self, guard: &LockGuard, ttl: Duration, name: &str) {
        let sim = &self.sim;
        let to = if sim.chance(0.5) {
            sim.millis(ttl.as_millis() as u64, 3000)
        } else {
            sim.millis(100, ttl.as_millis() as u64)
        };
        sim.trace(|| format!("c{} {name}: extend to {to:?}", self.c));
        let outcome = self.maybe_cancelled(0.2, Duration::from_millis(20), guard.extend(to)).await;
        sim.extended(guard, to);
        sim.trace(|| format!("c{} {name}: extend to {to:?}: {outcome:?}", self.c));
    }
}
