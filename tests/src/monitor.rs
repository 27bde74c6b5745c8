//! [`Monitor`]: records every command a Redis server executes (`MONITOR`), in execution order, so a test can
//! check which commands carried a given lock token and when, relative to markers it sends itself.
//!
//! The reader runs on its own thread, so it keeps reading while the test's runtime is blocked (a test that
//! starves its executor on purpose).

use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::RedisServer;

#[derive(Default)]
struct Seen {
    lines: Mutex<Vec<String>>,
    grew: Condvar,
}

/// A `MONITOR` connection and everything it has seen.
pub struct Monitor {
    seen: Arc<Seen>,
    stream: TcpStream,
    marks: AtomicU64,
}

impl Monitor {
    /// Connects to `server` over TCP and starts `MONITOR`; returns once the server confirmed it.
    pub fn start(server: &RedisServer) -> Self {
        let mut stream = TcpStream::connect(("127.0.0.1", server.port())).expect("MONITOR connection");
        stream.write_all(b"MONITOR\r\n").expect("send MONITOR");
        let mut reader = BufReader::new(stream.try_clone().expect("clone MONITOR stream"));
        let mut first = String::new();
        reader.read_line(&mut first).expect("MONITOR reply");
        assert_eq!(first.trim_end(), "+OK", "MONITOR refused");
        let seen = Arc::new(Seen::default());
        std::thread::spawn({
            let seen = Arc::clone(&seen);
            move || {
                let mut line = String::new();
                loop {
                    line.clear();
                    match reader.read_line(&mut line) {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {
                            let text = line.trim_end();
                            let text = text.strip_prefix('+').unwrap_or(text).to_owned();
                            seen.lines.lock().unwrap_or_else(PoisonError::into_inner).push(text);
                            seen.grew.notify_all();
                        }
                    }
                }
            }
        });
        Self { seen, stream, marks: AtomicU64::new(0) }
    }

    /// Every line so far, oldest first (`<time> [<db> <client>] "CMD" "arg"...`).
    pub fn lines(&self) -> Vec<String> {
        self.seen.lines.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// How many lines were seen so far: an index for [`lines_since`](Self::lines_since).
    pub fn len(&self) -> usize {
        self.seen.lines.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Whether nothing was seen yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The lines from index `from` on.
    pub fn lines_since(&self, from: usize) -> Vec<String> {
        let lines = self.seen.lines.lock().unwrap_or_else(PoisonError::into_inner);
        lines.get(from..).map(<[String]>::to_vec).unwrap_or_default()
    }

    /// Blocks (up to `limit`) until a line containing `needle` appears at or after index `from`; its index.
    pub fn wait_for_blocking(&self, from: usize, needle: &str, limit: Duration) -> usize {
        let deadline = Instant::now() + limit;
        let mut lines = self.seen.lines.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(i) = lines.get(from..).and_then(|l| l.iter().position(|l| l.contains(needle))) {
                return from + i;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                drop(lines);
                panic!("MONITOR did not show {needle:?} within {limit:?}; last lines:\n{}", self.tail(20));
            }
            lines = self.seen.grew.wait_timeout(lines, left).unwrap_or_else(PoisonError::into_inner).0;
        }
    }

    /// Waits (up to `limit`) until a line containing `needle` appears at or after index `from`; its index.
    pub async fn wait_for(&self, from: usize, needle: &str, limit: Duration) -> usize {
        self.wait_for_all(from, &[needle], limit).await
    }

    /// Waits (up to `limit`) until a line containing every one of `needles` appears at or after index
    /// `from`; its index.
    pub async fn wait_for_all(&self, from: usize, needles: &[&str], limit: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(i) = self.lines_since(from).iter().position(|l| needles.iter().all(|n| l.contains(n))) {
                return from + i;
            }
            if tokio::time::Instant::now() >= deadline {
                panic!("MONITOR did not show {needles:?} within {limit:?}; last lines:\n{}", self.tail(20));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Waits (up to 5 s) until `found` returns something for the lines since `from`.
    pub async fn wait_until<T>(&self, from: usize, what: &str, mut found: impl FnMut(&[String]) -> Option<T>) -> T {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(t) = found(&self.lines_since(from)) {
                return t;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "MONITOR did not show {what} within 5 s; last lines:\n{}",
                self.tail(20)
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    fn next_label(&self, label: &str) -> String {
        format!("distlock-test-mark:{label}:{}", self.marks.fetch_add(1, Ordering::SeqCst))
    }

    /// Sends a unique `ECHO` through `conn` and waits until the monitor shows it: every command the server
    /// executed before the marker is in [`lines`](Self::lines) before the returned index, every command it
    /// executes later after it.
    pub async fn mark(&self, conn: &mut (impl redis::aio::ConnectionLike + Send), label: &str) -> usize {
        let text = self.next_label(label);
        let from = self.len();
        let _: String = redis::cmd("ECHO").arg(&text).query_async(conn).await.expect("ECHO marker");
        self.wait_for(from, &format!("\"{text}\""), Duration::from_secs(10)).await
    }

    /// [`mark`](Self::mark) over a blocking connection, for a thread whose runtime is blocked.
    pub fn mark_blocking(&self, conn: &mut redis::Connection, label: &str) -> usize {
        let text = self.next_label(label);
        let from = self.len();
        let _: String = redis::cmd("ECHO").arg(&text).query(conn).expect("ECHO marker");
        self.wait_for_blocking(from, &format!("\"{text}\""), Duration::from_secs(10))
    }

    /// The last `n` lines, one per line, for failure messages.
    pub fn tail(&self, n: usize) -> String {
        let lines = self.lines();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        // Ends the reader thread.
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

impl std::fmt::Debug for Monitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Monitor").field("lines", &self.len()).finish_non_exhaustive()
    }
}

/// The quoted arguments of a `MONITOR` line (`"EVALSHA" "abc" "1"` → `["EVALSHA", "abc", "1"]`), unescaped
/// only as far as tokens and keys need (they hold no quotes).
pub fn monitor_args(line: &str) -> Vec<String> {
    let Some(start) = line.find("] ") else { return Vec::new() };
    let mut args = Vec::new();
    let mut rest = &line[start + 2..];
    while let Some(open) = rest.find('"') {
        let body = &rest[open + 1..];
        let mut end = None;
        let mut escaped = false;
        for (i, c) in body.char_indices() {
            match c {
                '\\' if !escaped => escaped = true,
                '"' if !escaped => {
                    end = Some(i);
                    break;
                }
                _ => escaped = false,
            }
        }
        let Some(end) = end else { break };
        args.push(body[..end].to_owned());
        rest = &body[end + 1..];
    }
    args
}

/// Whether the `MONITOR` line was a command a client sent (not one a Lua script called).
pub fn is_client_command(line: &str) -> bool {
    !line.contains(" lua] ")
}

/// The lock tokens (32 lowercase hex characters) among a `MONITOR` line's arguments.
pub fn tokens_in(line: &str) -> Vec<String> {
    monitor_args(line)
        .into_iter()
        .filter(|a| a.len() == 32 && a.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
        .collect()
}

/// The argument lists of the script calls (EVALSHA) clients sent on `record`, not a script's inner calls, with
/// at least `min_args` arguments: `EVALSHA sha 1 record token ttl holder` is 7 for an ACQUIRE, 10 queued
/// (`register lease attempt` after it).
pub fn script_calls(lines: &[String], record: &str, min_args: usize) -> Vec<Vec<String>> {
    lines
        .iter()
        .filter(|line| is_client_command(line))
        .map(|line| monitor_args(line))
        .filter(|args| args.len() >= min_args && args[0].eq_ignore_ascii_case("evalsha") && args[3] == record)
        .collect()
}
