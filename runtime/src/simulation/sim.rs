//! The workload's handle to a running schedule ([`Sim`]): its clients, the faults it injects, and the checks
//! it asks the oracle for.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::store::{self, SimStore};
use super::wire::Target;
use super::{stall, Config, Connection, Model, Sim, PREFIX};
use crate::backend::{Backend, RedisBackend, RedlockBackend, ReplicaAcks, Timeouts};
use crate::client::ClientInner;
use crate::{Client, LockError, LockGuard, RetryStrategy};

impl Sim {
    /// A client (process) `index` of the world, talking to the shared store through its own fault layer.
    pub fn client(&self, index: usize) -> Client {
        assert!(index < self.0.config.clients, "client {index} of {}", self.0.config.clients);
        let world = &self.0;
        let backend = match world.config.model {
            Model::Memory => Backend::Simulated(SimStore::new(Arc::clone(world), index)),
            Model::Redis | Model::RedisReplicas => {
                let acks = (world.config.model == Model::RedisReplicas)
                    .then_some(ReplicaAcks { count: 1, timeout: Duration::from_millis(50) });
                Backend::Redis(self.redis(index, Target::Primary, acks))
            }
            Model::Redlock(n) => {
                let servers = (0..n).map(|node| self.redis(index, Target::Node(node), None)).collect();
                Backend::Redlock(RedlockBackend::simulated(servers, PREFIX, world.config.response_timeout))
            }
        };
        Client {
            inner: Arc::new(ClientInner {
                backend,
                prefix: PREFIX.into(),
                owner: format!("client-{index}").into(),
                renewer: Default::default(),
                shutdown: Default::default(),
                lines: Default::default(),
            }),
        }
    }

    /// A Redis backend of client `index` whose connections reach `target`.
    fn redis(&self, index: usize, target: Target, acks: Option<ReplicaAcks>) -> RedisBackend {
        let world = Arc::clone(&self.0);
        let timeouts = Timeouts { connect: world.config.response_timeout, response: world.config.response_timeout };
        let open = move |push| Connection::new(Arc::clone(&world), index, target, push);
        RedisBackend::simulated(open, &format!("sim-client-{index}"), timeouts, acks)
    }

    /// Spawns `task` as a task of client `client`: it stops while the client is stalled, and so do the tasks
    /// the engine spawns from it (the client's renewer, its background releases).
    pub fn spawn<F>(&self, client: usize, task: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        tokio::spawn(stall::of_client(client, task))
    }

    /// The schedule's configuration.
    pub fn config(&self) -> &Config {
        &self.0.config
    }

    /// A number in `0..n` from the schedule's generator.
    pub fn below(&self, n: u64) -> u64 {
        self.0.state().rng.u64(0..n.max(1))
    }

    /// True with chance `p`.
    pub fn chance(&self, p: f64) -> bool {
        self.0.state().rng.f64() < p
    }

    /// A duration of `lo..=hi` whole milliseconds.
    pub fn millis(&self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(self.0.state().rng.u64(lo..=hi.max(lo)))
    }

    /// Adds a line to the trace (with `SIM_SEED`).
    pub fn trace(&self, line: impl FnOnce() -> String) {
        self.0.trace(line);
    }

    /// Records a violation found by the workload itself.
    pub fn violation(&self, message: String) {
        self.0.violation(message);
    }

    /// Counts a fault the workload injected itself.
    pub fn fault(&self) {
        self.0.state().faults += 1;
    }

    /// Stalls client `client` for `how_long`: its tasks (those spawned with [`Sim::spawn`] and the engine's
    /// they spawn) run nothing, it sends nothing, and hears no reply or announcement, until then (what a GC
    /// pause or SIGSTOP does; its timers fire late).
    pub fn stall(&self, client: usize, how_long: Duration) {
        let now = Instant::now();
        let until = now + how_long;
        let mut state = self.0.state();
        state.faults += 1;
        if let Some(frozen) = &mut state.frozen_until[client] {
            *frozen = (*frozen).max(until);
        }
        state.disturbed[client].push((now, until));
        state.stalls[client].push((now, until));
        drop(state);
        self.0.trace(|| format!("c{client} STALLED for {how_long:?}"));
    }

    /// Pauses the whole store for `how_long`: it applies nothing until then.
    pub fn pause_store(&self, how_long: Duration) {
        let now = Instant::now();
        let mut state = self.0.state();
        state.faults += 1;
        state.paused_until = state.paused_until.max(now + how_long);
        drop(state);
        self.0.disturb(None, now, now + how_long);
        self.0.trace(|| format!("store PAUSED for {how_long:?}"));
    }

    /// The store model of this schedule.
    pub fn model(&self) -> Model {
        self.0.config.model
    }

    /// Server `server` restarts without persistence: its keys and scripts are gone, its clock runs on, and
    /// every connection to it is reset. Locks it held are lost (README: holders find out at their next
    /// renewal), so the oracle no longer holds guards granted before it to exclusion on that server.
    pub fn restart_server(&self, server: usize) {
        self.fault();
        self.0.restart_node(server);
    }

    /// Pauses server `server` for `how_long` (a Redlock group's servers one at a time).
    pub fn pause_server(&self, server: usize, how_long: Duration) {
        let now = Instant::now();
        self.fault();
        let mut nodes = self.0.nodes();
        nodes[server].paused_until = nodes[server].paused_until.max(now + how_long);
        drop(nodes);
        self.0.disturb(None, now, now + how_long);
        self.0.trace(|| format!("server {server} PAUSED for {how_long:?}"));
    }

    /// Server `server` fails for the rest of the schedule: it stops answering (`hung`, a hung or unreachable
    /// server), or it is down (every call on it fails at once, as a refused connection does). What a Redlock
    /// group rides out while a majority answers, so its clients are not counted disturbed: a request that
    /// fails, a guard lost or a lock left held while a quorum answers is the engine's fault, not the server's.
    pub fn fail_server(&self, server: usize, hung: bool) {
        self.fault();
        let mut nodes = self.0.nodes();
        match hung {
            true => nodes[server].paused_until = Instant::now() + Duration::from_secs(86_400),
            false => nodes[server].down = true,
        }
        drop(nodes);
        self.0.trace(|| format!("server {server} {} for good", if hung { "HUNG" } else { "DOWN" }));
    }

    /// Steps server `server`'s wall clock by `micros` (forward when positive). A step forward beyond a lease's
    /// drift allowance can end that lease early on the server (README: Redis expires keys by its own clock);
    /// the oracle excuses exactly those leases, and holds every other to the rules.
    pub fn step_clock(&self, server: usize, micros: i64) {
        self.fault();
        let mut nodes = self.0.nodes();
        nodes[server].clock_offset_us += micros;
        nodes[server].steps.push((Instant::now(), micros));
        if nodes[server].follows.is_none() {
            nodes[server].steps_as_primary.push((Instant::now(), micros));
        }
        drop(nodes);
        self.0.trace(|| format!("server {server} CLOCK STEPPED by {micros} µs"));
    }

    /// The primary fails and its most advanced replica takes over (model `redis+replicas`).
    pub fn fail_over(&self) {
        self.fault();
        self.0.fail_over();
    }

    /// Client `client` crashes: it never sends or hears anything again. Every lock it held must be free
    /// within `max_lease` (the longest lease it may have set), plus the hand-over of a place it held in a
    /// queue and the store's delays.
    pub fn crash(&self, client: usize, max_lease: Duration) {
        let mut state = self.0.state();
        state.faults += 1;
        state.frozen_until[client] = None;
        let now = Instant::now();
        state.stalls[client].push((now, now + Duration::from_secs(86_400)));
        drop(state);
        self.0.trace(|| format!("c{client} CRASHED"));
        let world = Arc::clone(&self.0);
        let config = &world.config;
        let bound = 2 * max_lease + 2 * config.slow_delay + Duration::from_millis(300);
        tokio::spawn(async move {
            let crashed = Instant::now();
            let mut until = crashed + bound;
            loop {
                tokio::time::sleep_until(until).await;
                // A pause of the store holds commands sent before the crash; they may still apply after it. A
                // server clock stepped back keeps the crashed client's records that much longer.
                let paused = world.state().paused_until;
                let back = world.stepped_back_since(crashed.checked_sub(bound).unwrap_or(world.start));
                let due = paused.max(crashed) + bound + back;
                if due <= until {
                    break;
                }
                until = due;
            }
            world.check_crashed(client, bound);
        });
    }

    /// Runs `request` recording the tokens the store sees from it, so that the oracle can check what the
    /// store holds for them once the request is over.
    pub fn track<F: Future>(&self, request: F) -> (Tokens, impl Future<Output = F::Output>) {
        let tokens = Tokens::default();
        (tokens.clone(), store::TRACKED.scope(tokens, request))
    }

    /// Watches `guard` at every step from now on: while it says valid, the store's record must be its grant,
    /// with an expiry no earlier than the guard's deadline.
    pub fn watch(&self, client: usize, guard: &LockGuard, name: impl Into<String>) {
        let name = name.into();
        self.0.trace(|| format!("c{client} {name}: holds fence {}", guard.fencing_token()));
        let mut state = self.0.state();
        state.bodies.insert(name.clone(), vec![Arc::downgrade(guard.grant())]);
        state.probes.push((Arc::downgrade(guard.grant()), client, name.into()));
        drop(state);
        self.0.check("watch");
    }

    /// The workload looked at `guard` (`is_lost()`), as a holder does before acting under the lock: checks
    /// every watched guard now.
    pub fn observe(&self, client: usize, guard: &LockGuard, name: &str) -> bool {
        let lost = guard.is_lost();
        self.0.trace(|| format!("c{client} {name}: observed {}", if lost { "lost" } else { "valid" }));
        self.0.check_lost_is_final(guard.grant(), lost, client, name);
        if lost {
            self.0.check_needless_loss(guard.grant(), client, name);
        } else {
            self.0.check_grant(guard.grant(), client, &name);
        }
        self.0.check("observation");
        !lost
    }

    /// The holder of `tokens` on `key` is gone (its request ended, its guard was released or dropped): unless a
    /// fault kept its client's clean-up from the store, the store must hold none of them a moment later.
    pub fn gone(&self, client: usize, key: &str, tokens: Vec<String>) {
        self.0.state().finished.extend(tokens.iter().cloned());
        let world = Arc::clone(&self.0);
        let record = crate::backend::LockKeys::new(PREFIX, key.to_owned()).record;
        tokio::spawn(async move {
            let since = Instant::now();
            // Two round trips (leave the queue, release) and a renewal in flight, at normal speed.
            let slack = 6 * world.config.normal_delay + Duration::from_millis(5);
            tokio::time::sleep(slack).await;
            world.check_gone(client, &record, &tokens, since);
        });
    }

    /// Ends the schedule's faults: from now on no call, reply or announcement is lost or slowed (the nemesis
    /// must have stopped). Returns once every stall and pause has ended, with how much longer than its lease a
    /// record may live on a server whose clock stepped back meanwhile. For the liveness check: once calm, a
    /// request on a free lock, or on one whose holder crashed, must be served within the lease bound.
    pub async fn calm(&self) -> Duration {
        let stores = {
            let mut state = self.0.state();
            state.calm = true;
            // A crashed client's stall never ends; it is not asked to do anything.
            let stalls = state.stalls.iter().zip(&state.frozen_until).filter(|(_, frozen)| frozen.is_some());
            stalls.flat_map(|(stalls, _)| stalls.iter().map(|&(_, end)| end)).fold(state.paused_until, Instant::max)
        };
        let until = self.0.nodes().iter().map(|n| n.paused_until).fold(stores, Instant::max);
        self.0.trace(|| "CALM: no more faults".to_owned());
        tokio::time::sleep_until(until).await;
        self.0.stepped_back_since(self.0.start)
    }

    /// Whether client `client` crashed (it never runs again).
    pub fn crashed(&self, client: usize) -> bool {
        self.0.state().frozen_until[client].is_none()
    }

    /// A request that waited at most `wait` ended (`what`), having started at `started`: it must end by its
    /// wait, plus what faults on its client's calls cost.
    pub fn check_wait(&self, client: usize, started: Instant, wait: Duration, what: &str) {
        let now = Instant::now();
        let config = &self.0.config;
        // The last attempt, leaving the queue, giving a late grant back and reading the holder for the error:
        // four round trips past the wait, and three of them twice on a script's first use on a server (NOSCRIPT,
        // then EVAL; redis seed 5986 of the whole-API workload).
        let mut slack = 14 * config.normal_delay + Duration::from_millis(5);
        if self.0.disturbed(client, started, now) {
            let state = self.0.state();
            let disturbed: Duration = state.disturbed[client]
                .iter()
                .filter(|&&(a, b)| a <= now && b >= started)
                .map(|&(a, b)| b.min(now).saturating_duration_since(a.max(started)))
                .sum();
            slack += 3 * config.response_timeout + 6 * config.slow_delay + Duration::from_millis(100) + disturbed;
        }
        let waited = now - started;
        if waited > wait + slack {
            self.violation(format!("c{client} {what}: waited {waited:?}, past its wait {wait:?} + {slack:?}"));
        }
    }

    /// A request of `client` that started at `started` with `wait` and `retry` failed with `error`. A busy
    /// lock or a passing failure (a timeout, a lost connection, a Redlock round sat out) ends a request with a
    /// wait and a retry strategy only once its wait is over, or so nearly that the strategy's next pause (at
    /// most its longest delay) would pass it: until then it tries again.
    pub fn check_gave_up(
        &self,
        client: usize,
        started: Instant,
        (wait, retry): (Duration, RetryStrategy),
        error: &LockError,
        what: &str,
    ) {
        let longest = match retry {
            RetryStrategy::Linear { step } => step,
            RetryStrategy::Exponential { max, .. } => max,
            RetryStrategy::None => return,
        };
        let passing = matches!(error, LockError::NotObtained { .. }) || error.is_transient();
        let earliest = started + wait.saturating_sub(longest);
        let now = Instant::now();
        if passing && now < earliest {
            self.violation(format!(
                "c{client} {what}: gave up {:?} after it started, with {:?} of its wait {wait:?} left ({retry:?}): {error}",
                now - started,
                started + wait - now
            ));
        }
    }
}

/// The tokens a tracked request used, and when it began; see [`Sim::track`].
#[derive(Debug, Clone)]
pub struct Tokens {
    seen: Arc<Mutex<Vec<String>>>,
    pub(super) started: Instant,
}

impl Default for Tokens {
    fn default() -> Self {
        Self { seen: Arc::default(), started: Instant::now() }
    }
}

impl Tokens {
    /// The tokens seen so far.
    pub fn get(&self) -> Vec<String> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    pub(super) fn add(&self, token: &str) {
        let mut tokens = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if !tokens.iter().any(|t| t == token) {
            tokens.push(token.to_owned());
        }
    }
}
