//! [`Agent`]: a lock holder in another process (the `hold_lock` helper binary), which a test can freeze
//! (SIGSTOP), thaw (SIGCONT) or kill (SIGKILL), and whose reports (one event per stdout line, e.g.
//! `ACQUIRED 7`, `TOKEN <hex>`, `LOST`) the test reads as they come.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::sys::{self, Stopped};

/// A running helper process and the lines it printed so far.
#[derive(Debug)]
pub struct Agent {
    name: String,
    child: Child,
    pid: u32,
    rx: mpsc::UnboundedReceiver<(Instant, String)>,
    seen: Vec<(Instant, String)>,
}

impl Agent {
    /// Starts `binary` with `args`; its stderr goes to the test's stderr. Killed when dropped.
    pub fn spawn(name: &str, binary: &str, args: &[String]) -> Self {
        let mut child = Command::new(binary)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn {binary}: {e}"));
        let pid = child.id().expect("a just-spawned child has a pid");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if tx.send((Instant::now(), line)).is_err() {
                    return;
                }
            }
        });
        Self { name: name.to_owned(), child, pid, rx, seen: Vec::new() }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Every line read so far, with when it was read.
    pub fn seen(&self) -> &[(Instant, String)] {
        &self.seen
    }

    /// Waits (up to `limit`) for the next line whose first word is `kind`, reading past others; returns the
    /// rest of the line and when it was read. Panics with everything seen when it does not come.
    pub async fn expect(&mut self, kind: &str, limit: Duration) -> (String, Instant) {
        match self.wait_for(kind, limit).await {
            Some(found) => found,
            None => panic!("{} did not report {kind} within {limit:?}; it said:\n{}", self.name, self.transcript()),
        }
    }

    /// Like [`expect`](Self::expect), but `None` when the line does not come in time (or the process ended).
    pub async fn wait_for(&mut self, kind: &str, limit: Duration) -> Option<(String, Instant)> {
        let deadline = Instant::now() + limit;
        loop {
            let (at, line) = tokio::time::timeout_at(deadline, self.rx.recv()).await.ok()??;
            self.seen.push((at, line.clone()));
            let (first, rest) = line.split_once(' ').unwrap_or((line.as_str(), ""));
            if first == kind {
                return Some((rest.to_owned(), at));
            }
        }
    }

    /// Reads every line until the process closes its stdout (up to `limit`).
    pub async fn read_to_end(&mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while let Ok(Some((at, line))) = tokio::time::timeout_at(deadline, self.rx.recv()).await {
            self.seen.push((at, line));
        }
    }

    /// Whether a line with first word `kind` was read.
    pub fn saw(&self, kind: &str) -> bool {
        self.seen.iter().any(|(_, l)| l.split(' ').next() == Some(kind))
    }

    /// The lines read so far, for failure messages.
    pub fn transcript(&self) -> String {
        let start = self.seen.first().map(|(at, _)| *at);
        self.seen
            .iter()
            .map(|(at, l)| {
                format!("  +{:>9.3?} {l}", start.map(|s| at.saturating_duration_since(s)).unwrap_or_default())
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Freezes the process (SIGSTOP) until the returned guard is resumed or dropped.
    pub fn stop(&self) -> Stopped {
        Stopped::stop(self.pid)
    }

    /// Kills the process with SIGKILL (`kill -9`) and reaps it.
    pub async fn kill9(&mut self) {
        sys::signal(self.pid, "KILL");
        let _ = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
    }

    /// Whether the process has exited, without waiting: `Some(code)` if it has (`code` is `None` when a
    /// signal ended it), `None` while it runs.
    pub fn try_exit(&mut self) -> Option<Option<i32>> {
        self.child.try_wait().ok().flatten().map(|status| status.code())
    }

    /// Waits up to `limit` for the process to exit: `Some(code)` if it did (`code` is `None` when a signal
    /// ended it), `None` if it still runs. Unlike [`wait_exit`](Self::wait_exit), a hang is not a panic.
    pub async fn exit_within(&mut self, limit: Duration) -> Option<Option<i32>> {
        match tokio::time::timeout(limit, self.child.wait()).await {
            Ok(Ok(status)) => Some(status.code()),
            _ => None,
        }
    }

    /// Reads every line already printed, without waiting, so that the next [`wait_for`](Self::wait_for)
    /// returns a line printed from now on.
    pub async fn skip_printed(&mut self) {
        while let Ok(Some((at, line))) = tokio::time::timeout(Duration::ZERO, self.rx.recv()).await {
            self.seen.push((at, line));
        }
    }

    /// Waits (up to `limit`) for the process to exit; its exit code.
    pub async fn wait_exit(&mut self, limit: Duration) -> Option<i32> {
        match tokio::time::timeout(limit, self.child.wait()).await {
            Ok(Ok(status)) => status.code(),
            _ => panic!("{} did not exit within {limit:?}; it said:\n{}", self.name, self.transcript()),
        }
    }
}
