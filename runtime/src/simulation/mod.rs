//! Deterministic simulation of the lock engine (feature `simulation`; not public API).
//!
//! The real engine — acquire, hand-over, renewal, extend, release — runs unchanged against a simulated
//! store (`SimStore`: the memory store's semantics behind a seeded fault layer) on a current-thread tokio
//! runtime whose clock is paused, so minutes of simulated time pass in milliseconds and every choice comes
//! from one seed: the faults, the engine's tokens and retry jitter (through `crate::hooks`) and the workload.
//! An oracle that reads the store's truth checks the safety model after every command the store applies and
//! at every observation; see `oracle.rs`.

mod assumptions;
mod connection;
mod mutation;
mod oracle;
mod outcomes;
pub mod redis;
mod reports;
mod sim;
mod stall;
mod store;
mod wire;

use std::cell::RefCell;
use std::fmt::Write as _;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::MemoryBackend;
use crate::grant::Grant;
pub(crate) use connection::Connection;
pub use mutation::{lua_mutants, LuaMutant};
pub use outcomes::Releasing;
pub use sim::Tokens;
pub(crate) use stall::owned;
pub(crate) use store::SimStore;
pub(crate) use wire::Push;
use wire::{Node, Target};

/// The key prefix of every simulated client.
const PREFIX: &str = "sim:";

/// Which store the clients of a schedule share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Model {
    /// The memory store behind the fault layer.
    Memory,
    /// The Redis backend (scripts, coalescer, resends, subscriber) on one simulated redis-server.
    Redis,
    /// The Redis backend with `wait_for_replicas(1, ..)` on a simulated primary with two lagging replicas,
    /// which can fail over.
    RedisReplicas,
    /// Redlock over this many simulated redis-servers (3 or 5).
    Redlock(usize),
}

impl Model {
    /// The model's name in the simulation's summary lines.
    pub fn name(self) -> &'static str {
        match self {
            Model::Memory => "memory",
            Model::Redis => "redis",
            Model::RedisReplicas => "redis+replicas",
            Model::Redlock(_) => "redlock",
        }
    }

    /// How many simulated servers the model has.
    pub fn servers(self) -> usize {
        match self {
            Model::Memory => 0,
            Model::Redis => 1,
            Model::RedisReplicas => 3,
            Model::Redlock(n) => n,
        }
    }
}

/// What one schedule runs with. [`Config::new`] gives the defaults the simulation test uses.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    /// Everything random in the schedule comes from this.
    pub seed: u64,
    /// The store the clients share.
    pub model: Model,
    /// The longest a replica takes to apply a write of its primary.
    pub replication_lag: Duration,
    /// A mutant of the scripts the simulated servers run instead of the production ones (the clients send
    /// the scripts unchanged), to measure what the simulation catches.
    pub lua_mutant: Option<LuaMutant>,
    /// How many clients (processes) share the store.
    pub clients: usize,
    /// Print every call, reply, fault, stall and observation.
    pub trace: bool,
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
            model: Model::Memory,
            replication_lag: Duration::from_millis(20),
            lua_mutant: None,
            clients: 3,
            trace: false,
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
    /// The simulated redis-servers (none in the memory model).
    nodes: Mutex<Vec<Node>>,
    /// Woken when a replica applied writes (for `WAIT`).
    replication: tokio::sync::Notify,
}

/// A client's connection to one server, by (client, server): the memory model's calls all go on server 0's.
type Lane = (usize, usize);

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
    /// Per client: its stalls.
    stalls: Vec<Vec<(Instant, Instant)>>,
    /// Per client: the calls on their way, by id: when each was made and how long its legs take unhindered.
    in_flight: Vec<std::collections::BTreeMap<u64, (Instant, Duration)>>,
    /// Until when the store applies nothing.
    paused_until: Instant,
    /// Grants the oracle checks at every step, with the client and a name for messages.
    probes: Vec<(Weak<Grant>, usize, Arc<str>)>,
    /// Per record: the last owner token and fencing token the store was seen to hold.
    last_fence: std::collections::BTreeMap<String, (Option<String>, u64)>,
    /// Per record: when its last owner's grant was first seen.
    fence_seen: std::collections::BTreeMap<String, Instant>,
    /// Per token: the shortest ttl its acquires and renewals asked for (the models with simulated servers).
    ttl_asked: std::collections::BTreeMap<String, Duration>,
    /// Per token: each ttl its client sent a renewal or extend of it with, and when (the simulated servers'
    /// models).
    ttl_sent: std::collections::BTreeMap<String, Vec<(Instant, Duration)>>,
    /// Redlock: tokens whose lease met another guard's grant shorter than it on a server that had lost it in
    /// a restart: past the README's assumption from then on, whatever either lease does later.
    beyond_restart: std::collections::BTreeSet<String>,
    /// Tokens of grants a guard was seen to read lost: a lock seen lost never comes back.
    seen_lost: std::collections::BTreeSet<String>,
    /// Tokens whose holder the workload said is gone (request over, guard released or dropped): a guard of
    /// theirs (one that escaped its body) may read lost with the store still holding the grant. Learnt from the
    /// workload, not from the engine's own `is_finished()`, which a bug could switch on for every grant.
    finished: std::collections::BTreeSet<String>,
    /// Per lock body's name: the grants its guard holds, for the check of a `run` that returns `Lost`.
    bodies: std::collections::BTreeMap<String, Vec<Weak<Grant>>>,
    /// Every grant the store was seen to hold: record, owner token and fencing token (one token may own a record
    /// twice, by two grants: a hand-over that lapsed unclaimed, then another).
    owners_seen: std::collections::BTreeSet<(String, String, u64)>,
    /// Which client sent each token the store has seen.
    owners: std::collections::BTreeMap<String, usize>,
    /// Per client and server (its [`Lane`]): calls made, calls the store applied (or lost), and calls answered
    /// (or lost): one connection per client and server, so that server applies and answers them in order.
    issued: std::collections::BTreeMap<Lane, u64>,
    applied: std::collections::BTreeMap<Lane, u64>,
    replied: std::collections::BTreeMap<Lane, u64>,
    /// Per record: the subscribers to its announcements, in the order they subscribed.
    hubs: std::collections::BTreeMap<String, Vec<tokio::sync::mpsc::UnboundedSender<crate::backend::Announcement>>>,
    /// What the rules of `outcomes.rs` remember: applied releases, forced unlocks, `max_hold` caps, shutdowns.
    truth: outcomes::Truth,
    /// Set by [`Sim::calm`]: no call, reply or announcement is lost or slowed from then on.
    calm: bool,
}

impl State {
    /// `p`, the chance of a network fault, or none once the schedule is calm. The draw is still made, so that
    /// calming changes nothing else the generator decides.
    fn chance_of(&self, p: f64) -> f64 {
        if self.calm {
            0.0
        } else {
            p
        }
    }
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
    let mut weak = std::sync::Weak::new();
    let report = runtime.block_on(async {
        let world = Arc::new(World::new(config));
        weak = Arc::downgrade(&world);
        world.set_up_servers();
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
    let mut report = report;
    // Everything of the schedule is gone now, the clients too: anything still holding the world is a reference
    // cycle (found so: the Redis backend's announcement connection held itself through its push handler, so
    // a dropped client kept that connection open).
    if weak.strong_count() != 0 {
        report.violations.push(format!(
            "the world outlived its schedule: {} strong references left (a reference cycle)",
            weak.strong_count()
        ));
    }
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
            stalls: vec![Vec::new(); clients],
            in_flight: vec![Default::default(); clients],
            paused_until: now,
            probes: Vec::new(),
            last_fence: Default::default(),
            fence_seen: Default::default(),
            ttl_asked: Default::default(),
            ttl_sent: Default::default(),
            beyond_restart: Default::default(),
            seen_lost: Default::default(),
            finished: Default::default(),
            bodies: Default::default(),
            owners_seen: Default::default(),
            owners: Default::default(),
            issued: Default::default(),
            applied: Default::default(),
            replied: Default::default(),
            hubs: Default::default(),
            truth: Default::default(),
            calm: false,
        };
        // One store for every simulated client; the owner it records is not what the simulation checks.
        let memory = MemoryBackend::new("simulation".into());
        let nodes = (0..config.model.servers()).map(|_| Node::new(0, now, config.lua_mutant.clone())).collect();
        Self {
            config,
            memory,
            start: now,
            state: Mutex::new(state),
            turn: tokio::sync::Notify::new(),
            nodes: Mutex::new(nodes),
            replication: tokio::sync::Notify::new(),
        }
    }

    /// Sets the servers up as the model has them: replicas following the primary, each a little behind on the
    /// clock; a Redlock group's lock-state marks (as a client's first connection to a fresh group writes them).
    fn set_up_servers(&self) {
        let mut nodes = self.nodes();
        match self.config.model {
            Model::RedisReplicas => {
                for replica in 1..nodes.len() {
                    let behind = self.state().rng.i64(0..=20_000);
                    nodes[replica].follows = Some(0);
                    nodes[replica].clock_offset_us = -behind;
                }
            }
            Model::Redlock(_) => {
                for node in nodes.iter_mut() {
                    let now_us = self.node_now_us(node);
                    let mark = format!("{PREFIX}redlock:since").into_bytes();
                    node.redis.execute(now_us, &[b"SET".to_vec(), mark, b"0".to_vec(), b"NX".to_vec()]);
                }
            }
            Model::Memory | Model::Redis => {}
        }
    }

    /// The store's truth about `record`: its owner token (`None` for a freed or `min_hold` record), fencing
    /// token and expiry in simulated time; on a Redlock group, the first server's (the oracle asks each server
    /// itself, see `oracle.rs`).
    pub(super) fn peek(&self, record: &str) -> Option<(Option<String>, u64, Instant)> {
        match self.config.model {
            Model::Memory => self.memory.peek(record),
            // Redlock: the token a majority holds, until the quorum's earliest expiry among the latest ones.
            Model::Redlock(n) => {
                let seen = self.peek_each(record);
                let holders = |t: &String| seen.iter().flatten().filter(|(h, ..)| h.as_ref() == Some(t)).count();
                let token = seen.iter().flatten().filter_map(|(t, ..)| t.clone()).find(|t| holders(t) > n / 2)?;
                let mut until: Vec<Instant> =
                    seen.iter().flatten().filter(|(h, ..)| h.as_ref() == Some(&token)).map(|(_, _, e)| *e).collect();
                until.sort_unstable_by(|a, b| b.cmp(a));
                Some((Some(token), 0, until[n / 2]))
            }
            _ => {
                let nodes = self.nodes();
                let node = self.resolve(&nodes, Target::Primary);
                self.peek_node(&nodes, node, record)
            }
        }
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

    /// Whether client `client` was stalled (its own tasks stopped) at some moment between `from` and `to`.
    pub(super) fn stalled_between(&self, client: usize, from: Instant, to: Instant) -> bool {
        self.state().stalls[client].iter().any(|&(a, b)| a <= to && b >= from)
    }

    fn disturb(&self, client: Option<usize>, from: Instant, to: Instant) {
        let mut state = self.state();
        match client {
            Some(client) => state.disturbed[client].push((from, to)),
            None => state.disturbed.iter_mut().for_each(|d| d.push((from, to))),
        }
    }
}

/// The first 8 characters of a token: enough to follow it through a trace, never the whole credential.
fn short(token: &str) -> String {
    let mut out = String::with_capacity(9);
    let _ = write!(out, "{}…", &token[..token.len().min(8)]);
    out
}
