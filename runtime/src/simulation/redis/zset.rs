//! Sorted sets and their commands (`t_zset.c` of redis-server 7.0): ZADD, ZSCORE, ZREM, ZCARD, ZPOPMIN and
//! ZRANGE (by rank, by score and by lex, REV, LIMIT, WITHSCORES).

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use super::keyspace::{int_arg, Ctx, Data, Entry, Keyspace};
use super::parse::{self, is};
use super::reply::{Reply, NOT_FLOAT, SYNTAX};

/// A score as Redis orders them: by value (never NaN; -0 equals 0), ties broken by the member.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Score(f64);

impl Eq for Score {}

impl PartialOrd for Score {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Score {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.partial_cmp(&other.0).unwrap_or(Ordering::Equal)
    }
}

/// A sorted set: each member's score, and the members in Redis's order, (score, member).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ZSet {
    scores: BTreeMap<Vec<u8>, f64>,
    order: BTreeSet<(Score, Vec<u8>)>,
}

impl ZSet {
    /// The members and scores in Redis's order.
    pub(crate) fn iter(&self) -> impl DoubleEndedIterator<Item = (&[u8], f64)> + '_ {
        self.order.iter().map(|(score, member)| (member.as_slice(), score.0))
    }

    /// A member's score.
    pub(crate) fn score(&self, member: &[u8]) -> Option<f64> {
        self.scores.get(member).copied()
    }

    /// How many members it has.
    pub(crate) fn len(&self) -> usize {
        self.scores.len()
    }

    /// Whether it has no member (Redis never keeps an empty sorted set).
    pub(crate) fn is_empty(&self) -> bool {
        self.scores.is_empty()
    }

    /// Sets `member`'s score (NaN is refused by every caller).
    pub(crate) fn insert(&mut self, member: Vec<u8>, score: f64) {
        self.remove(&member);
        self.order.insert((Score(score), member.clone()));
        self.scores.insert(member, score);
    }

    /// Removes `member`; whether it was there.
    pub(crate) fn remove(&mut self, member: &[u8]) -> bool {
        match self.scores.remove(member) {
            Some(old) => self.order.remove(&(Score(old), member.to_vec())),
            None => false,
        }
    }
}

/// ZADD key [NX | XX] [GT | LT] [CH] [INCR] score member [score member ...], as `zaddGenericCommand`.
pub(super) fn zadd(ks: &mut Keyspace, ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    let (mut nx, mut xx, mut gt, mut lt, mut ch, mut incr) = (false, false, false, false, false, false);
    let mut at = 2;
    while let Some(opt) = args.get(at) {
        match () {
            () if is(opt, "nx") => nx = true,
            () if is(opt, "xx") => xx = true,
            () if is(opt, "ch") => ch = true,
            () if is(opt, "incr") => incr = true,
            () if is(opt, "gt") => gt = true,
            () if is(opt, "lt") => lt = true,
            () => break,
        }
        at += 1;
    }
    let pairs = &args[at..];
    if pairs.is_empty() || pairs.len() % 2 == 1 {
        return Reply::error(SYNTAX);
    }
    if nx && xx {
        return Reply::error("ERR XX and NX options at the same time are not compatible");
    }
    if (nx && (gt || lt)) || (gt && lt) {
        return Reply::error("ERR GT, LT, and/or NX options at the same time are not compatible");
    }
    if incr && pairs.len() > 2 {
        return Reply::error("ERR INCR option supports a single increment-element pair");
    }
    let mut scores = Vec::with_capacity(pairs.len() / 2);
    for pair in pairs.chunks(2) {
        match parse::double(&pair[0]) {
            Some(score) => scores.push(score),
            None => return Reply::error(NOT_FLOAT),
        }
    }
    let key = &args[1];
    let existing = match ks.zset(key) {
        Ok(z) => z.cloned(),
        Err(e) => return e,
    };
    let Some(mut zset) = existing.or_else(|| (!xx).then(ZSet::default)) else {
        return if incr { Reply::Nil } else { Reply::Int(0) };
    };
    let (mut added, mut updated, mut processed, mut last) = (0, 0, 0, 0.0);
    let mut failed = None;
    for (pair, &score) in pairs.chunks(2).zip(&scores) {
        let member = &pair[1];
        match zset.score(member) {
            Some(_) if nx => {}
            Some(current) => {
                let score = if incr { score + current } else { score };
                if score.is_nan() {
                    failed = Some(Reply::error("ERR resulting score is not a number (NaN)"));
                    break;
                }
                if (lt && score >= current) || (gt && score <= current) {
                    continue;
                }
                processed += 1;
                last = score;
                if score != current {
                    zset.insert(member.clone(), score);
                    updated += 1;
                }
            }
            None if xx => {}
            None => {
                zset.insert(member.clone(), score);
                added += 1;
                processed += 1;
                last = score;
            }
        }
    }
    let expires_at_ms = ks.get(key).and_then(|e| e.expires_at_ms);
    if added + updated > 0 || !zset.is_empty() && ks.get(key).is_none() {
        ks.put(ctx, key, Entry { value: Data::ZSet(zset), expires_at_ms });
    }
    if let Some(error) = failed {
        return error;
    }
    match (incr, processed) {
        (true, 0) => Reply::Nil,
        (true, _) => Reply::Double(last),
        (false, _) => Reply::Int(if ch { added + updated } else { added }),
    }
}

/// ZSCORE key member.
pub(super) fn zscore(ks: &mut Keyspace, _: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    match ks.zset(&args[1]) {
        Err(e) => e,
        Ok(z) => z.and_then(|z| z.score(&args[2])).map_or(Reply::Nil, Reply::Double),
    }
}

/// ZCARD key.
pub(super) fn zcard(ks: &mut Keyspace, _: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    ks.zset(&args[1]).map_or_else(|e| e, |z| Reply::Int(z.map_or(0, ZSet::len) as i64))
}

/// ZREM key member [member ...]: how many were removed; an emptied set is deleted.
pub(super) fn zrem(ks: &mut Keyspace, ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    let key = &args[1];
    let removed = match ks.zset_mut(key) {
        Err(e) => return e,
        Ok(None) => return Reply::Int(0),
        Ok(Some(z)) => args[2..].iter().filter(|m| z.remove(m)).count(),
    };
    if removed > 0 {
        ctx.wrote(key);
        if ks.zset(key).ok().flatten().is_some_and(ZSet::is_empty) {
            ks.remove(ctx, key);
        }
    }
    Reply::Int(removed as i64)
}

/// ZPOPMIN key [count]: RESP3 nests the pairs when a count is given.
pub(super) fn zpopmin(ks: &mut Keyspace, ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    if args.len() > 3 {
        return Reply::error(SYNTAX);
    }
    // `getPositiveLongFromObjectOrReply`: one message for a count that is not a number and a negative one.
    let count = match args.get(2).map(|a| parse::int(a)) {
        None => None,
        Some(Some(n)) if n >= 0 => Some(n),
        Some(_) => return Reply::error("ERR value is out of range, must be positive"),
    };
    let key = &args[1];
    let zset = match ks.zset_mut(key) {
        Err(e) => return e,
        Ok(None) => return Reply::Array(Vec::new()),
        Ok(Some(z)) => z,
    };
    if count == Some(0) {
        return Reply::Array(Vec::new());
    }
    let nested = ctx.resp3 && count.is_some();
    let mut out = Vec::new();
    for _ in 0..count.unwrap_or(1) {
        let Some((member, score)) = zset.iter().next().map(|(m, s)| (m.to_vec(), s)) else { break };
        zset.remove(&member);
        if nested {
            out.push(Reply::Array(vec![Reply::Bulk(member), Reply::Double(score)]));
        } else {
            out.extend([Reply::Bulk(member), Reply::Double(score)]);
        }
    }
    let empty = zset.is_empty();
    ctx.wrote(key);
    if empty {
        ks.remove(ctx, key);
    }
    Reply::Array(out)
}

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
