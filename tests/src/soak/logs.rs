//! Reading worker logs: progress since a moment, and the lines to show when a check fails.

use std::fmt::Write as _;

use super::events::{parse_log, Event};

/// Whether a worker log shows progress since `since`: a grant asked for then or later, released as
/// `Released` (what [`Check::Progress`](super::check::Check::Progress) wants of every worker after the heal).
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
