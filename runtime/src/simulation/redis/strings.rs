//! The string commands (`t_string.c` of redis-server 7.0): GET, GETDEL, SET, SETRANGE, GETRANGE.

use super::keyspace::{bad_expire, int_arg, Ctx, Data, Entry, Keyspace};
use super::parse::is;
use super::reply::{Reply, SYNTAX};

/// GET key.
pub(super) fn get(ks: &mut Keyspace, _: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    ks.string(&args[1]).map_or_else(|e| e, |s| Reply::bulk_or_nil(s.cloned()))
}

/// GETDEL key.
pub(super) fn getdel(ks: &mut Keyspace, ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    match ks.string(&args[1]) {
        Err(e) => e,
        Ok(None) => Reply::Nil,
        Ok(Some(s)) => {
            let value = s.clone();
            ks.remove(ctx, &args[1]);
            Reply::Bulk(value)
        }
    }
}

/// SET key value [NX | XX] [GET] [EX s | PX ms | EXAT s | PXAT ms | KEEPTTL], its options parsed as
/// `parseExtendedStringArgumentsOrReply` does (an expiry option given twice: the last wins).
pub(super) fn set(ks: &mut Keyspace, ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    /// Which expiry option was given.
    #[derive(PartialEq, Clone, Copy)]
    enum Unit {
        Ex,
        Px,
        ExAt,
        PxAt,
    }
    let (mut nx, mut xx, mut get, mut keepttl) = (false, false, false, false);
    let mut expire: Option<(Unit, &[u8])> = None;
    let mut j = 3;
    while j < args.len() {
        let opt = &args[j];
        let next = args.get(j + 1);
        let other_expiry = |unit: Unit| expire.is_some_and(|(u, _)| u != unit);
        if is(opt, "nx") && !xx {
            nx = true;
        } else if is(opt, "xx") && !nx {
            xx = true;
        } else if is(opt, "get") {
            get = true;
        } else if is(opt, "keepttl") && expire.is_none() {
            keepttl = true;
        } else if let (Some(unit), Some(next)) = (
            [("ex", Unit::Ex), ("px", Unit::Px), ("exat", Unit::ExAt), ("pxat", Unit::PxAt)]
                .into_iter()
                .find(|(name, _)| is(opt, name))
                .map(|(_, unit)| unit),
            next,
        ) {
            if keepttl || other_expiry(unit) {
                return Reply::error(SYNTAX);
            }
            expire = Some((unit, next));
            j += 1;
        } else {
            return Reply::error(SYNTAX);
        }
        j += 1;
    }
    let mut at = None;
    if let Some((unit, text)) = expire {
        let mut ms = match int_arg(text) {
            Ok(ms) => ms,
            Err(e) => return e,
        };
        let seconds = matches!(unit, Unit::Ex | Unit::ExAt);
        if ms <= 0 || (seconds && ms > i64::MAX / 1000) {
            return bad_expire("set");
        }
        if seconds {
            ms *= 1000;
        }
        if matches!(unit, Unit::Ex | Unit::Px) {
            // C's signed overflow wraps here in practice, and the check below catches it.
            ms = ms.wrapping_add(ctx.now_ms());
        }
        if ms <= 0 {
            return bad_expire("set");
        }
        at = Some(ms);
    }
    let old = match ks.string(&args[1]) {
        Ok(old) => old.cloned(),
        // Only GET reads the old value: without it SET overwrites any type.
        Err(e) if get => return e,
        Err(_) => None,
    };
    let found = ks.get(&args[1]).is_some();
    let reply = if get { Reply::bulk_or_nil(old) } else { Reply::ok() };
    if (nx && found) || (xx && !found) {
        return if get { reply } else { Reply::Nil };
    }
    let kept = if keepttl { ks.get(&args[1]).and_then(|e| e.expires_at_ms) } else { None };
    ks.put(ctx, &args[1], Entry { value: Data::String(args[2].clone()), expires_at_ms: at.or(kept) });
    reply
}

/// SETRANGE key offset value.
pub(super) fn setrange(ks: &mut Keyspace, ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    let offset = match int_arg(&args[2]) {
        Ok(n) => n,
        Err(e) => return e,
    };
    if offset < 0 {
        return Reply::error("ERR offset is out of range");
    }
    let value = &args[3];
    let current = match ks.string(&args[1]) {
        Ok(s) => s.cloned(),
        Err(e) => return e,
    };
    if value.is_empty() {
        return Reply::Int(current.map_or(0, |s| s.len() as i64));
    }
    // proto-max-bulk-len's default, 512 MB.
    let end = offset.saturating_add(value.len() as i64);
    let Ok(end) = usize::try_from(end).map_err(drop).and_then(|e| if e > 512 << 20 { Err(()) } else { Ok(e) }) else {
        return Reply::error("ERR string exceeds maximum allowed size (proto-max-bulk-len)");
    };
    let start = end - value.len();
    let expires_at_ms = ks.get(&args[1]).and_then(|e| e.expires_at_ms);
    let mut s = current.unwrap_or_default();
    if s.len() < end {
        s.resize(end, 0);
    }
    s[start..end].copy_from_slice(value);
    let len = s.len() as i64;
    ks.put(ctx, &args[1], Entry { value: Data::String(s), expires_at_ms });
    Reply::Int(len)
}

/// GETRANGE key start end.
pub(super) fn getrange(ks: &mut Keyspace, _: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    let (mut start, mut end) = match (int_arg(&args[2]), int_arg(&args[3])) {
        (Ok(s), Ok(e)) => (s, e),
        (Err(e), _) | (_, Err(e)) => return e,
    };
    let s = match ks.string(&args[1]) {
        Ok(Some(s)) => s,
        Ok(None) => return Reply::Bulk(Vec::new()),
        Err(e) => return e,
    };
    let len = s.len() as i64;
    if start < 0 && end < 0 && start > end {
        return Reply::Bulk(Vec::new());
    }
    if start < 0 {
        start += len;
    }
    if end < 0 {
        end += len;
    }
    start = start.max(0);
    end = end.max(0);
    if end >= len {
        end = len - 1;
    }
    if start > end || len == 0 {
        return Reply::Bulk(Vec::new());
    }
    Reply::Bulk(s[start as usize..=end as usize].to_vec())
}
