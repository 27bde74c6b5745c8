//! Deterministic simulation of the lock engine (feature `simulation`; not public API).
//!
//! The real engine — acquire, hand-over, renewal, extend, release — runs unchanged against a simulated
//! store (`SimStore`: the memory store's semantics behind a seeded fault layer) on a current-thread tokio
//! runtime whose clock is paused, so minutes of simulated time pass in milliseconds and every choice comes
//! from one seed: the faults, the engine's tokens and retry jitter (through `crate::hooks`) and the workload.
//! An oracle that reads the store's truth checks the safety model after every command the store applies and
//! at every observation; see `oracle.rs`.

mod oracle;
mod outcomes;
mod store;

use std::cell::RefCell;
use std::fmt::Write as _;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Backend, MemoryBackend};
use crate::client::ClientInner;
use crate::grant::Grant;
pub use crate::hooks::Fix;
use crate::{Client, LockGuard};
pub use outcomes::Releasing;
pub(crate) use store::SimStore;

/// The key prefix of every simulated client.
const PREFIX: &str = "sim:";

/// What one schedule runs with. [`Config::new`] gives the defaults the simulation test uses.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    /// Everything random in the schedule comes from this.
    pub seed: u64,
    /// How many clients (processes) share the store.
    pub clients: usize,
    /// Print every call, reply, fault, stall and observation.
    pub trace: bool,
    /// The fix of issue 15 to turn off, to show that the oracle catches its bug.
    pub reverted: Option<Fix>,
    /// How long a store call may take before it fails with a timeout.
    pub response_timeout: Duration,
    /// The longest one leg (request or reply) takes when nothing goes wrong.
    pub normal_delay: Duration,
    /// The longest a slowed leg takes.
    pub slow_delay: Duration,
    /// Chance that a leg is slowed.
    pub slow: f64,
    /// Chance that a request is lost before the store applies it.
    pub lose_request: f64,
    /// Chance that the store applies a command and its reply is lost (the ambiguous failure).
    pub lose_reply: f64,
    /// Chance that an announcement is dropped; as often it is delivered late.
    pub drop_announcement: f64,
    /// A schedule whose workload runs longer than this (simulated) has hung.
    pub time_limit: Duration,
}

impl Config {
    /// The defaults for `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            clients: 3,
            trace: false,
            reverted: None,
            response_timeout: Duration::from_millis(500),
            normal_delay: Duration::from_millis(2),
            slow_delay: Duration::from_millis(300),
            slow: 0.03,
            lose_request: 0.01,
            lose_reply: 0.02,
            drop_announcement: 0.05,
            time_limit: Duration::from_secs(120),
        }
    }
}

/// What one schedule found.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Report {
    /// Store calls made.
    pub calls: u64,
    /// Faults injected: slowed legs, lost requests and replies, dropped or late announcements, stalls,
    /// store pauses and crashes.
    pub faults: u64,
    /// What the oracle found, in order; empty when the schedule kept every rule.
    pub violations: Vec<String>,
}

/// The simulated world of one schedule: the store's truth, the fault plan's generator, the clients' stalls,
/// and what the oracle watches.
#[derive(Debug)]
pub(crate) struct World {
    config: Config,
    memory: MemoryBackend,
    start: Instant,
    state: Mutex<State>,
    /// Woken when a call passes its turn (see `State::applied`).
    turn: tokio::sync::Notify,
}

#[derive(Debug)]
struct State {
    rng: fastrand::Rng,
    calls: u64,
    faults: u64,
    violations: Vec<String>,
    /// Per client: until when it makes no progress (a stall; `None` when crashed: for ever).
    frozen_until: Vec<Option<Instant>>,
    /// Per client: intervals in which a fault may have kept its calls from the store in time.
    disturbed: Vec<Vec<(Instant, Instant)>>,
    /// Per client: the calls on their way, by id: when each was made and how long its legs take unhindered.
    in_flight: Vec<std::collections::BTreeMap<u64, (Instant, Duration)>>,
    /// Until when the store applies nothing.
    paused_until: Instant,
    /// Grants the oracle checks at every step, with the client and a name for messages.
    probes: Vec<(Weak<Grant>, usize, String)>,
    /// Per record: the last owner token and fencing token the store was seen to hold.
    last_fence: std::collections::BTreeMap<String, (Option<String>, u64)>,
    /// Which client sent each token the store has seen.
    owners: std::collections::BTreeMap<String, usize>,
    /// Per client: calls made, calls the store applied (or lost), and calls answered (or lost): one
    /// connection per client, so the store applies and answers them in order.
    issued: Vec<u64>,
    applied: Vec<u64>,
    replied: Vec<u64>,
    /// Per record: the subscribers to its announcements, in the order they subscribed.
    hubs: std::collections::BTreeMap<String, Vec<tokio::sync::mpsc::UnboundedSender<crate::backend::Announcement>>>,
    /// What the rules of `outcomes.rs` remember: applied releases, forced unlocks, `max_hold` caps, shutdowns.
    truth: outcomes::Truth,
}

thread_local! {
    /// The world of the schedule running on this thread: the engine's hooks draw from it.
    static CURRENT: RefCell<Option<Arc<World>>> = const { RefCell::new(None) };
}

fn current() -> Option<Arc<World>> {
    CURRENT.with(|c| c.borrow().clone())
}

pub(crate) fn hook_random_u64() -> Option<u64> {
    current().map(|world| world.state().rng.u64(..))
}

pub(crate) fn hook_wall_clock_micros() -> Option<u128> {
    // A fixed epoch (late 2023), so fencing tokens look like the real ones and rise with simulated time.
    current().map(|world| 1_700_000_000_000_000 + world.start.elapsed().as_micros())
}

pub(crate) fn hook_reverted(fix: Fix) -> bool {
    current().is_some_and(|world| world.config.reverted == Some(fix))
}

/// Clears this thread's world when the schedule ends, also by a panic.
struct Installed;

impl Drop for Installed {
    fn drop(&mut self) {
        CURRENT.with(|c| c.borrow_mut().take());
    }
}

/// Runs one schedule: builds a current-thread runtime with a paused clock, runs `workload` on it with a
/// handle to the world, lets background clean-ups finish, and reports. A workload that outlives the time limit
/// is reported as a hang.
pub fn run<F, Fut>(config: Config, workload: F) -> Report
where
    F: FnOnce(Sim) -> Fut,
    Fut: Future<Output = ()>,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    let report = runtime.block_on(async {
        let world = Arc::new(World::new(config));
        let _installed = Installed;
        CURRENT.with(|c| *c.borrow_mut() = Some(Arc::clone(&world)));
        let sim = Sim(Arc::clone(&world));
        let limit = world.config.time_limit;
        if tokio::time::timeout(limit, workload(sim.clone())).await.is_err() {
            sim.violation(format!("hang: the workload had not ended after {limit:?}"));
        }
        // Background releases and clean-ups, and the oracle's pending liveness checks, finish here.
        tokio::time::sleep(Duration::from_secs(30)).await;
        world.check("end");
        let state = world.state();
        Report { calls: state.calls, faults: state.faults, violations: state.violations.clone() }
    });
    // Tasks still pending (blackholed calls, crashed clients) are dropped with the runtime, hooks still set
    // to nothing: the world is already gone from this thread.
    drop(runtime);
    report
}

/// A handle to the running schedule's world, for the workload.
#[derive(Debug, Clone)]
pub struct Sim(Arc<World>);

impl World {
    fn new(config: Config) -> Self {
        let now = Instant::now();
        let clients = config.clients;
        let state = State {
            rng: fastrand::Rng::with_seed(config.seed),
            calls: 0,
            faults: 0,
            violations: Vec::new(),
            frozen_until: vec![Some(now); clients],
            disturbed: vec![Vec::new(); clients],
            in_flight: vec![Default::default(); clients],
            paused_until: now,
            probes: Vec::new(),
            last_fence: Default::default(),
            owners: Default::default(),
            issued: vec![0; clients],
            applied: vec![0; clients],
            replied: vec![0; clients],
            hubs: Default::default(),
            truth: Default::default(),
        };
        // One store for every simulated client; the owner it records is not what the simulation checks.
        let memory = MemoryBackend::new("simulation".into());
        Self { config, memory, start: now, state: Mutex::new(state), turn: tokio::sync::Notify::new() }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Simulated milliseconds since the schedule started, for messages.
    fn at(&self) -> f64 {
        self.start.elapsed().as_secs_f64() * 1000.0
    }

    fn trace(&self, line: impl FnOnce() -> String) {
        if self.config.trace {
            println!("[{:>10.3} ms] {}", self.at(), line());
        }
    }

    fn violation(&self, message: String) {
        let message = format!("at {:.3} ms: {message}", self.at());
        self.trace(|| format!("VIOLATION {message}"));
        self.state().violations.push(message);
    }

    /// Waits while `client` is stalled (for ever, once it crashed).
    async fn wait_unfrozen(&self, client: usize) {
        loop {
            let until = self.state().frozen_until[client];
            match until {
                Some(until) if until <= Instant::now() => return,
                Some(until) => tokio::time::sleep_until(until).await,
                None => std::future::pending().await,
            }
        }
    }

    /// Waits while the store is paused.
    async fn wait_unpaused(&self) {
        loop {
            let until = self.state().paused_until;
            if until <= Instant::now() {
                return;
            }
            tokio::time::sleep_until(until).await;
        }
    }

    /// Whether anything kept `client`'s calls from the store in time between `from` and `to`: a fault on one of
    /// its calls, a stall of it, a pause of the store, or a call of it still on its way past its time (held up
    /// behind another on its connection).
    fn disturbed(&self, client: usize, from: Instant, to: Instant) -> bool {
        let state = self.state();
        let slack = Duration::from_millis(1);
        state.disturbed[client].iter().any(|&(a, b)| a <= to && b >= from)
            || state.in_flight[client].values().any(|&(made, legs)| made + legs + slack < to)
    }

    fn disturb(&self, client: Option<usize>, from: Instant, to: Instant) {
        let mut state = self.state();
        match client {
            Some(client) => state.disturbed[client].push((from, to)),
            None => state.disturbed.iter_mut().for_each(|d| d.push((from, to))),
        }
    }
}

impl Sim {
    /// A client (process) `index` of the world, talking to the shared store through its own fault layer.
    pub fn client(&self, index: usize) -> Client {
        assert!(index < self.0.config.clients, "client {index} of {}", self.0.config.clients);
        let store = SimStore::new(Arc::clone(&self.0), index);
        Client {
            inner: Arc::new(ClientInner {
                backend: Backend::Simulated(store),
                prefix: PREFIX.into(),
                renewer: Default::default(),
                shutdown: Default::default(),
            }),
        }
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

    /// Stalls client `client` for `how_long`: it sends nothing, and hears no reply or announcement, until then
    /// (what a GC pause or SIGSTOP does; its timers still fire, and what they send waits).
    pub fn stall(&self, client: usize, how_long: Duration) {
        let now = Instant::now();
        let until = now + how_long;
        let mut state = self.0.state();
        state.faults += 1;
        if let Some(frozen) = &mut state.frozen_until[client] {
            *frozen = (*frozen).max(until);
        }
        state.disturbed[client].push((now, until));
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

    /// Client `client` crashes: it never sends or hears anything again. Every lock it held must be free
    /// within `max_lease` (the longest lease it may have set), plus the hand-over of a place it held in a
    /// queue and the store's delays.
    pub fn crash(&self, client: usize, max_lease: Duration) {
        let mut state = self.0.state();
        state.faults += 1;
        state.frozen_until[client] = None;
        drop(state);
        self.0.trace(|| format!("c{client} CRASHED"));
        let world = Arc::clone(&self.0);
        let config = &world.config;
        let bound = 2 * max_lease + 2 * config.slow_delay + Duration::from_millis(300);
        tokio::spawn(async move {
            let crashed = Instant::now();
            tokio::time::sleep(bound).await;
            // A pause of the store holds commands sent before the crash; they may still apply after it.
            let paused = world.state().paused_until;
            if paused > crashed {
                tokio::time::sleep_until(paused + bound).await;
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
        self.0.state().probes.push((Arc::downgrade(guard.grant()), client, name));
        self.0.check("watch");
    }

    /// The workload looked at `guard` (`is_lost()`), as a holder does before acting under the lock: checks
    /// every watched guard now.
    pub fn observe(&self, client: usize, guard: &LockGuard, name: &str) -> bool {
        let lost = guard.is_lost();
        self.0.trace(|| format!("c{client} {name}: observed {}", if lost { "lost" } else { "valid" }));
        if lost {
            self.0.check_needless_loss(guard.grant(), client, name);
        } else {
            self.0.check_grant(guard.grant(), client, name);
        }
        self.0.check("observation");
        !lost
    }

    /// The holder of `tokens` on `key` is gone (its request ended, its guard was released or dropped): unless a
    /// fault kept its client's clean-up from the store, the store must hold none of them a moment later.
    pub fn gone(&self, client: usize, key: &str, tokens: Vec<String>) {
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

    /// A request that waited at most `wait` ended (`what`), having started at `started`: it must end by its
    /// wait, plus what faults on its client's calls cost.
    pub fn check_wait(&self, client: usize, started: Instant, wait: Duration, what: &str) {
        let now = Instant::now();
        let config = &self.0.config;
        // The last attempt, leaving the queue and giving a late grant back: three round trips past the wait.
        let mut slack = 6 * config.normal_delay + Duration::from_millis(5);
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
}

/// The tokens a tracked request used; see [`Sim::track`].
#[derive(Debug, Clone, Default)]
pub struct Tokens(Arc<Mutex<Vec<String>>>);

impl Tokens {
    /// The tokens seen so far.
    pub fn get(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn add(&self, token: &str) {
        let mut tokens = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if !tokens.iter().any(|t| t == token) {
            tokens.push(token.to_owned());
        }
    }
}

/// The first 8 characters of a token: enough to follow it through a trace, never the whole credential.
fn short(token: &str) -> String {
    let mut out = String::with_capacity(9);
    let _ = write!(out, "{}…", &token[..token.len().min(8)]);
    out
}
