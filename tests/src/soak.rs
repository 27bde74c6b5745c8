//! The randomized fault soak (`tests/tests/soak.rs`, workers in `src/bin/soak_worker.rs`): the events the
//! worker processes log, one JSON object per line, the fenced register they write to, a seeded random
//! generator, and the [`check`]er that judges a run's history, Jepsen style.
//!
//! Every event is stamped on CLOCK_MONOTONIC ([`now_ns`]), which all processes on the machine share, so
//! events of different workers compare. A stamp pair `t0`/`t1` is taken just before and just after what the
//! event reports: whatever happened, happened between them.
//!
//! What the checker verifies (each a [`Check`]):
//! 1. [`Check::Overlap`]: no two grants of one key (different tokens) were *certainly* believed valid at
//!    overlapping moments. `is_lost()` is monotone (once true it stays true), so a grant was certainly
//!    valid from the `t1` of its acquire returning to the `t0` of its last `is_lost() == false`
//!    observation: whatever pauses happened in between, the holder believed in it throughout. And fencing
//!    tokens rise with real time: a grant whose acquire started after another's had returned has a higher
//!    token.
//! 2. [`Check::Register`]: the fenced register (on a server no fault touches) accepted tokens in strictly
//!    increasing order per key; every write a worker logged as accepted is in it, and every token in it was
//!    logged as granted; and no write was rejected while its grant was certainly valid (a rejection means a
//!    higher token had written already, i.e. a later grant existed while this one was held).
//! 3. [`Check::Progress`]: every worker was granted a lock, and released it as `Released`, after the faults
//!    healed.
//! 4. [`Check::Exit`]: no worker panicked, and every worker process not killed on purpose exited cleanly
//!    (status 0, an `exit` event) when told to stop — not hung, not crashed.
//!
//! A line that is not a valid event is tolerated only as the last line of a worker killed with SIGKILL (it
//! may have been cut mid-write); anywhere else it is a [`Check::Log`] violation.

use std::collections::{BTreeMap, HashMap};
use std::fmt::{self, Write as _};

use serde::{Deserialize, Serialize};

/// Nanoseconds on CLOCK_MONOTONIC: one clock for every process on the machine (it keeps running while a
/// process is stopped).
pub fn now_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (t.tv_sec as u64) * 1_000_000_000 + t.tv_nsec as u64
}

/// What a worker logged. `tok` is the first 8 characters of the grant's owner token (never the whole token).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum Event {
    /// The process started.
    Start {
        /// The worker's number.
        worker: usize,
        /// How many times this worker was started before (0 for the first process).
        inc: u32,
        /// The process id.
        pid: u32,
        /// When.
        t: u64,
    },
    /// Its client is built (connected through its proxy).
    Ready {
        /// When.
        t: u64,
    },
    /// About to call `acquire` (it will wait, queued, while the lock is busy).
    Wait {
        /// The lock key.
        key: String,
        /// When.
        t: u64,
    },
    /// `acquire` returned a guard: called at `t0`, returned at `t1`.
    Grant {
        /// The lock key.
        key: String,
        /// Its fencing token.
        fence: u64,
        /// Short token id.
        tok: String,
        /// Before the call.
        t0: u64,
        /// After it returned.
        t1: u64,
    },
    /// `acquire` returned an error.
    NotGranted {
        /// The lock key.
        key: String,
        /// The error.
        err: String,
        /// Before the call.
        t0: u64,
        /// After it returned.
        t1: u64,
    },
    /// `is_lost()` returned false between `t0` and `t1`.
    Valid {
        /// The lock key.
        key: String,
        /// Short token id.
        tok: String,
        /// Before the call.
        t0: u64,
        /// After it.
        t1: u64,
    },
    /// `is_lost()` returned true between `t0` and `t1`.
    Lost {
        /// The lock key.
        key: String,
        /// Short token id.
        tok: String,
        /// Before the call.
        t0: u64,
        /// After it.
        t1: u64,
    },
    /// The fenced register's answer to a write with the grant's fencing token.
    Write {
        /// The lock key (the register's key).
        key: String,
        /// Short token id.
        tok: String,
        /// The fencing token written.
        fence: u64,
        /// Whether the register took it.
        accepted: bool,
        /// The highest token the register had seen before.
        highest: u64,
        /// Before sending.
        t0: u64,
        /// After the reply.
        t1: u64,
    },
    /// A write to the register failed (no answer).
    WriteFailed {
        /// The lock key.
        key: String,
        /// Short token id.
        tok: String,
        /// The error.
        err: String,
        /// Before sending.
        t0: u64,
        /// After the failure.
        t1: u64,
    },
    /// `release` returned.
    Release {
        /// The lock key.
        key: String,
        /// Short token id.
        tok: String,
        /// `released`, `expired`, `taken_by_other` or `error: ...`.
        outcome: String,
        /// Before the call.
        t0: u64,
        /// After it returned.
        t1: u64,
    },
    /// A panic, from the panic hook.
    Panic {
        /// The panic message.
        msg: String,
        /// When.
        t: u64,
    },
    /// The worker saw the stop file and exits normally.
    Exit {
        /// When.
        t: u64,
    },
}

impl Event {
    /// The event as one JSON line, newline included.
    pub fn to_line(&self) -> String {
        let mut line = serde_json::to_string(self).expect("events serialize");
        line.push('\n');
        line
    }
}

/// The fenced register: KEYS highest-token, accepted-list; ARGV token. Takes the write only if the token is
/// above every one seen for the key, and appends it to the list of accepted tokens. Returns {accepted 1/0,
/// highest before}.
pub const REGISTER_WRITE: &str = r"local highest = tonumber(redis.call('get', KEYS[1]) or '0')
local token = tonumber(ARGV[1])
if token > highest then
  redis.call('set', KEYS[1], ARGV[1])
  redis.call('rpush', KEYS[2], ARGV[1])
  return {1, highest}
end
return {0, highest}";

/// The register's keys for lock key `key`: (highest token, list of accepted tokens).
pub fn register_keys(key: &str) -> (String, String) {
    (format!("soak:register:{key}:highest"), format!("soak:register:{key}:accepted"))
}

/// A small seeded generator (SplitMix64): the same seed gives the same numbers on every machine.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }

    /// An index below `n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// One worker process (one incarnation of a worker: a killed worker is started again as the next one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incarnation {
    /// The worker's number.
    pub worker: usize,
    /// Which start of the worker this was (0 first).
    pub inc: u32,
    /// Its whole log, as read from its file.
    pub log: String,
    /// Whether the test killed it on purpose (SIGKILL): its last line may be cut off.
    pub killed: bool,
    /// Its exit code, if it exited by itself; `None` if it was killed or did not exit (hung).
    pub exit_code: Option<i32>,
}

/// Everything the checker needs from one run.
#[derive(Debug, Clone, Default)]
pub struct History {
    /// How many workers ran (numbered from 0).
    pub workers: usize,
    /// Every worker process.
    pub incarnations: Vec<Incarnation>,
    /// The register's list of accepted tokens, per lock key, as read at the end.
    pub register: BTreeMap<String, Vec<u64>>,
    /// When the faults stopped ([`now_ns`]).
    pub healed_at: u64,
    /// Times are shown relative to this (the start of the run).
    pub origin: u64,
}

/// Which property a violation breaks (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Check {
    /// 1: two grants of one key certainly valid at once, or fencing tokens out of real-time order.
    Overlap,
    /// 2: the fenced register.
    Register,
    /// 3: a worker made no progress after the faults healed.
    Progress,
    /// 4: a panic, a crash or a hang.
    Exit,
    /// A malformed log line that a SIGKILL does not explain.
    Log,
}

/// One violation found by [`check`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// What it breaks.
    pub check: Check,
    /// What happened, with the events involved.
    pub detail: String,
    /// The grants involved, as (worker, incarnation, short token id), to show their log lines.
    pub grants: Vec<(usize, u32, String)>,
}

/// Counts, for the summary line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Grants logged.
    pub grants: usize,
    /// Grants whose certain-validity interval is not empty.
    pub certain: usize,
    /// `acquire` errors (mostly `NotObtained` after the wait).
    pub not_granted: usize,
    /// Grants the holder saw lost.
    pub lost: usize,
    /// Register writes accepted.
    pub accepted: usize,
    /// Register writes rejected (a later token had written).
    pub rejected: usize,
    /// Releases per outcome (errors counted together).
    pub releases: BTreeMap<String, usize>,
    /// Cut-off last lines of killed workers, tolerated.
    pub truncated: usize,
    /// Worker processes.
    pub incarnations: usize,
}

/// What [`check`] found.
#[derive(Debug, Clone, Default)]
pub struct Verdict {
    /// Everything wrong; empty when the history passes.
    pub violations: Vec<Violation>,
    /// Counts.
    pub stats: Stats,
}

impl Verdict {
    /// Whether no check failed.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }

    /// The violations of one check.
    pub fn of(&self, check: Check) -> Vec<&Violation> {
        self.violations.iter().filter(|v| v.check == check).collect()
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.stats;
        writeln!(
            f,
            "{} processes, {} grants ({} with a certain interval), {} not granted, {} seen lost, register \
             accepted {} and rejected {}, releases {:?}, {} cut-off lines of killed workers tolerated",
            s.incarnations, s.grants, s.certain, s.not_granted, s.lost, s.accepted, s.rejected, s.releases, s.truncated
        )?;
        for v in &self.violations {
            writeln!(f, "VIOLATION [{:?}] {}", v.check, v.detail)?;
        }
        Ok(())
    }
}

/// One grant and what its holder saw of it.
#[derive(Debug, Clone)]
struct GrantView {
    worker: usize,
    inc: u32,
    key: String,
    tok: String,
    fence: u64,
    /// `acquire` called.
    t0: u64,
    /// `acquire` returned: certainly valid from here...
    t1: u64,
    /// ...to the `t0` of the last `is_lost() == false` observation.
    last_valid: Option<u64>,
    released: bool,
}

impl GrantView {
    /// (worker, incarnation, short token id).
    fn id(&self) -> (usize, u32, String) {
        (self.worker, self.inc, self.tok.clone())
    }

    /// The interval in which the grant was certainly valid, if not empty.
    fn certain(&self) -> Option<(u64, u64)> {
        self.last_valid.filter(|&end| end > self.t1).map(|end| (self.t1, end))
    }
}

/// `+12.345678s` relative to `origin`.
pub fn rel(t: u64, origin: u64) -> String {
    let d = t as i128 - origin as i128;
    format!("{}{:.6}s", if d < 0 { "-" } else { "+" }, d.unsigned_abs() as f64 / 1e9)
}

fn describe(g: &GrantView, origin: u64) -> String {
    format!(
        "w{}#{} key {} fence {} tok {}: acquire called {}, returned {}, last seen valid {}",
        g.worker,
        g.inc,
        g.key,
        g.fence,
        g.tok,
        rel(g.t0, origin),
        rel(g.t1, origin),
        g.last_valid.map_or_else(|| String::from("never"), |t| rel(t, origin))
    )
}

/// Parses one worker log: its events, and its malformed lines with their (0-based) numbers. A final piece
/// without a newline is a line too.
pub fn parse_log(text: &str) -> (Vec<Event>, Vec<(usize, String)>) {
    let mut events = Vec::new();
    let mut bad = Vec::new();
    for (i, line) in text.split_terminator('\n').enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Event>(line) {
            Ok(e) => events.push(e),
            Err(_) => bad.push((i, line.to_owned())),
        }
    }
    (events, bad)
}

/// Checks a run's history (see the module docs for what).
pub fn check(history: &History) -> Verdict {
    let origin = history.origin;
    let mut verdict = Verdict::default();
    let mut grants: Vec<GrantView> = Vec::new();
    // (worker, inc, key, tok) -> index in `grants`.
    let mut index: HashMap<(usize, u32, String, String), usize> = HashMap::new();
    let mut writes: Vec<(usize, u32, Event)> = Vec::new();
    verdict.stats.incarnations = history.incarnations.len();

    for p in &history.incarnations {
        let (events, bad) = parse_log(&p.log);
        let lines = p.log.split_terminator('\n').filter(|l| !l.trim().is_empty()).count();
        let last_line = p.log.split_terminator('\n').enumerate().filter(|(_, l)| !l.trim().is_empty()).last();
        for (i, line) in bad {
            if p.killed && last_line.map(|(n, _)| n) == Some(i) {
                verdict.stats.truncated += 1;
            } else {
                verdict.violations.push(Violation {
                    check: Check::Log,
                    grants: Vec::new(),
                    detail: format!("w{}#{}: malformed log line {} of {lines}: {line:?}", p.worker, p.inc, i + 1),
                });
            }
        }
        let mut exited = false;
        for e in events {
            match &e {
                Event::Grant { key, fence, tok, t0, t1 } => {
                    verdict.stats.grants += 1;
                    index.insert((p.worker, p.inc, key.clone(), tok.clone()), grants.len());
                    grants.push(GrantView {
                        worker: p.worker,
                        inc: p.inc,
                        key: key.clone(),
                        tok: tok.clone(),
                        fence: *fence,
                        t0: *t0,
                        t1: *t1,
                        last_valid: None,
                        released: false,
                    });
                }
                Event::NotGranted { .. } => verdict.stats.not_granted += 1,
                Event::Valid { key, tok, t0, .. } => match index.get(&(p.worker, p.inc, key.clone(), tok.clone())) {
                    Some(&g) => {
                        let g = &mut grants[g];
                        g.last_valid = Some(g.last_valid.map_or(*t0, |v| v.max(*t0)));
                    }
                    None => verdict.violations.push(Violation {
                        check: Check::Log,
                        grants: Vec::new(),
                        detail: format!("w{}#{}: validity of a grant never logged: {e:?}", p.worker, p.inc),
                    }),
                },
                Event::Lost { .. } => verdict.stats.lost += 1,
                Event::Write { accepted, .. } => {
                    if *accepted {
                        verdict.stats.accepted += 1;
                    } else {
                        verdict.stats.rejected += 1;
                    }
                    writes.push((p.worker, p.inc, e.clone()));
                }
                Event::Release { key, tok, outcome, .. } => {
                    let kind = if outcome.starts_with("error") { "error" } else { outcome.as_str() };
                    *verdict.stats.releases.entry(kind.to_owned()).or_default() += 1;
                    if outcome == "released" {
                        if let Some(&g) = index.get(&(p.worker, p.inc, key.clone(), tok.clone())) {
                            grants[g].released = true;
                        }
                    }
                }
                Event::Panic { msg, t } => verdict.violations.push(Violation {
                    check: Check::Exit,
                    grants: Vec::new(),
                    detail: format!("w{}#{} panicked at {}: {msg}", p.worker, p.inc, rel(*t, origin)),
                }),
                Event::Exit { .. } => exited = true,
                Event::Start { .. } | Event::Ready { .. } | Event::Wait { .. } | Event::WriteFailed { .. } => {}
            }
        }
        // 4. Every process not killed on purpose exits cleanly when told to.
        if !p.killed && (p.exit_code != Some(0) || !exited) {
            let how = match p.exit_code {
                None => String::from("did not exit when told to stop (hung; killed by the test)"),
                Some(0) => String::from("exited with status 0 but never logged its exit"),
                Some(code) => format!("exited with status {code} (crashed)"),
            };
            verdict.violations.push(Violation {
                check: Check::Exit,
                grants: Vec::new(),
                detail: format!("w{}#{}: {how}", p.worker, p.inc),
            });
        }
    }
    verdict.stats.certain = grants.iter().filter(|g| g.certain().is_some()).count();

    check_overlaps(&grants, origin, &mut verdict);
    check_fences(&grants, origin, &mut verdict);
    check_register(history, &grants, &index, &writes, &mut verdict);

    // 3. Progress after the heal.
    for w in 0..history.workers {
        if !grants.iter().any(|g| g.worker == w && g.t0 >= history.healed_at && g.released) {
            let last = grants.iter().filter(|g| g.worker == w).max_by_key(|g| g.t1);
            verdict.violations.push(Violation {
                check: Check::Progress,
                grants: Vec::new(),
                detail: format!(
                    "w{w}: no grant released as Released after the heal at {}; its last grant: {}",
                    rel(history.healed_at, origin),
                    last.map_or_else(|| String::from("none"), |g| describe(g, origin))
                ),
            });
        }
    }
    verdict.violations.sort_by_key(|v| v.check);
    verdict
}

/// Check 1: no two grants of a key (different tokens) certainly valid at overlapping moments.
fn check_overlaps(grants: &[GrantView], origin: u64, verdict: &mut Verdict) {
    let mut by_key: BTreeMap<&str, Vec<&GrantView>> = BTreeMap::new();
    for g in grants.iter().filter(|g| g.certain().is_some()) {
        by_key.entry(&g.key).or_default().push(g);
    }
    for (_, mut list) in by_key {
        list.sort_by_key(|g| g.t1);
        // The grant reaching furthest among those that started earlier: anything starting before its end
        // overlaps it.
        let mut reach: Option<&GrantView> = None;
        for g in list {
            let (start, end) = g.certain().expect("filtered");
            if let Some(r) = reach {
                let (_, r_end) = r.certain().expect("filtered");
                if start < r_end && r.tok != g.tok {
                    verdict.violations.push(Violation {
                        check: Check::Overlap,
                        grants: vec![r.id(), g.id()],
                        detail: format!(
                            "two grants of key {} certainly valid at once for {:.3} ms:\n    {}\n    {}",
                            g.key,
                            (r_end.min(end) - start) as f64 / 1e6,
                            describe(r, origin),
                            describe(g, origin)
                        ),
                    });
                }
                if end > r_end {
                    reach = Some(g);
                }
            } else {
                reach = Some(g);
            }
        }
    }
}

/// Check 1, fencing: tokens rise with real time (a grant whose acquire began after another's returned has a
/// higher token), and two grants never share one.
fn check_fences(grants: &[GrantView], origin: u64, verdict: &mut Verdict) {
    let mut by_key: BTreeMap<&str, Vec<&GrantView>> = BTreeMap::new();
    for g in grants {
        by_key.entry(&g.key).or_default().push(g);
    }
    for (key, list) in by_key {
        let mut by_fence: HashMap<u64, &GrantView> = HashMap::new();
        for g in &list {
            if let Some(other) = by_fence.insert(g.fence, g) {
                verdict.violations.push(Violation {
                    check: Check::Overlap,
                    grants: vec![other.id(), g.id()],
                    detail: format!(
                        "two grants of key {key} share fencing token {}:\n    {}\n    {}",
                        g.fence,
                        describe(other, origin),
                        describe(g, origin)
                    ),
                });
            }
        }
        let mut returned = list.clone();
        returned.sort_by_key(|g| g.t1);
        let mut called = list;
        called.sort_by_key(|g| g.t0);
        let mut i = 0;
        let mut highest: Option<&GrantView> = None;
        for g in called {
            while i < returned.len() && returned[i].t1 < g.t0 {
                if highest.is_none_or(|h| returned[i].fence > h.fence) {
                    highest = Some(returned[i]);
                }
                i += 1;
            }
            if let Some(h) = highest {
                if h.fence >= g.fence && h.tok != g.tok {
                    verdict.violations.push(Violation {
                        check: Check::Overlap,
                        grants: vec![h.id(), g.id()],
                        detail: format!(
                            "fencing token of key {key} did not rise: a grant asked for after another returned has \
                             a token not above it:\n    {}\n    {}",
                            describe(h, origin),
                            describe(g, origin)
                        ),
                    });
                }
            }
        }
    }
}

/// Check 2: the fenced register.
fn check_register(
    history: &History,
    grants: &[GrantView],
    index: &HashMap<(usize, u32, String, String), usize>,
    writes: &[(usize, u32, Event)],
    verdict: &mut Verdict,
) {
    let origin = history.origin;
    for (key, list) in &history.register {
        if let Some(pair) = list.windows(2).find(|p| p[1] <= p[0]) {
            verdict.violations.push(Violation {
                check: Check::Register,
                grants: Vec::new(),
                detail: format!("register of key {key} accepted token {} after {}: {list:?}", pair[1], pair[0]),
            });
        }
        for token in list {
            if !grants.iter().any(|g| &g.key == key && g.fence == *token) {
                verdict.violations.push(Violation {
                    check: Check::Register,
                    grants: Vec::new(),
                    detail: format!("register of key {key} accepted token {token}, which no worker logged a grant of"),
                });
            }
        }
    }
    for (worker, inc, w) in writes {
        let Event::Write { key, tok, fence, accepted, highest, t0, t1 } = w else { continue };
        if *accepted {
            if !history.register.get(key).is_some_and(|l| l.contains(fence)) {
                verdict.violations.push(Violation {
                    check: Check::Register,
                    grants: Vec::new(),
                    detail: format!(
                        "w{worker}#{inc} logged its write of token {fence} on key {key} accepted at {}, but the \
                         register does not list it",
                        rel(*t1, origin)
                    ),
                });
            }
            continue;
        }
        let Some(&g) = index.get(&(*worker, *inc, key.clone(), tok.clone())) else { continue };
        let g = &grants[g];
        if g.t1 <= *t0 && g.last_valid.is_some_and(|v| v >= *t1) {
            verdict.violations.push(Violation {
                check: Check::Register,
                grants: vec![g.id()],
                detail: format!(
                    "the register rejected a write of token {fence} (it had seen {highest}) sent at {} and answered \
                     at {}, while its grant was certainly valid:\n    {}",
                    rel(*t0, origin),
                    rel(*t1, origin),
                    describe(g, origin)
                ),
            });
        }
    }
}

/// Whether a worker log shows progress since `since`: a grant asked for then or later, released as
/// `Released` (what [`Check::Progress`] wants of every worker after the heal).
pub fn progressed(log: &str, since: u64) -> bool {
    let mut granted: Vec<(String, String)> = Vec::new();
    for e in parse_log(log).0 {
        match e {
            Event::Grant { key, tok, t0, .. } if t0 >= since => granted.push((key, tok)),
            Event::Release { key, tok, outcome, .. }
                if outcome == "released" && granted.iter().any(|(k, t)| *k == key && *t == tok) =>
            {
                return true
            }
            _ => {}
        }
    }
    false
}

/// The lines of a worker log about the grant with short token id `tok`, for failure output: its grant,
/// write and release, and of its run of `valid` observations only the first and the last.
pub fn grant_lines(log: &str, tok: &str) -> String {
    let needle = format!("\"tok\":\"{tok}\"");
    let lines: Vec<&str> = log.split_terminator('\n').filter(|l| l.contains(&needle)).collect();
    let mut out = String::new();
    for (i, l) in lines.iter().enumerate() {
        let valid = l.starts_with("{\"ev\":\"valid\"");
        let between =
            |j: Option<usize>| j.and_then(|j| lines.get(j)).is_some_and(|n| n.starts_with("{\"ev\":\"valid\""));
        if valid && between(i.checked_sub(1)) && between(Some(i + 1)) {
            continue;
        }
        let _ = writeln!(out, "    {l}");
    }
    out
}

/// The last `n` lines of a log, for failure output.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.split_terminator('\n').collect();
    let mut out = String::new();
    for l in &lines[lines.len().saturating_sub(n)..] {
        let _ = writeln!(out, "    {l}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn k(s: &str) -> String {
        s.to_owned()
    }

    /// A worker's log of `cycles`: (key, fence, tok, acquire at ms, hold ms).
    fn cycles(worker: usize, list: &[(&str, u64, &str, u64, u64)]) -> String {
        let mut log = Event::Start { worker, inc: 0, pid: 100 + worker as u32, t: 0 }.to_line();
        log += &Event::Ready { t: MS }.to_line();
        for &(key, fence, tok, at, hold) in list {
            let (key, tok, at) = (k(key), k(tok), at * MS);
            log += &Event::Wait { key: key.clone(), t: at }.to_line();
            log += &Event::Grant { key: key.clone(), fence, tok: tok.clone(), t0: at, t1: at + MS }.to_line();
            log += &Event::Valid { key: key.clone(), tok: tok.clone(), t0: at + 2 * MS, t1: at + 2 * MS + 1 }.to_line();
            let w = at + hold * MS / 2;
            log += &Event::Write {
                key: key.clone(),
                tok: tok.clone(),
                fence,
                accepted: true,
                highest: fence - 1,
                t0: w,
                t1: w + MS,
            }
            .to_line();
            let end = at + hold * MS;
            log += &Event::Valid { key: key.clone(), tok: tok.clone(), t0: end, t1: end + 1 }.to_line();
            log += &Event::Release { key, tok, outcome: k("released"), t0: end + 1, t1: end + MS }.to_line();
        }
        log += &Event::Exit { t: 100_000 * MS }.to_line();
        log
    }

    fn incarnation(worker: usize, log: String) -> Incarnation {
        Incarnation { worker, inc: 0, log, killed: false, exit_code: Some(0) }
    }

    /// Two workers taking turns on key a (fences 1..4), and each once more after the heal at 1000 ms.
    fn clean() -> History {
        let w0 =
            cycles(0, &[("a", 1, "aaaa0001", 10, 50), ("a", 3, "aaaa0003", 130, 50), ("b", 1, "bbbb0001", 1100, 20)]);
        let w1 =
            cycles(1, &[("a", 2, "aaaa0002", 70, 50), ("a", 4, "aaaa0004", 190, 50), ("a", 5, "aaaa0005", 1200, 20)]);
        History {
            workers: 2,
            incarnations: vec![incarnation(0, w0), incarnation(1, w1)],
            register: BTreeMap::from([(k("a"), vec![1, 2, 3, 4, 5]), (k("b"), vec![1])]),
            healed_at: 1000 * MS,
            origin: 0,
        }
    }

    fn only(verdict: &Verdict, check: Check) {
        assert!(!verdict.passed(), "expected a {check:?} violation, the history passed:\n{verdict}");
        assert!(verdict.violations.iter().all(|v| v.check == check), "expected only {check:?}:\n{verdict}");
    }

    #[test]
    fn a_clean_history_passes() {
        let verdict = check(&clean());
        assert!(verdict.passed(), "{verdict}");
        assert_eq!(verdict.stats.grants, 6);
        assert_eq!(verdict.stats.certain, 6);
        assert_eq!(verdict.stats.accepted, 6);
    }

    #[test]
    fn overlapping_certain_intervals_are_flagged() {
        let mut h = clean();
        // w1's second grant (fence 4) starts at 150 ms, inside w0's fence-3 grant (130..180 ms).
        let w1 =
            cycles(1, &[("a", 2, "aaaa0002", 70, 50), ("a", 4, "aaaa0004", 150, 50), ("a", 5, "aaaa0005", 1200, 20)]);
        h.incarnations[1] = incarnation(1, w1);
        let verdict = check(&h);
        only(&verdict, Check::Overlap);
        let text = verdict.to_string();
        assert!(
            text.contains("certainly valid at once") && text.contains("aaaa0003") && text.contains("aaaa0004"),
            "{text}"
        );
    }

    #[test]
    fn a_paused_holder_whose_last_valid_observation_came_before_the_next_grant_is_not_flagged() {
        // w0's fence-3 grant was last seen valid at 132 ms, then its holder was paused and woke up lost: the
        // next grant at 150 ms overlaps only the holder's unverified belief, which the checker must not flag.
        let mut log = cycles(0, &[("a", 1, "aaaa0001", 10, 50), ("b", 1, "bbbb0001", 1100, 20)]);
        log += &Event::Grant { key: k("a"), fence: 3, tok: k("aaaa0003"), t0: 130 * MS, t1: 131 * MS }.to_line();
        log += &Event::Valid { key: k("a"), tok: k("aaaa0003"), t0: 132 * MS, t1: 132 * MS + 1 }.to_line();
        log += &Event::Lost { key: k("a"), tok: k("aaaa0003"), t0: 700 * MS, t1: 700 * MS + 1 }.to_line();
        log += &Event::Release { key: k("a"), tok: k("aaaa0003"), outcome: k("expired"), t0: 701 * MS, t1: 701 * MS }
            .to_line();
        log += &Event::Exit { t: 100_000 * MS }.to_line();
        let w1 =
            cycles(1, &[("a", 2, "aaaa0002", 70, 50), ("a", 4, "aaaa0004", 150, 50), ("a", 5, "aaaa0005", 1200, 20)]);
        let mut h = clean();
        h.incarnations = vec![incarnation(0, log), incarnation(1, w1)];
        h.register.insert(k("a"), vec![1, 2, 4, 5]);
        let verdict = check(&h);
        assert!(verdict.passed(), "{verdict}");
    }

    #[test]
    fn a_decreasing_register_is_flagged() {
        let mut h = clean();
        h.register.insert(k("a"), vec![1, 3, 2, 4, 5]);
        let verdict = check(&h);
        only(&verdict, Check::Register);
        assert!(verdict.to_string().contains("accepted token 2 after 3"), "{verdict}");
    }

    #[test]
    fn a_rejected_write_while_certainly_valid_is_flagged() {
        let mut h = clean();
        let log = h.incarnations[0].log.replace(
            r#""tok":"aaaa0003","fence":3,"accepted":true,"highest":2"#,
            r#""tok":"aaaa0003","fence":3,"accepted":false,"highest":4"#,
        );
        assert_ne!(log, h.incarnations[0].log);
        h.incarnations[0].log = log;
        h.register.insert(k("a"), vec![1, 2, 4, 5]);
        let verdict = check(&h);
        only(&verdict, Check::Register);
        assert!(verdict.to_string().contains("rejected a write of token 3"), "{verdict}");
    }

    #[test]
    fn an_accepted_write_missing_from_the_register_is_flagged() {
        let mut h = clean();
        h.register.insert(k("a"), vec![1, 2, 4, 5]);
        only(&check(&h), Check::Register);
    }

    #[test]
    fn fencing_tokens_falling_in_real_time_are_flagged() {
        let mut h = clean();
        // w1's grant at 190 ms carries fence 2, below w0's fence 3 granted at 130 ms.
        let w1 =
            cycles(1, &[("a", 4, "aaaa0004", 70, 50), ("a", 2, "aaaa0002", 190, 50), ("a", 5, "aaaa0005", 1200, 20)]);
        h.incarnations[1] = incarnation(1, w1);
        h.register.insert(k("a"), vec![1, 4, 5]);
        let verdict = check(&h);
        assert!(!verdict.of(Check::Overlap).is_empty(), "{verdict}");
        assert!(verdict.to_string().contains("did not rise"), "{verdict}");
    }

    #[test]
    fn a_worker_without_progress_after_the_heal_is_flagged() {
        let mut h = clean();
        let w0 = cycles(0, &[("a", 1, "aaaa0001", 10, 50), ("a", 3, "aaaa0003", 130, 50)]);
        h.incarnations[0] = incarnation(0, w0);
        h.register.insert(k("b"), vec![]);
        let verdict = check(&h);
        only(&verdict, Check::Progress);
        assert!(verdict.to_string().contains("w0: no grant"), "{verdict}");
    }

    #[test]
    fn a_grant_after_the_heal_that_was_not_released_is_no_progress() {
        let mut h = clean();
        h.incarnations[1].log = h.incarnations[1]
            .log
            .replace(r#""tok":"aaaa0005","outcome":"released""#, r#""tok":"aaaa0005","outcome":"expired""#);
        only(&check(&h), Check::Progress);
    }

    #[test]
    fn a_truncated_last_line_of_a_killed_worker_is_tolerated() {
        let mut h = clean();
        let mut killed = cycles(2, &[("c", 1, "cccc0001", 20, 10)]);
        killed = killed.replace(&Event::Exit { t: 100_000 * MS }.to_line(), "");
        killed += r#"{"ev":"grant","key":"c","fen"#;
        h.incarnations.push(Incarnation { worker: 2, inc: 0, log: killed, killed: true, exit_code: None });
        let mut after = cycles(2, &[("c", 2, "cccc0002", 1300, 10)]);
        after = after.replace(r#""inc":0"#, r#""inc":1"#);
        h.incarnations.push(Incarnation { worker: 2, inc: 1, log: after, killed: false, exit_code: Some(0) });
        h.workers = 3;
        h.register.insert(k("c"), vec![1, 2]);
        let verdict = check(&h);
        assert!(verdict.passed(), "{verdict}");
        assert_eq!(verdict.stats.truncated, 1);
    }

    #[test]
    fn a_malformed_line_of_a_worker_that_was_not_killed_is_flagged() {
        let mut h = clean();
        h.incarnations[0].log.insert_str(0, "{\"ev\":\"gra\n");
        only(&check(&h), Check::Log);
    }

    #[test]
    fn a_malformed_line_before_the_last_is_flagged_even_when_killed() {
        let mut h = clean();
        h.incarnations[0].log.insert_str(0, "garbage\n");
        h.incarnations[0].killed = true;
        only(&check(&h), Check::Log);
    }

    #[test]
    fn panics_crashes_and_hangs_are_flagged() {
        let mut h = clean();
        h.incarnations[0].log += &Event::Panic { msg: k("boom"), t: 5 }.to_line();
        only(&check(&h), Check::Exit);

        let mut h = clean();
        h.incarnations[0].exit_code = Some(101);
        only(&check(&h), Check::Exit);

        let mut h = clean();
        h.incarnations[1].exit_code = None;
        let verdict = check(&h);
        only(&verdict, Check::Exit);
        assert!(verdict.to_string().contains("hung"), "{verdict}");
    }

    #[test]
    fn a_violation_names_its_grants_and_their_lines_can_be_shown() {
        let mut h = clean();
        let w1 =
            cycles(1, &[("a", 2, "aaaa0002", 70, 50), ("a", 4, "aaaa0004", 150, 50), ("a", 5, "aaaa0005", 1200, 20)]);
        h.incarnations[1] = incarnation(1, w1.clone());
        let verdict = check(&h);
        let grants = &verdict.of(Check::Overlap)[0].grants;
        assert_eq!(grants, &vec![(0, 0, k("aaaa0003")), (1, 0, k("aaaa0004"))]);
        let lines = grant_lines(&w1, "aaaa0004");
        assert!(lines.contains("\"ev\":\"grant\"") && lines.contains("\"ev\":\"release\""), "{lines}");
        assert_eq!(lines.lines().count(), 5, "{lines}");
    }

    #[test]
    fn progress_is_a_grant_since_then_released() {
        let log = cycles(0, &[("a", 1, "aaaa0001", 10, 50), ("b", 1, "bbbb0001", 1100, 20)]);
        assert!(progressed(&log, 1000 * MS));
        assert!(!progressed(&log, 1101 * MS));
        assert!(!progressed(&log.replace("released", "expired"), 1000 * MS));
    }

    #[test]
    fn the_generator_repeats_with_its_seed() {
        let a: Vec<u64> = (0..5).scan(Rng::new(7), |r, _| Some(r.next_u64())).collect();
        let b: Vec<u64> = (0..5).scan(Rng::new(7), |r, _| Some(r.next_u64())).collect();
        assert_eq!(a, b);
        let mut r = Rng::new(1);
        assert!((0..1000).map(|_| r.range(3, 5)).all(|x| (3..=5).contains(&x)));
    }

    #[test]
    fn the_clock_is_monotonic() {
        let a = now_ns();
        let b = now_ns();
        assert!(b >= a && a > 0);
    }
}
