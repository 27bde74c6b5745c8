//! ZRANGE (`t_zset.c`'s `zrangeGenericCommand` in redis-server 7.0): by rank, by score and by lex, REV,
//! LIMIT, WITHSCORES.

use std::cmp::Ordering;

use super::keyspace::{int_arg, Ctx, Keyspace};
use super::parse::{self, is};
use super::reply::{Reply, SYNTAX};

/// One end of a ZRANGE range: an index, or a BYSCORE or BYLEX bound and whether it is exclusive.
enum Bound {
    Rank(i64),
    Score(f64, bool),
    Lex(Lex, bool),
}

/// A BYLEX bound: `-`, `+`, or a member.
enum Lex {
    Lowest,
    Highest,
    At(Vec<u8>),
}

/// ZRANGE key start stop [BYSCORE | BYLEX] [REV] [LIMIT offset count] [WITHSCORES], as
/// `zrangeGenericCommand` parses and answers it.
pub(super) fn zrange(ks: &mut Keyspace, ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    let (mut withscores, mut rev, mut by_score, mut by_lex) = (false, false, false, false);
    let (mut offset, mut limit) = (0i64, -1i64);
    let mut j = 4;
    while j < args.len() {
        let left = args.len() - j - 1;
        let opt = &args[j];
        if is(opt, "withscores") {
            withscores = true;
        } else if is(opt, "limit") && left >= 2 {
            match (int_arg(&args[j + 1]), int_arg(&args[j + 2])) {
                (Ok(o), Ok(l)) => (offset, limit) = (o, l),
                (Err(e), _) | (_, Err(e)) => return e,
            }
            j += 2;
        } else if !rev && is(opt, "rev") {
            rev = true;
        } else if !by_score && !by_lex && is(opt, "bylex") {
            by_lex = true;
        } else if !by_score && !by_lex && is(opt, "byscore") {
            by_score = true;
        } else {
            return Reply::error(SYNTAX);
        }
        j += 1;
    }
    if limit != -1 && !by_score && !by_lex {
        return Reply::error("ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX");
    }
    if withscores && by_lex {
        return Reply::error("ERR syntax error, WITHSCORES not supported in combination with BYLEX");
    }
    // With REV a score or lex range is given as max, min.
    let (lo, hi) = if rev && (by_score || by_lex) { (&args[3], &args[2]) } else { (&args[2], &args[3]) };
    let picked: Result<(Bound, Bound), Reply> = if by_score {
        match (score_bound(lo), score_bound(hi)) {
            (Some(a), Some(b)) => Ok((a, b)),
            _ => Err(Reply::error("ERR min or max is not a float")),
        }
    } else if by_lex {
        match (lex_bound(lo), lex_bound(hi)) {
            (Some(a), Some(b)) => Ok((a, b)),
            _ => Err(Reply::error("ERR min or max not valid string range item")),
        }
    } else {
        match (int_arg(lo), int_arg(hi)) {
            (Ok(a), Ok(b)) => Ok((Bound::Rank(a), Bound::Rank(b))),
            (Err(e), _) | (_, Err(e)) => Err(e),
        }
    };
    let (min, max) = match picked {
        Ok(bounds) => bounds,
        Err(e) => return e,
    };
    let zset = match ks.zset(&args[1]) {
        Err(e) => return e,
        Ok(None) => return Reply::Array(Vec::new()),
        Ok(Some(z)) => z,
    };
    let forward: Vec<(&[u8], f64)> = zset.iter().collect();
    // REV walks from the highest element: by rank, index 0 is the highest.
    let walk: Vec<(&[u8], f64)> = if rev { forward.iter().rev().copied().collect() } else { forward.clone() };
    let chosen: Vec<(&[u8], f64)> = match (min, max) {
        (Bound::Rank(start), Bound::Rank(stop)) => {
            let len = walk.len() as i64;
            let start = if start < 0 { start + len } else { start }.max(0);
            let stop = if stop < 0 { stop + len } else { stop };
            if start > stop || start >= len {
                Vec::new()
            } else {
                walk[start as usize..=stop.min(len - 1) as usize].to_vec()
            }
        }
        (min, max) => {
            // `zzlFirstInRange` and its kin: nothing when the range is empty or lies wholly past either end;
            // else the walk starts at the first element inside the range from its own end (min for a forward
            // walk), skips `offset` elements (a negative offset skips them all), and stops at the first
            // element outside it.
            let in_range = !range_is_empty(&min, &max)
                && forward.last().is_some_and(|i| above(&min, i))
                && forward.first().is_some_and(|i| below(&max, i));
            let enter = |i: &(&[u8], f64)| if rev { below(&max, i) } else { above(&min, i) };
            let stay = |i: &(&[u8], f64)| if rev { above(&min, i) } else { below(&max, i) };
            match walk.iter().position(enter).filter(|&s| stay(&walk[s])) {
                Some(s) if in_range && offset >= 0 => walk
                    .iter()
                    .skip(s.saturating_add(usize::try_from(offset).unwrap_or(usize::MAX)))
                    .take_while(|i| stay(i))
                    .take(usize::try_from(limit).unwrap_or(usize::MAX))
                    .copied()
                    .collect(),
                _ => Vec::new(),
            }
        }
    };
    let mut out = Vec::new();
    for (member, score) in chosen {
        match (withscores, ctx.resp3) {
            (false, _) => out.push(Reply::Bulk(member.to_vec())),
            (true, true) => out.push(Reply::Array(vec![Reply::Bulk(member.to_vec()), Reply::Double(score)])),
            (true, false) => out.extend([Reply::Bulk(member.to_vec()), Reply::Double(score)]),
        }
    }
    Reply::Array(out)
}

/// `zslParseRange`'s reading of one end: `(` makes it exclusive; then `strtod`, anything left over or NaN
/// refused (an empty number reads as 0, as strtod gives).
fn score_bound(arg: &[u8]) -> Option<Bound> {
    let (exclusive, text) = match arg.strip_prefix(b"(") {
        Some(rest) => (true, rest),
        None => (false, arg),
    };
    // strtod skips leading white space here (only ZADD's scores refuse it).
    let trimmed = text.trim_ascii_start();
    let (value, used, _) = parse::strtod_prefix(trimmed);
    let used = if used == 0 { 0 } else { used + text.len() - trimmed.len() };
    (used == text.len() && !value.is_nan()).then_some(Bound::Score(value, exclusive))
}

/// `zslParseLexRangeItem`: `-` and `+` (always exclusive), or `(`/`[` and the member.
fn lex_bound(arg: &[u8]) -> Option<Bound> {
    match arg.split_first() {
        Some((b'-', [])) => Some(Bound::Lex(Lex::Lowest, true)),
        Some((b'+', [])) => Some(Bound::Lex(Lex::Highest, true)),
        Some((b'(', rest)) => Some(Bound::Lex(Lex::At(rest.to_vec()), true)),
        Some((b'[', rest)) => Some(Bound::Lex(Lex::At(rest.to_vec()), false)),
        _ => None,
    }
}

/// A member against a lex bound (`sdscmplex`).
fn lex_cmp(member: &[u8], bound: &Lex) -> Ordering {
    match bound {
        Lex::Lowest => Ordering::Greater,
        Lex::Highest => Ordering::Less,
        Lex::At(b) => member.cmp(b.as_slice()),
    }
}

/// Whether the item is at or above the range's min.
fn above(min: &Bound, &(member, score): &(&[u8], f64)) -> bool {
    match min {
        Bound::Rank(_) => true,
        Bound::Score(m, ex) => {
            if *ex {
                score > *m
            } else {
                score >= *m
            }
        }
        Bound::Lex(m, ex) => {
            let c = lex_cmp(member, m);
            c == Ordering::Greater || (!ex && c == Ordering::Equal)
        }
    }
}

/// Whether the item is at or below the range's max.
fn below(max: &Bound, &(member, score): &(&[u8], f64)) -> bool {
    match max {
        Bound::Rank(_) => true,
        Bound::Score(m, ex) => {
            if *ex {
                score < *m
            } else {
                score <= *m
            }
        }
        Bound::Lex(m, ex) => {
            let c = lex_cmp(member, m);
            c == Ordering::Less || (!ex && c == Ordering::Equal)
        }
    }
}

/// Whether nothing can lie between min and max (`zslIsInRange`'s and `zslIsInLexRange`'s first test).
fn range_is_empty(min: &Bound, max: &Bound) -> bool {
    match (min, max) {
        (Bound::Score(a, aex), Bound::Score(b, bex)) => a > b || (a == b && (*aex || *bex)),
        (Bound::Lex(a, aex), Bound::Lex(b, bex)) => {
            let c = match (a, b) {
                (Lex::Lowest, Lex::Lowest) | (Lex::Highest, Lex::Highest) => Ordering::Equal,
                (Lex::Lowest, _) | (_, Lex::Highest) => Ordering::Less,
                (Lex::Highest, _) | (_, Lex::Lowest) => Ordering::Greater,
                (Lex::At(a), Lex::At(b)) => a.cmp(b),
            };
            c == Ordering::Greater || (c == Ordering::Equal && (*aex || *bex))
        }
        _ => false,
    }
}
