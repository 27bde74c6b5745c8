//! How the differential test compares the real server's replies and keyspace with the simulated one's: exactly,
//! but for what depends on the clock (µs timestamps wherever they are, and the parts of replies a step's
//! [`Check`] names), which may differ by 50 ms; error replies by their code, and by their message too unless a
//! script's own run failed.

use std::collections::BTreeMap;

use distlock::simulation::redis::SimValue;
use redis::Value;

use super::{Check, Step};

/// Every key with its value and ms to live (`None`: no expiry), as the simulated server's snapshot shows it.
pub type Keyspace = BTreeMap<Vec<u8>, (SimValue, Option<i64>)>;

/// The tolerance for what depends on the clock: 50 ms, in ms...
pub const TOLERANCE_MS: i64 = 50;
/// ...and in µs.
pub const TOLERANCE_US: i64 = 50_000;

/// A TIME reply in µs.
pub fn time_of(reply: &Value) -> i64 {
    let field = |v: &Value| match v {
        Value::BulkString(s) => std::str::from_utf8(s).ok().and_then(|s| s.parse::<i64>().ok()),
        _ => None,
    };
    match reply {
        Value::Array(parts) if parts.len() == 2 => match (field(&parts[0]), field(&parts[1])) {
            (Some(s), Some(us)) => s * 1_000_000 + us,
            _ => panic!("a TIME reply: {reply:?}"),
        },
        _ => panic!("a TIME reply: {reply:?}"),
    }
}

/// How a reply compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// They agree.
    Same,
    /// Both are failures of the script's own run with the same code; the messages differ.
    ScriptMessage,
}

/// Whether the real and the simulated reply to `step` agree, as the module's doc says.
pub fn compare(real: &Value, sim: &Value, step: &Step) -> Result<Outcome, String> {
    if let (Value::ServerError(r), Value::ServerError(s)) = (real, sim) {
        if r.code() != s.code() {
            return Err(format!("error codes {} and {}", r.code(), s.code()));
        }
        if r.details() == s.details() {
            return Ok(Outcome::Same);
        }
        // A script's own run failed (its message names a line and the script): the code is what counts.
        return if step.is_script() && r.details().is_some_and(|d| d.contains(" script: ")) {
            Ok(Outcome::ScriptMessage)
        } else {
            Err("error messages differ".into())
        };
    }
    same_value(real, sim, &step.check, &mut Vec::new()).map(|()| Outcome::Same)
}

/// Compares two values at `path` (indices from the reply's top), with the tolerances `check` gives.
fn same_value(real: &Value, sim: &Value, check: &Check, path: &mut Vec<usize>) -> Result<(), String> {
    let at = |path: &[usize]| format!("at {path:?}");
    match (real, sim) {
        (Value::Int(a), Value::Int(b)) => {
            if a == b || close_timestamps(*a, *b) || check.tolerates(path, *a, *b) {
                Ok(())
            } else {
                Err(format!("{} and {} {}", a, b, at(path)))
            }
        }
        (Value::Double(a), Value::Double(b)) => {
            if a == b || (*a >= 1e15 && *b >= 1e15 && (a - b).abs() <= TOLERANCE_US as f64) {
                Ok(())
            } else {
                Err(format!("{a} and {b} {}", at(path)))
            }
        }
        (Value::BulkString(a), Value::BulkString(b)) => {
            if check.is_time(path) {
                return Ok(());
            }
            same_text(a, b).map_err(|e| format!("{e} {}", at(path)))
        }
        (Value::Array(a), Value::Array(b)) if check.is_time_pair(path) && a.len() == 2 && b.len() == 2 => {
            let (ra, sa) = (time_of(real), time_of(sim));
            if (ra - sa).abs() <= TOLERANCE_US {
                Ok(())
            } else {
                Err(format!("TIME {ra} and {sa}"))
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            if a.len() != b.len() {
                return Err(format!("{} and {} elements {}", a.len(), b.len(), at(path)));
            }
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                path.push(i);
                same_value(x, y, check, path)?;
                path.pop();
            }
            Ok(())
        }
        (Value::ServerError(a), Value::ServerError(b)) => {
            if a.code() == b.code() && a.details() == b.details() {
                Ok(())
            } else {
                Err(format!("errors {a:?} and {b:?} {}", at(path)))
            }
        }
        (a, b) if a == b => Ok(()),
        _ => Err(format!("different values {}", at(path))),
    }
}

/// Two µs timestamps (16 digits or more) close enough to be the same moment seen a little apart.
fn close_timestamps(a: i64, b: i64) -> bool {
    a >= 1_000_000_000_000_000 && b >= 1_000_000_000_000_000 && (a - b).abs() <= TOLERANCE_US
}

/// Two byte strings equal but for µs timestamps in them (runs of 16 to 19 digits) that are close.
pub fn same_text(a: &[u8], b: &[u8]) -> Result<(), String> {
    if a == b {
        return Ok(());
    }
    let (ta, tb) = (tokens(a), tokens(b));
    let close = ta.len() == tb.len()
        && ta.iter().zip(&tb).all(|(x, y)| {
            x == y
                || match (number(x), number(y)) {
                    (Some(p), Some(q)) => close_timestamps(p, q),
                    _ => false,
                }
        });
    if close {
        Ok(())
    } else {
        Err(format!("{:?} and {:?}", String::from_utf8_lossy(a), String::from_utf8_lossy(b)))
    }
}

/// A string cut into runs of digits and runs of other bytes.
fn tokens(s: &[u8]) -> Vec<&[u8]> {
    s.chunk_by(|x, y| x.is_ascii_digit() == y.is_ascii_digit()).collect()
}

/// A run of 16 to 19 digits as a number.
fn number(run: &[u8]) -> Option<i64> {
    (16..=19).contains(&run.len()).then(|| std::str::from_utf8(run).ok()?.parse().ok()).flatten()
}

/// The two keyspaces hold the same keys with the same types and values, and lives within the tolerance.
pub fn same_keyspace(real: &Keyspace, sim: &Keyspace) -> Result<(), String> {
    let (rk, sk): (Vec<_>, Vec<_>) = (real.keys().collect(), sim.keys().collect());
    if rk != sk {
        return Err("the keys differ".into());
    }
    for ((key, (rv, rt)), (_, (sv, st))) in real.iter().zip(sim) {
        let shown = String::from_utf8_lossy(key);
        match (rv, sv) {
            (SimValue::String(a), SimValue::String(b)) => same_text(a, b).map_err(|e| format!("{shown}: {e}"))?,
            (SimValue::ZSet(a), SimValue::ZSet(b)) => {
                let members_agree = a.len() == b.len()
                    && a.iter().zip(b).all(|((m, x), (n, y))| {
                        m == n && (x == y || (*x >= 1e15 && *y >= 1e15 && (x - y).abs() <= TOLERANCE_US as f64))
                    });
                if !members_agree {
                    return Err(format!("{shown}: the sorted sets differ"));
                }
            }
            _ => return Err(format!("{shown}: the types differ")),
        }
        match (rt, st) {
            (None, None) => {}
            (Some(a), Some(b)) if (a - b).abs() <= TOLERANCE_MS => {}
            _ => return Err(format!("{shown}: lives {rt:?} and {st:?}")),
        }
    }
    Ok(())
}
