//! The seeded command sequences of the simulated redis-server's differential test (`tests/sim_keyspace.rs`):
//! what each sequence sends, and which parts of each reply depend on the clock.
//!
//! A sequence is a main phase — production scripts (plain, numbered, sharded; EVAL, EVALSHA, NOSCRIPT) on a
//! few locks with valid and wrong tokens, foreign values and wrong types at their keys, short or garbage
//! arguments; raw commands with random options, valid and not; ad-hoc scripts for Redis's conversions and
//! errors — whose keys all live for seconds or go at once, so nothing expires while it runs. One sequence in
//! sixteen adds an expiry phase: keys (a lock, its queue and waiter, strings) written to live 40–80 ms, read
//! at once, then read and used again once the real server no longer has them.

use std::collections::BTreeSet;
use std::sync::OnceLock;

use distlock::simulation::redis::production_scripts;

mod compare;
mod raw;
mod scripts;

pub use compare::{compare, same_keyspace, same_text, time_of, Keyspace, Outcome};

/// Valid owner tokens; the third shares the first's second half (what a release sent again compares).
pub(crate) const TOKENS: [&str; 4] = [
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
pub(crate) const RECORDS: [&str; 3] = ["{a}", "{b}", "lock:{c}"];
/// Keys raw commands write and read: the records, their derived keys, and others.
pub(crate) const KEYS: [&str; 10] = [
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
pub(crate) const VALUES: [&str; 10] = [
    "v",
    "",
    "123",
    "0123456789abcdef0123456789abcdef:17:1700000000000000:5:owner",
    "fedcba9876543210fedcba9876543210+18:1700000000000000:0:",
    "================0123456789abcdef:5:1700000000000000:0:",
    "----------------0123456789abcdef:5:1700000000000000:0:",
    "1:2:3:4",
    "abc def\u{e9}",
    "nul\u{0}byte",
];
/// Holder fields as the client writes them (`<owner's length>:<owner><metadata>`).
pub(crate) const HOLDERS: [&str; 4] = ["5:owner", "7:billing:job:42", "0:", "12:web-3:4242app::jobs"];
/// Bad values for any numeric argument: zero, negative, not a number, empty, fractional, huge, exponent.
pub(crate) const BAD: [&str; 7] = ["0", "-1", "abc", "", "1.5", "9223372036854775807", "1e3"];
/// Lives long enough that nothing expires while a phase runs.
pub(crate) const TTLS: [&str; 4] = ["30000", "45000", "60000", "120000"];

/// Which parts of a reply depend on the clock, by their index paths from the reply's top: ms (lives, ages)
/// and µs (since a grant or a place in a queue). µs timestamps are recognised wherever they are; TIME's
/// reply is one.
#[derive(Debug, Clone, Default)]
pub struct Check {
    ms: Vec<Vec<usize>>,
    us: Vec<Vec<usize>>,
    time: bool,
    /// PUBLISH's and SPUBLISH's reply: how many clients received it, which the simulated server does not know
    /// (it replies 0; the real one counts the test's subscriber).
    receivers: bool,
}

impl Check {
    /// Whether `a` and `b` at `path` may differ as the clock does: by at most 50 ms, both not negative.
    pub fn tolerates(&self, path: &[usize], a: i64, b: i64) -> bool {
        let within = |limit: i64| a >= 0 && b >= 0 && (a - b).abs() <= limit;
        (self.ms.iter().any(|p| p == path) && within(50))
            || (self.us.iter().any(|p| p == path) && within(50_000))
            || (self.receivers && path.is_empty() && within(i64::MAX))
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
    /// The command, its name first.
    pub args: Vec<Vec<u8>>,
    /// What of its reply depends on the clock.
    pub check: Check,
    /// What it runs, for messages: a production script's name, or the command.
    what: String,
}

impl Step {
    /// A step of text arguments, compared exactly.
    fn raw(args: &[&str]) -> Self {
        Self::bytes(args.iter().map(|a| a.as_bytes().to_vec()).collect(), Check::default())
    }

    /// A step of byte arguments.
    fn bytes(args: Vec<Vec<u8>>, check: Check) -> Self {
        let what = String::from_utf8_lossy(&args[0]).into_owned();
        Self { args, check, what }
    }

    /// What it runs: a production script's name and variant, `snippet`, or the command's name.
    pub fn what(&self) -> &str {
        &self.what
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
    /// Its commands, in order.
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
    /// Filled on first use.
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

/// The channels a sequence may publish on by SPUBLISH (sharded channels have no patterns): the records'
/// announcements and the keys raw commands use.
pub fn sharded_channels() -> Vec<String> {
    let records = RECORDS.iter().chain(&["{e}"]).map(|r| format!("{r}:released"));
    records.chain(KEYS.iter().map(|k| k.to_string())).collect()
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

    /// One of `from`.
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

    /// A token for a release, renewal or look-up: mostly valid, sometimes any bad one.
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

    /// SCANs to compare after the sequence: the options after the cursor (MATCH, COUNT, TYPE, in any order).
    pub fn scans(&mut self) -> Vec<Vec<Vec<u8>>> {
        let patterns =
            ["*", "{a}*", "*:queue", "?a*", "[a-c]*", "{[ab]}*", "*waiter*", "\\{a\\}*", "[^{]*", "*[", "s?"];
        (0..2)
            .map(|_| {
                let mut options: Vec<[String; 2]> = vec![["COUNT".into(), self.rng.u32(1..12).to_string()]];
                if self.rng.u8(..4) > 0 {
                    options.push(["MATCH".into(), self.pick(&patterns).into()]);
                }
                if self.rng.u8(..4) == 0 {
                    options.push(["TYPE".into(), self.pick(&["string", "zset", "ZSET", "hash"]).into()]);
                }
                self.rng.shuffle(&mut options);
                options.into_iter().flatten().map(String::into_bytes).collect()
            })
            .collect()
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
