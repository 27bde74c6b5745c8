//! A simulated redis-server (issue 32): one keyspace and script cache, in process and deterministic — no I/O,
//! no clock of its own — that runs distlock's production Lua scripts unchanged on an embedded Lua 5.1, with
//! the commands they call (and the ones the Rust side sends directly) answering as redis-server 7.0 answers a
//! RESP3 client. `tests/tests/sim_keyspace.rs` drives it and a real redis-server with the same seeded command
//! sequences and finds no difference.
//!
//! The parts: `commands.rs` (the command table), `keyspace.rs` (values, expiry, a call's context),
//! `strings.rs`, `generic.rs`, `zset.rs` and `zrange.rs` (the commands), `lua.rs` (the script engine:
//! EVAL, EVALSHA, SCRIPT), `api.rs` (the `redis` table scripts call), `convert.rs` (between Redis replies and
//! Lua values), `parse.rs` (Redis's number, pattern and double-printing rules), `reply.rs` (replies before
//! they meet a protocol).

mod api;
mod commands;
mod convert;
mod generic;
mod keyspace;
mod lua;
mod parse;
mod reply;
mod strings;
#[cfg(test)]
mod tests;
mod zrange;
mod zset;

use std::collections::BTreeMap;

pub(crate) use keyspace::{Data, Entry};
#[cfg_attr(not(test), allow(unused_imports, reason = "the simulation's Redis model reads sorted sets through it"))]
pub(crate) use zset::ZSet;

use commands::{Kind, Lookup};
use keyspace::{Ctx, Keyspace};
use reply::Reply;

/// One simulated redis-server: its keyspace and script cache. Deterministic; no I/O, no real clock.
#[derive(Debug)]
pub(crate) struct SimRedis {
    keyspace: Keyspace,
    /// Always `Some` until dropped, when the state goes back to this thread's pool.
    engine: Option<lua::Engine>,
}

/// What one command did.
#[derive(Debug, Clone)]
#[cfg_attr(not(test), allow(dead_code, reason = "the simulation's Redis model reads the effects and publications"))]
pub(crate) struct Executed {
    /// The reply as the redis crate parses the server's reply on a RESP3 connection (a script's reply
    /// converted as Redis 7.0 converts it for a RESP3 client: a script reads replies in RESP2 unless it calls
    /// `redis.setresp(3)`). Errors are `redis::Value::ServerError`.
    pub(crate) reply: redis::Value,
    /// Messages published (PUBLISH or SPUBLISH, from scripts or direct), in order.
    pub(crate) published: Vec<Published>,
    /// For replication: the state after the command of each key it wrote (`None`: deleted), in the order of
    /// their first write, with absolute expiry times (as Redis 7 propagates `SET … PX` as `PXAT`). Keys the
    /// command found expired and deleted are among them, as Redis propagates an expiry as a DEL.
    pub(crate) effects: Vec<(Vec<u8>, Option<Entry>)>,
}

/// A message published on a channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Published {
    /// The channel.
    pub(crate) channel: Vec<u8>,
    /// The message.
    pub(crate) message: Vec<u8>,
    /// Whether it went by SPUBLISH (sharded pub/sub).
    pub(crate) sharded: bool,
}

thread_local! {
    /// Lua states of servers gone, for the next ones on this thread.
    static ENGINES: std::cell::RefCell<Vec<lua::Engine>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Drop for SimRedis {
    fn drop(&mut self) {
        if let Some(engine) = self.engine.take() {
            // A handful covers a schedule's servers; the pool is dropped with its thread.
            let _ = ENGINES.try_with(|pool| {
                let mut pool = pool.borrow_mut();
                if pool.len() < 8 {
                    pool.push(engine);
                }
            });
        }
    }
}

impl Default for SimRedis {
    fn default() -> Self {
        Self::new()
    }
}

impl SimRedis {
    /// An empty server.
    pub(crate) fn new() -> Self {
        Self::running(None)
    }

    /// An empty server whose scripts run as `mutant` has them (the simulation's Lua mutation testing). Its Lua
    /// state comes from this thread's pool of states of earlier servers, their script caches emptied: setting
    /// one up and compiling the scripts again cost a schedule more than running it.
    pub(crate) fn running(mutant: Option<crate::simulation::LuaMutant>) -> Self {
        let mut engine = ENGINES.with(|pool| pool.borrow_mut().pop()).unwrap_or_else(lua::Engine::new);
        engine.reset(mutant);
        Self { keyspace: Keyspace::default(), engine: Some(engine) }
    }

    /// Runs one command at the server's wall-clock time `now_us` (µs since the Unix epoch). TIME replies it
    /// (a script's further TIMEs one µs later each); a key is gone once `now_us / 1000` is past its
    /// `expires_at_ms` (Redis keeps it through that ms), and every command first deletes every such key.
    /// `args[0]` is the command name in any case. Bad input gets Redis's error reply, never a panic.
    pub(crate) fn execute(&mut self, now_us: i64, args: &[Vec<u8>]) -> Executed {
        let mut ctx = Ctx::new(now_us);
        self.keyspace.expire_all(&mut ctx);
        let found = commands::lookup(args);
        let reply = match commands::refusal(args, &found) {
            Some(refused) => refused,
            None => match found {
                Lookup::Found(command) => self.run(command.kind, &mut ctx, args),
                // `refusal` answers every other lookup.
                Lookup::UnknownSubcommand | Lookup::Unknown => Reply::error("ERR unknown command"),
            },
        };
        let (written, published) = ctx.into_written();
        let effects = written.into_iter().map(|key| (key.clone(), self.keyspace.get(&key).cloned())).collect();
        Executed { reply: reply.into_value(), published, effects }
    }

    fn engine(&mut self) -> &mut lua::Engine {
        self.engine.get_or_insert_with(lua::Engine::new)
    }

    /// Runs a command whose arity fits.
    fn run(&mut self, kind: Kind, ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
        match kind {
            Kind::Data(run) => run(&mut self.keyspace, ctx, args),
            Kind::Eval => {
                let engine = self.engine.get_or_insert_with(lua::Engine::new);
                engine.eval(&mut self.keyspace, ctx, args, false)
            }
            Kind::EvalSha => {
                let engine = self.engine.get_or_insert_with(lua::Engine::new);
                engine.eval(&mut self.keyspace, ctx, args, true)
            }
            Kind::ScriptLoad => self.engine().load(&args[2]),
            Kind::ScriptExists => self.engine().exists(&args[2..]),
            Kind::ScriptFlush => match args {
                [_, _] => self.engine().flush(),
                [_, _, mode] if parse::is(mode, "sync") || parse::is(mode, "async") => self.engine().flush(),
                _ => Reply::error("ERR SCRIPT FLUSH only support SYNC|ASYNC option"),
            },
            Kind::ScriptKill => Reply::error("NOTBUSY No scripts in execution right now."),
        }
    }

    /// Whether the script cache holds the script whose SHA1 is `sha` (any case): an EVALSHA of it runs.
    pub(crate) fn knows_script(&self, sha: &[u8]) -> bool {
        self.engine.as_ref().is_some_and(|engine| engine.knows(sha))
    }

    /// A restart without persistence: the keyspace and the script cache are gone. The Lua state stays: its
    /// globals are read-only to scripts, so a script leaves nothing in it that a new process would not have.
    pub(crate) fn restart(&mut self) {
        self.keyspace = Keyspace::default();
        self.engine().flush();
    }

    /// A replica applies its primary's effects.
    #[cfg_attr(not(test), allow(dead_code, reason = "the simulation's replicas call it"))]
    pub(crate) fn apply(&mut self, effects: &[(Vec<u8>, Option<Entry>)]) {
        for (key, entry) in effects {
            match entry {
                Some(entry) => self.keyspace.entries.insert(key.clone(), entry.clone()),
                None => self.keyspace.entries.remove(key),
            };
        }
    }

    /// The string at `key` and its ms to live (`None`: no expiry), as the server sees it at `now_us`; no side
    /// effects. `None` if absent, expired or not a string.
    #[cfg_attr(not(test), allow(dead_code, reason = "the simulation's oracle calls it"))]
    pub(crate) fn peek(&self, now_us: i64, key: &[u8]) -> Option<(&[u8], Option<i64>)> {
        let now_ms = now_us.div_euclid(1000);
        let entry = self.keyspace.get(key).filter(|e| !keyspace::expired(e.expires_at_ms, now_ms))?;
        match &entry.value {
            Data::String(s) => Some((s.as_slice(), entry.expires_at_ms.map(|at| (at - now_ms).max(0)))),
            Data::ZSet(_) => None,
        }
    }

    /// Every live key and its entry at `now_us` (for comparisons and the simulation's oracle).
    pub(crate) fn snapshot(&self, now_us: i64) -> BTreeMap<Vec<u8>, Entry> {
        let now_ms = now_us.div_euclid(1000);
        self.keyspace
            .entries
            .iter()
            .filter(|(_, e)| !keyspace::expired(e.expires_at_ms, now_ms))
            .map(|(k, e)| (k.clone(), e.clone()))
            .collect()
    }
}

/// Not public API: the simulated redis-server, for `tests/tests/sim_keyspace.rs`, which checks it against a
/// real one.
#[derive(Debug, Default)]
pub struct SimServer {
    server: SimRedis,
    /// What it published since [`SimServer::take_published`] was last called.
    published: Vec<(Vec<u8>, Vec<u8>, bool)>,
}

/// Not public API: every production script's text as servers receive it — each script plain, numbered and
/// sharded (`ACQUIRE`, `ACQUIRE numbered`, `ACQUIRE sharded`, …) — for the simulated server's tests.
pub fn production_scripts() -> Vec<(String, &'static str)> {
    crate::backend::script_sources()
}

/// A key's value as [`SimServer::snapshot`] shows it.
#[derive(Debug, Clone, PartialEq)]
pub enum SimValue {
    /// A string.
    String(Vec<u8>),
    /// A sorted set's members and scores, in Redis's order.
    ZSet(Vec<(Vec<u8>, f64)>),
}

impl SimServer {
    /// An empty server.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs one command at `now_us` (µs since the Unix epoch by the server's clock); its reply as a RESP3
    /// connection of the redis crate reads it.
    pub fn execute(&mut self, now_us: i64, args: &[Vec<u8>]) -> redis::Value {
        let done = self.server.execute(now_us, args);
        self.published.extend(done.published.into_iter().map(|p| (p.channel, p.message, p.sharded)));
        done.reply
    }

    /// The messages published since the last call, in order: channel, message, and whether by SPUBLISH.
    pub fn take_published(&mut self) -> Vec<(Vec<u8>, Vec<u8>, bool)> {
        std::mem::take(&mut self.published)
    }

    /// A restart without persistence.
    pub fn restart(&mut self) {
        self.server.restart();
        self.published.clear();
    }

    /// Every live key at `now_us`: its value and its ms to live (`None`: no expiry).
    pub fn snapshot(&self, now_us: i64) -> BTreeMap<Vec<u8>, (SimValue, Option<i64>)> {
        let now_ms = now_us.div_euclid(1000);
        let shown = |entry: Entry| {
            let value = match entry.value {
                Data::String(s) => SimValue::String(s),
                Data::ZSet(z) => SimValue::ZSet(z.iter().map(|(m, s)| (m.to_vec(), s)).collect()),
            };
            (value, entry.expires_at_ms.map(|at| (at - now_ms).max(0)))
        };
        self.server.snapshot(now_us).into_iter().map(|(k, e)| (k, shown(e))).collect()
    }
}
