//! Deterministic simulation of the lock engine (feature `simulation`; not public API).
//!
//! The real engine — acquire, hand-over, renewal, extend, release — runs unchanged against a simulated
//! store (`SimStore`: the memory store's semantics behind a seeded fault layer) on a current-thread tokio
//! runtime whose clock is paused, so minutes of simulated time pass in milliseconds and every choice comes
//! from one seed: the faults, the engine's tokens and retry jitter (through `crate::hooks`) and the workload.
//! An oracle that reads the store's truth checks the safety model after every command the store applies and
//! at every observation; see `oracle.rs`.

mod assumptions;
mod mutation;
mod oracle;
mod outcomes;
pub mod redis;
mod stall;
mod store;
mod wire;

use std::cell::RefCell;
use std::fmt::Write as _;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Backend, MemoryBackend, RedisBackend, RedlockBackend, ReplicaAcks, Timeouts};
use crate::client::ClientInner;
use crate::grant::Grant;
use crate::{Client, LockError, LockGuard, RetryStrategy};
pub use mutation::{lua_mutants, LuaMutant};
pub use outcomes::Releasing;
pub(crate) use stall::owned;
pub(crate) use store::SimStore;
pub(crate) use wire::{Connection, Push};
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
    started: Instant,
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

    fn add(&self, token: &str) {
        let mut tokens = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
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
