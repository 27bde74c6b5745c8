//! Compile-time parser for the `retry` argument, which names one `distlock::RetryStrategy` variant with all
//! its fields: `"none"`, `"linear <step>"`, `"exponential <base>..<max>"`, the durations written as in
//! [`duration`](crate::duration).

use std::ops::Range;

use crate::duration::parse_duration;

/// A `RetryStrategy`, durations in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retry {
    /// `RetryStrategy::None`: one attempt.
    None,
    /// `RetryStrategy::Linear { step }`.
    Linear { step_ms: u64 },
    /// `RetryStrategy::Exponential { base, max }`.
    Exponential { base_ms: u64, max_ms: u64 },
}

/// What a valid value looks like, for messages.
const FORMS: &str = "\"none\", \"linear <step>\" (e.g. \"linear 100ms\") or \"exponential <base>..<max>\" \
                     (e.g. \"exponential 25ms..1s\")";

/// Why a `retry` value was rejected: the message, and the bytes of the value it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RetryError {
    pub(crate) message: String,
    pub(crate) range: Range<usize>,
}

fn error(range: Range<usize>, message: String) -> RetryError {
    RetryError { message, range }
}

/// Parses a `retry` value.
pub(crate) fn parse_retry(text: &str) -> Result<Retry, RetryError> {
    let whole = 0..text.len();
    let start = text.len() - text.trim_start().len();
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(error(whole, format!("empty `retry`; expected {FORMS}")));
    }
    let (kind, rest) = trimmed.split_once(char::is_whitespace).unwrap_or((trimmed, ""));
    let kind_range = start..start + kind.len();
    let rest_start = start + kind.len() + (trimmed.len() - kind.len() - rest.trim_start().len());
    let rest = rest.trim_start();
    let rest_range = rest_start..rest_start + rest.len();
    match kind {
        "none" if rest.is_empty() => Ok(Retry::None),
        "none" => {
            Err(error(rest_range, "`none` takes no value: it makes a single attempt; write \"none\" alone".to_owned()))
        }
        "linear" if rest.is_empty() => {
            Err(error(kind_range, "`linear` needs a step: write e.g. \"linear 100ms\"".to_owned()))
        }
        "linear" if rest.contains("..") => Err(error(
            rest_range,
            "`linear` takes one step, not a range; for delays that grow write e.g. \"exponential 25ms..1s\"".to_owned(),
        )),
        "linear" => {
            let step_ms = positive(rest, rest_range, "step")?;
            Ok(Retry::Linear { step_ms })
        }
        "exponential" => {
            let Some((base, max)) = rest.split_once("..") else {
                let range = if rest.is_empty() { kind_range } else { rest_range };
                return Err(error(
                    range,
                    "`exponential` needs a range `<base>..<max>`: the first delay, doubled each time up to the \
                     longest; write e.g. \"exponential 25ms..1s\""
                        .to_owned(),
                ));
            };
            let base_range = rest_start..rest_start + base.len();
            let max_start = base_range.end + 2;
            let base_ms = positive(base, base_range, "base")?;
            let max_ms = positive(max, max_start..max_start + max.len(), "max")?;
            if base_ms > max_ms {
                return Err(error(
                    rest_range,
                    format!("the base `{base}` is longer than the max `{max}`; write the shorter delay first"),
                ));
            }
            Ok(Retry::Exponential { base_ms, max_ms })
        }
        other => {
            let hint = crate::validate::closest(other, ["none", "linear", "exponential"])
                .map(|c| format!("did you mean `{c}`? "))
                .unwrap_or_default();
            Err(error(kind_range, format!("unknown retry strategy `{other}`; {hint}expected {FORMS}")))
        }
    }
}

/// A duration above zero, in milliseconds.
fn positive(text: &str, range: Range<usize>, what: &str) -> Result<u64, RetryError> {
    match parse_duration(text) {
        Ok(0) => {
            Err(error(range, format!("the {what} must be above zero: a waiter would query the store without pause")))
        }
        Ok(ms) => Ok(ms),
        Err(e) => Err(error(range, format!("invalid {what}: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_retry, Retry};

    #[test]
    fn every_variant() {
        assert_eq!(parse_retry("none"), Ok(Retry::None));
        assert_eq!(parse_retry("linear 100ms"), Ok(Retry::Linear { step_ms: 100 }));
        assert_eq!(parse_retry("linear  1m30s"), Ok(Retry::Linear { step_ms: 90_000 }));
        assert_eq!(parse_retry("exponential 10ms..1s"), Ok(Retry::Exponential { base_ms: 10, max_ms: 1000 }));
        assert_eq!(parse_retry("exponential 1s..1s"), Ok(Retry::Exponential { base_ms: 1000, max_ms: 1000 }));
    }

    /// Each error points at the part of the value it is about.
    #[test]
    fn errors_point_at_the_offending_part() {
        let at = |text: &str| {
            let e = parse_retry(text).expect_err(text);
            (text[e.range.clone()].to_owned(), e.message)
        };
        assert_eq!(at("lineer 1s").0, "lineer");
        assert!(at("lineer 1s").1.contains("did you mean `linear`?"), "{}", at("lineer 1s").1);
        assert_eq!(at("none 1s").0, "1s");
        assert_eq!(at("linear").0, "linear");
        assert_eq!(at("linear 0ms").0, "0ms");
        assert!(at("linear 0ms").1.contains("above zero"));
        assert_eq!(at("linear 5sec").0, "5sec");
        assert!(at("linear 5sec").1.contains("unknown duration unit `sec`"), "{}", at("linear 5sec").1);
        assert_eq!(at("linear 1ms..1s").0, "1ms..1s");
        assert_eq!(at("exponential 10ms").0, "10ms");
        assert_eq!(at("exponential").0, "exponential");
        assert_eq!(at("exponential 10ms..1x").0, "1x");
        assert_eq!(at("exponential 0s..1s").0, "0s");
        assert_eq!(at("exponential 2s..1s").0, "2s..1s");
        assert!(at("exponential 2s..1s").1.contains("longer than the max"));
        assert_eq!(at("").0, "");
    }
}
