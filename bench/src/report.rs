//! The Markdown report: machine line, one table per scenario, and the targets of issue 5.

use std::fmt::Write as _;
use std::time::Duration;

use crate::contention::Waiter;
use crate::measure::percentile_us;
use crate::proxy::ProxyStats;
use crate::systems::Variant;
use crate::uncontended::{self, VariantResult};
use crate::{Config, Results};

mod scenarios;

/// What the machine is, and how busy it was.
#[derive(Debug, Clone, Default)]
pub struct Machine {
    pub cores: usize,
    pub cpu: String,
    pub kernel: String,
    pub redis: String,
    pub load_before: String,
    pub load_after: String,
    pub pinning: Option<String>,
    pub workers: usize,
}

impl Machine {
    pub fn read() -> Self {
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines().find_map(|l| {
                    l.strip_prefix("model name").map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
                })
            })
            .unwrap_or_else(|| "unknown CPU".into());
        let binary = std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".into());
        let redis = std::process::Command::new(&binary)
            .arg("--version")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.split_whitespace().find_map(|w| w.strip_prefix("v=").map(str::to_owned)))
            .unwrap_or_else(|| "unknown".into());
        Self {
            cores: std::thread::available_parallelism().map_or(0, usize::from),
            cpu,
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_owned(),
            redis,
            load_before: load_average(),
            load_after: String::new(),
            pinning: None,
            workers: 0,
        }
    }

    pub fn finish(&mut self) {
        self.load_after = load_average();
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn num(x: f64, decimals: usize) -> String {
    if x.is_finite() {
        format!("{x:.decimals$}")
    } else {
        "–".into()
    }
}

fn ratio(x: f64, base: f64) -> f64 {
    if base > 0.0 {
        x / base
    } else {
        f64::NAN
    }
}

const ORDER: [Variant; 6] =
    [Variant::Raw, Variant::Api, Variant::Run, Variant::Macro, Variant::Rslock, Variant::Fenced];

fn uncontended_table(out: &mut String, s: &uncontended::Scenario) {
    let raw = s.by_variant.get(&Variant::Raw).map(|r| r.median(|x| x.cycles_per_s));
    let _ = writeln!(
        out,
        "| contender | cycles/s | × raw | p50 µs | p99 µs | client CPU µs/cycle | redis CPU µs/cycle | redis in commands µs/cycle | allocations/cycle | heap kept B/cycle |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for v in ORDER {
        let Some(r) = s.by_variant.get(&v) else { continue };
        let cps = r.median(|x| x.cycles_per_s);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            v.label(),
            num(cps, 0),
            raw.map_or("–".into(), |b| num(ratio(cps, b), 2)),
            num(r.median(|x| x.p50_us), 1),
            num(r.median(|x| x.p99_us), 1),
            num(r.median(|x| x.cpu_us), 1),
            num(r.median(|x| x.server_cpu_us), 1),
            num(r.median(|x| x.server_cmd_us), 2),
            num(r.allocs_per_cycle, 1),
            num(r.retained_bytes_per_cycle, 0),
        );
    }
    errors_note(out, s.by_variant.iter().map(|(v, r)| (v.name(), r.errors, r.first_error.as_deref())));
}

fn errors_note<'a>(out: &mut String, rows: impl Iterator<Item = (&'a str, u64, Option<&'a str>)>) {
    for (name, errors, first) in rows {
        if errors > 0 {
            let _ = writeln!(out, "\n**{name}: {errors} failed cycles** (first: {})", first.unwrap_or("?"));
        }
    }
}

fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 1.0 {
        format!("{s:.1} s")
    } else {
        format!("{:.0} ms", s * 1000.0)
    }
}

/// A target line: what, the measured value, met or not.
struct Target {
    scenario: &'static str,
    what: String,
    result: String,
    met: Option<bool>,
}

/// One pass of the scenarios, at one added round trip.
#[derive(Debug)]
pub struct Pass {
    /// The round trip the proxy adds (0 on loopback).
    pub rtt_ms: f64,
    /// Through the delay proxy (`--rtt +0`: with no delay).
    pub proxied: bool,
    pub results: Results,
    pub proxy: Option<ProxyStats>,
}

impl Pass {
    fn label(&self) -> String {
        if self.proxied {
            format!("+{} ms", self.rtt_ms)
        } else {
            "loopback".to_owned()
        }
    }
}

pub fn print(config: &Config, machine: &Machine, passes: &[Pass], elapsed: Duration) {
    let mut out = String::new();

    let _ = writeln!(out, "## Performance\n");
    let _ = writeln!(
        out,
        "Machine: {} cores, {}, Linux {}; redis-server {} on loopback TCP, started by the benchmark; {}; tokio \
         multi-thread runtime ({} worker(s)); load average {} before, {} after.",
        machine.cores,
        machine.cpu,
        machine.kernel,
        machine.redis,
        machine.pinning.as_deref().unwrap_or("not pinned"),
        machine.workers,
        machine.load_before,
        machine.load_after
    );
    let _ = writeln!(
        out,
        "Command: `{}` ({} rounds{}; {} in all). Each number is the median over rounds; in each round every \
         contender ran one window, in an order rotated every round; the windows of scenarios 1 and 2 each run in \
         a fresh process. Client CPU includes the runtime's idle wake-ups (large for one task in this VM); \
         allocations are counted in a separate untimed pass; \"heap kept\" is what a pass left allocated, per \
         cycle.\n",
        config.command_line(),
        config.rounds,
        if config.quick { ", --quick: short windows, not for the README" } else { "" },
        secs(elapsed),
    );
    for p in passes {
        pass(&mut out, p, passes.len() > 1 || p.proxied);
    }
    if passes.len() > 1 || passes.iter().any(|p| p.proxied) {
        summary(&mut out, passes);
        beyond_the_floor(&mut out, passes);
    }
    print!("{out}");
}

/// The tables of one pass, under a heading of its own when `headed`.
fn pass(out: &mut String, pass: &Pass, headed: bool) {
    let results = &pass.results;
    let mut targets: Vec<Target> = Vec::new();
    let rtt50 = percentile_us(&results.rtt, 50.0);
    let rtt99 = percentile_us(&results.rtt, 99.0);
    if headed {
        let _ = writeln!(out, "## Added round trip: {}\n", pass.label());
    }
    let _ =
        write!(out, "Round trip (PING on a `ConnectionManager`): p50 {} µs, p99 {} µs.", num(rtt50, 1), num(rtt99, 1));
    if let Some(proxy) = &pass.proxy {
        let _ = write!(
            out,
            " Every contender crossed the benchmark's delay proxy ({} ms each way): {} connections, {} chunks up \
             and {} down, released late by p50 {} µs, p99 {} µs.",
            pass.rtt_ms / 2.0,
            proxy.connections,
            proxy.chunks_up,
            proxy.chunks_down,
            num(percentile_us(&proxy.lateness, 50.0), 1),
            num(percentile_us(&proxy.lateness, 99.0), 1),
        );
    }
    out.push_str("\n\n");

    if let Some(s) = &results.one_task {
        scenarios::one_task(out, s, &mut targets);
    }

    if let Some(s) = &results.many_tasks {
        scenarios::many_tasks(out, pass, s, &mut targets);
    }

    if let Some(s) = &results.many_tasks_unpinned {
        scenarios::many_tasks_unpinned(out, pass, s, &mut targets);
    }

    if let Some(s) = &results.contention {
        scenarios::contention(out, s, &mut targets);
    }

    if !results.held.is_empty() {
        scenarios::held(out, pass, &mut targets);
    }

    if !results.wake.is_empty() {
        scenarios::wake(out, pass, &mut targets);
    }

    if !results.waiters.is_empty() {
        waiters_table(out, &results.waiters);
    }

    if !targets.is_empty() {
        let _ = writeln!(out, "### Targets (issue 5)\n");
        let _ = writeln!(out, "| scenario | target | result | met |");
        let _ = writeln!(out, "|---|---|---|---|");
        for t in &targets {
            let met = match t.met {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "–",
            };
            let _ = writeln!(out, "| {} | {} | {} | {} |", t.scenario, t.what, t.result, met);
        }
        out.push('\n');
    }
}

/// The ratios to the raw floor that issue 18's targets name, in one pass.
#[derive(Debug, Default, Clone, Copy)]
struct Ratios {
    one: (f64, f64),
    /// One task: the least fenced cycle by script ÷ raw (the bound for `one.0`).
    one_fenced: f64,
    /// One task: the raw floor's cycle p50 ÷ distlock's (less moved by a loaded machine's stalls than cycles/s).
    one_p50: f64,
    many: (f64, f64),
    unpinned: (f64, f64),
    /// distlock's hand-off gap p50 ÷ its release call p50 (target: ≤ 1, one release round trip).
    hand_off: f64,
    /// distlock's fewest acquisitions of a task ÷ the mean (median over rounds).
    fairness: f64,
}

/// (distlock `acquire`+`release` ÷ raw, rslock ÷ raw) in cycles/s.
fn ratios(s: Option<&uncontended::Scenario>) -> (f64, f64) {
    let Some(s) = s else { return (f64::NAN, f64::NAN) };
    let get = |v| s.by_variant.get(&v).map_or(f64::NAN, |r: &VariantResult| r.median(|x| x.cycles_per_s));
    let raw = get(Variant::Raw);
    (ratio(get(Variant::Api), raw), ratio(get(Variant::Rslock), raw))
}

impl Ratios {
    fn of(results: &Results) -> Self {
        let (hand_off, fairness) = results.contention.as_ref().and_then(|c| c.by_waiter.get(&Waiter::Distlock)).map_or(
            (f64::NAN, f64::NAN),
            |d| {
                (
                    ratio(d.median(|x| x.gap_p50_us), d.median(|x| x.release_p50_us)),
                    d.median(|x| x.min_per_task as f64 / x.mean_per_task),
                )
            },
        );
        let one_p50 = results.one_task.as_ref().map_or(f64::NAN, |s| {
            let p50 = |v| s.by_variant.get(&v).map_or(f64::NAN, |r: &VariantResult| r.median(|x| x.p50_us));
            ratio(p50(Variant::Raw), p50(Variant::Api))
        });
        Self {
            one: ratios(results.one_task.as_ref()),
            one_fenced: results.one_task.as_ref().map_or(f64::NAN, |s| {
                let get = |v| s.by_variant.get(&v).map_or(f64::NAN, |r: &VariantResult| r.median(|x| x.cycles_per_s));
                ratio(get(Variant::Fenced), get(Variant::Raw))
            }),
            one_p50,
            many: ratios(results.many_tasks.as_ref()),
            unpinned: ratios(results.many_tasks_unpinned.as_ref()),
            hand_off,
            fairness,
        }
    }

    /// Issue 18's targets this pass missed (NaN: not measured, not missed).
    fn missed(&self) -> Vec<String> {
        let mut missed = Vec::new();
        let mut check = |ok: bool, what: String| {
            if !ok {
                missed.push(what);
            }
        };
        let (d, r) = self.many;
        check(not_below(d, 0.95), format!("64 tasks {} < 0.95", num(d, 2)));
        check(not_below(d, r), format!("64 tasks {} < rslock {}", num(d, 2), num(r, 2)));
        let (d, r) = self.unpinned;
        check(not_below(d, r), format!("2u {} < rslock {}", num(d, 2), num(r, 2)));
        check(not_below(self.one.0, 0.97), format!("1 task {} < 0.97", num(self.one.0, 2)));
        check(not_below(1.0, self.hand_off), format!("hand-off {} release calls", num(self.hand_off, 2)));
        check(not_below(self.fairness, 0.9), format!("fairness {} < 0.9", num(self.fairness, 2)));
        missed
    }

    /// Issue 10's targets this pass missed: 64 tasks at ≥ 0.95 of rslock's ratio, pinned and unpinned (2u),
    /// and ≥ 0.90 of the floor pinned; a network hop away (`rtt_ms` ≥ 0.25), one task ≥ 0.95 of the floor.
    fn missed_issue_10(&self, rtt_ms: f64) -> Vec<String> {
        let mut missed = Vec::new();
        let mut check = |ok: bool, what: String| {
            if !ok {
                missed.push(what);
            }
        };
        for (name, (d, r)) in [("64 tasks", self.many), ("2u", self.unpinned)] {
            check(not_below(d, 0.95 * r), format!("{name} {} < 0.95 × rslock {}", num(d, 2), num(r, 2)));
        }
        check(not_below(self.many.0, 0.90), format!("64 tasks {} < 0.90", num(self.many.0, 2)));
        if rtt_ms >= 0.25 {
            check(not_below(self.one.0, 0.95), format!("1 task {} < 0.95", num(self.one.0, 2)));
        }
        missed
    }
}

/// What one task's cycle costs beyond the raw floor's at each round trip, and where: Redis's time in the
/// scripts' commands (fencing, the queue check, the record's fields) and the client's CPU. A time is the
/// median cycle (1 / cycles per second) over rounds.
fn beyond_the_floor(out: &mut String, passes: &[Pass]) {
    let _ = writeln!(out, "### One task: what a cycle costs beyond the raw floor, per added round trip\n");
    let _ = writeln!(
        out,
        "Cycle: 1 s ÷ cycles/s (median over rounds). Redis: time in commands per cycle (INFO commandstats); what \
         distlock's scripts add there is fencing (`TIME`, the last token kept in a freed record), the queue check \
         and the record's fields. Client: this process's CPU per cycle.\n"
    );
    let _ = writeln!(
        out,
        "| added round trip | floor cycle µs | distlock cycle µs | distlock − floor µs | Redis in commands floor / distlock µs | client CPU floor / distlock µs |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|");
    for p in passes {
        let Some(s) = p.results.one_task.as_ref() else { continue };
        let get = |v, f: fn(&crate::uncontended::Round) -> f64| {
            s.by_variant.get(&v).map_or(f64::NAN, |r: &VariantResult| r.median(f))
        };
        let cycle = |v| 1e6 / get(v, |x| x.cycles_per_s);
        let (raw, api) = (cycle(Variant::Raw), cycle(Variant::Api));
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} / {} | {} / {} |",
            p.label(),
            num(raw, 1),
            num(api, 1),
            num(api - raw, 1),
            num(get(Variant::Raw, |x| x.server_cmd_us), 1),
            num(get(Variant::Api, |x| x.server_cmd_us), 1),
            num(get(Variant::Raw, |x| x.cpu_us), 1),
            num(get(Variant::Api, |x| x.cpu_us), 1),
        );
    }
    out.push('\n');
}

/// `x ≥ bound`, or either is unknown (NaN: not measured, so not missed).
fn not_below(x: f64, bound: f64) -> bool {
    x.partial_cmp(&bound) != Some(std::cmp::Ordering::Less)
}

/// Scenario × round trip: each contender's ratio to the raw floor in the same pass, and issue 18's targets.
fn summary(out: &mut String, passes: &[Pass]) {
    let _ = writeln!(out, "## Summary: ratios to the raw floor, per added round trip\n");
    let _ = writeln!(
        out,
        "Each ratio is cycles/s ÷ the raw floor's in the same pass (distlock = `acquire` + `release`). Hand-off: \
         distlock's hand-off gap p50 ÷ its own release call p50 (1 = one release round trip). Fairness: the fewest \
         acquisitions of any task ÷ the mean. \"1 task p50\": raw's cycle p50 ÷ distlock's. \"1 task bound\": the least \
         fenced cycle by script (GET, TIME, SET PX; GET, SET KEEPTTL) ÷ raw, which no fenced cycle can beat. Targets (issue 18): 64 \
         tasks ≥ 0.95 and ≥ rslock's ratio, 1 task ≥ 0.97, hand-off ≤ 1, fairness ≥ 0.9. Targets (issue 10): 64 tasks \
         ≥ 0.95 × rslock's ratio pinned and 2u, and ≥ 0.90 pinned; a hop away (≥ 0.25 ms), 1 task ≥ 0.95.\n"
    );
    let _ = writeln!(
        out,
        "| added round trip | PING p50 µs | 1 task distlock | 1 task rslock | 1 task bound | 1 task p50 | 64 tasks distlock | 64 tasks rslock | 2u distlock | 2u rslock | hand-off ÷ release call | fairness | targets missed (issue 18) | targets missed (issue 10) |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|");
    for p in passes {
        let r = Ratios::of(&p.results);
        let missed = r.missed();
        let missed_10 = r.missed_issue_10(p.rtt_ms);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            p.label(),
            num(percentile_us(&p.results.rtt, 50.0), 1),
            num(r.one.0, 2),
            num(r.one.1, 2),
            num(r.one_fenced, 2),
            num(r.one_p50, 2),
            num(r.many.0, 2),
            num(r.many.1, 2),
            num(r.unpinned.0, 2),
            num(r.unpinned.1, 2),
            num(r.hand_off, 2),
            num(r.fairness, 2),
            if missed.is_empty() { "none".to_owned() } else { missed.join("; ") },
            if missed_10.is_empty() { "none".to_owned() } else { missed_10.join("; ") },
        );
    }
    out.push('\n');
}

/// Scenario 6, and issue 33's waiter targets against its first row (N = 10).
fn waiters_table(out: &mut String, rows: &[crate::waiters::Row]) {
    let _ = writeln!(out, "### 6. Waiters on one key: N tasks loop acquire → ~2 ms hold → release (one client)\n");
    let _ = writeln!(
        out,
        "What waiting costs Redis: commands (scripts' inner calls included) and Redis CPU (its process's user + \
         system time) per acquisition, measured after every waiter queued, on a server emptied before each row \
         (FLUSHALL: no key left by earlier scenarios expires inside a window); the median of {} windows.\n",
        crate::waiters::WINDOWS
    );
    let _ = writeln!(
        out,
        "| waiters | windows | acquisitions/s | Redis commands/acquisition | Redis CPU µs/acquisition | release call p50 µs | keys expired | overlaps | errors |"
    );
    let _ = writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} × {} | {} | {} | {} | {} | {} | {} | {} |",
            r.waiters,
            crate::waiters::WINDOWS,
            secs(r.window),
            num(r.acquisitions_per_s, 0),
            num(r.commands_per_acquisition, 1),
            num(r.redis_cpu_us_per_acquisition, 0),
            num(r.release_p50_us, 0),
            r.expired_keys,
            r.overlaps,
            r.errors
        );
    }
    if let Some(e) = rows.iter().find_map(|r| r.first_error.as_deref()) {
        let _ = writeln!(out, "\nFirst error: {e}");
    }
    let Some(base) = rows.iter().find(|r| r.waiters == 10) else { return out.push('\n') };
    let _ = writeln!(out, "\n| target (issue 33), against N = 10 | result | met |");
    let _ = writeln!(out, "|---|---|---|");
    for r in rows.iter().filter(|r| r.waiters >= 1_000) {
        let commands = ratio(r.commands_per_acquisition, base.commands_per_acquisition);
        let cpu = ratio(r.redis_cpu_us_per_acquisition, base.redis_cpu_us_per_acquisition);
        let throughput = ratio(r.acquisitions_per_s, base.acquisitions_per_s);
        let met = commands <= 1.5 && cpu <= 1.5 && throughput >= 0.9 && r.overlaps == 0 && r.errors == 0;
        let _ = writeln!(
            out,
            "| N = {}: commands and Redis CPU per acquisition ≤ 1.5×, throughput ≥ 0.9× | commands {}×, CPU {}×, throughput {}× | {} |",
            r.waiters,
            num(commands, 2),
            num(cpu, 2),
            num(throughput, 2),
            if met { "yes" } else { "no" }
        );
    }
    out.push('\n');
}
