//! The events soak workers log, one JSON object per line, stamped on CLOCK_MONOTONIC.

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
