//! The scripts' unit tests: their sources as composed, the names they share with the client, and the
//! reply codes.

use super::*;
use crate::backend::CHANNEL;

/// Every script, named; the same as [`all_scripts`], in its order.
fn all() -> [(&'static str, &'static LuaScript); 14] {
    [
        ("acquire", &ACQUIRE),
        ("acquire_plain", &ACQUIRE_PLAIN),
        ("acquire_all", &ACQUIRE_ALL),
        ("release", &RELEASE),
        ("batch", &BATCH),
        ("batch_spread", &BATCH_SPREAD),
        ("renew", &RENEW),
        ("renew_many", &RENEW_MANY),
        ("renew_spread", &RENEW_SPREAD),
        ("withdraw", &WITHDRAW),
        ("remaining", &REMAINING),
        ("info", &INFO),
        ("force_unlock", &FORCE_UNLOCK),
        ("waiters", &WAITERS),
    ]
}

#[test]
fn every_script_is_listed_for_numbering() {
    let named: Vec<*const LuaScript> = all().iter().map(|(_, s)| *s as *const LuaScript).collect();
    let listed: Vec<*const LuaScript> = all_scripts().iter().map(|s| *s as *const LuaScript).collect();
    assert_eq!(named, listed);
}

/// No script as sent (plain, numbered or sharded) opens with a `#!` flags line: a script with flags may not
/// reach keys outside its declared ones' slot, which would end the spread scripts' cross-slot reads on a
/// cluster node (BATCH_SPREAD, RENEW_SPREAD) and make Redis refuse them.
#[test]
fn no_script_declares_flags() {
    for (name, script) in all() {
        for (variant, source) in
            [("plain", script.source), ("numbered", script.numbered.source), ("sharded", script.sharded.source)]
        {
            assert!(!source.trim_start().starts_with("#!"), "{name} ({variant}) opens with a flags line");
        }
    }
}

/// Each script's header (its opening comment lines) names every key it reaches besides KEYS, as
/// `R:<suffix>`, so that each script reads alone: what the composed source (its includes inlined) derives
/// from the record must be named there.
#[test]
fn every_script_s_header_names_the_keys_it_touches() {
    let mut unnamed = Vec::new();
    for (name, script) in all() {
        let header: String = script
            .source
            .lines()
            .take_while(|l| l.starts_with("--"))
            .filter(|l| !l.starts_with("-- #include"))
            .collect::<Vec<_>>()
            .join("\n");
        for suffix in [":queue", ":waiter:", ":client:", ":last", ":released"] {
            if script.source.contains(&format!("'{suffix}'")) && !header.contains(&format!("R{suffix}")) {
                unnamed.push(format!("{name}: R{suffix}"));
            }
        }
    }
    assert!(unnamed.is_empty(), "keys a script touches that its header does not name: {unnamed:?}");
}

/// Every value `record.lua` names, as the Rust side derives it.
fn rust_values() -> Vec<(&'static str, String)> {
    use record::*;
    use reply::*;
    vec![
        ("TOKEN_END", TOKEN_END.to_string()),
        ("MARK_AT", MARK_AT.to_string()),
        ("FENCE_AT", FENCE_AT.to_string()),
        ("QUEUED_MARK", QUEUED_MARK.to_string()),
        ("TOKEN_HALF", TOKEN_HALF.to_string()),
        ("NOBODY", format!("'{}'", "-".repeat(TOKEN_HALF))),
        ("FREED", format!("'{FREED}'")),
        ("BUSY", BUSY.to_string()),
        ("GRANTED", GRANTED.to_string()),
        ("EXPIRED", EXPIRED.to_string()),
        ("RELEASED", RELEASED.to_string()),
        ("TAKEN_BY_OTHER", TAKEN_BY_OTHER.to_string()),
        ("UNCONFIRMED", UNCONFIRMED.to_string()),
        ("NOT_OWNER", NOT_OWNER.to_string()),
        ("RENEWED", RENEWED.to_string()),
        ("NOT_HELD", NOT_HELD.to_string()),
        ("NOT_HANDED", NOT_HANDED.to_string()),
        ("FAILED", FAILED.to_string()),
    ]
}

/// `record.lua` holds exactly the values the Rust side derives from the token length and its reply
/// constants, one `local NAME = value` each.
#[test]
fn record_lua_names_the_values_rust_derives() {
    assert_eq!(record::FREED.len(), record::TOKEN_HALF);
    assert!(!record::FREED.bytes().any(|b| b.is_ascii_hexdigit()), "a hex token could equal FREED");
    let lua: Vec<(String, String)> = include_str!("../lua/record.lua")
        .lines()
        .filter_map(|line| line.strip_prefix("local "))
        .map(|decl| {
            let (name, value) = decl.split_once(" = ").unwrap_or_else(|| panic!("not `local N = v`: {decl}"));
            (name.to_owned(), value.to_owned())
        })
        .collect();
    let rust = rust_values();
    assert_eq!(lua.len(), rust.len(), "record.lua: {lua:?}");
    for (name, value) in rust {
        let found = lua.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
        assert_eq!(found, Some(value.as_str()), "{name} in record.lua");
    }
}

/// No other script file writes a record offset, the token length or NOBODY itself: they use the names.
#[test]
fn offsets_appear_only_in_record_lua() {
    let token = record::TOKEN_END;
    let numbers = [token, token + 1, token + 2, record::TOKEN_HALF].map(|n| n.to_string());
    // record.lua itself, wherever a script includes it (BATCH's slow paths have a copy of their own).
    let record = compose(include_str!("../lua/record.lua"));
    for (_, script) in all() {
        let body = script.source.replace(&record, "");
        let code: String = body.lines().filter(|l| !l.trim_start().starts_with("--")).collect();
        for number in &numbers {
            let hits = code.match_indices(number.as_str()).filter(|(i, _)| {
                let before = code[..*i].chars().next_back().is_some_and(|c| c.is_ascii_alphanumeric());
                let after = code[i + number.len()..].chars().next().is_some_and(|c| c.is_ascii_alphanumeric());
                !before && !after
            });
            assert_eq!(hits.count(), 0, "a literal {number} in\n{code}");
        }
        assert!(!code.contains("string.rep('-'"), "the no-owner token spelt out in\n{code}");
        assert!(!code.contains("string.rep('='") && !code.contains("'=="), "the freed token spelt out in\n{code}");
    }
}

/// Every script starts with its header, every include resolves, and the shared names come first.
#[test]
fn scripts_open_with_their_header_and_compose() {
    for (name, script) in all() {
        let header = format!("-- {}:", name.to_uppercase());
        assert!(script.source.starts_with(&header), "{name} does not open with `{header}`");
        let (opening, closing) = CALL_FRAME.split_once("{body}").expect("the frame has a body");
        let numbered = script.numbered.source;
        assert_eq!(numbered.strip_prefix(opening).and_then(|b| b.strip_suffix(closing)), Some(script.source));
        assert!(!script.source.contains(INCLUDE), "an include left in {name}");
        let record = script.source.find("local TOKEN_END").expect("record.lua included");
        let code = script.source.find("redis.call").expect("a command");
        assert!(record < code, "{name} uses the record's names before defining them");
    }
}

/// The common paths run inline, before any function is defined: defining a function costs Redis time on
/// every call.
#[test]
fn fast_paths_come_before_the_functions() {
    let fast_paths = [
        (&*ACQUIRE, "free = redis.call('exists', R .. ':queue', R .. ':last') == 0", "local function "),
        (&*ACQUIRE, "  return fence\nend", "local function "),
        (&*RELEASE, "    and string.byte(v, MARK_AT) ~= QUEUED_MARK then\n", "local function "),
    ];
    for (script, fast, function) in fast_paths {
        let fast = script.source.find(fast).expect("fast path");
        let first_fn = script.source.find(function).expect("a function");
        assert!(fast < first_fn, "{}", script.source);
    }
    // The inline grant and free are the shared ones: the same text as grant()'s and free()'s bodies.
    for (script, snippet) in [(&*ACQUIRE, &*GRANT_SNIPPET), (&*RELEASE, &*FREEING_SNIPPET)] {
        let inline = script.source.find(snippet.as_str()).expect("the fast path runs the snippet");
        let in_function = script.source.rfind(snippet.as_str()).expect("and so does the function");
        assert!(inline < in_function, "{}", script.source);
    }
}

/// No script writes a key without an expiry, or a counter for the fencing token: a freed record keeps the
/// record's expiry (SETRANGE over the record just read, which exists; FORCE_UNLOCK's second half only after
/// EXISTS), and every other write sets one (R:last too). The one exception is a Redlock server's lock-state
/// mark (acquire_plain_fn.lua), one key per server that must outlive every lease.
#[test]
fn every_write_keeps_or_sets_an_expiry() {
    for (name, script) in all() {
        let source = script.source;
        assert!(!source.contains("'incr'") && !source.contains(":fence"), "{name}:\n{source}");
        for (at, _) in source.match_indices("redis.call('setrange', ") {
            let line = source[at..].lines().next().unwrap_or_default();
            let freed_second_half = name == "force_unlock"
                && source.contains(
                    "if redis.call('exists', R) == 1 then redis.call('setrange', R, tostring(TOKEN_HALF), FREED) end",
                );
            assert!(
                line == "redis.call('setrange', R, '0', FREED)" || freed_second_half,
                "{name} writes a range of another key: {line}"
            );
        }
        for (at, _) in source.match_indices("redis.call('set', ") {
            let line = source[at..].lines().next().unwrap_or_default();
            let expiring = line.contains("'px', ") || line.contains("'keepttl'");
            let mark = line == "redis.call('set', S, clock)";
            assert!(expiring || mark, "{name} writes without an expiry: {line}");
        }
    }
}

/// The holder field splits back into the owner and metadata written, whatever either holds (the default
/// owner's own `:`, digits, a field that looks like another, multi-byte text); what is not one is refused.
#[test]
fn holder_field_round_trips_any_owner_and_metadata() {
    let cases = [("web-3:4242", "app::jobs::nightly"), ("12:x", "3:y"), ("é", ""), ("", "m"), ("o", "ü:\n9:")];
    for (owner, metadata) in cases {
        let mut field = Vec::new();
        record::write_holder(&mut field, owner, metadata);
        let field = String::from_utf8(field).expect("UTF-8");
        assert_eq!(field, format!("{}:{owner}{metadata}", owner.len()));
        assert_eq!(record::split_holder(&field), Some((owner, metadata)), "{field}");
    }
    for not_a_holder in ["", "abc", "x:abc", "5:abc", "+1:a", "-1:a", "1:é", " 1:a"] {
        assert_eq!(record::split_holder(not_a_holder), None, "{not_a_holder:?}");
    }
}

/// Every script that writes a record writes the grant's time beside the fence, and the holder field as
/// the client sent it.
#[test]
fn grants_and_hand_overs_write_the_documented_record() {
    // ACQUIRE's and BATCH's fast paths run grant's body inline too.
    for (script, expected) in [(&*ACQUIRE, 3), (&*BATCH, 3), (&*RELEASE, 2)] {
        let writes = script.source.matches(" .. ':' .. now .. ':' .. holder, 'px', ").count();
        assert_eq!(writes, expected, "a grant's and a hand-over's record in\n{}", script.source);
    }
}

/// A cluster's variant of each script is its numbered one with every announcement made by SPUBLISH, and
/// nothing else changed; the scripts that announce nothing run the same text everywhere.
#[test]
fn cluster_variants_announce_with_spublish_only() {
    for (name, script) in all() {
        let publishes = script.source.matches(PUBLISH).count();
        let sharded = script.sharded.source;
        assert!(!sharded.contains("'publish'"), "{name}'s cluster variant still publishes:\n{sharded}");
        assert_eq!(sharded.matches(SPUBLISH).count(), publishes, "{name}");
        assert_eq!(sharded.replace(SPUBLISH, PUBLISH), script.numbered.source, "{name}");
        assert!(!script.source.contains("spublish"), "{name} announces by SPUBLISH on one server too");
        if publishes == 0 {
            assert_eq!(script.sharded.sha, script.numbered.sha, "{name}");
        } else {
            assert_ne!(script.sharded.sha, script.numbered.sha, "{name}");
        }
    }
    // The scripts that announce a release or a forced unlock do have a cluster variant of their own.
    for script in [&*ACQUIRE, &*RELEASE, &*BATCH, &*FORCE_UNLOCK] {
        assert!(script.sharded.source.contains(SPUBLISH), "{}", script.source);
    }
}

/// The scripts name a lock's channel after its record exactly as the client does.
#[test]
fn scripts_derive_the_same_key_names_as_the_client() {
    assert!(ACQUIRE.source.contains(&format!("R .. '{CHANNEL}'")), "{CHANNEL}");
}

/// The reply codes as the client reads them.
mod reply_codes {
    use super::super::reply::*;
    use crate::backend::{Attempt, Hold};
    use crate::ReleaseOutcome;
    use std::time::Duration;

    /// A code no script sends is an error, never taken for busy, expired or not renewed.
    #[test]
    fn unknown_reply_codes_are_errors() {
        for code in [-1, 2, 7] {
            assert!(attempt_of((code, 5, 100)).is_err(), "acquire code {code}");
        }
        for code in [-1, 4, 7] {
            assert!(release_outcome(code).is_err(), "release code {code}");
        }
        for code in [-1, 2, 7] {
            assert!(renew_outcome(code).is_err(), "renew code {code}");
        }
        assert!(withdrawn((-5, 0)).is_err());
        assert!(remaining_of(-3).is_err());
        assert!(attempt_of((GRANTED, -1, 100)).is_err(), "a negative fence");
        assert!(attempt_of((GRANTED, 5, -1)).is_err(), "a grant without a lease");
    }

    /// The known codes map to what the scripts mean by them.
    #[test]
    fn known_reply_codes_map_to_their_outcomes() {
        let hold = Hold { fence: 5, lease: Duration::from_millis(100) };
        assert_eq!(attempt_of((GRANTED, 5, 100)).unwrap(), Attempt::Granted(hold));
        assert_eq!(attempt_of((BUSY, 5, -2)).unwrap(), Attempt::Busy { fence: 5, remaining: None });
        assert_eq!(release_outcome(RELEASED).unwrap(), ReleaseOutcome::Released);
        assert_eq!(release_outcome(EXPIRED).unwrap(), ReleaseOutcome::Expired);
        assert_eq!(release_outcome(TAKEN_BY_OTHER).unwrap(), ReleaseOutcome::TakenByOther);
        assert_eq!(release_outcome(UNCONFIRMED).unwrap(), ReleaseOutcome::Unconfirmed);
        assert!(renew_outcome(RENEWED).unwrap());
        assert!(!renew_outcome(NOT_OWNER).unwrap());
        assert_eq!(withdrawn((NOT_HANDED, 0)).unwrap(), None);
        assert_eq!(withdrawn((5, 100)).unwrap(), Some(hold));
        // Handed over, but its lease ran out before PTTL ran: nothing to keep, and no error.
        assert_eq!(withdrawn((5, -2)).unwrap(), None);
        assert_eq!(remaining_of(NOT_HELD).unwrap(), None);
        assert_eq!(remaining_of(100).unwrap(), Some(Duration::from_millis(100)));
    }
}
