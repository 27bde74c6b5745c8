//! `ls`, `show` and `release`.

use std::io::{BufWriter, IsTerminal, Write};
use std::time::Duration;

use tokio::io::AsyncBufReadExt;

use crate::render::{fence, printable, short, Row, State, Table};
use crate::{Exit, Failure};

/// How many records are read at once: one page of names, its reads pipelined.
const BATCH: usize = 1000;

/// The rows of the held locks among `names` (in that order), skipping any released since it was listed.
pub(crate) async fn rows(client: &distlock::Client, names: Vec<String>) -> Result<Vec<Row>, Failure> {
    let infos = client.lock_infos(&names).await?;
    Ok(held_rows(names, infos))
}

/// The rows of the names whose lock is held, from their records (`None`: free).
fn held_rows(names: Vec<String>, infos: Vec<Option<distlock::LockInfo>>) -> Vec<Row> {
    names.into_iter().zip(infos).filter_map(|(name, info)| Some(Row::new(name, info.as_ref()?))).collect()
}

/// As [`rows`], but a record that cannot be read (a value another program wrote since the listing, or a
/// failure on the way) is left out and counted in `skips`, so one bad key does not end `ls`: when the batch's
/// reads fail, each record is read again alone.
async fn readable_rows(client: &distlock::Client, names: Vec<String>, skips: &mut Skips) -> Vec<Row> {
    if let Ok(infos) = client.lock_infos(&names).await {
        return held_rows(names, infos);
    }
    let mut rows = Vec::with_capacity(names.len());
    for name in names {
        match client.lock_info(&name).await {
            Ok(Some(info)) => rows.push(Row::new(name, &info)),
            Ok(None) => {}
            Err(e) => {
                skips.unreadable += 1;
                skips.unreadable_cause = Some(crate::in_cli_terms(&e.to_string()));
            }
        }
    }
    rows
}

/// How long a listing interrupted by a failed SCAN step (a failover, a dropped connection) keeps starting over
/// before it gives up: a Sentinel failover takes the sentinels' `down-after-milliseconds` (30 s by default)
/// and the switch.
const RESUME_FOR: Duration = Duration::from_secs(60);

/// What a listing left out or rode out, said on standard error when it ends.
#[derive(Debug, Default)]
pub(crate) struct Skips {
    /// Keys under the prefix holding a value distlock did not write.
    foreign: usize,
    /// Records that could not be read, and the last error.
    unreadable: usize,
    unreadable_cause: Option<String>,
    /// SCAN steps that failed and were asked again, and the last error.
    interruptions: usize,
    interruption_cause: Option<String>,
}

impl Skips {
    /// The lines `ls` and `watch` print on standard error.
    pub(crate) fn notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        if self.foreign > 0 {
            let keys = if self.foreign == 1 { "key" } else { "keys" };
            notes.push(format!(
                "skipped {} {keys} under the key prefix holding a value distlock did not write (another program's \
                 data: give distlock a prefix of its own with --prefix, or delete them)",
                self.foreign
            ));
        }
        if let Some(cause) = &self.unreadable_cause {
            let records = if self.unreadable == 1 { "lock whose record" } else { "locks whose records" };
            notes.push(format!("skipped {} {records} could not be read (the last error: {cause})", self.unreadable));
        }
        if let Some(cause) = &self.interruption_cause {
            notes.push(format!(
                "the listing was interrupted {} time(s) and started over on the server answering then (the last \
                 error: {cause}): a lock taken or released meanwhile, or lost in a failover, may be missing or \
                 shown though gone",
                self.interruptions
            ));
        }
        notes
    }

    fn print(&self) {
        self.notes().iter().for_each(|note| eprintln!("{note}"));
    }
}

/// A listing that rides out a failover or a dropped connection: when a SCAN step fails with a transient error,
/// it starts over (a SCAN cursor means nothing to another server, such as a promoted replica), asking for up to
/// [`RESUME_FOR`]; what it gives again after starting over, its reader leaves out.
struct Listing<'a> {
    client: &'a distlock::Client,
    pattern: &'a str,
    scan: distlock::LockListing,
    skips: Skips,
}

impl<'a> Listing<'a> {
    fn new(client: &'a distlock::Client, pattern: &'a str) -> Self {
        Self { client, pattern, scan: client.list_locks(pattern), skips: Skips::default() }
    }

    /// The next page, or `None` when the listing is over.
    async fn next_page(&mut self) -> Result<Option<Vec<String>>, Failure> {
        let deadline = tokio::time::Instant::now() + RESUME_FOR;
        let mut said = false;
        loop {
            match self.scan.next_page().await {
                Ok(page) => {
                    self.skips.foreign = self.skips.foreign.max(self.scan.skipped());
                    return Ok(page);
                }
                Err(e) if e.is_transient() && tokio::time::Instant::now() < deadline => {
                    let cause = crate::in_cli_terms(&e.to_string());
                    if !said {
                        eprintln!("listing interrupted ({cause}): starting over, for up to {}s", RESUME_FOR.as_secs());
                        self.skips.interruptions += 1;
                        said = true;
                    }
                    self.skips.interruption_cause = Some(cause);
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    self.scan = self.client.list_locks(self.pattern);
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// Every held lock matching `pattern`, sorted by name (`watch` shows a screenful; `ls` streams instead), and what
/// the listing left out or rode out.
pub(crate) async fn sorted_names(client: &distlock::Client, pattern: &str) -> Result<(Vec<String>, Skips), Failure> {
    let mut listing = Listing::new(client, pattern);
    let mut names = Vec::new();
    while let Some(page) = listing.next_page().await? {
        names.extend(page);
    }
    names.sort_unstable();
    names.dedup();
    Ok((names, listing.skips))
}

/// Prints rows as a table or as the elements of one JSON array, as they come.
struct Printer<W: Write> {
    out: W,
    json: bool,
    table: Table,
    printed: usize,
}

impl<W: Write> Printer<W> {
    fn print(&mut self, rows: &[Row]) -> Result<(), Failure> {
        for row in rows {
            match (self.json, self.printed) {
                (true, 0) => write!(self.out, "[\n{}", json(row))?,
                (true, _) => write!(self.out, ",\n{}", json(row))?,
                (false, 0) => {
                    self.table.header(&mut self.out)?;
                    self.table.row(&mut self.out, row)?;
                }
                (false, _) => self.table.row(&mut self.out, row)?,
            }
            self.printed += 1;
        }
        self.out.flush()?;
        Ok(())
    }

    fn finish(mut self, pattern: &str) -> Result<(), Failure> {
        if self.json {
            writeln!(self.out, "{}", if self.printed == 0 { "[]" } else { "\n]" })?;
        } else if self.printed == 0 {
            eprintln!("no lock held matching `{}`", printable(pattern));
        }
        self.out.flush()?;
        Ok(())
    }
}

fn json(row: &Row) -> String {
    // A struct of strings and numbers always serializes.
    serde_json::to_string(row).unwrap_or_default()
}

/// `distlock ls`: sorted, the names are gathered first (memory: the names alone), then their records read
/// and printed a batch at a time; `--unsorted` prints each page as it is scanned.
pub(crate) async fn ls(client: &distlock::Client, pattern: &str, json: bool, unsorted: bool) -> Result<(), Failure> {
    let out = BufWriter::new(std::io::stdout().lock());
    if unsorted {
        let mut printer = Printer { out, json, table: Table::new(MAX_UNSORTED_KEY), printed: 0 };
        let mut listing = Listing::new(client, pattern);
        // The names printed (memory: the names alone, as the sorted listing holds), for when the listing starts
        // over and gives them again.
        let mut printed = std::collections::HashSet::new();
        while let Some(mut page) = listing.next_page().await? {
            page.sort_unstable();
            page.dedup();
            if listing.skips.interruptions > 0 {
                page.retain(|name| !printed.contains(name));
            }
            let rows = readable_rows(client, page, &mut listing.skips).await;
            printer.print(&rows)?;
            printed.extend(rows.into_iter().map(|row| row.key));
        }
        listing.skips.print();
        return printer.finish(pattern);
    }
    let (names, mut skips) = sorted_names(client, pattern).await?;
    let longest = names.iter().map(|n| printable(n).chars().count()).max().unwrap_or(0);
    let mut printer = Printer { out, json, table: Table::new(longest), printed: 0 };
    let mut names = names.into_iter();
    loop {
        let batch: Vec<String> = names.by_ref().take(BATCH).collect();
        if batch.is_empty() {
            break;
        }
        printer.print(&readable_rows(client, batch, &mut skips).await)?;
    }
    skips.print();
    printer.finish(pattern)
}

/// The key column's width when the names are not known in advance.
const MAX_UNSORTED_KEY: usize = 32;

/// The lock's row, or the "not held" failure.
async fn held(client: &distlock::Client, key: &str) -> Result<Row, Failure> {
    match client.lock_info(key).await? {
        Some(info) => Ok(Row::new(key.to_owned(), &info)),
        None => Err(Failure::new(Exit::NotFound, format!("lock `{}` is not held", printable(key)))),
    }
}

/// One waiter, as `show` prints it.
#[derive(Debug, serde::Serialize)]
struct Waiter {
    position: usize,
    owner: String,
    metadata: String,
    waiting_for_ms: u128,
}

/// `distlock show KEY`.
pub(crate) async fn show(client: &distlock::Client, key: &str, json: bool) -> Result<(), Failure> {
    let row = held(client, key).await?;
    let queue: Vec<Waiter> = client
        .lock_waiters(key)
        .await?
        .into_iter()
        .enumerate()
        .map(|(i, w)| Waiter {
            position: i + 1,
            owner: w.owner,
            metadata: w.metadata,
            waiting_for_ms: w.waiting_for.as_millis(),
        })
        .collect();
    let mut out = BufWriter::new(std::io::stdout().lock());
    if json {
        #[derive(serde::Serialize)]
        struct Shown<'a> {
            #[serde(flatten)]
            row: &'a Row,
            queue: &'a [Waiter],
        }
        let text = serde_json::to_string_pretty(&Shown { row: &row, queue: &queue }).unwrap_or_default();
        writeln!(out, "{text}")?;
        out.flush()?;
        return Ok(());
    }
    writeln!(out, "key:            {}", printable(&row.key))?;
    match row.state {
        State::Running => writeln!(out, "state:          running (its holder renews the lease while it works)")?,
        State::Finished => {
            writeln!(out, "state:          {} (released by its holder; min_hold keeps it)", row.state_text())?
        }
    }
    writeln!(out, "owner:          {}", printable(&row.owner))?;
    writeln!(out, "metadata:       {}", printable(&row.metadata))?;
    writeln!(out, "held for:       {}", short(row.held_for()))?;
    writeln!(out, "lease left:     {}", short(row.lease_left()))?;
    writeln!(out, "fencing token:  {}", fence(row.fencing_token))?;
    let stale = row.waiters.saturating_sub(queue.len());
    match (queue.len(), stale) {
        (0, 0) => writeln!(out, "queue:          empty")?,
        (n, 0) => writeln!(out, "queue:          {n} waiting, first in line first")?,
        (n, stale) => writeln!(
            out,
            "queue:          {n} waiting, first in line first (and {stale} places whose waiters stopped refreshing \
             them, or past the first {}; a release skips the former)",
            distlock::MAX_WAITERS_LISTED
        )?,
    }
    for w in &queue {
        writeln!(
            out,
            "  {:>3}. {:<24}  waiting {:>8}  {}",
            w.position,
            printable(&w.owner),
            short(Duration::from_millis(w.waiting_for_ms as u64)),
            printable(&w.metadata)
        )?;
    }
    out.flush()?;
    Ok(())
}

/// `distlock release KEY`: shows the holder, asks (unless `--yes`; refused without a terminal), frees it.
pub(crate) async fn release(client: &distlock::Client, key: &str, yes: bool) -> Result<(), Failure> {
    let row = held(client, key).await?;
    let shown = printable(key);
    if !yes {
        if !std::io::stdin().is_terminal() {
            return Err(Failure::new(
                Exit::Refused,
                format!("not releasing `{shown}`: standard input is not a terminal to confirm on; add --yes to release without asking"),
            ));
        }
        let consequence = match row.state {
            State::Running => {
                "Force-releasing frees it now; the holder learns it at its next renewal and may act as holder until then."
            }
            State::Finished => "Its holder has finished: force-releasing frees it now, before min_hold would.",
        };
        eprintln!(
            "lock `{shown}` is held by {} ({}) for {}, {}, lease left {}, fencing token {}, {} waiting.\n{consequence}",
            printable(&row.owner),
            printable(&row.metadata),
            short(row.held_for()),
            row.state_text(),
            short(row.lease_left()),
            fence(row.fencing_token),
            row.waiters,
        );
        eprint!("Release `{shown}`? [y/N] ");
        let mut answer = String::new();
        tokio::io::BufReader::new(tokio::io::stdin()).read_line(&mut answer).await.map_err(|e| {
            Failure::new(Exit::Refused, format!("not releasing `{shown}`: cannot read the answer: {e}"))
        })?;
        if !matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes") {
            return Err(Failure::new(Exit::Refused, format!("not releasing `{shown}`")));
        }
        // The answer may have taken a while: free only the grant that was confirmed, not a later holder's.
        let now = held(client, key).await?;
        if (now.fencing_token, &now.owner, &now.metadata) != (row.fencing_token, &row.owner, &row.metadata)
            || now.held_for_ms < row.held_for_ms
        {
            return Err(Failure::new(
                Exit::Refused,
                format!(
                    "not releasing `{shown}`: it changed hands while you answered (now held by {}, fencing token {}); run release again",
                    printable(&now.owner),
                    fence(now.fencing_token)
                ),
            ));
        }
    }
    if client.force_unlock(key).await? {
        println!("released `{shown}`");
        Ok(())
    } else {
        Err(Failure::new(
            Exit::NotFound,
            format!("lock `{shown}` was released or expired meanwhile: nothing to release"),
        ))
    }
}
