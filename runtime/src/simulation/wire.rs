//! The simulated redis-servers and the network between them and the clients, for the store models that run
//! the real Redis backend (`redis`, `redis+replicas`, `redlock`): the backend's connections
//! ([`Connection`], a `Link` of its own) carry each command through the same fault layer as the memory
//! model's calls (slow, lost request, applied with its reply lost, reset), to a [`Node`] that runs it on its
//! [`SimRedis`] — the production scripts, unchanged — at the node's own wall clock. A reset connection fails
//! the calls on it with a dropped-connection error, which the backend answers by sending the call again, as it
//! does with redis-rs. Announcements reach subscribed connections through a push handler, each dropped, late
//! (so reordered) or on time; a restart tells every subscriber it was disconnected, as redis-rs does.
//!
//! Faults of the servers: a restart without persistence (keyspace and scripts gone, clock kept, every
//! connection reset), a pause, the wall clock stepping forward or back, and, with replicas, replication lag,
//! `WAIT`, and a failover to the most advanced replica (as Sentinel picks it), whose clock may be behind.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use redis::{Arg, Cmd, Pipeline, PushInfo, PushKind, RedisError, RedisResult, Value};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::redis::{Entry, SimRedis};
use super::{short, World};
use crate::LockError;

/// What a connection does with a push (an announcement, a subscription's confirmation, a disconnection).
pub(crate) type Push = Arc<dyn Fn(PushInfo) + Send + Sync>;

/// The server behind every `sim` connection: one node, or whichever is the primary now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    Node(usize),
    Primary,
}

/// One simulated redis-server.
pub(crate) struct Node {
    pub(super) redis: SimRedis,
    /// The server's wall clock minus the simulation's, in µs: steps move it.
    pub(super) clock_offset_us: i64,
    pub(super) paused_until: Instant,
    /// Down for good: every call on it fails at once, as a refused connection does.
    pub(super) down: bool,
    /// When it last restarted (or, for the primary, failed over): calls sent before then are reset.
    pub(super) reset_at: Option<Instant>,
    /// Every restart and every clock step, for the oracle's assumptions.
    pub(super) restarts: Vec<Instant>,
    pub(super) steps: Vec<(Instant, i64)>,
    /// The steps that moved the clock its records expire by: those it took while a primary (or standalone),
    /// and on promotion its clock against the old primary's.
    pub(super) steps_as_primary: Vec<(Instant, i64)>,
    /// Subscribed connections per channel.
    subscribers: BTreeMap<Vec<u8>, Vec<Subscriber>>,
    /// With replicas: writes applied here (a primary) or received (a replica), by offset.
    pub(super) offset: u64,
    /// A replica: whose writes it applies; `None` for a primary or a standalone server.
    pub(super) follows: Option<usize>,
    /// A primary's writes on their way to each replica: (when it applies them, offset, effects).
    backlog: BTreeMap<usize, VecDeque<(Instant, u64, Effects)>>,
}

type Effects = Vec<(Vec<u8>, Option<Entry>)>;

#[derive(Clone)]
struct Subscriber {
    connection: u64,
    client: usize,
    push: Push,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("clock_offset_us", &self.clock_offset_us).field("offset", &self.offset).finish()
    }
}

impl Node {
    pub(super) fn new(clock_offset_us: i64, now: Instant, mutant: Option<super::LuaMutant>) -> Self {
        Self {
            redis: SimRedis::running(mutant),
            clock_offset_us,
            paused_until: now,
            down: false,
            reset_at: None,
            restarts: Vec::new(),
            steps: Vec::new(),
            steps_as_primary: Vec::new(),
            subscribers: BTreeMap::new(),
            offset: 0,
            follows: None,
            backlog: BTreeMap::new(),
        }
    }
}

/// The fixed epoch of the simulated wall clocks (late 2023), in µs: fencing tokens look like real ones.
pub(super) const EPOCH_US: i64 = 1_700_000_000_000_000;

/// A record's token (or `None` for a freed or `min_hold` record: its first half is `=` or `-`) and fencing
/// token, as the scripts write it: `<token><mark><fence>:<granted>:<holder>`.
pub(super) fn parse_record(value: &[u8]) -> Option<(Option<String>, u64)> {
    let (token, fence) = parse_record_borrowed(value)?;
    // Tokens are ASCII hex: `from_utf8` checks them faster than a lossy conversion would copy them.
    let token =
        token.map(|t| std::str::from_utf8(t).map_or_else(|_| String::from_utf8_lossy(t).into_owned(), str::to_owned));
    Some((token, fence))
}

/// [`parse_record`], the token borrowed from the record: the oracle reads records after every command.
fn parse_record_borrowed(value: &[u8]) -> Option<(Option<&[u8]>, u64)> {
    let token = value.get(..crate::token::TOKEN_LEN)?;
    let rest = value.get(crate::token::TOKEN_LEN + 1..)?;
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    // As `str::parse` would (0 when none or too many), without the UTF-8 check.
    let fence = rest[..digits].iter().try_fold(0u64, |n, d| n.checked_mul(10)?.checked_add(u64::from(d - b'0')));
    let vacant = token[0] == b'=' || token[0] == b'-';
    Some(((!vacant).then_some(token), fence.unwrap_or(0)))
}

impl World {
    pub(super) fn nodes(&self) -> MutexGuard<'_, Vec<Node>> {
        self.nodes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The node a connection's call reaches now.
    pub(super) fn resolve(&self, nodes: &[Node], target: Target) -> usize {
        match target {
            Target::Node(node) => node,
            Target::Primary => nodes.iter().position(|n| n.follows.is_none()).unwrap_or(0),
        }
    }

    /// A node's wall clock now, in µs since the Unix epoch.
    pub(super) fn node_now_us(&self, node: &Node) -> i64 {
        self.node_us_at(node, Instant::now())
    }

    /// A node's wall clock at `now`, in µs since the Unix epoch.
    fn node_us_at(&self, node: &Node, now: Instant) -> i64 {
        EPOCH_US + now.saturating_duration_since(self.start).as_micros() as i64 + node.clock_offset_us
    }

    /// The record at `record` on `node`: its token, fencing token and when it expires in simulated time.
    pub(super) fn peek_node(
        &self,
        nodes: &[Node],
        node: usize,
        record: &str,
    ) -> Option<(Option<String>, u64, Instant)> {
        let (value, expires) = self.peek_raw(nodes, node, record, Instant::now())?;
        let (token, fence) = parse_record(value)?;
        Some((token, fence, expires))
    }

    /// When the record at `record` on `node` expires in simulated time, if it is `token`'s: [`World::peek_node`]
    /// without a copy of the token, for the oracle's checks of every guard after every command.
    pub(super) fn held_on_node(
        &self,
        nodes: &[Node],
        node: usize,
        record: &str,
        token: &str,
        now: Instant,
    ) -> Option<Instant> {
        let (value, expires) = self.peek_raw(nodes, node, record, now)?;
        let (held_by, _) = parse_record_borrowed(value)?;
        (held_by? == token.as_bytes()).then_some(expires)
    }

    /// The value at `record` on `node` at `now` and when it expires in simulated time.
    fn peek_raw<'n>(&self, nodes: &'n [Node], node: usize, record: &str, now: Instant) -> Option<(&'n [u8], Instant)> {
        let n = &nodes[node];
        let (value, ttl) = n.redis.peek(self.node_us_at(n, now), record.as_bytes())?;
        // No expiry cannot happen to a record; take it as far away.
        let expires = now + ttl.map_or(Duration::from_secs(3600), |ms| Duration::from_millis(ms.max(0) as u64));
        Some((value, expires))
    }

    /// Runs one command on the node `target` names, as a call of `client`'s connection `connection` sent at
    /// `sent` on its socket opened at `opened`: reset if the node restarted (or failed over) since that socket
    /// opened (a restart closes every connection, and Sentinel kills the clients of every server it
    /// reconfigures); `WAIT` and the subscription commands are the connection's own.
    async fn apply_wire(
        self: &Arc<Self>,
        client: usize,
        connection: &ConnectionState,
        opened: Instant,
        args: Vec<Vec<u8>>,
        reports: Vec<Report>,
    ) -> Wire {
        loop {
            let until = {
                let nodes = self.nodes();
                nodes[self.resolve(&nodes, connection.target)].paused_until
            };
            if until <= Instant::now() {
                break;
            }
            tokio::time::sleep_until(until).await;
        }
        let name = args.first().map(|a| a.to_ascii_uppercase()).unwrap_or_default();
        if name == b"WAIT" {
            return self.wait_for_replicas(connection, opened, &args).await;
        }
        let mut nodes = self.nodes();
        let node = self.resolve(&nodes, connection.target);
        if nodes[node].down || nodes[node].reset_at.is_some_and(|at| at > opened) {
            return Wire::Reset;
        }
        match name.as_slice() {
            b"SUBSCRIBE" | b"SSUBSCRIBE" => {
                let push = connection.push.clone();
                let Some(push) = push else { return Wire::Reply(error("ERR this connection takes no pushes")) };
                let mut confirmations = Vec::new();
                // In a fixed order: the engine resubscribes its channels in its HashMap's (unseeded) order.
                let mut channels = args[1..].to_vec();
                channels.sort();
                for channel in &channels {
                    let subscribers = nodes[node].subscribers.entry(channel.clone()).or_default();
                    if !subscribers.iter().any(|s| s.connection == connection.id) {
                        subscribers.push(Subscriber { connection: connection.id, client, push: push.clone() });
                    }
                    confirmations.push(channel.clone());
                }
                drop(nodes);
                // The confirmations reach the handler before the call returns, as redis-rs delivers them.
                for channel in confirmations {
                    push(PushInfo { kind: PushKind::Subscribe, data: vec![Value::BulkString(channel), Value::Int(1)] });
                }
                return Wire::Reply(Value::Okay);
            }
            b"UNSUBSCRIBE" | b"SUNSUBSCRIBE" => {
                for channel in &args[1..] {
                    if let Some(subscribers) = nodes[node].subscribers.get_mut(channel) {
                        subscribers.retain(|s| s.connection != connection.id);
                    }
                }
                return Wire::Reply(Value::Okay);
            }
            _ => {}
        }
        if nodes[node].follows.is_some() && writes(&name) {
            return Wire::Reply(error("READONLY You can't write against a read only replica."));
        }
        let mut reported = if runs_on(&nodes[node].redis, &args) { reports } else { Vec::new() };
        let redlock = matches!(self.config.model, super::Model::Redlock(_));
        if redlock {
            // Redlock's renewals are rounds over servers: S8 is checked on the single-primary models only.
            // Its releases are judged per server (outcomes/quorum.rs), after the token's last acquire attempt.
            reported.retain(|r| !matches!(r, Report::Renew { .. }));
        }
        // The oracle's server: a Redlock group's own; the single-primary models keep one record, whichever node
        // is primary (a failover moves it).
        let server = if redlock { node } else { 0 };
        let now_us = self.node_now_us(&nodes[node]);
        if !reported.is_empty() {
            // The oracle reads the truth through the nodes: let go of them while it looks.
            drop(nodes);
            for report in &reported {
                match report {
                    Report::Release { record, token, resent, after_acquire, after_release } => {
                        self.applying_release(record, token, *resent, (*after_acquire, *after_release), server)
                    }
                    Report::Renew { record, token, ttl } => {
                        self.asked(token, ttl);
                        self.applying_renew(record, token)
                    }
                    Report::ForceUnlock { record } => self.applying_force_unlock(record, node),
                    Report::Acquire { token, ttl } => {
                        if !redlock {
                            self.asked(token, ttl); // The fencing assumption's: Redlock has no fencing.
                        }
                        self.applying_acquire(token, server)
                    }
                }
            }
            nodes = self.nodes();
        }
        let executed = nodes[node].redis.execute(now_us, &args);
        if !executed.effects.is_empty() {
            let offset = self.replicate(&mut nodes, node, executed.effects);
            connection.written.fetch_max(offset, Ordering::Relaxed);
            connection.written_on.store(node as u64, Ordering::Relaxed);
        }
        let mut deliveries = Vec::new();
        for published in executed.published {
            for subscriber in nodes[node].subscribers.get(&published.channel).into_iter().flatten() {
                deliveries.push((subscriber.clone(), published.channel.clone(), published.message.clone()));
            }
        }
        drop(nodes);
        for (subscriber, channel, message) in deliveries {
            self.deliver(subscriber, channel, message);
        }
        Wire::Reply(executed.reply)
    }

    /// A primary's write, sent on to its replicas, each applying it after its own lag (in order); its offset.
    fn replicate(self: &Arc<Self>, nodes: &mut [Node], node: usize, effects: Effects) -> u64 {
        nodes[node].offset += 1;
        let offset = nodes[node].offset;
        let replicas: Vec<usize> = (0..nodes.len()).filter(|&r| nodes[r].follows == Some(node)).collect();
        for replica in replicas {
            let lag = {
                let mut state = self.state();
                Duration::from_millis(state.rng.u64(0..=self.config.replication_lag.as_millis() as u64))
            };
            let queue = nodes[node].backlog.entry(replica).or_default();
            let at = queue.back().map_or(Instant::now(), |last| last.0).max(Instant::now() + lag);
            queue.push_back((at, offset, effects.clone()));
            let world = Arc::clone(self);
            tokio::spawn(async move {
                tokio::time::sleep_until(at).await;
                world.replicated_until(node, replica);
            });
        }
        offset
    }

    /// Applies the writes of `primary` due at `replica` by now, in order.
    fn replicated_until(&self, primary: usize, replica: usize) {
        let mut nodes = self.nodes();
        if nodes[replica].follows != Some(primary) {
            return;
        }
        let now = Instant::now();
        while let Some((at, offset, effects)) =
            nodes[primary].backlog.get_mut(&replica).and_then(|q| q.front().cloned())
        {
            if at > now {
                break;
            }
            nodes[primary].backlog.get_mut(&replica).map(VecDeque::pop_front);
            nodes[replica].redis.apply(&effects);
            nodes[replica].offset = offset;
        }
        drop(nodes);
        self.replication.notify_waiters();
    }

    /// `WAIT numreplicas timeout`: how many replicas of the primary have this connection's writes, once enough
    /// have or the timeout passed.
    async fn wait_for_replicas(&self, connection: &ConnectionState, opened: Instant, args: &[Vec<u8>]) -> Wire {
        let number = |i: usize| args.get(i).and_then(|a| std::str::from_utf8(a).ok()?.parse::<u64>().ok());
        let (Some(wanted), Some(timeout)) = (number(1), number(2)) else {
            return Wire::Reply(error("ERR value is not an integer or out of range"));
        };
        let deadline = Instant::now() + Duration::from_millis(timeout);
        let written = connection.written.load(Ordering::Relaxed);
        loop {
            let notified = self.replication.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let acknowledged = {
                let nodes = self.nodes();
                let primary = self.resolve(&nodes, connection.target);
                // A failover or restart since its socket opened (or while it waits) resets it.
                if nodes[primary].reset_at.is_some_and(|at| at > opened) {
                    return Wire::Reset;
                }
                if connection.written_on.load(Ordering::Relaxed) != primary as u64 && written > 0 {
                    0
                } else {
                    nodes.iter().filter(|n| n.follows == Some(primary) && n.offset >= written).count() as u64
                }
            };
            if acknowledged >= wanted || (timeout > 0 && Instant::now() >= deadline) {
                return Wire::Reply(Value::Int(acknowledged as i64));
            }
            if timeout == 0 {
                notified.await;
            } else {
                let _ = tokio::time::timeout_at(deadline, notified).await;
            }
        }
    }

    /// Carries an announcement to one subscriber: dropped, late or on time as the seed says, and only once its
    /// client runs.
    fn deliver(self: &Arc<Self>, subscriber: Subscriber, channel: Vec<u8>, message: Vec<u8>) {
        let (dropped, delay) = {
            let mut state = self.state();
            let dropped = state.rng.f64() < state.chance_of(self.config.drop_announcement);
            let late = !dropped && state.rng.f64() < state.chance_of(self.config.drop_announcement);
            state.faults += u64::from(dropped || late);
            let most = if late { self.config.slow_delay } else { self.config.normal_delay };
            (dropped, Duration::from_millis(state.rng.u64(0..=most.as_millis() as u64)))
        };
        let text = String::from_utf8_lossy(&message).into_owned();
        let client = subscriber.client;
        if dropped {
            self.trace(|| format!("c{client} announcement DROPPED: {}", announced(&text)));
            return;
        }
        let world = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            world.wait_unfrozen(client).await;
            // A subscription the server has forgotten (a restart) hears nothing more.
            let subscribed = world.nodes().iter().any(|n| {
                n.subscribers.get(&channel).is_some_and(|s| s.iter().any(|s| s.connection == subscriber.connection))
            });
            if subscribed {
                world.trace(|| format!("c{client} hears {}", announced(&text)));
                (subscriber.push)(PushInfo {
                    kind: PushKind::Message,
                    data: vec![Value::BulkString(channel), Value::BulkString(message)],
                });
            }
        });
    }

    /// Node `node` restarts without persistence: its keys and scripts are gone, its clock runs on, every
    /// connection to it is reset, and its subscribers are told they were disconnected.
    pub(super) fn restart_node(self: &Arc<Self>, node: usize) {
        let now = Instant::now();
        let mut nodes = self.nodes();
        let n = &mut nodes[node];
        n.redis.restart();
        n.reset_at = Some(now);
        n.restarts.push(now);
        n.offset = 0;
        let subscribers: Vec<Subscriber> = std::mem::take(&mut n.subscribers).into_values().flatten().collect();
        // A replica of it resynchronises from scratch (an empty dataset).
        for r in 0..nodes.len() {
            if nodes[r].follows == Some(node) {
                nodes[r].redis.restart();
                nodes[r].offset = 0;
            }
        }
        nodes[node].backlog.clear();
        drop(nodes);
        self.trace(|| format!("server {node} RESTARTED (state lost)"));
        self.disturb(
            None,
            now.checked_sub(self.config.response_timeout).unwrap_or(now),
            now + 2 * self.config.response_timeout,
        );
        self.disconnect(subscribers);
    }

    /// The primary fails and the most advanced replica takes over (Sentinel's pick): the old primary is gone
    /// (it comes back empty, as a replica of the new one), every connection to the primary is reset.
    pub(super) fn fail_over(self: &Arc<Self>) {
        let now = Instant::now();
        let mut nodes = self.nodes();
        let old = self.resolve(&nodes, Target::Primary);
        let Some(new) =
            (0..nodes.len()).filter(|&r| nodes[r].follows == Some(old)).max_by_key(|&r| (nodes[r].offset, r))
        else {
            return;
        };
        let subscribers: Vec<Subscriber> =
            std::mem::take(&mut nodes[old].subscribers).into_values().flatten().collect();
        nodes[old].backlog.clear();
        // Not a restart for the oracle: with replica acknowledgements, what the clients count on survives.
        nodes[old].redis.restart();
        nodes[new].follows = None;
        nodes[new].reset_at = Some(now);
        // Its clock against the old primary's reads as a step: back, to the tokens; forward, to the records
        // the old primary wrote (their expiry is absolute, so they end that much earlier).
        let step = nodes[new].clock_offset_us - nodes[old].clock_offset_us;
        nodes[new].steps.push((now, step));
        nodes[new].steps_as_primary.push((now, step));
        let promoted = nodes[new].redis.snapshot(self.node_now_us(&nodes[new]));
        let promoted: Effects = promoted.into_iter().map(|(k, e)| (k, Some(e))).collect();
        let offset = nodes[new].offset;
        for r in 0..nodes.len() {
            if r != new && (nodes[r].follows == Some(old) || r == old) {
                nodes[r].follows = Some(new);
                nodes[r].redis.restart();
                nodes[r].redis.apply(&promoted);
                nodes[r].offset = offset;
            }
        }
        drop(nodes);
        self.trace(|| format!("FAILOVER: server {new} replaces primary {old}"));
        self.failing_over();
        // Calls under way fail: renewals may be lost while the new primary still holds their grants.
        self.disturb(
            None,
            now.checked_sub(self.config.response_timeout).unwrap_or(now),
            now + 2 * self.config.response_timeout,
        );
        self.disconnect(subscribers);
    }

    fn disconnect(self: &Arc<Self>, subscribers: Vec<Subscriber>) {
        let mut told: Vec<u64> = Vec::new();
        for subscriber in subscribers {
            if told.contains(&subscriber.connection) {
                continue;
            }
            told.push(subscriber.connection);
            let world = Arc::clone(self);
            tokio::spawn(async move {
                world.wait_unfrozen(subscriber.client).await;
                (subscriber.push)(PushInfo { kind: PushKind::Disconnection, data: Vec::new() });
            });
        }
    }
}

/// What a script call is about to do that the oracle checks (outcomes.rs): its releases, renewals and
/// force_unlocks, read from its keys and arguments as the scripts read them.
enum Report {
    /// `after_acquire`: an earlier operation of the same BATCH call may grant the same record (to another
    /// token), so what the release finds is not known before the call runs; `after_release`: an earlier one
    /// may free it (a release of the same record, by another token or this one: then this one finds nobody).
    Release {
        record: String,
        token: String,
        resent: bool,
        after_acquire: bool,
        after_release: bool,
    },
    Renew {
        record: String,
        token: String,
        ttl: String,
    },
    ForceUnlock {
        record: String,
    },
    Acquire {
        token: String,
        ttl: String,
    },
}

/// Whether a command runs on `redis` as sent: an EVALSHA the server does not know runs nothing.
fn runs_on(redis: &SimRedis, args: &[Vec<u8>]) -> bool {
    let by_sha = args.first().is_some_and(|name| name.eq_ignore_ascii_case(b"EVALSHA"));
    !by_sha || args.get(1).is_some_and(|sha| redis.knows_script(sha))
}

/// The reports of a call of one of the production scripts, read from its arguments when it is sent (whether
/// it runs or not: [`runs_on`] tells where it is applied).
fn reports_of(args: &[Vec<u8>]) -> Vec<Report> {
    if args.len() < 3 {
        return Vec::new();
    }
    let text = |i: usize| args.get(i).map(|a| String::from_utf8_lossy(a).into_owned()).unwrap_or_default();
    let Some(script) = crate::backend::script_name(&args[1]) else { return Vec::new() };
    let keys: usize = text(2).parse().unwrap_or(0);
    let (key, arg) = (|i: usize| text(2 + i), |i: usize| text(2 + keys + i));
    match script {
        "RELEASE" => {
            let (record, token, resent) = (key(1), arg(1), arg(4) == "1");
            vec![Report::Release { record, token, resent, after_acquire: false, after_release: false }]
        }
        "RENEW" => vec![Report::Renew { record: key(1), token: arg(1), ttl: arg(2) }],
        "RENEW_MANY" => {
            (1..=keys).map(|i| Report::Renew { record: key(i), token: arg(2 * i - 1), ttl: arg(2 * i) }).collect()
        }
        "FORCE_UNLOCK" => vec![Report::ForceUnlock { record: key(1) }],
        "ACQUIRE" | "ACQUIRE_PLAIN" => vec![Report::Acquire { token: arg(1), ttl: arg(2) }],
        "ACQUIRE_ALL" => (1..=keys).map(|i| Report::Acquire { token: arg(2 + i), ttl: arg(1) }).collect(),
        "BATCH" => {
            // ARGV[1]: one letter per operation; each operation's arguments follow, in order (batch.lua).
            let (mut reports, mut acquired, mut released) = (Vec::new(), Vec::new(), Vec::new());
            let (mut at, mut last_ttl) = (2, String::new());
            for (i, op) in arg(1).bytes().enumerate() {
                let (record, token) = (key(i + 1), arg(at));
                // 'b' takes the ttl of the last 'a' before it.
                if matches!(op, b'a' | b'p' | b'q') {
                    last_ttl = arg(at + 1);
                }
                let Some(arity) = crate::backend::batch_arity(op) else { return reports };
                at += arity;
                if matches!(op, b'r' | b'k' | b's') {
                    let (after_acquire, after_release) = (acquired.contains(&record), released.contains(&record));
                    released.push(record.clone());
                    reports.push(Report::Release { record, token, resent: op == b's', after_acquire, after_release });
                } else {
                    acquired.push(record);
                    reports.push(Report::Acquire { token, ttl: last_ttl.clone() });
                }
            }
            reports
        }
        _ => Vec::new(),
    }
}

/// Whether a command writes (a replica refuses it). Scripts may write: a replica refuses them too.
fn writes(name: &[u8]) -> bool {
    !matches!(name, b"GET" | b"PTTL" | b"EXISTS" | b"SCAN" | b"PING" | b"TIME" | b"GETRANGE" | b"INFO" | b"ECHO")
}

fn error(line: &str) -> Value {
    let bytes = format!("-{line}\r\n");
    redis::parse_redis_value(bytes.as_bytes()).unwrap_or(Value::Nil)
}

/// An announcement as the trace shows it (the heir's token shortened).
fn announced(text: &str) -> String {
    match text.split_once(':') {
        Some((heir, rest)) if heir.len() == crate::token::TOKEN_LEN => {
            format!("handed over to {} ({rest})", short(heir))
        }
        _ => text.to_owned(),
    }
}

/// What a call on the wire came back with.
#[derive(Debug)]
enum Wire {
    Reply(Value),
    /// The connection was reset under it (a restart, a failover): not applied.
    Reset,
}

/// One client's connection to a simulated server (a `Link` of the Redis backend).
#[derive(Clone)]
pub(crate) struct Connection {
    world: Arc<World>,
    client: usize,
    state: Arc<ConnectionState>,
}

struct ConnectionState {
    id: u64,
    target: Target,
    push: Option<Push>,
    /// The replication offset of this connection's last write, which `WAIT` waits for, and on which node.
    written: AtomicU64,
    written_on: AtomicU64,
    /// When its socket opened: the commands connection is a `ConnectionManager`, which opens a new socket
    /// after a call failed on a closed one; the new socket made no writes, and a `WAIT` on it counts none.
    opened: Mutex<Instant>,
}

impl ConnectionState {
    /// The socket opened at `was` is closed: the next call goes on a new one (unless that happened already).
    fn reopen(&self, was: Instant) {
        let mut opened = self.opened.lock().unwrap_or_else(PoisonError::into_inner);
        if *opened == was {
            *opened = Instant::now();
            self.written.store(0, Ordering::Relaxed);
            self.written_on.store(0, Ordering::Relaxed);
        }
    }
}

static CONNECTIONS: AtomicU64 = AtomicU64::new(1);

impl Connection {
    pub(super) fn new(world: Arc<World>, client: usize, target: Target, push: Option<Push>) -> Self {
        let id = CONNECTIONS.fetch_add(1, Ordering::Relaxed);
        Self {
            world,
            client,
            state: Arc::new(ConnectionState {
                id,
                target,
                push,
                written: AtomicU64::new(0),
                written_on: AtomicU64::new(0),
                opened: Mutex::new(Instant::now()),
            }),
        }
    }

    /// Sends one command and waits for its reply, as redis-rs does: a timeout after the response timeout, a
    /// dropped-connection error when the connection was reset under it.
    pub(crate) fn send(&self, cmd: &Cmd) -> impl Future<Output = RedisResult<Value>> + Send + 'static {
        let args: Vec<Vec<u8>> =
            cmd.args_iter().map(|a| if let Arg::Simple(a) = a { a.to_vec() } else { Vec::new() }).collect();
        let this = self.clone();
        async move { this.call(args).await }
    }

    /// A pipeline, one command after another (our pipelines are never atomic).
    pub(crate) fn send_all(
        &self,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
    ) -> impl Future<Output = RedisResult<Vec<Value>>> + Send + 'static {
        let calls: Vec<_> = pipeline.cmd_iter().map(|cmd| self.send(cmd)).collect();
        async move {
            let mut replies = Vec::new();
            for call in calls {
                replies.push(call.await?);
            }
            Ok(replies.into_iter().skip(offset).take(count).collect())
        }
    }

    pub(crate) async fn subscribe(&self, channels: &[Vec<u8>]) -> RedisResult<()> {
        let mut args = vec![b"SUBSCRIBE".to_vec()];
        args.extend(channels.iter().cloned());
        self.call(args).await.map(drop)
    }

    pub(crate) async fn unsubscribe(&self, channel: &[u8]) -> RedisResult<()> {
        self.call(vec![b"UNSUBSCRIBE".to_vec(), channel.to_vec()]).await.map(drop)
    }

    async fn call(&self, args: Vec<Vec<u8>>) -> RedisResult<Value> {
        let (world, client) = (&self.world, self.client);
        self.note_tokens(&args);
        let script =
            args.first().is_some_and(|a| a.eq_ignore_ascii_case(b"EVAL") || a.eq_ignore_ascii_case(b"EVALSHA"));
        // Read once, here: what the oracle learns at the send, and what the server reports if the call runs.
        let reports = if script { reports_of(&args) } else { Vec::new() };
        for report in &reports {
            match report {
                Report::Release { token, .. } => world.release_sent(token),
                Report::Renew { token, ttl, .. } => world.sent_ttl(token, ttl),
                _ => {}
            }
        }
        // A Redlock group's servers answer on connections of their own: a hung one holds up no other's calls.
        let lane = match self.state.target {
            Target::Node(node) => node,
            Target::Primary => 0,
        };
        let plan = world.plan((client, lane));
        let id = plan.id;
        world.trace(|| {
            let to = match self.state.target {
                Target::Node(node) => format!(" s{node}"),
                Target::Primary => String::new(),
            };
            format!("c{client} #{id}{to} → {} (legs {:?}/{:?})", describe(&args), plan.request, plan.reply)
        });
        // The records a script call is about (every key: ACQUIRE_ALL and BATCH take several), for the oracle's
        // fencing check (found by the simulation's whole workload, redis seed 795: a lock_all grant of three
        // keys went unseen on the second and third, and a token after a clock step back was not excused).
        let records: Vec<String> = match script {
            true => {
                let keys = args.get(2).and_then(|k| std::str::from_utf8(k).ok()?.parse::<usize>().ok()).unwrap_or(0);
                args.iter().skip(3).take(keys).map(|r| String::from_utf8_lossy(r).into_owned()).collect()
            }
            false => Vec::new(),
        };
        let (tx, rx) = oneshot::channel();
        // The subscriptions' connection is reset by its Disconnection push instead (`disconnect`).
        let opened = match self.state.push {
            Some(_) => Instant::now(),
            None => *self.state.opened.lock().unwrap_or_else(PoisonError::into_inner),
        };
        let op = {
            let (world, state) = (Arc::clone(world), Arc::clone(&self.state));
            async move { Ok::<Wire, LockError>(world.apply_wire(client, &state, opened, args, reports).await) }
        };
        // Boxed: the call's future is a few KB, which spawning copied three times over.
        tokio::spawn(Box::pin(Arc::clone(world).carry(client, plan, records, op, tx)));
        let reply = tokio::time::timeout(world.config.response_timeout, rx).await;
        world.wait_unfrozen(client).await;
        match reply {
            Ok(Ok(Ok(Wire::Reply(value)))) => {
                world.trace(|| format!("c{client} #{id} ← {}", shown(&value)));
                // The production scripts never fail on the calls the engine makes (no foreign data here): a
                // script error is a bug, not a fault.
                if let Value::ServerError(e) = &value {
                    if script && !matches!(e.code(), "NOSCRIPT" | "READONLY") {
                        world.violation(format!("c{client} #{id}: a script failed: {e}"));
                    }
                }
                // A server error is a reply, as redis-rs hands it on: the caller's query makes it an error, a
                // pipeline that ignores errors keeps it in its place.
                Ok(value)
            }
            Ok(Ok(Ok(Wire::Reset))) | Ok(Err(_)) | Ok(Ok(Err(_))) => {
                // The client learns here that the socket closed, and only here: its next call goes on a new
                // one. (Reopened when the server reset the call instead, a call sent before this reset's reply
                // had come back — or with that reply lost — went on a new socket while the caller's link still
                // read the old epoch: a WAIT there counted a write the promoted replica never got;
                // redis+replicas seed 26281.)
                if matches!(reply, Ok(Ok(Ok(Wire::Reset)))) && self.state.push.is_none() {
                    self.state.reopen(opened);
                }
                world.trace(|| format!("c{client} #{id} ← connection reset"));
                Err(RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset)))
            }
            Err(_) => {
                world.trace(|| format!("c{client} #{id} ← timed out"));
                Err(RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut)))
            }
        }
    }

    /// Tokens (32 hex digits) the call carries belong to this client, for the oracle.
    fn note_tokens(&self, args: &[Vec<u8>]) {
        let tokens = args.iter().filter(|a| a.len() == crate::token::TOKEN_LEN && a.iter().all(u8::is_ascii_hexdigit));
        let tokens: Vec<String> = tokens.map(|t| String::from_utf8_lossy(t).into_owned()).collect();
        if tokens.is_empty() {
            return;
        }
        for token in &tokens {
            let _ = super::store::TRACKED.try_with(|tracked| tracked.add(token));
        }
        let mut state = self.world.state();
        for token in tokens {
            state.owners.insert(token, self.client);
        }
    }
}

/// A command as the trace shows it: the script's name instead of its source or SHA, tokens shortened.
fn describe(args: &[Vec<u8>]) -> String {
    let mut out = String::new();
    for (i, arg) in args.iter().enumerate() {
        let text = String::from_utf8_lossy(arg);
        let shown = if i == 1 && (text.len() == 40 || text.len() > 64) {
            crate::backend::script_name(arg).unwrap_or("<script>").to_owned()
        } else if arg.len() == crate::token::TOKEN_LEN && arg.iter().all(u8::is_ascii_hexdigit) {
            short(&text)
        } else {
            text.into_owned()
        };
        if i > 0 {
            out.push(' ');
        }
        out.push_str(&shown);
    }
    out
}

fn shown(value: &Value) -> String {
    match value {
        Value::BulkString(bytes) => format!("{:?}", String::from_utf8_lossy(bytes)),
        Value::Array(items) => format!("[{}]", items.iter().map(shown).collect::<Vec<_>>().join(", ")),
        other => format!("{other:?}"),
    }
}
