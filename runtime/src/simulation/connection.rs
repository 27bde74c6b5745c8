//! One client's connection to a simulated server: each call goes through the fault layer to the node that
//! runs it (wire.rs), and comes back as redis-rs would give it: a reply, a dropped connection, a timeout.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use redis::{Arg, Cmd, Pipeline, RedisError, RedisResult, Value};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::reports::{reports_of, Report};
use super::wire::{Push, Target};
use super::{short, World};
use crate::LockError;

/// What a call on the wire came back with.
#[derive(Debug)]
pub(super) enum Wire {
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

pub(super) struct ConnectionState {
    pub(super) id: u64,
    pub(super) target: Target,
    pub(super) push: Option<Push>,
    /// The replication offset of this connection's last write, which `WAIT` waits for, and on which node.
    pub(super) written: AtomicU64,
    pub(super) written_on: AtomicU64,
    /// When its socket opened: the commands connection is a `ConnectionManager`, which opens a new socket
    /// after a call failed on a closed one; the new socket made no writes, and a `WAIT` on it counts none.
    pub(super) opened: Mutex<Instant>,
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
