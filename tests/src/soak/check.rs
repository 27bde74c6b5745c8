//! The checker: a run's [`History`] in, a [`Verdict`] (every [`Violation`] of a [`Check`]) out.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use super::events::{parse_log, Event};

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
    /// When the faults stopped ([`now_ns`](super::events::now_ns)).
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
