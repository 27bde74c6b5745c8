//! Captures what distlock logs through `tracing` (warnings, debug notes), so a test can assert on them.
//!
//! [`capture`] installs, once per test binary, a global subscriber that keeps every event at DEBUG or above
//! in memory. Tests running in parallel share it: filter by something unique to the test (its server's
//! port, its lock key).

use std::fmt::{self, Write as _};
use std::sync::{Mutex, OnceLock, PoisonError};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// One captured event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// Its level.
    pub level: Level,
    /// Its target (module path).
    pub target: String,
    /// The message followed by ` name=value` for every other field.
    pub text: String,
}

impl fmt::Display for LogLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.level, self.target, self.text)
    }
}

/// The captured events of this process.
#[derive(Debug, Default)]
pub struct Logs {
    lines: Mutex<Vec<LogLine>>,
}

impl Logs {
    /// Every event so far.
    pub fn lines(&self) -> Vec<LogLine> {
        self.lines.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The events at `level` whose text contains every one of `needles`.
    pub fn matching(&self, level: Level, needles: &[&str]) -> Vec<LogLine> {
        self.lines().into_iter().filter(|l| l.level == level && needles.iter().all(|n| l.text.contains(n))).collect()
    }

    /// All events, one per line, for failure messages.
    pub fn dump(&self) -> String {
        self.lines().iter().map(ToString::to_string).collect::<Vec<_>>().join("\n")
    }
}

struct Capture(&'static Logs);

static LOGS: OnceLock<&'static Logs> = OnceLock::new();

/// The process-wide captured log, installing the capturing subscriber on first use.
///
/// Panics if another global subscriber was installed first.
pub fn capture() -> &'static Logs {
    LOGS.get_or_init(|| {
        let logs: &'static Logs = Box::leak(Box::default());
        tracing::subscriber::set_global_default(Capture(logs))
            .expect("another global tracing subscriber is installed; distlock_tests::logs needs its own");
        logs
    })
}

#[derive(Default)]
struct Fields {
    message: String,
    rest: String,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.rest, " {}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.rest, " {}={value}", field.name());
        }
    }
}

impl Subscriber for Capture {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        *metadata.level() <= Level::DEBUG
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::DEBUG)
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let line = LogLine {
            level: *event.metadata().level(),
            target: event.metadata().target().to_owned(),
            text: format!("{}{}", fields.message, fields.rest),
        };
        self.0.lines.lock().unwrap_or_else(PoisonError::into_inner).push(line);
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}
