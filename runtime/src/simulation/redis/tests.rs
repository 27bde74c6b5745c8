//! Unit tests of the simulated redis-server: Redis's parsing and printing rules, expiry, errors, the
//! conversions between replies and Lua, the script cache, replication effects. `tests/tests/sim_keyspace.rs`
//! compares the whole against a real redis-server.

use super::parse::{self, format_double, format_g};
use super::*;

/// A time in late 2023, in µs.
const NOW: i64 = 1_700_000_000_123_456;

/// Text arguments as a command.
fn args(parts: &[&str]) -> Vec<Vec<u8>> {
    parts.iter().map(|p| p.as_bytes().to_vec()).collect()
}

/// Runs one command at `now` and returns its reply.
fn run(sim: &mut SimRedis, now: i64, parts: &[&str]) -> redis::Value {
    sim.execute(now, &args(parts)).reply
}

/// An integer reply.
fn int(n: i64) -> redis::Value {
    redis::Value::Int(n)
}

/// A bulk string reply.
fn bulk(s: &str) -> redis::Value {
    redis::Value::BulkString(s.as_bytes().to_vec())
}

/// An error reply's code and message.
fn error(value: &redis::Value) -> (String, String) {
    match value {
        redis::Value::ServerError(e) => (e.code().to_owned(), e.details().unwrap_or_default().to_owned()),
        other => panic!("not an error: {other:?}"),
    }
}

/// `%.17g`, as redis-server 7.0 prints scores and a script's number arguments; `%.14g` for Lua's tostring.
#[test]
fn doubles_print_as_redis_7_0_prints_them() {
    let cases = [
        (1_700_000_000_123_456.0, "1700000000123456"),
        (0.1, "0.10000000000000001"),
        (1.5, "1.5"),
        (100.0, "100"),
        (1e20, "1e+20"),
        (1e-5, "1.0000000000000001e-05"),
        (123_456_789_012_345_678.0, "1.2345678901234568e+17"),
        (-0.0, "-0"),
        (f64::INFINITY, "inf"),
        (f64::NEG_INFINITY, "-inf"),
    ];
    for (x, printed) in cases {
        assert_eq!(format_double(x), printed, "{x}");
    }
    // Lua's own tostring: %.14g.
    assert_eq!(format_g(1e15, 14), "1e+15");
    assert_eq!(format_g(3.0, 14), "3");
}

/// The short path for integers prints what the digits path prints, on both sides of its bounds (10^P for P
/// digits, and 9e15 just above 2^53).
#[test]
fn integers_print_as_their_digits_would() {
    let mut integers: Vec<f64> = (1..2_000).map(f64::from).collect();
    for power in 1..=17 {
        let p = 10f64.powi(power);
        integers.extend([p - 1.0, p, p + 1.0]);
    }
    integers.extend([9.0e15 - 1.0, 9.0e15, 2f64.powi(53) - 1.0, 2f64.powi(53), 2f64.powi(53) + 2.0]);
    for x in integers.iter().flat_map(|&x| [x, -x]) {
        for precision in [1, 6, 14, 17] {
            assert_eq!(format_g(x, precision), parse::format_g_digits(x, precision), "{x} at %.{precision}g");
        }
    }
}

/// `string2ll`, `string2d` and SCAN's `strtoul`: what they accept and refuse.
#[test]
fn numbers_and_cursors_parse_as_redis_reads_them() {
    for (text, value) in [("0", Some(0)), ("-12", Some(-12)), ("9223372036854775807", Some(i64::MAX))] {
        assert_eq!(parse::int(text.as_bytes()), value, "{text}");
    }
    assert_eq!(parse::int(b"-9223372036854775808"), Some(i64::MIN));
    for refused in ["", "-0", "01", "+1", " 1", "1 ", "9223372036854775808", "1.0", "abc"] {
        assert_eq!(parse::int(refused.as_bytes()), None, "{refused:?}");
    }
    let doubles = [("1.5", 1.5), ("inf", f64::INFINITY), ("-inf", f64::NEG_INFINITY), ("+inf", f64::INFINITY)];
    for (text, value) in doubles.into_iter().chain([("0x10", 16.0), ("1e3", 1000.0), ("1.", 1.0), (".5", 0.5)]) {
        assert_eq!(parse::double(text.as_bytes()), Some(value), "{text}");
    }
    for refused in ["", " 1", "1 ", "abc", "nan", "1e400", "1e-400", "1e", "."] {
        assert_eq!(parse::double(refused.as_bytes()), None, "{refused:?}");
    }
    assert_eq!(parse::cursor(b""), Some(0), "strtoul reads nothing as 0");
    assert_eq!(parse::cursor(b"-1"), Some(u64::MAX), "and wraps a negative one");
    assert_eq!(parse::cursor(b" 1"), None);
    assert_eq!(parse::cursor(b"1x"), None);
}

/// Patterns checked against redis-server 7.0's KEYS with the same keys.
#[test]
fn glob_patterns_match_as_stringmatchlen_does() {
    let cases: [(&str, &str, bool); 15] = [
        ("*", "anything", true),
        ("{a}*", "{a}:queue", true),
        ("?a*", "lxb", false),
        ("?a*", "{a}:last", true),
        ("?a*", "xab", true),
        ("[a-c]*", "b1", true),
        ("[c-a]*", "b1", true),
        ("[^{]*", "{a}", false),
        ("\\{a\\}*", "{a}:last", true),
        ("*:queue", "{a}:queue", true),
        ("*:queue", "{a}:queue:x", false),
        ("*[", "x[", false),
        ("[abc", "b", true),
        ("s?", "s1", true),
        ("a\\", "a\\", true),
    ];
    for (pattern, text, matches) in cases {
        assert_eq!(parse::glob(pattern.as_bytes(), text.as_bytes()), matches, "{pattern} ~ {text}");
    }
}

/// A key is there during the ms of its expiry and gone after; eager expiry is a write, and a clock stepped
/// back does not bring the key back.
#[test]
fn keys_live_through_their_last_ms_and_expire_for_good() {
    let mut sim = SimRedis::new();
    assert_eq!(run(&mut sim, NOW, &["SET", "k", "v", "PX", "10"]), redis::Value::Okay);
    let at = NOW.div_euclid(1000) + 10;
    // Redis keeps a key during the ms of its expiry (`now > when` expires it).
    assert_eq!(run(&mut sim, at * 1000 + 999, &["GET", "k"]), bulk("v"));
    assert_eq!(run(&mut sim, at * 1000 + 999, &["PTTL", "k"]), redis::Value::Int(0));
    // Every command deletes what has expired, as a write (a DEL for replicas)...
    let later = sim.execute((at + 1) * 1000, &args(&["PING"]));
    assert_eq!(later.effects, vec![(b"k".to_vec(), None)]);
    // ...so a clock stepped back does not revive it.
    assert_eq!(run(&mut sim, NOW, &["GET", "k"]), redis::Value::Nil);
    assert_eq!(sim.peek(NOW, b"k"), None);
}

/// PEXPIRE to now or before deletes the key; SET refuses a non-positive PX; a PXAT in the past leaves nothing.
#[test]
fn non_positive_expiry_deletes_or_is_refused_as_redis_does() {
    let mut sim = SimRedis::new();
    run(&mut sim, NOW, &["SET", "k", "v"]);
    assert_eq!(run(&mut sim, NOW, &["PEXPIRE", "k", "0"]), redis::Value::Int(1));
    assert_eq!(run(&mut sim, NOW, &["EXISTS", "k"]), redis::Value::Int(0));
    for px in ["0", "-5"] {
        let refused = run(&mut sim, NOW, &["SET", "k", "v", "PX", px]);
        assert_eq!(error(&refused), ("ERR".into(), "invalid expire time in 'set' command".into()));
    }
    assert_eq!(run(&mut sim, NOW, &["SET", "k", "v", "PXAT", "1000"]), redis::Value::Okay);
    assert_eq!(sim.snapshot(NOW).len(), 0, "written already expired: gone");
}

/// Error codes and messages, word for word.
#[test]
fn errors_use_redis_wording() {
    let mut sim = SimRedis::new();
    run(&mut sim, NOW, &["ZADD", "z", "1", "m"]);
    let cases: [(&[&str], &str, &str); 9] = [
        (&["GET", "z"], "WRONGTYPE", "Operation against a key holding the wrong kind of value"),
        (&["GET"], "ERR", "wrong number of arguments for 'get' command"),
        (&["script"], "ERR", "wrong number of arguments for 'script' command"),
        (&["SCRIPT", "LOAD"], "ERR", "wrong number of arguments for 'script|load' command"),
        (&["PEXPIRE", "k", "x"], "ERR", "value is not an integer or out of range"),
        (
            &["EVALSHA", "0000000000000000000000000000000000000000", "0"],
            "NOSCRIPT",
            "No matching script. Please use EVAL.",
        ),
        (&["FOO", "a", "b"], "ERR", "unknown command 'FOO', with args beginning with: 'a' 'b' "),
        (&["SCRIPT", "nosuch"], "ERR", "unknown subcommand 'nosuch'. Try SCRIPT HELP."),
        (&["EVAL", "return 1", "2", "k"], "ERR", "Number of keys can't be greater than number of args"),
    ];
    for (command, code, message) in cases {
        assert_eq!(error(&run(&mut sim, NOW, command)), (code.into(), message.into()), "{command:?}");
    }
}

/// Lua to Redis (numbers truncated, false nil, true 1, tables up to the first nil, `err`, `ok`, `double`) and
/// Redis to Lua (nil false, status `{ok=}`, scores as text; RESP3 types after `redis.setresp(3)`).
#[test]
fn script_replies_convert_as_redis_converts_them() {
    let mut sim = SimRedis::new();
    let reply = run(
        &mut sim,
        NOW,
        &["EVAL", "return {1, 2.9, -2.9, 'x', false, true, {ok='fine'}, {err='E bad'}, nil, 4}", "0"],
    );
    let redis::Value::Array(items) = reply else { panic!("an array") };
    assert_eq!(items[..6], [int(1), int(2), int(-2), bulk("x"), redis::Value::Nil, int(1)]);
    assert_eq!(items[6], redis::Value::SimpleString("fine".into()));
    assert_eq!(error(&items[7]), ("E".into(), "bad".into()));
    assert_eq!(items.len(), 8, "an array ends at its first nil");
    // A number beyond i64 converts as x86-64's (long long) does.
    assert_eq!(run(&mut sim, NOW, &["EVAL", "return 1e20", "0"]), redis::Value::Int(i64::MIN));
    assert_eq!(run(&mut sim, NOW, &["EVAL", "return {double=1.5}", "0"]), redis::Value::Double(1.5));
    assert_eq!(run(&mut sim, NOW, &["EVAL", "return redis.status_reply('OK')", "0"]), redis::Value::Okay);
    assert_eq!(
        error(&run(&mut sim, NOW, &["EVAL", "return redis.error_reply('oops')", "0"])),
        ("ERR".into(), "oops".into())
    );
    // What a script reads back: nil as false, a status as {ok=}, a score as its %.17g text; RESP3 after setresp.
    let script = "redis.call('zadd', 'z', 0.1, 'm') return {type(redis.call('get', 'none')), \
                  redis.call('set', 'k', 'v')['ok'], redis.call('zscore', 'z', 'm'), redis.call('exists', 'k', 'k')}";
    let expected = [bulk("boolean"), bulk("OK"), bulk("0.10000000000000001"), int(2)];
    assert_eq!(run(&mut sim, NOW, &["EVAL", script, "0"]), redis::Value::Array(expected.to_vec()));
    let resp3 = "redis.setresp(3) return {redis.call('zscore', 'z', 'm'), redis.call('get', 'none') == nil, false}";
    let expected = [redis::Value::Double(0.1), redis::Value::Boolean(true), redis::Value::Boolean(false)];
    assert_eq!(run(&mut sim, NOW, &["EVAL", resp3, "0"]), redis::Value::Array(expected.to_vec()));
}

/// A failed `redis.call` fails the script with the command's code and the line; writes before it stay; pcall
/// and redis.pcall hand the error over; globals are read-only; a runaway script and a compile error fail.
#[test]
fn script_errors_keep_their_code_and_the_writes_before_them() {
    let mut sim = SimRedis::new();
    run(&mut sim, NOW, &["ZADD", "z", "1", "m"]);
    let failed = run(&mut sim, NOW, &["EVAL", "redis.call('set', 'k', 'kept')\nreturn redis.call('get', 'z')", "0"]);
    let (code, message) = error(&failed);
    assert_eq!(code, "WRONGTYPE");
    assert!(message.ends_with(", on @user_script:2."), "{message}");
    assert_eq!(sim.peek(NOW, b"k"), Some((b"kept".as_slice(), None)), "Redis does not roll a script back");
    // Under pcall a script gets the error's text; redis.pcall returns its table.
    let caught = "local ok, e = pcall(redis.call, 'get', 'z') return {tostring(ok), e, redis.pcall('get', 'z')}";
    let wrongtype = "WRONGTYPE Operation against a key holding the wrong kind of value";
    let reply = run(&mut sim, NOW, &["EVAL", caught, "0"]);
    let redis::Value::Array(items) = reply else { panic!("an array") };
    assert_eq!(items[..2], [bulk("false"), bulk(wrongtype)]);
    assert_eq!(error(&items[2]).0, "WRONGTYPE");
    let runtime = [
        ("x = 1", "user_script:1: Attempt to modify a readonly table"),
        ("return nope", "user_script:1: Script attempted to access nonexistent global variable 'nope'"),
        ("return 1 + nil", "user_script:1: attempt to perform arithmetic on a nil value"),
        ("string.upper = nil", "user_script:1: Attempt to modify a readonly table"),
    ];
    for (script, text) in runtime {
        let (code, message) = error(&run(&mut sim, NOW, &["EVAL", script, "0"]));
        assert_eq!(code, "ERR", "{script}");
        assert!(message.starts_with(text), "{script}: {message}");
    }
    let (code, runaway) = error(&run(&mut sim, NOW, &["EVAL", "while true do end", "0"]));
    assert_eq!(code, "ERR", "a script that never ends fails instead of hanging the simulation: {runaway}");
    let (_, compile) = error(&run(&mut sim, NOW, &["EVAL", "return 1 +", "0"]));
    assert_eq!(compile, "Error compiling script (new function): user_script:1: unexpected symbol near '<eof>'");
}

/// EVAL and SCRIPT LOAD cache by SHA1 (any case); SCRIPT FLUSH and a restart forget, a restart the keys too.
#[test]
fn scripts_are_cached_by_sha1_until_a_flush_or_restart() {
    let mut sim = SimRedis::new();
    let sha = "e0e1f9fabfc9d4800c877a703b823ac0578ff8db";
    assert_eq!(error(&run(&mut sim, NOW, &["EVALSHA", sha, "0"])).0, "NOSCRIPT");
    assert_eq!(run(&mut sim, NOW, &["SCRIPT", "LOAD", "return 1"]), bulk(sha));
    assert_eq!(run(&mut sim, NOW, &["EVALSHA", &sha.to_uppercase(), "0"]), int(1));
    let exists = run(&mut sim, NOW, &["SCRIPT", "EXISTS", sha, "0000000000000000000000000000000000000000"]);
    assert_eq!(exists, redis::Value::Array(vec![int(1), int(0)]));
    run(&mut sim, NOW, &["SCRIPT", "FLUSH", "ASYNC"]);
    assert_eq!(error(&run(&mut sim, NOW, &["EVALSHA", sha, "0"])).0, "NOSCRIPT");
    assert_eq!(run(&mut sim, NOW, &["EVAL", "return 1", "0"]), int(1), "EVAL caches it again");
    run(&mut sim, NOW, &["SET", "k", "v"]);
    sim.restart();
    assert_eq!(error(&run(&mut sim, NOW, &["EVALSHA", sha, "0"])).0, "NOSCRIPT");
    assert!(sim.snapshot(NOW).is_empty(), "nothing persists");
}

/// A script's writes as effects with absolute expiry, deletions included, in order; its messages; a replica
/// applying the effects holds the same keyspace.
#[test]
fn effects_and_publications_are_what_a_replica_and_subscribers_get() {
    let mut primary = SimRedis::new();
    let script = "redis.call('set', 'a', '1', 'px', 5000) redis.call('set', 'b', '2') redis.call('del', 'b') \
                  redis.call('publish', 'ch', 'one') redis.call('spublish', 'sh', 'two') return 1";
    let done = primary.execute(NOW, &args(&["EVAL", script, "0"]));
    let expires = Some(NOW.div_euclid(1000) + 5000);
    let a = Entry { value: Data::String(b"1".to_vec()), expires_at_ms: expires };
    assert_eq!(done.effects, vec![(b"a".to_vec(), Some(a)), (b"b".to_vec(), None)]);
    let published: Vec<(&[u8], &[u8], bool)> =
        done.published.iter().map(|p| (p.channel.as_slice(), p.message.as_slice(), p.sharded)).collect();
    assert_eq!(published, [(&b"ch"[..], &b"one"[..], false), (&b"sh"[..], &b"two"[..], true)]);
    let mut replica = SimRedis::new();
    replica.apply(&done.effects);
    assert_eq!(replica.snapshot(NOW), primary.snapshot(NOW));
    assert_eq!(replica.peek(NOW + 1_000_000, b"a"), Some((b"1".as_slice(), Some(4000))));
}

/// Order by score then member; WITHSCORES pairs and ZPOPMIN with a count nested as RESP3 nests them.
#[test]
fn sorted_sets_reply_in_resp3_shapes() {
    let mut sim = SimRedis::new();
    run(&mut sim, NOW, &["ZADD", "z", "2", "b", "1", "a", "1", "c"]);
    let snapshot = sim.snapshot(NOW);
    let Some(Entry { value: Data::ZSet(z), .. }) = snapshot.get(&b"z"[..]) else { panic!("a sorted set") };
    let z: &ZSet = z;
    let members: Vec<(&[u8], f64)> = z.iter().collect();
    assert_eq!(members, [(&b"a"[..], 1.0), (&b"c"[..], 1.0), (&b"b"[..], 2.0)], "by score, then member");
    let pair = |m: &str, s: f64| redis::Value::Array(vec![bulk(m), redis::Value::Double(s)]);
    let ranged = run(&mut sim, NOW, &["ZRANGE", "z", "0", "-1", "WITHSCORES"]);
    assert_eq!(ranged, redis::Value::Array(vec![pair("a", 1.0), pair("c", 1.0), pair("b", 2.0)]));
    assert_eq!(run(&mut sim, NOW, &["ZRANGE", "z", "0", "0", "REV"]), redis::Value::Array(vec![bulk("b")]));
    let by_score = run(&mut sim, NOW, &["ZRANGE", "z", "(1", "+inf", "BYSCORE"]);
    assert_eq!(by_score, redis::Value::Array(vec![bulk("b")]));
    assert_eq!(run(&mut sim, NOW, &["ZPOPMIN", "z"]), redis::Value::Array(vec![bulk("a"), redis::Value::Double(1.0)]));
    assert_eq!(run(&mut sim, NOW, &["ZPOPMIN", "z", "1"]), redis::Value::Array(vec![pair("c", 1.0)]));
    assert_eq!(run(&mut sim, NOW, &["ZREM", "z", "b"]), int(1));
    assert_eq!(run(&mut sim, NOW, &["EXISTS", "z"]), int(0), "an emptied set is deleted");
}

/// Keys present from a SCAN's first call to its last are returned while others come and go.
#[test]
fn scan_returns_every_key_present_throughout() {
    let mut sim = SimRedis::new();
    for i in 0..40 {
        run(&mut sim, NOW, &["SET", &format!("k{i}"), "v"]);
    }
    let (mut cursor, mut seen) = ("0".to_owned(), std::collections::BTreeSet::new());
    for round in 0.. {
        // Keys come and go during the scan; the first 20 stay.
        run(&mut sim, NOW, &["SET", &format!("new{round}"), "v"]);
        run(&mut sim, NOW, &["DEL", &format!("k{}", 39 - round)]);
        let reply = run(&mut sim, NOW, &["SCAN", &cursor, "COUNT", "3"]);
        let redis::Value::Array(parts) = reply else { panic!("SCAN") };
        let (redis::Value::BulkString(next), redis::Value::Array(keys)) = (&parts[0], &parts[1]) else { panic!() };
        seen.extend(keys.iter().map(|k| format!("{k:?}")));
        cursor = String::from_utf8(next.clone()).unwrap_or_default();
        if cursor == "0" || round > 100 {
            break;
        }
    }
    for i in 0..20 {
        assert!(seen.contains(&format!("{:?}", bulk(&format!("k{i}")))), "k{i}");
    }
}

/// ACQUIRE grants with the clock as fence, queues a second token, and RELEASE hands the lock to it and
/// announces the hand-over.
#[test]
fn production_scripts_hand_a_lock_over_and_announce_it() {
    let sources: std::collections::HashMap<String, &str> = production_scripts().into_iter().collect();
    let (acquire, release) = (sources["ACQUIRE"], sources["RELEASE"]);
    let (holder, waiter) = ("0123456789abcdef0123456789abcdef", "fedcba9876543210fedcba9876543210");
    let mut sim = SimRedis::new();
    let granted = run(&mut sim, NOW, &["EVAL", acquire, "1", "{k}", holder, "30000", "5:owner"]);
    assert_eq!(
        granted,
        redis::Value::BulkString(NOW.to_string().into_bytes()),
        "the fast path's fence is the server's clock in µs"
    );
    let busy = run(
        &mut sim,
        NOW + 1,
        &["EVAL", acquire, "1", "{k}", waiter, "30000", "5:other", "60000", "20000", "3", "00000000000000c1", "90000"],
    );
    assert_eq!(busy, redis::Value::Array(vec![int(0), bulk(&NOW.to_string()), int(30000)]));
    let released = sim.execute(NOW + 2, &args(&["EVAL", release, "1", "{k}", holder]));
    assert_eq!(released.reply, int(1));
    // The heir's fence: the clock at the release, past the holder's.
    let announced = format!("{waiter}:{}:20000:3", NOW + 2);
    assert_eq!(released.published[0].message, announced.as_bytes(), "to the longest waiter");
    let (record, ttl) = sim.peek(NOW + 2, b"{k}").unwrap_or_default();
    assert!(record.starts_with(format!("{waiter}+{}:", NOW + 2).as_bytes()), "{:?}", String::from_utf8_lossy(record));
    assert_eq!(ttl, Some(20000), "for the hand-over lease");
}

/// The simulation keeps its servers in a shared, locked world: they must be Send and Sync.
#[test]
fn a_simulated_server_can_live_in_a_shared_world() {
    /// Compiles only for types that are both.
    fn shared<T: Send + Sync>() {}
    shared::<SimRedis>();
    shared::<SimServer>();
}

/// A Redlock server's attempt that lands twice (sent again after its reply was lost) never shortens the lease:
/// the client may have renewed or extended it meanwhile and counts on that (redlock/round.rs counts a server
/// whose grant is still on its way for the next renewal). A shorter lease is still set to the ttl.
#[test]
fn a_plain_attempt_landing_twice_never_shortens_its_lease() {
    let sources: std::collections::HashMap<String, &str> = production_scripts().into_iter().collect();
    let plain = sources["ACQUIRE_PLAIN"];
    let token = "0123456789abcdef0123456789abcdef";
    let attempt = ["EVAL", plain, "1", "{k}", token, "10000", "5:owner", "mark"];
    let mut sim = SimRedis::new();
    let granted = run(&mut sim, NOW, &attempt);
    let redis::Value::Array(first) = &granted else { panic!("not a grant: {granted:?}") };
    assert_eq!(run(&mut sim, NOW, &["PTTL", "{k}"]), int(10000));
    // Extended to a minute, then the attempt lands again: still granted, the minute kept.
    assert_eq!(run(&mut sim, NOW + 1_000, &["PEXPIRE", "{k}", "60000"]), int(1));
    let again = run(&mut sim, NOW + 2_000, &attempt);
    let redis::Value::Array(second) = &again else { panic!("not a grant: {again:?}") };
    assert_eq!(second[0], first[0], "granted again");
    assert_eq!(run(&mut sim, NOW + 2_000, &["PTTL", "{k}"]), int(59999));
    // Shorter than the ttl: the attempt sets the ttl.
    assert_eq!(run(&mut sim, NOW + 3_000, &["PEXPIRE", "{k}", "3000"]), int(1));
    run(&mut sim, NOW + 4_000, &attempt);
    assert_eq!(run(&mut sim, NOW + 4_000, &["PTTL", "{k}"]), int(10000));
}
