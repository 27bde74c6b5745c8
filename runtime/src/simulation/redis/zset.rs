//! Sorted sets and their commands (`t_zset.c` of redis-server 7.0): ZADD, ZSCORE, ZREM, ZCARD, ZPOPMIN;
//! ZRANGE is in `zrange.rs`.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use super::keyspace::{Ctx, Data, Entry, Keyspace};
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
