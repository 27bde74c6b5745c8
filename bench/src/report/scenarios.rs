//! One function a scenario: its table (or tables) and the targets it decides.

use std::fmt::Write as _;
use std::time::Duration;

use super::{errors_note, num, ratio, secs, uncontended_table, Pass, Target};
use crate::contention::{self, Waiter};
use crate::measure::percentile_us;
use crate::systems::Variant;
use crate::uncontended::{self, VariantResult};

/// Scenario 1: one task, distinct keys, and its targets.
pub(super) fn one_task(out: &mut String, s: &uncontended::Scenario, targets: &mut Vec<Target>) {
    let _ = writeln!(out, "### 1. One task, distinct keys (acquire + release, {} windows)\n", secs(s.window));
    uncontended_table(out, s);
    let get = |v| s.by_variant.get(&v).map(|r: &VariantResult| r.median(|x| x.cycles_per_s));
    if let (Some(raw), Some(api)) = (get(Variant::Raw), get(Variant::Api)) {
        let r = api / raw;
        targets.push(Target {
            scenario: "1",
            what: "distlock ÷ raw floor ≥ 0.95 (cycles/s, one task)".into(),
            result: num(r, 2),
            met: Some(r >= 0.95),
        });
    }
    if let (Some(api), Some(mac)) = (get(Variant::Api), get(Variant::Macro)) {
        let r = mac / api;
        targets.push(Target {
            scenario: "1",
            what: "macro within 3% of the programmatic API (cycles/s)".into(),
            result: format!("macro ÷ acquire+release = {}", num(r, 3)),
            met: Some(r >= 0.97),
        });
    }
    if let (Some(raw), Some(api), Some(rs)) = (get(Variant::Raw), get(Variant::Api), get(Variant::Rslock)) {
        let bound = get(Variant::Fenced)
            .map_or(String::new(), |f| format!("; the least fenced cycle by script {}", num(f / raw, 2)));
        targets.push(Target {
            scenario: "1",
            what: "issue 33: distlock ≥ rslock (× raw, one task)".into(),
            result: format!("{} vs rslock {}{bound}", num(api / raw, 2), num(rs / raw, 2)),
            met: Some(api >= rs),
        });
    }
    if let (Some(run), Some(mac)) = (get(Variant::Run), get(Variant::Macro)) {
        let _ = writeln!(out, "\nmacro ÷ `run` = {} (the macro expands to `run`).", num(mac / run, 3));
    }
    out.push('\n');
}

/// Scenario 2: many tasks on one client, and its targets.
pub(super) fn many_tasks(out: &mut String, pass: &Pass, s: &uncontended::Scenario, targets: &mut Vec<Target>) {
    let _ = writeln!(
        out,
        "### 2. {} tasks, distinct keys, all on one client (one connection) per contender ({} windows)\n",
        s.tasks,
        secs(s.window)
    );
    uncontended_table(out, s);
    let get = |v| s.by_variant.get(&v).map(|r: &VariantResult| r.median(|x| x.cycles_per_s));
    if let (Some(raw), Some(api)) = (get(Variant::Raw), get(Variant::Api)) {
        let r = api / raw;
        let rs = get(Variant::Rslock).map_or(String::new(), |c| format!(" (rslock {})", num(c / raw, 2)));
        targets.push(Target {
            scenario: "2",
            what: "distlock ÷ raw floor ≥ 0.9 (cycles/s, 64 tasks)".into(),
            result: format!("{}{rs}", num(r, 2)),
            met: Some(r >= 0.9),
        });
    }
    // Through the proxy at +0 the proxy's threads take CPU from Redis: the Redis-bound row of issue 33.
    if let (true, Some(raw), Some(api), Some(rs)) =
        (pass.proxied && pass.rtt_ms == 0.0, get(Variant::Raw), get(Variant::Api), get(Variant::Rslock))
    {
        targets.push(Target {
            scenario: "2",
            what: "issue 33: distlock ≥ rslock (× raw, 64 tasks through the proxy at +0)".into(),
            result: format!("{} vs rslock {}", num(api / raw, 2), num(rs / raw, 2)),
            met: Some(api >= rs),
        });
    }
    out.push('\n');
}

/// Scenario 2u: many tasks, client and Redis sharing every CPU, and its target.
pub(super) fn many_tasks_unpinned(out: &mut String, pass: &Pass, s: &uncontended::Scenario, targets: &mut Vec<Target>) {
    let _ = writeln!(
        out,
        "### 2u. {} tasks, distinct keys, unpinned: a {}-worker client and redis-server share every CPU ({} windows)\n",
        s.tasks,
        crate::uncontended::UNPINNED_WORKERS,
        secs(s.window)
    );
    uncontended_table(out, s);
    let get = |v| s.by_variant.get(&v).map(|r: &VariantResult| r.median(|x| x.cycles_per_s));
    if let (false, Some(raw), Some(api), Some(rs)) =
        (pass.proxied, get(Variant::Raw), get(Variant::Api), get(Variant::Rslock))
    {
        targets.push(Target {
            scenario: "2u",
            what: "issue 33: distlock ≥ rslock (× raw, 64 tasks, Redis sharing both CPUs)".into(),
            result: format!("{} vs rslock {}", num(api / raw, 2), num(rs / raw, 2)),
            met: Some(api >= rs),
        });
    }
    out.push('\n');
}

/// Scenario 3: tasks contending for one key (the hand-off), and its targets.
pub(super) fn contention(out: &mut String, s: &contention::Scenario, targets: &mut Vec<Target>) {
    let _ = writeln!(
        out,
        "### 3. {} tasks, one key, hold ~1 ms, 5 ms pause after release ({} windows)\n",
        contention::TASKS,
        secs(s.window)
    );
    let _ = writeln!(
        out,
        "Hand-off gap: from the holder starting its release to the next holder (which was already waiting) \
         having the lock. A hand-off cannot beat one round trip (the release reaching Redis, the announcement \
         coming back): the holder's own release call, start to reply, is shown beside it.\n"
    );
    let _ = writeln!(
        out,
        "| contender | acquisitions/s | × raw | hand-off p50 µs | hand-off p99 µs | release call p50 µs | per task min / max (mean) | min ÷ mean | commands/acquisition | overlaps |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let raw = s.by_waiter.get(&Waiter::RawPoll).map(|r| r.median(|x| x.acquisitions_per_s));
    for w in Waiter::ALL {
        let Some(r) = s.by_waiter.get(&w) else { continue };
        let acq = r.median(|x| x.acquisitions_per_s);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} / {} ({}) | {} | {} | {} |",
            w.label(),
            num(acq, 0),
            raw.map_or("–".into(), |b| num(ratio(acq, b), 2)),
            num(r.median(|x| x.gap_p50_us), 1),
            num(r.median(|x| x.gap_p99_us), 1),
            num(r.median(|x| x.release_p50_us), 1),
            num(r.median(|x| x.min_per_task as f64), 0),
            num(r.median(|x| x.max_per_task as f64), 0),
            num(r.median(|x| x.mean_per_task), 1),
            num(r.median(|x| x.min_per_task as f64 / x.mean_per_task), 2),
            num(r.median(|x| x.commands_per_acquisition), 1),
            r.rounds.iter().map(|x| x.overlaps).sum::<u64>(),
        );
    }
    errors_note(out, s.by_waiter.iter().map(|(w, r)| (w.name(), r.errors, r.first_error.as_deref())));
    let _ = writeln!(
        out,
        "\nmin ÷ mean is the median over rounds of (fewest acquisitions of any task) ÷ (mean per task); the \
         worst round: {}.\n",
        Waiter::ALL
            .iter()
            .filter_map(|w| s.by_waiter.get(w).map(|r| (w, r)))
            .map(|(w, r)| format!(
                "{} {}",
                w.name(),
                num(r.rounds.iter().map(|x| x.min_per_task as f64 / x.mean_per_task).fold(f64::INFINITY, f64::min), 2)
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if let Some(d) = s.by_waiter.get(&Waiter::Distlock) {
        let p50 = d.median(|x| x.gap_p50_us);
        let p99 = d.median(|x| x.gap_p99_us);
        targets.push(Target {
            scenario: "3",
            what: "hand-off gap p50 ≤ 300 µs".into(),
            result: format!("{} µs", num(p50, 1)),
            met: Some(p50 <= 300.0),
        });
        targets.push(Target {
            scenario: "3",
            what: "hand-off gap p99 ≤ 1 ms".into(),
            result: format!("{} µs", num(p99, 1)),
            met: Some(p99 <= 1000.0),
        });
        if let Some(rs) = s.by_waiter.get(&Waiter::Rslock) {
            let f50 = rs.median(|x| x.gap_p50_us) / p50;
            let f99 = rs.median(|x| x.gap_p99_us) / p99;
            targets.push(Target {
                scenario: "3",
                what: "hand-off ≥ 5x better than rslock (p50 and p99)".into(),
                result: format!("{}x (p50), {}x (p99)", num(f50, 1), num(f99, 1)),
                met: Some(f50 >= 5.0 && f99 >= 5.0),
            });
        }
        let worst = d.rounds.iter().map(|x| x.min_per_task as f64 / x.mean_per_task).fold(f64::INFINITY, f64::min);
        targets.push(Target {
            scenario: "3",
            what: "no task below half the mean (every round)".into(),
            result: format!("worst min ÷ mean {}", num(worst, 2)),
            met: Some(worst >= 0.5),
        });
    }
}

/// Scenario 4: locks held at once, their renewals and memory, and its targets.
pub(super) fn held(out: &mut String, pass: &Pass, targets: &mut Vec<Target>) {
    let results = &pass.results;
    let ttl = results.held[0].ttl;
    let _ = writeln!(
        out,
        "### 4. Locks held at once by one client, ttl {} (renewal every ttl/3 = {})\n",
        secs(ttl),
        secs(ttl / 3)
    );
    let _ = writeln!(
        out,
        "Measured over one ttl/3 period right after taking the locks (each lock is renewed exactly once in \
         it). Client commands are what the client sent; the server also counts the commands run inside \
         scripts. CPU is this process's, in % of one core, over the period (the raw rows: one measured \
         renewal sweep, spread over the period). Memory is the growth while taking the locks: heap is \
         what the allocator handed out and kept (exact), RSS the resident growth; each row runs in a fresh \
         child process.\n"
    );
    let _ = writeln!(
        out,
        "| contender | locks | renewal commands/s | target ≤ N/(ttl/3) | server commands/s (incl. in scripts) | client CPU % | heap B/lock | heap blocks/lock | RSS B/lock | time to take all |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &results.held {
        let period = r.period().as_secs_f64();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.label,
            r.locks,
            num(r.commands_per_s(), 1),
            num(r.target_per_s(), 0),
            num(r.server_commands as f64 / period, 0),
            num(r.cpu_pct, 2),
            num(r.heap_per_lock, 0),
            num(r.blocks_per_lock, 1),
            num(r.rss_per_lock, 0),
            secs(Duration::from_secs_f64(r.fill_s)),
        );
    }
    errors_note(out, results.held.iter().map(|r| (r.label, r.errors + r.lost as u64, r.first_error.as_deref())));
    out.push('\n');
    let largest = results.held.iter().map(|r| r.locks).max().unwrap_or(0);
    for r in results.held.iter().filter(|r| r.label.starts_with("distlock")) {
        let tag = match r.locks {
            n if n >= 1000 && n % 1000 == 0 => format!("{}k", n / 1000),
            n => n.to_string(),
        };
        targets.push(Target {
            scenario: "4",
            what: format!("{tag} held: renewal ≤ N/(ttl/3) commands/s"),
            result: format!("{} cmds/s vs {}", num(r.commands_per_s(), 0), num(r.target_per_s(), 0)),
            met: Some(r.commands_per_s() <= r.target_per_s() * 1.01),
        });
        targets.push(Target {
            scenario: "4",
            what: format!("{tag} held: < 1 KiB client memory per lock"),
            result: format!("heap {} B, RSS {} B", num(r.heap_per_lock, 0), num(r.rss_per_lock, 0)),
            met: Some(r.heap_per_lock < 1024.0 && r.rss_per_lock < 1024.0),
        });
        if r.locks == largest {
            // Batched when the server extended more leases than the client sent renewal calls.
            targets.push(Target {
                scenario: "4",
                what: "renewals pipelined or batched".into(),
                result: format!(
                    "{} script calls renewed {} of {} locks in ttl/3 ({} per call)",
                    r.renewal_commands,
                    r.renewed,
                    r.locks,
                    num(r.renewed as f64 / r.renewal_commands.max(1) as f64, 0)
                ),
                met: Some(r.renewed >= r.locks as u64 && r.renewal_commands < r.renewed),
            });
        }
        if r.locks >= 100_000 {
            targets.push(Target {
                scenario: "4",
                what: "100k held: client CPU < 5% of one core".into(),
                result: format!("{} %", num(r.cpu_pct, 2)),
                met: Some(r.cpu_pct < 5.0),
            });
        }
    }
}

/// Scenario 5: a blocked waiter's wake-up after the release, and its target.
pub(super) fn wake(out: &mut String, pass: &Pass, targets: &mut Vec<Target>) {
    let results = &pass.results;
    let rtt50 = percentile_us(&results.rtt, 50.0);
    let idle50 = percentile_us(&results.idle_rtt, 50.0);
    let _ = writeln!(out, "### 5. Wake-up of a blocked waiter after the release\n");
    let _ = writeln!(
        out,
        "The waiter is blocked in a wait when the holder (another client) releases, {} ms after the waiter \
         started. Wake-up is measured from the holder starting its release call to the waiter holding the \
         lock. A round trip after that much idle time is slower than back to back (the CPUs have gone idle): \
         PING after {} ms idle p50 = {} µs (back to back {} µs); the holder's release call itself is one \
         such round trip.\n",
        crate::wakeup::SETTLE.as_millis(),
        crate::wakeup::SETTLE.as_millis(),
        num(idle50, 1),
        num(rtt50, 1)
    );
    let _ = writeln!(
        out,
        "| waiter | trials | wake-up p50 µs | max µs | release call p50 µs | wake-up ÷ release call | wake-up ÷ idle PING | from release reply, p50 µs |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|");
    for w in &results.wake {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            w.label,
            w.from_release_start.len(),
            num(w.p50_us(), 1),
            num(w.max_us(), 1),
            num(w.release_call_p50_us(), 1),
            num(ratio(w.p50_us(), w.release_call_p50_us()), 1),
            num(ratio(w.p50_us(), idle50), 1),
            num(w.done_p50_us(), 1),
        );
        if w.bad_trials > 0 {
            let _ = writeln!(
                out,
                "\n**{}: {} trials not counted** ({})\n",
                w.label,
                w.bad_trials,
                w.first_error.as_deref().unwrap_or("?")
            );
        }
    }
    if let Some(d) = results.wake.iter().find(|w| w.label.starts_with("distlock")) {
        let rtt = d.release_call_p50_us();
        let rtts = ratio(d.p50_us(), rtt);
        targets.push(Target {
            scenario: "5",
            what: "wake-up ≤ 2 round trips after release, with a 5 s backoff".into(),
            result: format!(
                "p50 {} round trips (release call {} µs), max {}; {} idle PINGs",
                num(rtts, 1),
                num(rtt, 0),
                num(ratio(d.max_us(), rtt), 1),
                num(ratio(d.p50_us(), idle50), 1),
            ),
            met: Some(rtts <= 2.0),
        });
    }
    out.push('\n');
}
