//! `distlock watch`: the held locks redrawn in place every interval, and what changed between two looks.
//!
//! What it can tell apart is what two listings an interval apart show: a lock that appeared (acquired), one
//! with a new fencing token or holder (handed over, or released and acquired again, within the interval), one
//! gone before its lease would have ended (released or force-released) and one gone after (expired: its
//! holder stopped renewing, so it crashed, hung or lost the lock). Anything shorter than an interval is not
//! seen.

use std::collections::{HashMap, VecDeque};
use std::io::{IsTerminal, Write};
use std::time::Duration;

use tokio::time::Instant;

use crate::commands::{rows, skipped_note, sorted_names};
use crate::render::{fence, printable, Row, Table};
use crate::Failure;

/// The most recent changes shown under the table.
const EVENTS_SHOWN: usize = 12;

pub(crate) async fn watch(
    client: &distlock::Client,
    pattern: &str,
    interval: Duration,
    count: Option<u64>,
) -> Result<(), Failure> {
    let terminal = std::io::stdout().is_terminal();
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
        if let Some((then, before)) = &previous {
            for event in changes(before, &now, seen_at.duration_since(*then)) {
                if events.len() == EVENTS_SHOWN {
                    events.pop_front();
                }
                events.push_back(format!("{}  {event}", clock()));
            }
        }
        draw(terminal, pattern, &current, &events, interval)?;
        if let Some(note) = skipped_note(skipped) {
            eprintln!("{note}");
        }
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

/// What changed from `before` to `now`, `elapsed` apart, in key order.
fn changes(before: &HashMap<String, Row>, now: &HashMap<String, Row>, elapsed: Duration) -> Vec<String> {
    let mut keys: Vec<&String> = before.keys().chain(now.keys()).collect();
    keys.sort_unstable();
    keys.dedup();
    keys.into_iter()
        .filter_map(|key| {
            let shown = printable(key);
            match (before.get(key), now.get(key)) {
                (None, Some(row)) => Some(format!("acquired  {shown}  by {}", printable(&row.owner))),
                (Some(old), Some(new)) if old.fencing_token != new.fencing_token || old.owner != new.owner || old.metadata != new.metadata || new.held_for_ms < old.held_for_ms => {
                    Some(format!(
                        "new holder  {shown}  {} → {} (fencing token {} → {}): handed over, or released and taken again",
                        printable(&old.owner),
                        printable(&new.owner),
                        fence(old.fencing_token),
                        fence(new.fencing_token)
                    ))
                }
                (Some(old), None) if Duration::from_millis(old.lease_left_ms as u64) > elapsed => {
                    Some(format!("released  {shown}  (was held by {})", printable(&old.owner)))
                }
                (Some(old), None) => Some(format!(
                    "EXPIRED  {shown}  held by {}: its lease ran out (the holder stopped renewing: crashed, hung or lost it)",
                    printable(&old.owner)
                )),
                _ => None,
            }
        })
        .collect()
}

/// Wall-clock time of day (UTC), for the event log.
fn clock() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    format!("{:02}:{:02}:{:02}", secs / 3600 % 24, secs / 60 % 60, secs % 60)
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
        clock(),
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

    fn row(key: &str, owner: &str, fence: u64, lease_left_ms: u128) -> Row {
        Row {
            key: key.into(),
            owner: owner.into(),
            metadata: String::new(),
            held_for_ms: 1000,
            lease_left_ms,
            fencing_token: fence,
            waiters: 0,
        }
    }

    #[test]
    fn changes_tell_acquired_handed_over_released_and_expired_apart() {
        let before: HashMap<String, Row> =
            [row("a", "x", 1, 5000), row("b", "x", 2, 5000), row("c", "x", 3, 100), row("d", "x", 4, 5000)]
                .into_iter()
                .map(|r| (r.key.clone(), r))
                .collect();
        let now: HashMap<String, Row> = [row("a", "x", 1, 4000), row("b", "y", 5, 5000), row("e", "z", 6, 5000)]
            .into_iter()
            .map(|r| (r.key.clone(), r))
            .collect();
        let events = changes(&before, &now, Duration::from_secs(1));
        assert_eq!(events.len(), 4, "{events:#?}");
        assert!(events[0].starts_with("new holder  b  x → y (fencing token 2 → 5)"), "{}", events[0]);
        assert!(events[1].starts_with("EXPIRED  c"), "{}", events[1]);
        assert!(events[2].starts_with("released  d"), "{}", events[2]);
        assert!(events[3].starts_with("acquired  e  by z"), "{}", events[3]);
    }
}
