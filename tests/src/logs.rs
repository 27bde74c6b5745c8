//! Captures what distlock reports through `tracing` — events (warnings, debug notes) and spans, with their
//! fields and parents — so a test can assert on them.
//!
//! [`capture`] installs, once per test binary, a global subscriber (tracing-subscriber's registry with a
//! capturing layer) that keeps every event and span at DEBUG or above in memory. Tests running in parallel
//! share it: filter by something unique to the test (its server's port, its lock key).

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// One captured event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// Its level.
    pub level: Level,
    /// Its target (module path).
    pub target: String,
    /// The message followed by ` name=value` for every other field.
    pub text: String,
    /// Every field but the message, by name: strings as they are, other values as `Debug` shows them.
    pub fields: BTreeMap<&'static str, String>,
    /// The span it happened in, as an index into [`Logs::spans`].
    pub span: Option<usize>,
}

impl fmt::Display for LogLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.level, self.target, self.text)
    }
}

/// One captured span.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpanLine {
    /// Its index in [`Logs::spans`] (span ids are reused once closed; these are not).
    pub index: usize,
    /// Its name.
    pub name: &'static str,
    /// Its target.
    pub target: String,
    /// Its level.
    pub level: Level,
    /// The fields recorded so far (at creation or later), formatted as in [`LogLine::fields`].
    pub fields: BTreeMap<&'static str, String>,
    /// Its parent, as an index into [`Logs::spans`].
    pub parent: Option<usize>,
    /// Whether it has closed (every handle to it dropped).
    pub closed: bool,
}

impl SpanLine {
    /// The field `name`, if recorded.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

/// The captured events and spans of this process.
#[derive(Debug, Default)]
pub struct Logs {
    lines: Mutex<Vec<LogLine>>,
    spans: Mutex<Vec<SpanLine>>,
}

impl Logs {
    /// Every event so far.
    pub fn lines(&self) -> Vec<LogLine> {
        lock(&self.lines).clone()
    }

    /// Every span so far, in the order they were created.
    pub fn spans(&self) -> Vec<SpanLine> {
        lock(&self.spans).clone()
    }

    /// The events at `level` whose text contains every one of `needles`.
    pub fn matching(&self, level: Level, needles: &[&str]) -> Vec<LogLine> {
        self.lines().into_iter().filter(|l| l.level == level && needles.iter().all(|n| l.text.contains(n))).collect()
    }

    /// All events and spans, one per line, for failure messages.
    pub fn dump(&self) -> String {
        let spans = self.spans().into_iter().map(|s| format!("span {s:?}"));
        self.lines().iter().map(ToString::to_string).chain(spans).collect::<Vec<_>>().join("\n")
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking test thread cannot leave a half-pushed line behind.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

static LOGS: OnceLock<&'static Logs> = OnceLock::new();

/// The process-wide captured log, installing the capturing subscriber on first use.
///
/// Panics if another global subscriber was installed first.
pub fn capture() -> &'static Logs {
    let logs = LOGS.get_or_init(|| {
        let logs: &'static Logs = Box::leak(Box::default());
        let subscriber = tracing_subscriber::registry().with(Capture(logs).with_filter(LevelFilter::DEBUG));
        tracing::subscriber::set_global_default(subscriber)
            .expect("another global tracing subscriber is installed; distlock_tests::logs needs its own");
        logs
    });
    // A callsite first hit on another test's thread while the subscriber was being installed can keep the
    // interest it got from no subscriber ("never"), and its events are then lost for good: the `observability`
    // binary once captured no `lock lost` WARN, and none of its test's own events (3 lines in all). Each
    // test asks again from its own start.
    tracing::callsite::rebuild_interest_cache();
    logs
}

/// A span's index in [`Logs::spans`], kept in the registry's data for the span.
struct Index(usize);

struct Capture(&'static Logs);

#[derive(Default)]
struct Fields {
    message: String,
    rest: BTreeMap<&'static str, String>,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            self.rest.insert(field.name(), format!("{value:?}"));
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            self.rest.insert(field.name(), value.to_owned());
        }
    }
}

impl Capture {
    fn index<S: Subscriber + for<'a> LookupSpan<'a>>(id: &Id, ctx: &Context<'_, S>) -> Option<usize> {
        ctx.span(id)?.extensions().get::<Index>().map(|i| i.0)
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let parent = span.parent().and_then(|p| p.extensions().get::<Index>().map(|i| i.0));
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        let mut spans = lock(&self.0.spans);
        let index = spans.len();
        let metadata = attrs.metadata();
        spans.push(SpanLine {
            index,
            name: metadata.name(),
            target: metadata.target().to_owned(),
            level: *metadata.level(),
            fields: fields.rest,
            parent,
            closed: false,
        });
        drop(spans);
        span.extensions_mut().insert(Index(index));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(index) = Self::index(id, &ctx) else { return };
        let mut fields = Fields::default();
        values.record(&mut fields);
        lock(&self.0.spans)[index].fields.extend(fields.rest);
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let rest: String = fields.rest.iter().map(|(name, value)| format!(" {name}={value}")).collect();
        let span = ctx.event_span(event).and_then(|span| span.extensions().get::<Index>().map(|i| i.0));
        let line = LogLine {
            level: *event.metadata().level(),
            target: event.metadata().target().to_owned(),
            text: format!("{}{rest}", fields.message),
            fields: fields.rest,
            span,
        };
        lock(&self.0.lines).push(line);
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        if let Some(index) = Self::index(&id, &ctx) {
            lock(&self.0.spans)[index].closed = true;
        }
    }
}
