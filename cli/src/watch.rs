//! `distlock watch`: the held locks redrawn in place every interval, and what changed between two looks; or,
//! with `--json`, the changes as JSON lines.
//!
//! What it can tell apart is what two listings an interval apart show: a lock that appeared (acquired), one
//! with a new fencing token or holder (handed over, or released and acquired again, within the interval), one
//! whose holder finished while `min_hold` keeps it, one gone before its lease would have ended (released or
//! force-released), one kept by `min_hold` that is gone after it (its `min_hold` is over: free) and a running
//! one gone after its lease (expired: its holder stopped renewing, so it crashed, hung or lost the lock).
//! Anything shorter than an interval is not seen.

use std::collections::{HashMap, VecDeque};
use std::io::{IsTerminal, Write};
use std::time::{Duration, SystemTime};

use serde::Serialize;
use tokio::time::Instant;

use crate::commands::{rows, sorted_names};
use crate::render::{fence, printable, time_of_day, Row, State, Table};
use crate::Failure;

/// The most recent changes shown under the table.
const EVENTS_SHOWN: usize = 12;

pub(crate) async fn watch(
    client: &distlock::Client,
    pattern: &str,
    interval: Duration,
    count: Option<u64>,
    json: bool,
) -> Result<(), Failure> {
    let terminal = !json && std::io::stdout().is_terminal();
    let mut previous: Option<(Instant, HashMap<String, Row>)> = None;
    let mut events: VecDeque<String> = VecDeque::new();
    let mut refreshes = 0u64;
    // Listening from the start, so a Ctrl-C during a refresh also ends the watch cleanly.
    let (interrupted, mut stop) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            let _ = interrupted.send(());
        }
    });
    loop {
        let seen_at = Instant::now();
        let current = tokio::select! {
            current = async {
                let (names, skipped) = sorted_names(client, pattern).await?;
                Ok::<_, Failure>((rows(client, names).await?, skipped))
            } => current?,
            Ok(()) = &mut stop => return Ok(()),
        };
        let (current, skipped) = current;
        let now: HashMap<String, Row> = current.iter().map(|r| (r.key.clone(), r.clone())).collect();
        let changed = match &previous {
            Some((then, before)) => changes(before, &now, seen_at.duration_since(*then)),
            // The first look: what is held, for a reader of the JSON lines to start from.
            None if json => current.iter().map(|row| Change { kind: Kind::Held, row, previous: None }).collect(),
            None => Vec::new(),
        };
        if json {
            print_json_lines(&changed)?;
        } else {
            for change in &changed {
                if events.len() == EVENTS_SHOWN {
                    events.pop_front();
                }
                events.push_back(format!("{}  {change}", time_of_day(SystemTime::now())));
            }
            draw(terminal, pattern, &current, &events, interval)?;
        }
        skipped.notes().iter().for_each(|note| eprintln!("{note}"));
        previous = Some((seen_at, now));
        refreshes += 1;
        if count.is_some_and(|n| refreshes >= n) {
            return Ok(());
        }
        tokio::select! {
            _ = tokio::time::sleep_until(seen_at + interval) => {}
            Ok(()) = &mut stop => return Ok(()),
        }
    }
}

/// What happened to a lock between two looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Kind {
    /// Held at the first look (`--json` only).
    Held,
    /// Taken, since the last look.
    Acquired,
    /// Held by another grant than at the last look: handed over, or released and taken again.
    NewHolder,
    /// Its holder released it and `min_hold` keeps it (it may also have been taken since the last look).
    Finished,
    /// Gone before its lease would have ended: released by its holder, or force-released.
    Released,
    /// Kept by `min_hold` at the last look and gone after its lease: `min_hold` is over, it is free.
    MinHoldOver,
    /// Running at the last look and gone after its lease: nobody renewed it.
    Expired,
}

/// One change: the lock as now seen (as last seen, once gone) and, for a new holder, as before.
#[derive(Debug, Serialize)]
struct Change<'a> {
    #[serde(rename = "event")]
    kind: Kind,
    #[serde(flatten)]
    row: &'a Row,
    #[serde(skip_serializing_if = "Option::is_none")]
    previous: Option<Previous<'a>>,
}

/// The holder before a new one, in a `new_holder` change's JSON.
#[derive(Debug, Serialize)]
struct Previous<'a> {
    owner: &'a str,
    metadata: &'a str,
    fencing_token: u64,
}

impl std::fmt::Display for Change<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (key, owner) = (printable(&self.row.key), printable(&self.row.owner));
        match (self.kind, &self.previous) {
            (Kind::Held, _) => write!(f, "held  {key}  by {owner}"),
            (Kind::Acquired, _) => write!(f, "acquired  {key}  by {owner}"),
            (Kind::NewHolder, Some(old)) => write!(
                f,
                "new holder  {key}  {} → {owner} (fencing token {} → {}): handed over, or released and taken again",
                printable(old.owner),
                fence(old.fencing_token),
                fence(self.row.fencing_token)
            ),
            (Kind::NewHolder, None) => write!(f, "new holder  {key}  {owner}"),
            (Kind::Finished, _) => {
                write!(f, "finished  {key}  by {owner}: released; min_hold keeps it until {}", self.row.lease_end())
            }
            (Kind::Released, _) if self.row.state == State::Finished => {
                write!(f, "released  {key}  (force-released before min_hold freed it; finished by {owner})")
            }
            (Kind::Released, _) => write!(f, "released  {key}  (was held by {owner})"),
            (Kind::MinHoldOver, _) => write!(f, "free  {key}  min_hold is over (finished by {owner})"),
            (Kind::Expired, _) => write!(
                f,
                "EXPIRED  {key}  held by {owner}: its lease ran out unrenewed (the holder crashed, hung or lost it)"
            ),
        }
    }
}

/// Each change as one JSON object on a line, stamped with the time it was seen (`time_ms`, Unix epoch).
fn print_json_lines(changes: &[Change<'_>]) -> Result<(), Failure> {
    #[derive(Serialize)]
    struct Line<'a> {
        time_ms: u128,
        #[serde(flatten)]
        change: &'a Change<'a>,
    }
    let time_ms = SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    let mut out = std::io::stdout().lock();
    for change in changes {
        // Strings and numbers always serialize.
        writeln!(out, "{}", serde_json::to_string(&Line { time_ms, change }).unwrap_or_default())?;
    }
    out.flush()?;
    Ok(())
}

/// What changed from `before` to `now`, `elapsed` apart, in key order.
fn changes<'a>(before: &'a HashMap<String, Row>, now: &'a HashMap<String, Row>, elapsed: Duration) -> Vec<Change<'a>> {
    let mut keys: Vec<&String> = before.keys().chain(now.keys()).collect();
    keys.sort_unstable();
    keys.dedup();
    keys.into_iter().filter_map(|key| change(before.get(key), now.get(key), elapsed)).collect()
}

/// What happened to one lock, seen as `before` and then as `now`, `elapsed` apart; `None` if nothing did.
fn change<'a>(before: Option<&'a Row>, now: Option<&'a Row>, elapsed: Duration) -> Option<Change<'a>> {
    let plain = |kind, row| Some(Change { kind, row, previous: None });
    match (before, now) {
        (None, Some(row)) if row.state == State::Finished => plain(Kind::Finished, row),
        (None, Some(row)) => plain(Kind::Acquired, row),
        (Some(old), Some(new))
            if old.fencing_token != new.fencing_token
                || old.owner != new.owner
                || old.metadata != new.metadata
                || new.held_for_ms < old.held_for_ms =>
        {
            let previous = Previous { owner: &old.owner, metadata: &old.metadata, fencing_token: old.fencing_token };
            Some(Change { kind: Kind::NewHolder, row: new, previous: Some(previous) })
        }
        (Some(old), Some(new)) if old.state == State::Running && new.state == State::Finished => {
            plain(Kind::Finished, new)
        }
        (Some(old), None) if old.lease_left() > elapsed => plain(Kind::Released, old),
        (Some(old), None) if old.state == State::Finished => plain(Kind::MinHoldOver, old),
        (Some(old), None) => plain(Kind::Expired, old),
        _ => None,
    }
}

/// One screen: on a terminal, drawn over the last and cut to its height (the changes first, then as many
/// locks as fit); otherwise appended in full, without escape sequences.
fn draw(
    terminal: bool,
    pattern: &str,
    rows: &[Row],
    events: &VecDeque<String>,
    interval: Duration,
) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    if terminal {
        // Home, then clear the screen below.
        write!(out, "\x1b[H\x1b[J")?;
    }
    writeln!(
        out,
        "distlock watch `{}`: {} held, {} UTC, every {:?} (Ctrl-C to stop)",
        printable(pattern),
        rows.len(),
        time_of_day(SystemTime::now()),
        interval
    )?;
    if !events.is_empty() {
        writeln!(out, "changes (UTC, latest last):")?;
        for event in events {
            writeln!(out, "  {event}")?;
        }
    }
    let table = Table::new(rows.iter().map(|r| printable(&r.key).chars().count()).max().unwrap_or(0));
    table.header(&mut out)?;
    // Lines left for rows: the header, the changes and the table's header are out; one stays for the cursor.
    let used = 2 + if events.is_empty() { 0 } else { events.len() + 1 };
    let fits = match (terminal, terminal_height()) {
        (true, Some(height)) => height.saturating_sub(used + 1).max(1),
        _ => usize::MAX,
    };
    let shown = if rows.len() > fits { fits - 1 } else { rows.len() };
    for row in &rows[..shown] {
        table.row(&mut out, row)?;
    }
    if shown < rows.len() {
        write!(out, "… and {} more: narrow the pattern, or use `distlock ls`", rows.len() - shown)?;
    }
    if !terminal {
        writeln!(out)?;
    }
    out.flush()?;
    Ok(())
}

/// The terminal's height in lines, if standard output is one that says.
#[cfg(unix)]
fn terminal_height() -> Option<usize> {
    let size = rustix::termios::tcgetwinsize(std::io::stdout()).ok()?;
    (size.ws_row > 0).then_some(usize::from(size.ws_row))
}

#[cfg(not(unix))]
fn terminal_height() -> Option<usize> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(key: &str, owner: &str, fence: u64, lease_left_ms: u128, state: State) -> Row {
        Row {
            key: key.into(),
            state,
            owner: owner.into(),
            metadata: String::new(),
            held_for_ms: 1000,
            lease_left_ms,
            fencing_token: fence,
            waiters: 0,
        }
    }

    fn by_key(rows: impl IntoIterator<Item = Row>) -> HashMap<String, Row> {
        rows.into_iter().map(|r| (r.key.clone(), r)).collect()
    }

    #[test]
    fn changes_are_worded_by_what_happened() {
        use State::{Finished, Running};
        let before = by_key([
            row("a", "x", 1, 5000, Running),
            row("b", "x", 2, 5000, Running),
            row("c", "x", 3, 100, Running),
            row("d", "x", 4, 5000, Running),
            row("f", "x", 7, 5000, Running),
            row("g", "x", 8, 100, Finished),
            row("h", "x", 9, 5000, Finished),
        ]);
        let now = by_key([
            row("a", "x", 1, 4000, Running),
            row("b", "y", 5, 5000, Running),
            row("e", "z", 6, 5000, Running),
            row("f", "x", 7, 4000, Finished),
            row("i", "z", 10, 4000, Finished),
        ]);
        let events: Vec<String> =
            changes(&before, &now, Duration::from_secs(1)).iter().map(ToString::to_string).collect();
        let expected = [
            "new holder  b  x → y (fencing token 2 → 5)",
            "EXPIRED  c  held by x: its lease ran out unrenewed",
            "released  d  (was held by x)",
            "acquired  e  by z",
            "finished  f  by x: released; min_hold keeps it until ",
            "free  g  min_hold is over (finished by x)",
            "released  h  (force-released before min_hold freed it",
            "finished  i  by z",
        ];
        assert_eq!(events.len(), expected.len(), "{events:#?}");
        for (event, start) in events.iter().zip(expected) {
            assert!(event.starts_with(start), "{event:?} does not start with {start:?}");
        }
        assert!(events.iter().all(|e| !e.contains("EXPIRED") || e.contains("  c  ")), "{events:#?}");
    }

    #[test]
    fn a_json_line_is_one_object_with_the_event_and_the_lock() {
        let old = row("b", "x", 2, 5000, State::Running);
        let new = row("b", "y", 5, 5000, State::Finished);
        let change = change(Some(&old), Some(&new), Duration::from_secs(1)).expect("a new holder");
        let value = serde_json::to_value(&change).expect("serializes");
        assert_eq!(value["event"], "new_holder");
        assert_eq!(
            (value["key"].as_str(), value["owner"].as_str(), value["state"].as_str()),
            (Some("b"), Some("y"), Some("finished"))
        );
        assert_eq!(value["previous"]["owner"], "x");
        assert_eq!(value["previous"]["fencing_token"], 2);
    }
}
