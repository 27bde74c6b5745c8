//! The generic commands (`expire.c`, `db.c`, `pubsub.c`, `server.c` of redis-server 7.0): PEXPIRE, PTTL, DEL,
//! EXISTS, TYPE, TIME, PUBLISH, SPUBLISH, PING, ECHO, SCAN.

use super::keyspace::{bad_expire, int_arg, Ctx, Entry, Keyspace};
use super::parse::{self, is};
use super::reply::{Reply, SYNTAX};
use super::Published;

/// PEXPIRE key ms [NX | XX | GT | LT], as `expireGenericCommand` does it (options first, then the time).
pub(super) fn pexpire(ks: &mut Keyspace, ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    let (mut nx, mut xx, mut gt, mut lt) = (false, false, false, false);
    for opt in &args[3..] {
        match () {
            () if is(opt, "nx") => nx = true,
            () if is(opt, "xx") => xx = true,
            () if is(opt, "gt") => gt = true,
            () if is(opt, "lt") => lt = true,
            () => {
                // `%s` of a C string: up to its first NUL.
                let shown = opt.split(|&c| c == 0).next().unwrap_or_default();
                return Reply::formatted_error([b"ERR Unsupported option ", shown].concat());
            }
        }
    }
    if nx && (xx || gt || lt) {
        return Reply::error("ERR NX and XX, GT or LT options at the same time are not compatible");
    }
    if gt && lt {
        return Reply::error("ERR GT and LT options at the same time are not compatible");
    }
    let when = match int_arg(&args[2]) {
        Ok(n) => n,
        Err(e) => return e,
    };
    let now = ctx.now_ms();
    if when > i64::MAX - now {
        return bad_expire("pexpire");
    }
    let when = when + now;
    let Some(current) = ks.get(&args[1]).map(|e| e.expires_at_ms) else {
        return Reply::Int(0);
    };
    let refused = (nx && current.is_some())
        || (xx && current.is_none())
        || (gt && current.is_none_or(|c| when <= c))
        || (lt && current.is_some_and(|c| when >= c));
    if refused {
        return Reply::Int(0);
    }
    // `checkAlreadyExpired`: a time not after now deletes the key.
    if when <= now {
        ks.remove(ctx, &args[1]);
    } else if let Some(entry) = ks.entries.get_mut(&args[1]) {
        entry.expires_at_ms = Some(when);
        ctx.wrote(&args[1]);
    }
    Reply::Int(1)
}

/// PTTL key: -2 without the key, -1 without an expiry.
pub(super) fn pttl(ks: &mut Keyspace, ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    Reply::Int(match ks.get(&args[1]) {
        None => -2,
        Some(Entry { expires_at_ms: None, .. }) => -1,
        Some(Entry { expires_at_ms: Some(at), .. }) => (at - ctx.now_ms()).max(0),
    })
}

/// DEL key [key ...]: how many were deleted (a key named twice counts once).
pub(super) fn del(ks: &mut Keyspace, ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    Reply::Int(args[1..].iter().filter(|key| ks.remove(ctx, key)).count() as i64)
}

/// EXISTS key [key ...]: how many of the keys named exist (a key named twice counts twice).
pub(super) fn exists(ks: &mut Keyspace, _: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    Reply::Int(args[1..].iter().filter(|key| ks.get(key).is_some()).count() as i64)
}

/// TYPE key.
pub(super) fn type_of(ks: &mut Keyspace, _: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    Reply::Status(ks.get(&args[1]).map_or("none", |e| e.value.type_name()).as_bytes().to_vec())
}

/// TIME: seconds and microseconds of the server's clock (`Ctx::read_clock`), as bulk strings.
pub(super) fn time(_: &mut Keyspace, ctx: &mut Ctx, _: &[Vec<u8>]) -> Reply {
    let now = ctx.read_clock();
    let (s, us) = (now.div_euclid(1_000_000), now.rem_euclid(1_000_000));
    Reply::Array(vec![Reply::Bulk(s.to_string().into_bytes()), Reply::Bulk(us.to_string().into_bytes())])
}

/// PUBLISH channel message: recorded; the reply counts no receiver (subscribers are the simulation's, not
/// the server's).
pub(super) fn publish(_: &mut Keyspace, ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    ctx.published.push(Published { channel: args[1].clone(), message: args[2].clone(), sharded: false });
    Reply::Int(0)
}

/// SPUBLISH shardchannel message: as PUBLISH.
pub(super) fn spublish(_: &mut Keyspace, ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    ctx.published.push(Published { channel: args[1].clone(), message: args[2].clone(), sharded: true });
    Reply::Int(0)
}

/// PING [message].
pub(super) fn ping(_: &mut Keyspace, _: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    match args {
        [_] => Reply::Status(b"PONG".to_vec()),
        [_, message] => Reply::Bulk(message.clone()),
        _ => Reply::error("ERR wrong number of arguments for 'ping' command"),
    }
}

/// ECHO message.
pub(super) fn echo(_: &mut Keyspace, _: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    Reply::Bulk(args[1].clone())
}

/// SCAN cursor [MATCH pattern] [COUNT count] [TYPE type]. The cursor is a position in a fixed order of all
/// possible keys (by a 64-bit hash, then the key): each call returns the keys from the cursor on, at least
/// COUNT of them unless none are left, never splitting keys of one hash, and the next cursor is the hash
/// where it stopped (0: done). A key present from the first call to the last is returned, as Redis promises;
/// the cursors themselves are not Redis's.
pub(super) fn scan(ks: &mut Keyspace, _: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    let Some(cursor) = parse::cursor(&args[1]) else {
        return Reply::error("ERR invalid cursor");
    };
    let (mut count, mut pattern, mut type_name): (i64, Option<&[u8]>, Option<&[u8]>) = (10, None, None);
    let mut i = 2;
    while i < args.len() {
        let has_value = args.len() - i >= 2;
        if is(&args[i], "count") && has_value {
            count = match int_arg(&args[i + 1]) {
                Ok(n) if n >= 1 => n,
                Ok(_) => return Reply::error(SYNTAX),
                Err(e) => return e,
            };
        } else if is(&args[i], "match") && has_value {
            pattern = Some(&args[i + 1]).filter(|p| p.as_slice() != b"*").map(Vec::as_slice);
        } else if is(&args[i], "type") && has_value {
            type_name = Some(&args[i + 1]);
        } else {
            return Reply::error(SYNTAX);
        }
        i += 2;
    }
    let mut order: Vec<(u64, &Vec<u8>)> =
        ks.entries.keys().map(|k| (scan_hash(k), k)).filter(|(h, _)| *h >= cursor).collect();
    order.sort();
    let mut next = 0;
    let mut keys: Vec<(u64, &Vec<u8>)> = Vec::new();
    for (hash, key) in order {
        if keys.len() as i64 >= count && keys.last().is_some_and(|(h, _)| *h != hash) {
            next = hash;
            break;
        }
        keys.push((hash, key));
    }
    let keys = keys
        .into_iter()
        .filter(|(_, k)| pattern.is_none_or(|p| parse::glob(p, k)))
        .filter(|(_, k)| {
            type_name.is_none_or(|t| ks.get(k).is_some_and(|e| e.value.type_name().as_bytes().eq_ignore_ascii_case(t)))
        })
        .map(|(_, k)| Reply::Bulk(k.clone()))
        .collect();
    Reply::Array(vec![Reply::Bulk(next.to_string().into_bytes()), Reply::Array(keys)])
}

/// A key's place in SCAN's order: FNV-1a, which never changes between runs. A key hashing to 0 would read as
/// the end, so hashes start at 1.
fn scan_hash(key: &[u8]) -> u64 {
    let hash = key.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    hash.max(1)
}
