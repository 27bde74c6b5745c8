//! Compile-time parser for duration literals such as `"500ms"`, `"5s"`, `"2m"`, `"1h"` and `"1m30s"`.
//!
//! A duration is one or more `<digits><unit>` parts, largest unit first, each unit at most once, with no
//! spaces. Units: `h` (hours), `m` (minutes), `s` (seconds), `ms` (milliseconds). The result is a whole number
//! of milliseconds, which the expansion turns into a `Duration::from_millis(N)` constant.

use std::fmt;

/// The units accepted in a duration literal, largest first, with their length in milliseconds.
const UNITS: &[(&str, u64)] = &[("h", 3_600_000), ("m", 60_000), ("s", 1_000), ("ms", 1)];

/// Human-readable list of the units, used in error messages.
const UNIT_LIST: &str = "`h`, `m`, `s`, `ms`";

/// Why a duration literal was rejected; `Display` gives the full message shown to the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DurationError {
    /// The literal is empty (or only whitespace).
    Empty,
    /// The literal contains whitespace, e.g. `"1m 30s"`.
    Whitespace,
    /// A number with no unit after it, e.g. `"30"` or `"1m30"`.
    MissingUnit { number: String },
    /// A unit that is not one of `h`, `m`, `s`, `ms`, e.g. `"5sec"`.
    UnknownUnit { unit: String },
    /// A unit with no number before it, e.g. `"s"` or `"1m s"`.
    MissingNumber { unit: String },
    /// A character that is neither a digit nor part of a unit, e.g. `"1.5s"` or `"-1s"`.
    InvalidChar { ch: char },
    /// The same unit twice, or units out of order, e.g. `"30s1m"`.
    UnitOrder { unit: String },
    /// The total does not fit in a `u64` number of milliseconds.
    Overflow,
}

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DurationError::Empty => write!(
                f,
                "empty duration; write a number and a unit such as \"500ms\", \"5s\", \"2m\", \"1h\" or \"1m30s\""
            ),
            DurationError::Whitespace => {
                write!(f, "durations cannot contain spaces; write e.g. \"1m30s\"")
            }
            DurationError::MissingUnit { number } => write!(
                f,
                "duration `{number}` has no unit; write e.g. \"{number}s\" or \"{number}ms\" (units: {UNIT_LIST})"
            ),
            DurationError::UnknownUnit { unit } => write!(
                f,
                "unknown duration unit `{unit}`; expected one of {UNIT_LIST}, e.g. \"500ms\", \"5s\", \"2m\", \"1h\""
            ),
            DurationError::MissingNumber { unit } => {
                write!(f, "unit `{unit}` has no number before it; write e.g. \"5{unit}\"")
            }
            DurationError::InvalidChar { ch } => write!(
                f,
                "unexpected `{}` in duration; write whole numbers with units, e.g. \"1s500ms\" rather than \"1.5s\"",
                ch.escape_debug()
            ),
            DurationError::UnitOrder { unit } => write!(
                f,
                "unit `{unit}` is repeated or out of order; write units largest first, each once, e.g. \"1h30m\""
            ),
            DurationError::Overflow => {
                write!(f, "duration is too large: it must fit in a u64 number of milliseconds")
            }
        }
    }
}

/// Parses a duration literal into milliseconds.
///
/// `"0s"` is accepted here; callers that need a positive duration (`ttl`) check for zero themselves.
pub(crate) fn parse_duration(text: &str) -> Result<u64, DurationError> {
    if text.trim().is_empty() {
        return Err(DurationError::Empty);
    }
    if text.chars().any(char::is_whitespace) {
        return Err(DurationError::Whitespace);
    }
    let mut total: u64 = 0;
    // Index into UNITS of the last unit seen; every next unit must come strictly later.
    let mut last_unit: Option<usize> = None;
    let mut rest = text;
    while !rest.is_empty() {
        let digits_len = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let (number, after) = rest.split_at(digits_len);
        let unit_len = after.find(|c: char| !c.is_ascii_alphabetic()).unwrap_or(after.len());
        let (unit, after_unit) = after.split_at(unit_len);
        if number.is_empty() && unit.is_empty() {
            // Neither a digit nor a letter: the next character is invalid.
            let ch = rest.chars().next().unwrap_or(' ');
            return Err(DurationError::InvalidChar { ch });
        }
        if unit.is_empty() {
            return match after.chars().next() {
                Some(ch) => Err(DurationError::InvalidChar { ch }),
                None => Err(DurationError::MissingUnit { number: number.to_owned() }),
            };
        }
        let Some(index) = UNITS.iter().position(|(name, _)| *name == unit) else {
            return Err(DurationError::UnknownUnit { unit: unit.to_owned() });
        };
        if number.is_empty() {
            return Err(DurationError::MissingNumber { unit: unit.to_owned() });
        }
        if last_unit.is_some_and(|last| index <= last) {
            return Err(DurationError::UnitOrder { unit: unit.to_owned() });
        }
        last_unit = Some(index);
        let value: u64 = number.parse().map_err(|_| DurationError::Overflow)?;
        let millis = value.checked_mul(UNITS[index].1).ok_or(DurationError::Overflow)?;
        total = total.checked_add(millis).ok_or(DurationError::Overflow)?;
        rest = after_unit;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_units() {
        assert_eq!(parse_duration("500ms"), Ok(500));
        assert_eq!(parse_duration("5s"), Ok(5_000));
        assert_eq!(parse_duration("2m"), Ok(120_000));
        assert_eq!(parse_duration("1h"), Ok(3_600_000));
        assert_eq!(parse_duration("0s"), Ok(0));
        assert_eq!(parse_duration("0ms"), Ok(0));
    }

    #[test]
    fn compound() {
        assert_eq!(parse_duration("1m30s"), Ok(90_000));
        assert_eq!(parse_duration("1h2m3s4ms"), Ok(3_723_004));
        assert_eq!(parse_duration("1s500ms"), Ok(1_500));
        assert_eq!(parse_duration("1h30s"), Ok(3_630_000));
    }

    #[test]
    fn leading_zeros_are_fine() {
        assert_eq!(parse_duration("007s"), Ok(7_000));
    }

    #[test]
    fn empty() {
        assert_eq!(parse_duration(""), Err(DurationError::Empty));
        assert_eq!(parse_duration("  "), Err(DurationError::Empty));
    }

    #[test]
    fn no_unit() {
        assert_eq!(parse_duration("30"), Err(DurationError::MissingUnit { number: "30".into() }));
        assert_eq!(parse_duration("1m30"), Err(DurationError::MissingUnit { number: "30".into() }));
        let message = parse_duration("30").unwrap_err().to_string();
        assert!(message.contains("\"30s\""), "{message}");
    }

    #[test]
    fn unknown_unit() {
        assert_eq!(parse_duration("5sec"), Err(DurationError::UnknownUnit { unit: "sec".into() }));
        assert_eq!(parse_duration("5d"), Err(DurationError::UnknownUnit { unit: "d".into() }));
        assert_eq!(parse_duration("5S"), Err(DurationError::UnknownUnit { unit: "S".into() }));
        assert!(parse_duration("5x").unwrap_err().to_string().contains("`ms`"));
    }

    #[test]
    fn missing_number() {
        assert_eq!(parse_duration("s"), Err(DurationError::MissingNumber { unit: "s".into() }));
        assert_eq!(parse_duration("1ms"), Ok(1));
        assert_eq!(parse_duration("1mms"), Err(DurationError::UnknownUnit { unit: "mms".into() }));
    }

    #[test]
    fn invalid_characters() {
        assert_eq!(parse_duration("1.5s"), Err(DurationError::InvalidChar { ch: '.' }));
        assert_eq!(parse_duration("-1s"), Err(DurationError::InvalidChar { ch: '-' }));
        assert_eq!(parse_duration("1s!"), Err(DurationError::InvalidChar { ch: '!' }));
        assert_eq!(parse_duration("1m 30s"), Err(DurationError::Whitespace));
    }

    #[test]
    fn unit_order() {
        assert_eq!(parse_duration("30s1m"), Err(DurationError::UnitOrder { unit: "m".into() }));
        assert_eq!(parse_duration("1s1s"), Err(DurationError::UnitOrder { unit: "s".into() }));
    }

    #[test]
    fn overflow() {
        assert_eq!(parse_duration("99999999999999999999999ms"), Err(DurationError::Overflow));
        assert_eq!(parse_duration("18446744073709551615h"), Err(DurationError::Overflow));
        assert_eq!(parse_duration("18446744073709551615ms"), Ok(u64::MAX));
        assert_eq!(parse_duration("18446744073709551s1000ms"), Err(DurationError::Overflow));
    }
}
