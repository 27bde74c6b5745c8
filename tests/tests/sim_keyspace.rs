//! The simulated redis-server (`distlock::simulation::redis`) against a real one (issue 32): thousands of
//! seeded command sequences — every production script in its plain, numbered and sharded form with realistic
//! and hostile arguments, by EVAL and EVALSHA, raw commands with random options, ad-hoc scripts for the
//! conversions, expiries — run through both, and every reply and the keyspace afterwards must agree.
//!
//! Time: the real server's clock runs. Every command is sent in one pipeline with a TIME before it, and the
//! simulated server runs it at that time. What depends on the clock may differ by the time between the TIME
//! and the command: µs timestamps (fencing tokens, grant times, queue scores, wherever they appear) and the
//! ms left to live and since a grant are compared with a tolerance of 50 ms; everything else exactly. Error
//! replies: the code always, the message too unless a script's own run failed (its message names a line).
//!
//! `SIM_KEYSPACE_SEQUENCES=n` runs n sequences (default 2,000); `SIM_KEYSPACE_SEED=n` one sequence, printing
//! every command and both replies; `SIM_KEYSPACE_COVERAGE=1` also prints how each production script replied.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::time::{Duration, Instant};

use distlock::simulation::redis::{production_scripts, SimServer, SimValue};
use distlock_tests::RedisServer;
use redis::aio::MultiplexedConnection;
use redis::{PushInfo, PushKind, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use distlock_tests::sim_keyspace::{
    compare, same_keyspace, same_text, sharded_channels, time_of, Generator, Keyspace, Outcome,
};

/// Prints past the test harness's capture.
fn say(line: &str) {
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}

/// A number from the environment variable `name`, if set.
fn env(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(value.trim().parse().unwrap_or_else(|_| panic!("{name}={value:?} is not a number")))
}

/// The real server's side: one RESP3 connection.
struct Real {
    conn: MultiplexedConnection,
    /// What the subscriber connection receives: every PUBLISH (PSUBSCRIBE *) and every SPUBLISH on the
    /// channels a sequence may use.
    pushes: UnboundedReceiver<PushInfo>,
    /// The subscriber connection itself, kept open.
    _listener: MultiplexedConnection,
}

/// The channel the test publishes on to know that every message before it has arrived.
const BARRIER: &str = "sim_keyspace:barrier";

/// What one pipeline on the real server answered.
struct Ran {
    /// Each command's reply, with the server's clock (µs) just before it.
    replies: Vec<(i64, Value)>,
    /// The clock after the last command.
    end: i64,
    /// The keyspace right after that, when asked for.
    dump: Option<Keyspace>,
}

/// A script that reads the whole keyspace in one call: each key with its type, value and PTTL.
const DUMP: &str = "local out = {}
for _, k in ipairs(redis.call('keys', '*')) do
  local t = redis.call('type', k).ok
  local v
  if t == 'string' then v = redis.call('get', k) else v = redis.call('zrange', k, 0, -1, 'withscores') end
  out[#out + 1] = {k, t, v, redis.call('pttl', k)}
end
return out";

impl Real {
    /// Sends one pipeline: `before` (their replies not looked at), then each of `commands` after a TIME, a
    /// last TIME, and, with `dump`, the keyspace's dump. One round trip per phase keeps the test fast on a
    /// loaded machine.
    async fn run(&mut self, before: &[&[&str]], commands: &[Vec<Vec<u8>>], dump: bool) -> Ran {
        let mut pipe = redis::pipe();
        for command in before {
            let mut cmd = redis::Cmd::new();
            for arg in *command {
                cmd.arg(*arg);
            }
            pipe.add_command(cmd);
        }
        for command in commands {
            pipe.cmd("TIME");
            let mut cmd = redis::Cmd::new();
            for arg in command {
                cmd.arg(arg.as_slice());
            }
            pipe.add_command(cmd);
        }
        pipe.cmd("TIME");
        if dump {
            pipe.cmd("EVAL").arg(DUMP).arg(0);
        }
        let count = before.len() + commands.len() * 2 + 1 + usize::from(dump);
        let replies = self.conn.send_packed_commands(&pipe, 0, count).await.expect("the real server answers");
        assert_eq!(replies.len(), count, "one reply per command");
        let mut replies = replies.into_iter().skip(before.len());
        let mut out = Vec::with_capacity(commands.len());
        for _ in commands {
            let (time, reply) = (replies.next().unwrap_or(Value::Nil), replies.next().unwrap_or(Value::Nil));
            out.push((time_of(&time), reply));
        }
        let end = time_of(&replies.next().unwrap_or(Value::Nil));
        let dump = replies.next().map(|reply| parse_dump(&reply));
        Ran { replies: out, end, dump }
    }

    /// Every key a whole SCAN iteration with `options` (after the cursor) returns.
    async fn scan(&mut self, options: &[Vec<u8>]) -> Vec<Vec<u8>> {
        let mut cursor = b"0".to_vec();
        let mut keys = BTreeSet::new();
        loop {
            let ran = self.run(&[], &[scan_command(cursor, options)], false).await;
            let (next, found) = scan_reply(&ran.replies[0].1);
            keys.extend(found);
            if next == b"0" {
                return keys.into_iter().collect();
            }
            cursor = next;
        }
    }
}

/// `SCAN cursor options…`.
fn scan_command(cursor: Vec<u8>, options: &[Vec<u8>]) -> Vec<Vec<u8>> {
    [vec![b"SCAN".to_vec(), cursor], options.to_vec()].concat()
}

impl Real {
    /// The messages the real server published since the last call, in order (channel, message, whether by
    /// SPUBLISH): everything the subscriber received before a message the test publishes last.
    async fn take_published(&mut self) -> Vec<(Vec<u8>, Vec<u8>, bool)> {
        let mark = format!("{}", Instant::now().elapsed().as_nanos());
        let _: Value =
            redis::cmd("PUBLISH").arg(BARRIER).arg(&mark).query_async(&mut self.conn).await.expect("PUBLISH");
        let mut out = Vec::new();
        loop {
            let push = tokio::time::timeout(Duration::from_secs(5), self.pushes.recv()).await;
            let push = push.expect("the barrier message arrives").expect("the subscriber is open");
            let bytes = |v: &Value| match v {
                Value::BulkString(b) => b.clone(),
                other => panic!("a pushed field: {other:?}"),
            };
            let (channel, message, sharded) = match (push.kind, push.data.as_slice()) {
                (PushKind::PMessage, [_, channel, message]) => (bytes(channel), bytes(message), false),
                (PushKind::SMessage, [channel, message]) => (bytes(channel), bytes(message), true),
                _ => continue,
            };
            if channel == BARRIER.as_bytes() && message == mark.as_bytes() {
                return out;
            }
            out.push((channel, message, sharded));
        }
    }
}

/// Whether the messages published agree, their µs timestamps within the tolerance (an announcement names the
/// heir's fencing token).
fn same_published(real: &[(Vec<u8>, Vec<u8>, bool)], sim: &[(Vec<u8>, Vec<u8>, bool)]) -> bool {
    real.len() == sim.len()
        && real.iter().zip(sim).all(|((rc, rm, rs), (sc, sm, ss))| rc == sc && rs == ss && same_text(rm, sm).is_ok())
}

/// The dump script's reply as the simulated server's snapshot shows a keyspace.
fn parse_dump(reply: &Value) -> Keyspace {
    let Value::Array(entries) = reply else { panic!("the dump: {reply:?}") };
    let bulk = |v: &Value| match v {
        Value::BulkString(b) => b.clone(),
        other => panic!("the dump: {other:?}"),
    };
    let mut out = BTreeMap::new();
    for entry in entries {
        let Value::Array(fields) = entry else { panic!("the dump: {entry:?}") };
        let value = match (bulk(&fields[1]).as_slice(), &fields[2]) {
            (b"string", v) => SimValue::String(bulk(v)),
            (b"zset", Value::Array(flat)) => SimValue::ZSet(
                flat.chunks(2)
                    .map(|pair| {
                        let score = String::from_utf8(bulk(&pair[1])).ok().and_then(|s| s.parse().ok());
                        (bulk(&pair[0]), score.unwrap_or_else(|| panic!("a score: {pair:?}")))
                    })
                    .collect(),
            ),
            other => panic!("the dump: {other:?}"),
        };
        let pttl = match fields[3] {
            Value::Int(-1) => None,
            Value::Int(ms) => Some(ms),
            ref other => panic!("the dump's PTTL: {other:?}"),
        };
        out.insert(bulk(&fields[0]), (value, pttl));
    }
    out
}

/// A SCAN reply's cursor and keys.
fn scan_reply(reply: &Value) -> (Vec<u8>, Vec<Vec<u8>>) {
    match reply {
        Value::Array(parts) => match (&parts[0], &parts[1]) {
            (Value::BulkString(cursor), Value::Array(keys)) => (
                cursor.clone(),
                keys.iter()
                    .map(|k| match k {
                        Value::BulkString(k) => k.clone(),
                        other => panic!("a SCAN key: {other:?}"),
                    })
                    .collect(),
            ),
            other => panic!("a SCAN reply: {other:?}"),
        },
        other => panic!("a SCAN reply: {other:?}"),
    }
}

/// What a run of sequences found.
#[derive(Default)]
struct Tally {
    sequences: u64,
    commands: u64,
    differences: Vec<String>,
    /// Scripts' own failures whose messages differ (the code and the failure agree): reported, not counted.
    script_messages: u64,
    /// Messages published, compared.
    messages: u64,
    /// Expiry phases that could not be judged: the real server took longer than the keys' lives.
    racy: u64,
    /// Per production script (variants together), how often the real server replied in each way.
    outcomes: BTreeMap<String, BTreeMap<String, u64>>,
}

/// A reply in a word, for the coverage table: an error's code, a fence (an integer or its text), an integer,
/// or an array by its first element (the numbered frame's reply inside it).
fn outcome(what: &str, reply: &Value) -> String {
    let reply = match reply {
        Value::Array(framed) if what.contains(' ') && framed.len() == 2 => &framed[1],
        other => other,
    };
    match reply {
        Value::ServerError(e) => format!("error {}", e.code()),
        Value::Int(n) if *n >= 1_000_000_000_000_000 => "fence".into(),
        Value::Int(n) => format!("{n}"),
        Value::BulkString(text)
            if std::str::from_utf8(text)
                .ok()
                .and_then(|t| t.parse::<i64>().ok())
                .is_some_and(|n| n >= 1_000_000_000_000_000) =>
        {
            "fence".into()
        }
        Value::BulkString(_) => "string".into(),
        Value::Array(items) => match items.first() {
            None => "[]".into(),
            Some(first) => format!("[{} …]", outcome("", first)),
        },
        Value::Nil => "nil".into(),
        other => format!("{other:?}"),
    }
}

/// Runs sequence `seed` on both servers, each started afresh (FLUSHALL and SCRIPT FLUSH on the real one, a
/// restart of the simulated one), and records what differs.
async fn sequence(seed: u64, real: &mut Real, sim: &mut SimServer, trace: bool, tally: &mut Tally) {
    let mut generator = Generator::new(seed);
    sim.restart();
    let mut differences = Vec::new();
    let phases = generator.phases();
    let mut dump = None;
    for (i, phase) in phases.iter().enumerate() {
        let commands: Vec<Vec<Vec<u8>>> = phase.steps.iter().map(|s| s.args.clone()).collect();
        let before: &[&[&str]] = if i == 0 { &[&["FLUSHALL"], &["SCRIPT", "FLUSH"]] } else { &[] };
        let ran = real.run(before, &commands, i + 1 == phases.len()).await;
        if let Some(expiry) = phase.short_lived_until(&ran.replies) {
            if ran.end >= expiry - 5_000 {
                // The keys may have expired while the phase ran: its replies cannot be judged.
                tally.racy += 1;
                return;
            }
        }
        for (step, (at, reply)) in phase.steps.iter().zip(ran.replies) {
            let simulated = sim.execute(at, &step.args);
            tally.commands += 1;
            if step.is_script() && step.what() != "snippet" {
                let script = step.what().split(' ').next().unwrap_or_default().to_owned();
                *tally.outcomes.entry(script).or_default().entry(outcome(step.what(), &reply)).or_default() += 1;
            }
            if trace {
                say(&format!("{}\n  real: {reply:?}\n  sim:  {simulated:?}", step.shown()));
            }
            match compare(&reply, &simulated, step) {
                Ok(Outcome::Same) => {}
                Ok(Outcome::ScriptMessage) => tally.script_messages += 1,
                Err(why) => differences
                    .push(format!("seed {seed}: {}\n  real: {reply:?}\n  sim:  {simulated:?}\n  {why}", step.shown())),
            }
        }
        if let Some(keys) = &phase.wait_for_expiry {
            wait_until_gone(real, keys).await;
        }
        dump = ran.dump.map(|keys| (keys, ran.end));
    }
    let (real_published, sim_published) = (real.take_published().await, sim.take_published());
    tally.messages += real_published.len() as u64;
    if !same_published(&real_published, &sim_published) {
        let shown = |m: &[(Vec<u8>, Vec<u8>, bool)]| -> Vec<String> {
            m.iter()
                .map(|(c, m, s)| {
                    format!(
                        "{}{} {}",
                        if *s { "S " } else { "" },
                        String::from_utf8_lossy(c),
                        String::from_utf8_lossy(m)
                    )
                })
                .collect()
        };
        differences.push(format!(
            "seed {seed}: the messages published differ\n  real: {:?}\n  sim:  {:?}",
            shown(&real_published),
            shown(&sim_published)
        ));
    }
    let (real_keys, at) = dump.expect("the last phase dumps the keyspace");
    let sim_keys = sim.snapshot(at);
    if let Err(why) = same_keyspace(&real_keys, &sim_keys) {
        differences
            .push(format!("seed {seed}: the keyspaces differ: {why}\n  real: {real_keys:?}\n  sim:  {sim_keys:?}"));
    }
    // SCAN iterates in round trips: every fourth sequence.
    if seed.is_multiple_of(4) {
        for options in generator.scans() {
            let found = real.scan(&options).await;
            let simulated = sim_scan(sim, at, &options);
            if found != simulated {
                let shown: Vec<_> = options.iter().map(|o| String::from_utf8_lossy(o)).collect();
                differences
                    .push(format!("seed {seed}: SCAN {}\n  real: {found:?}\n  sim:  {simulated:?}", shown.join(" ")));
            }
        }
    }
    tally.sequences += 1;
    tally.differences.extend(differences);
}

/// Every key the simulated server's SCAN returns over a whole iteration with `options`.
fn sim_scan(sim: &mut SimServer, at: i64, options: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut cursor = b"0".to_vec();
    let mut keys = BTreeSet::new();
    for _ in 0..10_000 {
        let (next, found) = scan_reply(&sim.execute(at, &scan_command(cursor, options)));
        keys.extend(found);
        if next == b"0" {
            break;
        }
        cursor = next;
    }
    keys.into_iter().collect()
}

/// Waits (polling EXISTS, at most 5 s) until none of `keys` is on the real server any more.
async fn wait_until_gone(real: &mut Real, keys: &[Vec<u8>]) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut exists = vec![b"EXISTS".to_vec()];
    exists.extend(keys.iter().cloned());
    loop {
        let mut ran = real.run(&[], std::slice::from_ref(&exists), false).await;
        if matches!(ran.replies.pop(), Some((_, Value::Int(0)))) || Instant::now() > deadline {
            return;
        }
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
}

/// A real server and a RESP3 connection to it.
async fn real_server() -> (RedisServer, Real) {
    let server = RedisServer::new();
    let url = format!("redis://127.0.0.1:{}/?protocol=resp3", server.port());
    let client = redis::Client::open(url).expect("a RESP3 URL");
    // A loaded machine may keep the server from answering within the crate's default half second.
    let patient = redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(30)));
    let conn = client.get_multiplexed_async_connection_with_config(&patient).await.expect("a RESP3 connection");
    let (sender, pushes) = tokio::sync::mpsc::unbounded_channel();
    let config = patient.set_push_sender(sender);
    let mut listener = client.get_multiplexed_async_connection_with_config(&config).await.expect("a subscriber");
    let _: Value = redis::cmd("PSUBSCRIBE").arg("*").query_async(&mut listener).await.expect("PSUBSCRIBE");
    let _: Value =
        redis::cmd("SSUBSCRIBE").arg(sharded_channels()).query_async(&mut listener).await.expect("SSUBSCRIBE");
    (server, Real { conn, pushes, _listener: listener })
}

/// How many servers run sequences side by side: while one waits for keys to expire or for its server, the
/// others go on.
const WORKERS: u64 = 3;

/// The seeded sequences on both servers: no difference in replies, published messages, keyspaces or SCANs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulated_keyspace_agrees_with_redis_server() {
    assert!(!production_scripts().is_empty(), "the production scripts");
    let started = Instant::now();
    let mut tally = Tally::default();
    if let Some(seed) = env("SIM_KEYSPACE_SEED") {
        let (_server, mut real) = real_server().await;
        sequence(seed, &mut real, &mut SimServer::new(), true, &mut tally).await;
    } else {
        let sequences = env("SIM_KEYSPACE_SEQUENCES").unwrap_or(2_000);
        let mut workers = tokio::task::JoinSet::new();
        for worker in 0..WORKERS {
            workers.spawn(async move {
                let (server, mut real) = real_server().await;
                let (mut sim, mut tally) = (SimServer::new(), Tally::default());
                for seed in (worker..sequences).step_by(WORKERS as usize) {
                    sequence(seed, &mut real, &mut sim, false, &mut tally).await;
                }
                drop(server);
                tally
            });
        }
        while let Some(done) = workers.join_next().await {
            let done = done.expect("a worker");
            tally.sequences += done.sequences;
            tally.commands += done.commands;
            tally.script_messages += done.script_messages;
            tally.racy += done.racy;
            tally.messages += done.messages;
            for (script, outcomes) in done.outcomes {
                for (outcome, count) in outcomes {
                    *tally.outcomes.entry(script.clone()).or_default().entry(outcome).or_default() += count;
                }
            }
            tally.differences.extend(done.differences);
        }
    }
    for difference in tally.differences.iter().take(20) {
        say(difference);
    }
    if std::env::var_os("SIM_KEYSPACE_COVERAGE").is_some() {
        for (script, outcomes) in &tally.outcomes {
            let mut counts: Vec<(&String, &u64)> = outcomes.iter().collect();
            counts.sort_by(|a, b| b.1.cmp(a.1));
            let shown: Vec<String> = counts.iter().take(8).map(|(o, n)| format!("{o} {n}")).collect();
            say(&format!("  {script}: {}", shown.join(", ")));
        }
    }
    say(&format!(
        "  ({:.1} s; {} messages published; {} script failures with the same code and another message; {} expiry \
         phases too slow to judge)",
        started.elapsed().as_secs_f64(),
        tally.messages,
        tally.script_messages,
        tally.racy
    ));
    say(&format!(
        "sim_keyspace: {} sequences, {} commands, {} differences",
        tally.sequences,
        tally.commands,
        tally.differences.len()
    ));
    assert!(
        tally.differences.is_empty(),
        "{} differences; replay one with SIM_KEYSPACE_SEED=<seed>",
        tally.differences.len()
    );
}

/// A key lives through the ms its expiry names and is gone the ms after (Redis's `keyIsExpired`: `now > when`),
/// on both servers: a key set to expire 3 ms ahead is read in pipelines whose TIMEs before and after the read
/// fall in one ms, until one such read lands in the expiry's ms and one in the ms after.
#[tokio::test(flavor = "current_thread")]
async fn keys_expire_after_the_ms_of_their_expiry_on_both_servers() {
    let (_server, mut real) = real_server().await;
    let mut sim = SimServer::new();
    let (mut at_expiry, mut after) = (None, None);
    for _ in 0..200 {
        let now = real.run(&[], &[], false).await.end;
        let when = now.div_euclid(1000) + 3;
        let set = vec![b"SET".to_vec(), b"k".to_vec(), b"v".to_vec(), b"PXAT".to_vec(), when.to_string().into_bytes()];
        let ran = real.run(&[&["DEL", "k"]], std::slice::from_ref(&set), false).await;
        sim.restart();
        sim.execute(ran.replies[0].0, &set);
        let deadline = Instant::now() + Duration::from_millis(50);
        while Instant::now() < deadline && (at_expiry.is_none() || after.is_none()) {
            let ran = real.run(&[], &[vec![b"GET".to_vec(), b"k".to_vec()]], false).await;
            let (before, reply) = &ran.replies[0];
            let ms = before.div_euclid(1000);
            if ms != ran.end.div_euclid(1000) || ms < when {
                continue;
            }
            let simulated = sim.execute(*before, &[b"GET".to_vec(), b"k".to_vec()]);
            let seen = (reply.clone(), simulated);
            match ms - when {
                0 if at_expiry.is_none() => at_expiry = Some(seen),
                1 if after.is_none() => after = Some(seen),
                _ => {}
            }
            if ms > when + 1 {
                break;
            }
        }
        if at_expiry.is_some() && after.is_some() {
            break;
        }
        (at_expiry, after) = (None, None);
    }
    let (Some(at_expiry), Some(after)) = (at_expiry, after) else {
        say("  skipped: no read landed in the ms of the expiry and the ms after it (a loaded machine)");
        return;
    };
    assert_eq!(at_expiry, (Value::BulkString(b"v".to_vec()), Value::BulkString(b"v".to_vec())), "in the expiry's ms");
    assert_eq!(after, (Value::Nil, Value::Nil), "the ms after");
}
