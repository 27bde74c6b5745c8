//! The seeded command sequences of the simulated redis-server's differential test (`tests/sim_keyspace.rs`):
//! what each sequence sends, and which parts of each reply depend on the clock.
//!
//! A sequence is a main phase — production scripts (plain, numbered, sharded; EVAL, EVALSHA, NOSCRIPT) on a
//! few locks with valid and wrong tokens, foreign values and wrong types at their keys, short or garbage
//! arguments; raw commands with random options, valid and not; ad-hoc scripts for Redis's conversions and
//! errors — whose keys all live for seconds or go at once, so nothing expires while it runs. One sequence in
//! twelve adds an expiry phase: keys (a lock, its queue and waiter, strings) written to live 60–120 ms, read
//! at once, then read and used again once the real server no longer has them.

use std::collections::BTreeSet;
use std::sync::OnceLock;

use distlock::simulation::redis::production_scripts;

/// Valid owner tokens; the third shares the first's second half (what a release sent again compares).
const TOKENS: [&str; 4] = [
    "0123456789abcdef0123456789abcdef",
    "fedcba9876543210fedcba9876543210",
    "ffffffffffffffff0123456789abcdef",
    "a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6",
];
/// Tokens no client sends: empty, short, one too long, not hex, FREED's and NOBODY's look, upper case.
const BAD_TOKENS: [&str; 7] = [
    "",
    "abc",
    "0123456789abcdef0123456789abcdef0",
    "0123456789abcdef0123456789abcdeX",
    "================0123456789abcdef",
    "----------------0123456789abcdef",
    "0123456789ABCDEF0123456789ABCDEF",
];
/// Lock records the main phase uses.
const RECORDS: [&str; 3] = ["{a}", "{b}", "lock:{c}"];
/// Keys raw commands write and read: the records, their derived keys, and others.
const KEYS: [&str; 10] = [
    "{a}",
    "{b}",
    "lock:{c}",
    "{a}:queue",
    "{b}:queue",
    "{a}:last",
    "{a}:waiter:fedcba9876543210fedcba9876543210",
    "mark",
    "s1",
    "z1",
];
/// Values raw commands write: plain ones, and ones that look like records (or nearly).
const VALUES: [&str; 9] = [
    "v",
    "",
    "123",
    "0123456789abcdef0123456789abcdef:17:1700000000000000:5:owner",
    "fedcba9876543210fedcba9876543210+18:1700000000000000:0:",
    "================0123456789abcdef:5:1700000000000000:0:",
    "----------------0123456789abcdef:5:1700000000000000:0:",
    "1:2:3:4",
    "abc def\u{e9}",
];
const HOLDERS: [&str; 4] = ["5:owner", "7:billing:job:42", "0:", "12:web-3:4242app::jobs"];
const BAD: [&str; 7] = ["0", "-1", "abc", "", "1.5", "9223372036854775807", "1e3"];
/// Lives long enough that nothing expires while a phase runs.
const TTLS: [&str; 4] = ["30000", "45000", "60000", "120000"];

/// The ad-hoc scripts: the conversions both ways, `redis.*`, errors, globals, writes before a failure.
const SNIPPETS: [&str; 40] = [
    "return {1, 2.9, -2.9, 'x', false, true, {ok='fine'}, {err='E bad'}, nil, 4}",
    "return 1e20",
    "return -7.99",
    "return redis.call('get', KEYS[1])",
    "return redis.pcall('zadd', KEYS[1], 'x', 'm')",
    "return redis.pcall('zadd', KEYS[1], 1, 'm')",
    "return redis.pcall('nosuch')",
    "return redis.pcall('get')",
    "return redis.pcall('eval', 'return 1', 0)",
    "return redis.error_reply('oops')",
    "return redis.error_reply('MY bad')",
    "return redis.status_reply('FINE')",
    "return redis.status_reply(5)",
    "return redis.sha1hex(ARGV[1] or '')",
    "x = 1",
    "return undefined_global",
    "string.upper = nil",
    "redis.call('set', KEYS[1], 'before') return redis.call('nosuch')",
    "redis.call('set', KEYS[1], 'before') error('boom')",
    "local ok, e = pcall(redis.call, 'zadd', KEYS[1], 'x', 'y') return {tostring(ok), e}",
    "local ok, e = pcall(error, {err='MINE x'}) return e",
    "return {redis.call('zadd', KEYS[1], 1.5, 'a'), redis.call('zrange', KEYS[1], 0, -1, 'withscores')}",
    "return redis.call('zscore', KEYS[1], 'a')",
    "return redis.call('zpopmin', KEYS[1], 2)",
    "return redis.call('exists', KEYS[1], KEYS[1], 'nokey')",
    "return redis.call('ping')",
    "redis.setresp(3) return redis.call('zrange', KEYS[1], 0, -1, 'withscores')",
    "redis.setresp(3) return redis.call('get', 'no such key') == nil",
    "redis.setresp(3) return {true, false, redis.call('zscore', KEYS[1], 'a')}",
    "return redis.call('set', KEYS[1], 'v', 'px', 0)",
    "return {#KEYS, #ARGV, ARGV[1], KEYS[1]}",
    "return {double=1.5}",
    "return redis.log(redis.LOG_WARNING, 'x')",
    "redis.log(9, 'x')",
    "return redis.REDIS_VERSION",
    "return pcall(redis.call, 'get', KEYS[1])",
    "return redis.call('getrange', KEYS[1], 0, -1)",
    "return redis.call('del', KEYS[1], KEYS[1])",
    "local function f() return redis.call('zcard', KEYS[1]) end return f() + 1",
    "return 1 +",
];

/// Which parts of a reply depend on the clock, by their index paths from the reply's top: ms (lives, ages)
/// and µs (since a grant or a place in a queue). µs timestamps are recognised wherever they are; TIME's
/// reply is one.
#[derive(Debug, Clone, Default)]
pub struct Check {
    ms: Vec<Vec<usize>>,
    us: Vec<Vec<usize>>,
    time: bool,
}

impl Check {
    /// Whether `a` and `b` at `path` may differ as the clock does: by at most 50 ms, both not negative.
    pub fn tolerates(&self, path: &[usize], a: i64, b: i64) -> bool {
        let within = |limit: i64| a >= 0 && b >= 0 && (a - b).abs() <= limit;
        (self.ms.iter().any(|p| p == path) && within(50)) || (self.us.iter().any(|p| p == path) && within(50_000))
    }

    /// Whether the reply at `path` is TIME's.
    pub fn is_time_pair(&self, path: &[usize]) -> bool {
        self.time && path.is_empty()
    }

    /// Whether the string at `path` is one of TIME's fields (compared as a whole by `is_time_pair`).
    pub fn is_time(&self, path: &[usize]) -> bool {
        self.time && path.len() == 1
    }
}

/// One command and how to compare its reply.
#[derive(Debug, Clone)]
pub struct Step {
    pub args: Vec<Vec<u8>>,
    pub check: Check,
    /// What it runs, for messages: a production script's name, or the command.
    what: String,
}

impl Step {
    fn raw(args: &[&str]) -> Self {
        Self::bytes(args.iter().map(|a| a.as_bytes().to_vec()).collect(), Check::default())
    }

    fn bytes(args: Vec<Vec<u8>>, check: Check) -> Self {
        let what = String::from_utf8_lossy(&args[0]).into_owned();
        Self { args, check, what }
    }

    /// Whether it runs a script (EVAL or EVALSHA).
    pub fn is_script(&self) -> bool {
        let name = self.args[0].to_ascii_lowercase();
        name == b"eval" || name == b"evalsha"
    }

    /// The command as text, scripts by name rather than source.
    pub fn shown(&self) -> String {
        let args: Vec<String> = self
            .args
            .iter()
            .enumerate()
            .map(|(i, a)| {
                if i == 1 && self.is_script() && a.len() > 60 {
                    "<source>".into()
                } else {
                    format!("{:?}", String::from_utf8_lossy(a))
                }
            })
            .collect();
        format!("[{}] {}", self.what, args.join(" "))
    }
}

/// Commands sent in one pipeline.
#[derive(Debug, Default)]
pub struct Phase {
    pub steps: Vec<Step>,
    /// Steps that write a key to live a short time: their index and the key's life in ms.
    short: Vec<(usize, i64)>,
    /// Keys to wait for the real server to expire after the phase.
    pub wait_for_expiry: Option<Vec<Vec<u8>>>,
}

impl Phase {
    /// When the first short-lived key of the phase expires (µs by the server's clock), given the phase's
    /// replies with their times; `None` when it writes none.
    pub fn short_lived_until<T>(&self, replies: &[(i64, T)]) -> Option<i64> {
        self.short.iter().filter_map(|&(i, ms)| replies.get(i).map(|(at, _)| at + ms * 1000)).min()
    }
}

/// A production script: its name (with its variant), source and SHA1.
#[derive(Debug)]
struct Script {
    name: String,
    source: &'static str,
    sha: String,
}

/// Every production script with its SHA1, computed once for all sequences.
fn scripts() -> &'static [Script] {
    static SCRIPTS: OnceLock<Vec<Script>> = OnceLock::new();
    SCRIPTS.get_or_init(|| {
        production_scripts()
            .into_iter()
            .map(|(name, source)| Script { name, source, sha: redis::Script::new(source).get_hash().to_owned() })
            .collect()
    })
}

/// Whether sequence `seed` has an expiry phase (one in sixteen), which waits for keys to expire.
pub fn has_expiry_phase(seed: u64) -> bool {
    seed % 16 == 5
}

/// Makes the sequences.
#[derive(Debug)]
pub struct Generator {
    rng: fastrand::Rng,
    scripts: &'static [Script],
    /// The SHA1s the real server has cached, as far as the sequence's commands tell.
    loaded: BTreeSet<String>,
    /// Call numbers for the numbered scripts.
    calls: u64,
    seed: u64,
}

impl Generator {
    /// The generator of sequence `seed`.
    pub fn new(seed: u64) -> Self {
        Self { rng: fastrand::Rng::with_seed(seed), scripts: scripts(), loaded: BTreeSet::new(), calls: 0, seed }
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[self.rng.usize(..from.len())]
    }

    /// Mostly a good value from `good`, sometimes a bad one.
    fn field(&mut self, good: &[&'static str]) -> &'static str {
        if self.rng.u8(..100) < 88 {
            self.pick(good)
        } else {
            self.pick(&BAD)
        }
    }

    fn token(&mut self) -> &'static str {
        if self.rng.u8(..100) < 88 {
            self.pick(&TOKENS)
        } else {
            self.pick(&BAD_TOKENS)
        }
    }

    /// A token for an attempt, which writes it into a record: a bad one still has the 32 characters of a
    /// token. (A shorter or longer one shifts the record's fields, and the scripts then read digits of the
    /// grant's time as the fence: right on both servers, but a value that depends on the µs the script ran.)
    fn acquire_token(&mut self) -> &'static str {
        if self.rng.u8(..100) < 88 {
            self.pick(&TOKENS)
        } else {
            self.pick(&BAD_TOKENS[3..])
        }
    }

    /// The phases of the sequence.
    pub fn phases(&mut self) -> Vec<Phase> {
        let mut phases = Vec::new();
        let mut main = Phase::default();
        for _ in 0..self.rng.usize(8..40) {
            let step = match self.rng.u8(..100) {
                0..50 => self.script_step(),
                50..62 => self.snippet_step(),
                _ => self.raw_step(),
            };
            main.steps.push(step);
        }
        phases.push(main);
        if has_expiry_phase(self.seed) {
            phases.extend(self.expiry_phases());
        }
        phases
    }

    /// SCANs to compare after the sequence: a pattern and a COUNT.
    pub fn scans(&mut self) -> Vec<(Vec<u8>, u32)> {
        let patterns =
            ["*", "{a}*", "*:queue", "?a*", "[a-c]*", "{[ab]}*", "*waiter*", "\\{a\\}*", "[^{]*", "*[", "s?"];
        (0..2).map(|_| (self.pick(&patterns).as_bytes().to_vec(), self.rng.u32(1..12))).collect()
    }

    /// A production script call.
    fn script_step(&mut self) -> Step {
        // Mostly the scripts that change locks; every script now and then.
        let weights: &[(&str, u8)] = &[
            ("ACQUIRE", 30),
            ("RELEASE", 16),
            ("BATCH", 10),
            ("ACQUIRE_PLAIN", 5),
            ("ACQUIRE_ALL", 5),
            ("RENEW", 5),
            ("RENEW_MANY", 4),
            ("WITHDRAW", 5),
            ("INFO", 5),
            ("WAITERS", 4),
            ("REMAINING", 3),
            ("FORCE_UNLOCK", 3),
            ("BATCH_SPREAD", 3),
            ("RENEW_SPREAD", 2),
        ];
        let mut roll = self.rng.u8(..weights.iter().map(|w| w.1).sum::<u8>());
        let name = weights
            .iter()
            .find(|(_, w)| {
                roll < *w || {
                    roll -= w;
                    false
                }
            })
            .map_or("ACQUIRE", |w| w.0);
        let variant = ["", " numbered", " sharded"][self.rng.usize(..3)];
        let (keys, mut argv, mut check) = self.script_args(name);
        if !variant.is_empty() {
            self.calls += 1;
            argv.push(self.calls.to_string());
            // The numbered frame replies {call, reply}.
            let under = |paths: Vec<Vec<usize>>| paths.into_iter().map(|p| [vec![1], p].concat()).collect();
            check = Check { ms: under(check.ms), us: under(check.us), time: false };
        }
        // Sometimes a script cut short: its last arguments left out.
        if self.rng.u8(..100) < 6 && !argv.is_empty() {
            let keep = self.rng.usize(..argv.len());
            argv.truncate(keep);
        }
        let full = format!("{name}{variant}");
        let index = self.scripts.iter().position(|s| s.name == full).unwrap_or_else(|| panic!("no script {full}"));
        let (sha, source) = (self.scripts[index].sha.clone(), self.scripts[index].source);
        let by_sha = if self.loaded.contains(&sha) { self.rng.u8(..100) < 80 } else { self.rng.u8(..100) < 25 };
        let mut args: Vec<Vec<u8>> = vec![
            if by_sha { b"EVALSHA".to_vec() } else { b"EVAL".to_vec() },
            if by_sha { sha.clone().into_bytes() } else { source.as_bytes().to_vec() },
            keys.len().to_string().into_bytes(),
        ];
        args.extend(keys.into_iter().map(String::into_bytes));
        args.extend(argv.into_iter().map(String::into_bytes));
        if !by_sha {
            self.loaded.insert(sha);
        }
        Step { args, check, what: full }
    }

    /// KEYS, ARGV and the clock-dependent parts of the reply of one call of script `name`.
    fn script_args(&mut self, name: &str) -> (Vec<String>, Vec<String>, Check) {
        let record = |g: &mut Self| g.pick(&RECORDS).to_owned();
        let mut check = Check::default();
        let s = |v: &str| v.to_owned();
        let (keys, argv) = match name {
            "ACQUIRE" => {
                check.ms.push(vec![2]);
                let mut argv = vec![s(self.acquire_token()), s(self.field(&TTLS)), s(self.field(&HOLDERS))];
                if self.rng.bool() {
                    argv.extend([
                        s(self.field(&["30000", "90000"])),
                        s(self.field(&["20000", "40000"])),
                        s(self.field(&["1", "2", "9"])),
                    ]);
                }
                (vec![record(self)], argv)
            }
            "ACQUIRE_PLAIN" => {
                check.ms.extend([vec![1], vec![2]]);
                let mark = s(self.pick(&["mark", "mark", "{a}", "{a}:queue"]));
                (vec![record(self)], vec![s(self.acquire_token()), s(self.field(&TTLS)), s(self.field(&HOLDERS)), mark])
            }
            "ACQUIRE_ALL" => {
                let mut keys: Vec<String> = RECORDS.iter().map(|r| s(r)).filter(|_| self.rng.bool()).collect();
                if keys.is_empty() || self.rng.u8(..10) == 0 {
                    keys.push(record(self));
                }
                let mut argv = vec![s(self.field(&TTLS)), s(self.field(&HOLDERS))];
                argv.extend((0..keys.len()).map(|_| s(self.acquire_token())));
                (keys, argv)
            }
            "RELEASE" => {
                let mut argv = vec![s(self.token())];
                match self.rng.u8(..6) {
                    0 => argv.push(s(self.field(&["0", "30000", "90000"]))),
                    1 => argv.extend([s(self.field(&["0", "30000"])), s("1")]),
                    _ => {}
                }
                (vec![record(self)], argv)
            }
            "BATCH" | "BATCH_SPREAD" => return self.batch_args(name == "BATCH_SPREAD"),
            "RENEW" => (vec![record(self)], vec![s(self.token()), s(self.field(&TTLS))]),
            "RENEW_MANY" => {
                let keys: Vec<String> = (0..self.rng.usize(1..4)).map(|_| record(self)).collect();
                let argv = keys.iter().flat_map(|_| [s(self.token()), s(self.field(&TTLS))]).collect::<Vec<_>>();
                (keys, argv)
            }
            "RENEW_SPREAD" => {
                let argv = (0..self.rng.usize(1..4))
                    .flat_map(|_| [record(self), s(self.token()), s(self.field(&TTLS))])
                    .collect::<Vec<_>>();
                (vec![record(self)], argv)
            }
            "WITHDRAW" => {
                check.ms.push(vec![1]);
                (vec![record(self)], vec![s(self.token())])
            }
            "REMAINING" => {
                check.ms.push(vec![]);
                (vec![record(self)], vec![s(self.token())])
            }
            "INFO" => {
                check.us.push(vec![2]);
                check.ms.push(vec![3]);
                (vec![record(self)], vec![])
            }
            "FORCE_UNLOCK" => (vec![record(self)], vec![s(self.pick(&["wake", "*"]))]),
            "WAITERS" => {
                for i in 0..8 {
                    check.us.push(vec![i, 1]);
                    check.ms.push(vec![i, 2]);
                }
                (vec![record(self)], vec![s(self.field(&["1", "3", "10"]))])
            }
            other => panic!("no arguments for {other}"),
        };
        (keys, argv, check)
    }

    /// BATCH's (or BATCH_SPREAD's) KEYS and ARGV: one to five operations of any kind, now and then an unknown
    /// one.
    fn batch_args(&mut self, spread: bool) -> (Vec<String>, Vec<String>, Check) {
        let ops: String = (0..self.rng.usize(1..6))
            .map(|_| self.pick(&["a", "a", "b", "p", "q", "r", "r", "k", "s", "x"]).to_owned())
            .collect();
        let mut check = Check::default();
        let (mut records, mut args) = (Vec::new(), Vec::new());
        for (i, op) in ops.chars().enumerate() {
            check.ms.push(vec![i, 2]);
            records.push(self.pick(&RECORDS).to_owned());
            let token = if "abpq".contains(op) { self.acquire_token() } else { self.token() }.to_owned();
            match op {
                'a' => args.extend([token, self.field(&TTLS).into(), self.field(&HOLDERS).into()]),
                'b' | 'r' => args.push(token),
                'p' => {
                    check.ms.push(vec![i]);
                    args.extend([token, self.field(&TTLS).into(), self.field(&HOLDERS).into(), "mark".into()]);
                }
                'q' => args.extend([
                    token,
                    self.field(&TTLS).into(),
                    self.field(&HOLDERS).into(),
                    self.field(&["30000", "90000"]).into(),
                    self.field(&["20000", "40000"]).into(),
                    self.field(&["1", "7"]).into(),
                ]),
                'k' => args.extend([token, self.field(&["0", "30000", "90000"]).into()]),
                's' => args.extend([token, self.field(&["0", "30000"]).into(), "1".into()]),
                _ => {}
            }
        }
        let mut argv = vec![ops];
        if spread {
            let first = records[0].clone();
            argv.extend(records);
            argv.extend(args);
            (vec![first], argv, check)
        } else {
            argv.extend(args);
            (records, argv, check)
        }
    }

    /// An ad-hoc script, by EVAL.
    fn snippet_step(&mut self) -> Step {
        let snippet = self.pick(&SNIPPETS);
        let key = self.pick(&KEYS);
        let arg = self.pick(&VALUES);
        let mut step = Step::raw(&["EVAL", snippet, "1", key, arg]);
        step.what = "snippet".into();
        step
    }

    /// A raw command: any the simulated server knows, with random options, valid or not.
    fn raw_step(&mut self) -> Step {
        let k = self.pick(&KEYS);
        let k2 = self.pick(&KEYS);
        let v = self.pick(&VALUES);
        let member = self.pick(&["a", "b", "c", TOKENS[0]]);
        let score = |g: &mut Self| {
            g.pick(&[
                "1",
                "2.5",
                "-3",
                "1700000000123456",
                "inf",
                "-inf",
                "+inf",
                "1e3",
                "0x10",
                "abc",
                "nan",
                " 1",
                "",
                "1.5e308",
                "0.1",
            ])
        };
        let args: Vec<&str> = match self.rng.u8(..30) {
            0 => vec!["GET", k],
            1 => vec!["GETDEL", k],
            2 => vec!["TYPE", k],
            3 => return Step { check: Check { ms: vec![vec![]], ..Check::default() }, ..Step::raw(&["PTTL", k]) },
            4 => vec!["DEL", k, k2, k],
            5 => vec!["EXISTS", k, k2, k],
            6 => vec!["ZCARD", k],
            7 => vec!["ZSCORE", k, member],
            8 => vec!["ZREM", k, member, self.pick(&["a", "b"])],
            9 => vec!["ECHO", v],
            10 => [vec!["PING"], vec![v; self.rng.usize(..3)]].concat(),
            11 => return Step { check: Check { time: true, ..Check::default() }, ..Step::raw(&["TIME"]) },
            12..=15 => {
                let mut args = vec!["SET", k, v];
                for _ in 0..self.rng.usize(..4) {
                    match self.rng.u8(..12) {
                        0 => args.push("NX"),
                        1 => args.push("XX"),
                        2 => args.push("GET"),
                        3 => args.push("KEEPTTL"),
                        4 => args.extend(["EX", self.pick(&["30", "100", "0", "-5", "abc", "9223372036854775807"])]),
                        5 | 6 => {
                            args.extend(["PX", self.pick(&["30000", "90000", "0", "-5", "abc", "9223372036854775807"])])
                        }
                        7 => args.extend(["EXAT", self.pick(&["4102444800", "1000", "0"])]),
                        8 => args.extend(["PXAT", self.pick(&["4102444800000", "1000", "-1"])]),
                        9 => args.push("px"),
                        10 => args.push("FOO"),
                        _ => args.push("get"),
                    }
                }
                args
            }
            // Ranges never cut through a µs time in a value (records, R:last, the lock-state mark hold them):
            // what such a cut leaves depends on the µs the time was read at.
            16 => {
                let key = self.pick(&["s1", "z1", KEYS[6]]);
                vec!["SETRANGE", key, self.pick(&["0", "3", "40", "-1", "abc", "536870912"]), v]
            }
            17 => {
                let start = if RECORDS.contains(&k) {
                    self.pick(&["0", "1", "5", "-1000", "abc"])
                } else {
                    self.pick(&["0", "-1000", "abc"])
                };
                vec!["GETRANGE", k, start, self.pick(&["-1", "31", "32", "100", "abc"])]
            }
            18 | 19 => {
                let mut args =
                    vec!["PEXPIRE", k, self.pick(&["30000", "90000", "0", "-1", "abc", "9223372036854775807"])];
                for _ in 0..self.rng.usize(..3) {
                    args.push(self.pick(&["NX", "XX", "GT", "LT", "nx", "FOO"]));
                }
                args
            }
            20 | 21 => {
                let mut args = vec!["ZADD", k];
                for _ in 0..self.rng.usize(..3) {
                    args.push(self.pick(&["NX", "XX", "GT", "LT", "CH", "INCR"]));
                }
                for _ in 0..self.rng.usize(1..4) {
                    args.extend([score(self), self.pick(&["a", "b", "c", TOKENS[1]])]);
                }
                if self.rng.u8(..10) == 0 {
                    args.pop();
                }
                args
            }
            22 | 23 => {
                let (by, bounds): (Option<&str>, [&str; 7]) = match self.rng.u8(..3) {
                    0 => (None, ["0", "-1", "1", "5", "-100", "abc", "2"]),
                    1 => (Some("BYSCORE"), ["-inf", "+inf", "(1", "2.5", "1700000000000000", "abc", "(abc"]),
                    _ => (Some("BYLEX"), ["-", "+", "[a", "(b", "c", "[b", "(a"]),
                };
                let mut args = vec!["ZRANGE", k, self.pick(&bounds), self.pick(&bounds)];
                args.extend(by);
                if self.rng.bool() {
                    args.push("REV");
                }
                if self.rng.u8(..4) == 0 {
                    args.extend(["LIMIT", self.pick(&["0", "1", "-1"]), self.pick(&["1", "2", "-1", "0"])]);
                }
                if self.rng.bool() {
                    args.push("WITHSCORES");
                }
                args
            }
            24 => {
                [vec!["ZPOPMIN", k], vec![self.pick(&["1", "2", "0", "-1", "abc", "10"]); self.rng.usize(..3)]].concat()
            }
            25 => vec![self.pick(&["PUBLISH", "SPUBLISH"]), k, v],
            26 => {
                let script = &self.scripts[self.rng.usize(..self.scripts.len())];
                let (source, sha) = (script.source, script.sha.clone());
                match self.rng.u8(..9) {
                    0 | 1 => {
                        self.loaded.insert(sha);
                        return Step::bytes(
                            vec![b"SCRIPT".to_vec(), b"LOAD".to_vec(), source.as_bytes().to_vec()],
                            Check::default(),
                        );
                    }
                    2 => {
                        let upper = sha.to_uppercase();
                        return Step::raw(&[
                            "SCRIPT",
                            "EXISTS",
                            &sha,
                            "0000000000000000000000000000000000000000",
                            &upper,
                        ]);
                    }
                    3 => {
                        self.loaded.clear();
                        vec!["SCRIPT", "FLUSH"]
                    }
                    4 => {
                        let mode = self.pick(&["ASYNC", "sync", "now"]);
                        if mode != "now" {
                            self.loaded.clear();
                        }
                        vec!["SCRIPT", "FLUSH", mode]
                    }
                    5 => vec!["SCRIPT", "LOAD", "return 1 +"],
                    6 => vec!["SCRIPT"],
                    7 => vec!["SCRIPT", self.pick(&["KILL", "nosuch"])],
                    _ => return Step::raw(&["EVALSHA", &sha.to_uppercase(), "1", k]),
                }
            }
            27 => match self.rng.u8(..5) {
                0 => vec!["EVALSHA", "0000000000000000000000000000000000000000", "0"],
                1 => vec!["EVALSHA", "abc", "0"],
                2 => vec!["EVAL", "return 1", self.pick(&["-1", "abc", "3", "1"])],
                3 => vec!["EVAL", "return KEYS[1]", "1"],
                _ => vec!["EVAL"],
            },
            28 => match self.rng.u8(..4) {
                0 => vec!["FOO", "a", "b"],
                1 => vec!["GET"],
                2 => vec!["GET", k, k2],
                _ => vec!["ZADD", k, "1"],
            },
            _ => vec!["SET", k, v, "PX", self.pick(&TTLS)],
        };
        let mut step = Step::raw(&args);
        // Now and then in another case, as clients may send them.
        if self.rng.u8(..8) == 0 {
            step.args[0].make_ascii_lowercase();
        }
        step
    }

    /// The expiry phases: a lock on `{e}` (its own record, which the main phase never touches) with a waiter
    /// queued behind it, and two strings, all living 40–80 ms, read at once; then, once the real server has
    /// expired them all, read and used again.
    fn expiry_phases(&mut self) -> Vec<Phase> {
        let life = |g: &mut Self| g.rng.i64(40..80);
        let (l1, l2, l3, l4) = (life(self), life(self), life(self), life(self));
        let acquire = self.scripts.iter().find(|s| s.name == "ACQUIRE").map(|s| s.source).unwrap_or_default();
        let eval = |token: &str, ttl: i64, register: i64| {
            let (ttl, register) = (ttl.to_string(), register.to_string());
            let mut args = vec!["EVAL", acquire, "1", "{e}", token, &ttl, "5:owner"];
            let extra = [register.as_str(), "40000", "1"];
            if register != "0" {
                args.extend(extra);
            }
            Step { check: Check { ms: vec![vec![2]], ..Check::default() }, ..Step::raw(&args) }
        };
        let ttl = |ms: i64| ms.to_string();
        let pttl =
            |key: &str| Step { check: Check { ms: vec![vec![]], ..Check::default() }, ..Step::raw(&["PTTL", key]) };
        let mut first = Phase::default();
        first.steps.push(eval(TOKENS[0], l1, 0));
        first.steps.push(eval(TOKENS[1], 30000, l2));
        first.steps.push(Step::raw(&["SET", "t1", "v", "PX", &ttl(l3)]));
        first.steps.push(Step::raw(&["SET", "t2", "w", "PX", "90000"]));
        first.steps.push(Step::raw(&["PEXPIRE", "t2", &ttl(l4)]));
        first.short = vec![(0, l1), (1, l2), (2, l3), (4, l4)];
        for key in ["{e}", "t1", "t2", "{e}:queue"] {
            first.steps.push(Step::raw(&["GET", key]));
            first.steps.push(pttl(key));
        }
        let gone = ["{e}", "{e}:queue", "{e}:waiter:fedcba9876543210fedcba9876543210", "t1", "t2"];
        first.wait_for_expiry = Some(gone.iter().map(|k| k.as_bytes().to_vec()).collect());
        let mut second = Phase::default();
        for key in gone {
            second.steps.push(Step::raw(&["EXISTS", key]));
            second.steps.push(pttl(key));
            second.steps.push(Step::raw(&["GET", key]));
        }
        second.steps.push(Step::raw(&["PEXPIRE", "t1", "1000"]));
        second.steps.push(Step::raw(&["ZCARD", "{e}:queue"]));
        second.steps.push(eval(TOKENS[1], 30000, 0));
        second.steps.push(Step::raw(&["GET", "{e}"]));
        vec![first, second]
    }
}
