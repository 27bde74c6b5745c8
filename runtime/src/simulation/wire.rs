//! The simulated redis-servers and the network between them and the clients, for the store models that run
//! the real Redis backend (`redis`, `redis+replicas`, `redlock`): the backend's connections
//! ([`Connection`](super::connection::Connection), a `Link` of its own) carry each command through the same fault layer as the memory
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
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard, PoisonError};
use std::time::Duration;

use redis::{PushInfo, PushKind, Value};
use tokio::time::Instant;

use super::connection::{ConnectionState, Wire};
use super::redis::{Entry, SimRedis};
use super::reports::{runs_on, Report};
use super::{short, World};

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
    pub(super) async fn apply_wire(
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
