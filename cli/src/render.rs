//! How locks are shown: table rows for people (durations made short, control characters escaped so a
//! record cannot drive the terminal) and JSON objects for scripts (durations in milliseconds, text as stored).

use std::io::Write;
use std::time::{Duration, SystemTime};

use serde::Serialize;

/// Whether a lock's holder is still at work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum State {
    /// The holder has it (and renews it while it works).
    Running,
    /// The holder released it and `min_hold` keeps it held by nobody until its lease left runs out.
    Finished,
}

impl State {
    fn as_str(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Finished => "finished",
        }
    }
}

/// One held lock, as `ls`, `show` and `watch` print it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Row {
    pub(crate) key: String,
    pub(crate) state: State,
    pub(crate) owner: String,
    pub(crate) metadata: String,
    pub(crate) held_for_ms: u128,
    pub(crate) lease_left_ms: u128,
    /// 0 on Redlock, which has no fencing tokens.
    pub(crate) fencing_token: u64,
    /// Queue places, as the record's store counts them (including places of waiters that stopped refreshing).
    pub(crate) waiters: usize,
}

impl Row {
    pub(crate) fn new(key: String, info: &distlock::LockInfo) -> Self {
        Self {
            key,
            state: if info.kept_by_min_hold { State::Finished } else { State::Running },
            owner: info.owner.clone(),
            metadata: info.metadata.clone(),
            held_for_ms: info.held_for.as_millis(),
            lease_left_ms: info.remaining_ttl.as_millis(),
            fencing_token: info.fencing_token,
            waiters: info.waiting,
        }
    }

    /// The lease left, which for a finished lock is when it frees.
    pub(crate) fn lease_left(&self) -> Duration {
        Duration::from_millis(u64::try_from(self.lease_left_ms).unwrap_or(u64::MAX))
    }

    /// How long it has been held, since its grant.
    pub(crate) fn held_for(&self) -> Duration {
        Duration::from_millis(u64::try_from(self.held_for_ms).unwrap_or(u64::MAX))
    }

    /// "running", or "finished, kept until 14:03:22 UTC".
    pub(crate) fn state_text(&self) -> String {
        match self.state {
            State::Running => "running".into(),
            State::Finished => format!("finished, kept until {}", self.lease_end()),
        }
    }

    /// When its lease left ends, as a time of day: `14:03:22 UTC`.
    pub(crate) fn lease_end(&self) -> String {
        format!("{} UTC", time_of_day(SystemTime::now() + self.lease_left()))
    }
}

/// The table's columns: fixed widths but for the key's (the longest name's, up to a limit) and the last.
pub(crate) struct Table {
    key_width: usize,
}

/// Longer names overflow their column rather than widen it for every row.
const MAX_KEY_WIDTH: usize = 48;
const OWNER_WIDTH: usize = 24;

impl Table {
    /// A table whose key column fits `longest` characters.
    pub(crate) fn new(longest: usize) -> Self {
        Self { key_width: longest.clamp(3, MAX_KEY_WIDTH) }
    }

    pub(crate) fn header(&self, out: &mut impl Write) -> std::io::Result<()> {
        writeln!(
            out,
            "{:<kw$}  {:<8}  {:>9}  {:>10}  {:>16}  {:>7}  {:<ow$}  METADATA",
            "KEY",
            "STATE",
            "HELD FOR",
            "LEASE LEFT",
            "FENCING TOKEN",
            "WAITERS",
            "OWNER",
            kw = self.key_width,
            ow = OWNER_WIDTH
        )
    }

    pub(crate) fn row(&self, out: &mut impl Write, row: &Row) -> std::io::Result<()> {
        writeln!(
            out,
            "{:<kw$}  {:<8}  {:>9}  {:>10}  {:>16}  {:>7}  {:<ow$}  {}",
            printable(&row.key),
            row.state.as_str(),
            short(row.held_for()),
            short(row.lease_left()),
            fence(row.fencing_token),
            row.waiters,
            printable(&row.owner),
            printable(&row.metadata),
            kw = self.key_width,
            ow = OWNER_WIDTH
        )
    }
}

/// A fencing token, or `-` for none (Redlock).
pub(crate) fn fence(token: u64) -> String {
    if token == 0 {
        "-".into()
    } else {
        token.to_string()
    }
}

/// `text` with control characters (escape sequences, newlines) and invisible or direction-changing ones shown
/// escaped, so that no text can drive the terminal or read as something else (`evil\u{202e}nimda` shows its
/// U+202E instead of reading as "…admin").
pub(crate) fn printable(text: &str) -> String {
    if !text.chars().any(needs_escape) {
        return text.to_owned();
    }
    text.chars()
        .map(|c| match c {
            c if c.is_control() => c.escape_default().to_string(),
            c if needs_escape(c) => c.escape_unicode().to_string(),
            c => c.to_string(),
        })
        .collect()
}

/// Control characters, and the format characters (Unicode category Cf) that change direction or show nothing:
/// the bidirectional marks, embeddings, overrides and isolates, zero-width characters, invisible operators,
/// the byte-order mark, interlinear annotations and tags.
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{00ad}'
                | '\u{061c}'
                | '\u{180e}'
                | '\u{200b}'..='\u{200f}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2060}'..='\u{2064}'
                | '\u{2066}'..='\u{206f}'
                | '\u{feff}'
                | '\u{fff9}'..='\u{fffb}'
                | '\u{e0000}'..='\u{e007f}'
        )
}

/// The time of day of `at`, in UTC: `14:03:22`.
pub(crate) fn time_of_day(at: SystemTime) -> String {
    let secs = at.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    format!("{:02}:{:02}:{:02}", secs / 3600 % 24, secs / 60 % 60, secs % 60)
}

/// `850ms`, `12.3s`, `4m05s`, `2h03m`, `3d04h`.
pub(crate) fn short(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{}ms", d.as_millis()),
        1..=59 => format!("{:.1}s", d.as_secs_f64()),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86399 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86400, s % 86400 / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_short_and_text_cannot_drive_the_terminal() {
        let cases =
            [(850, "850ms"), (12_340, "12.3s"), (245_000, "4m05s"), (7_380_000, "2h03m"), (273_600_000, "3d04h")];
        for (ms, text) in cases {
            assert_eq!(short(Duration::from_millis(ms)), text);
        }
        assert_eq!(printable("a\x1b[2Jb\n"), "a\\u{1b}[2Jb\\n");
        assert_eq!(printable("plain é"), "plain é");
        // Issue 36: direction-changing and invisible characters are escaped as control characters are.
        assert_eq!(printable("evil\u{202E}nimda"), "evil\\u{202e}nimda");
        assert_eq!(printable("a\u{200B}b\u{2066}c\u{feff}"), "a\\u{200b}b\\u{2066}c\\u{feff}");
        assert_eq!(printable("עברית and العربية"), "עברית and العربية", "right-to-left letters themselves are text");
        assert_eq!(fence(0), "-");
    }
}
