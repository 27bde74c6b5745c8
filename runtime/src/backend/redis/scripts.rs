//! The Lua scripts (`lua/*.lua`): each operation is one script call, so one round trip, with keys and values
//! only in KEYS and ARGV. Under load, concurrent acquires and releases share one call ([`BATCH`]). Each script
//! file opens with its KEYS, ARGV and reply; a line `-- #include a b` pulls in the shared files `a.lua` and
//! `b.lua` there (`record` names the record's fields and the reply codes, the others define functions).
//!
//! # Keys
//!
//! KEYS[1] is always the lock's record, `R` = `<prefix>{<escaped key>}`. The scripts also reach keys named
//! after it that they do not receive in KEYS: `R:last` the last fencing token where a record ends sooner than
//! its last grant's lease (a hand-over, `min_hold`; see `record.lua`), `R:queue` the wait queue (a sorted set of waiter tokens in arrival order),
//! `R:waiter:<token>` each waiter's details (`<hand-over lease ms>:<holder>`, which Redis expires when the
//! waiter stops refreshing its place), and they publish on the channel `R:released`. A hand-over reaches the
//! heir's `R:waiter:<heir>`, which the caller cannot name in advance, so not every key could be declared
//! anyway. Every derived key starts with `R` and so carries its hash tag `{<escaped key>}`, the only braces
//! in it (the user's key is escaped, see `LockKeys`): all of a lock's keys hash to the record's slot by
//! construction (`tests/tests/keys.rs` checks it with `CLUSTER KEYSLOT`). That is all Redis Cluster needs of
//! a script's keys in practice; the cluster connection routes each call by the record's slot, and there the
//! scripts announce with SPUBLISH (sharded pub/sub, [`LuaScript::sharded`]), which the channel's slot, the
//! record's, keeps on the lock's own shard.
//!
//! Declaring the derived keys too would not cost Redis much: with two of them (then `R:fence`, since replaced
//! by the freed record and `R:last`, and `R:queue`) passed as KEYS[2] and KEYS[3]
//! (and used instead of concatenating), ACQUIRE measured 5.4–6.0 µs per call against 5.6–5.9 with one key,
//! RELEASE 2.08–2.18 against 1.90–2.06 (redis-server 7.0, 64 locks cycling acquire then release, EVALSHA
//! pipelined, `INFO commandstats` usec_per_call, five interleaved runs on a shared 2-core machine). They stay
//! undeclared because the heir's waiter key cannot be declared, and three key strings per operation would
//! cost the client instead.
//!
//! # The record
//!
//! One string, `<token><mark><fence>:<granted>:<holder>` ([`record`]): cheaper for Redis than a hash, and the
//! 32-character token at its start is all that renew and release compare. The mark is `:`, or `+` once a
//! waiter may have queued behind this holder: only then does a release look at the queue. While
//! `min_hold` keeps a released lock, the token is replaced by dashes, which no hex token can equal.
//! `<granted>` is the server's clock in µs when the grant (or hand-over) was made, read with the fencing token;
//! `<holder>` is the client's text, `<owner's length in bytes>:<owner><metadata>`
//! ([`record::write_holder`]), which a waiter also leaves in its `R:waiter:<token>`, so that a hand-over
//! writes the heir's owner and metadata. The length prefix lets both be any text; the scripts never split it.
//!
//! What the grant time and owner cost Redis: nothing this machine can resolve. Measured with `redis-benchmark`
//! on a private redis-server 7.0 (EVALSHA of ACQUIRE granting free locks of random keys, 8 clients, pipelines
//! of 16, 100 000 calls a run, `INFO commandstats` usec_per_call, 40 interleaved runs alternating which script
//! goes first, on a shared 2-core machine): 7.9 µs per call before (median; minimum 5.6), 7.6 after (5.8),
//! with an owner of 19 bytes; the old script against a copy of itself differed by 0.13. The longer
//! concatenation alone, timed in a Lua loop, costs about 0.05 µs; no command was added.
//!
//! A release (or an expiry noticed by an acquire) hands the lock straight to the longest-waiting live waiter
//! and publishes `<its token>:<fence>:<hand-over lease ms>` on `R:released`: waiters are served in order, and
//! the next holder has the lock one message after the release instead of racing for it.

use once_cell::sync::Lazy;

/// Where the fields of a lock record lie, as Lua's 1-based string positions (`record.lua` names the same
/// values; a unit test ties them together), and the holder field the client writes and reads. The record is
/// `<token><mark><fence>:<granted>:<holder>`.
pub(super) mod record {
    use crate::token::TOKEN_LEN;

    /// The last character of the grant's token: `string.sub(v, 1, TOKEN_END)` is the token.
    #[cfg_attr(not(test), expect(dead_code, reason = "only the scripts read records; Rust checks the offset"))]
    pub(in super::super) const TOKEN_END: usize = TOKEN_LEN;
    /// The mark: `:` held, `+` a waiter may be queued behind this holder.
    #[cfg_attr(not(test), expect(dead_code, reason = "only the scripts read records; Rust checks the offset"))]
    pub(in super::super) const MARK_AT: usize = TOKEN_LEN + 1;
    /// The fencing token's first digit.
    #[cfg_attr(not(test), expect(dead_code, reason = "only the scripts read records; Rust checks the offset"))]
    pub(in super::super) const FENCE_AT: usize = TOKEN_LEN + 2;
    /// Where the token's first half ends: FREED and NOBODY cover that half, the second half stays (a release
    /// sent again recognises its own work by it; half a token grants nothing).
    #[cfg_attr(not(test), expect(dead_code, reason = "only the scripts read records; Rust checks the offset"))]
    pub(in super::super) const TOKEN_HALF: usize = TOKEN_LEN / 2;
    /// What a freed record holds in place of the first half of a holder's token: a released lock's record,
    /// FREED written over it, keeps its last fencing token for the rest of its lease, for the next grant
    /// (fence.lua).
    pub(in super::super) const FREED: &str = "================";
    /// The mark of a record a waiter may be queued behind.
    #[cfg_attr(not(test), expect(dead_code, reason = "only the scripts read records; Rust checks the mark"))]
    pub(in super::super) const QUEUED_MARK: u8 = b'+';

    /// Writes the holder field, `<owner's length in bytes>:<owner><metadata>`, straight into a command's
    /// argument (no string built per attempt).
    pub(in super::super) fn write_holder(out: &mut impl std::io::Write, owner: &str, metadata: &str) {
        // Writes into a command's buffer, which cannot fail. On every acquire: plain writes, where `write!`'s
        // formatting machinery cost the client about 500 instructions a call.
        let _ = out.write_all(itoa::Buffer::new().format(owner.len()).as_bytes());
        let _ = out.write_all(b":");
        let _ = out.write_all(owner.as_bytes());
        let _ = out.write_all(metadata.as_bytes());
    }

    /// The owner and metadata in a holder field; `None` if it is not one (not written by this client).
    pub(in super::super) fn split_holder(holder: &str) -> Option<(&str, &str)> {
        let (len, rest) = holder.split_once(':')?;
        let len: usize = len.parse().ok().filter(|_| len.bytes().all(|b| b.is_ascii_digit()))?;
        Some((rest.get(..len)?, rest.get(len..)?))
    }
}

/// What the scripts reply (`record.lua` names the same values; a unit test ties them together). A reply the
/// client does not know is an error, never taken for one of these.
pub(super) mod reply {
    use std::time::Duration;

    use super::super::unexpected_reply;
    use crate::backend::{Attempt, Hold};
    use crate::ReleaseOutcome;

    /// ACQUIRE's first value: the lock is the caller's.
    pub(in super::super) const GRANTED: i64 = 1;
    /// ACQUIRE's first value: another grant holds the lock.
    pub(in super::super) const BUSY: i64 = 0;
    /// RELEASE: the token's grant was given back.
    pub(in super::super) const RELEASED: i64 = 1;
    /// RELEASE: nobody holds the lock (the grant expired).
    pub(in super::super) const EXPIRED: i64 = 0;
    /// RELEASE: another grant holds the lock.
    pub(in super::super) const TAKEN_BY_OTHER: i64 = 2;
    /// RELEASE sent again: the lock is no longer this token's, and no trace says whether the first send freed it.
    pub(in super::super) const UNCONFIRMED: i64 = 3;
    /// RENEW: the lease now runs for the ttl from now.
    pub(in super::super) const RENEWED: i64 = 1;
    /// RENEW: the token no longer owns the lock.
    pub(in super::super) const NOT_OWNER: i64 = 0;
    /// REMAINING: the token does not own the lock.
    pub(in super::super) const NOT_HELD: i64 = -2;
    /// WITHDRAW's first value: the lock was not handed to the token.
    pub(in super::super) const NOT_HANDED: i64 = -1;
    /// BATCH: this operation failed inside the script (the message follows).
    pub(in super::super) const FAILED: i64 = -1;

    /// An ACQUIRE reply `(code, fence, ms)`: granted for `ms`, or busy with the holder's fence and PTTL (negative:
    /// unknown). Any other code, or a negative fence or grant, is an error: a script this client does not know.
    pub(in super::super) fn attempt_of((code, fence, ms): (i64, i64, i64)) -> redis::RedisResult<Attempt> {
        let (Ok(fence), ms) = (u64::try_from(fence), u64::try_from(ms).ok().map(Duration::from_millis)) else {
            return Err(unexpected_reply());
        };
        match (code, ms) {
            (GRANTED, Some(lease)) => Ok(Attempt::Granted(Hold { fence, lease })),
            (BUSY, remaining) => Ok(Attempt::Busy { fence, remaining }),
            _ => Err(unexpected_reply()),
        }
    }

    /// A RELEASE reply; any other code is an error.
    pub(in super::super) fn release_outcome(code: i64) -> redis::RedisResult<ReleaseOutcome> {
        match code {
            RELEASED => Ok(ReleaseOutcome::Released),
            TAKEN_BY_OTHER => Ok(ReleaseOutcome::TakenByOther),
            UNCONFIRMED => Ok(ReleaseOutcome::Unconfirmed),
            EXPIRED => Ok(ReleaseOutcome::Expired),
            _ => Err(unexpected_reply()),
        }
    }

    /// A RENEW reply: whether the lease was extended; any other code is an error.
    pub(in super::super) fn renew_outcome(code: i64) -> redis::RedisResult<bool> {
        match code {
            RENEWED => Ok(true),
            NOT_OWNER => Ok(false),
            _ => Err(unexpected_reply()),
        }
    }

    /// A REMAINING reply: the lease left, `None` when the token does not own the lock.
    pub(in super::super) fn remaining_of(pttl: i64) -> redis::RedisResult<Option<Duration>> {
        match pttl {
            NOT_HELD => Ok(None),
            // Ours without expiry cannot happen through this crate; report it as "as long as you like".
            -1 => Ok(Some(Duration::MAX)),
            ms => u64::try_from(ms).map(|ms| Some(Duration::from_millis(ms))).map_err(|_| unexpected_reply()),
        }
    }

    /// A WITHDRAW reply: the hold, if the lock was handed to the waiter meanwhile.
    pub(in super::super) fn withdrawn((fence, pttl): (i64, i64)) -> redis::RedisResult<Option<Hold>> {
        match (fence, u64::try_from(fence), u64::try_from(pttl)) {
            (NOT_HANDED, ..) => Ok(None),
            (_, Ok(fence), Ok(ms)) => Ok(Some(Hold { fence, lease: Duration::from_millis(ms) })),
            // Handed to it, but expired by the time PTTL ran (-2) or without expiry (-1, not written by us).
            (_, Ok(_), Err(_)) => Ok(None),
            _ => Err(unexpected_reply()),
        }
    }
}

/// A Lua script with its SHA1, sent as EVALSHA and, when the server has not cached it (after a restart or
/// SCRIPT FLUSH), once more as EVAL, which caches it again.
pub(super) struct LuaScript {
    pub(super) source: &'static str,
    pub(super) sha: String,
    /// The same script in the call-number frame ([`CALL_FRAME`]), which connections that also carry
    /// subscriptions send instead (link.rs).
    pub(super) numbered: Numbered,
    /// The numbered script announcing with SPUBLISH (sharded pub/sub) instead of PUBLISH: what a Redis Cluster
    /// runs, so an announcement goes to the shard that owns the lock's slot, not over the cluster bus to every
    /// node. The other connections keep PUBLISH, which Redis before 7.0 has too.
    pub(super) sharded: Numbered,
}

/// A script in the call-number frame.
pub(super) struct Numbered {
    pub(super) source: &'static str,
    pub(super) sha: String,
}

impl LuaScript {
    /// `file` with each `-- #include` line replaced by the files it names.
    fn new(file: &'static str) -> Self {
        let body = compose(file);
        let numbered = Numbered::new(CALL_FRAME.replacen("{body}", &body, 1));
        let sharded = Numbered::new(numbered.source.replace(PUBLISH, SPUBLISH));
        let source: &'static str = Box::leak(body.into_boxed_str());
        Self { source, sha: redis::Script::new(source).get_hash().to_owned(), numbered, sharded }
    }

    /// The SHA and the source a call sends: the script itself, or its variant in `frame`.
    pub(super) fn sent_as(&self, frame: Option<Frame>) -> (&str, &'static str) {
        match frame {
            None => (&self.sha, self.source),
            Some(Frame::Numbered) => (&self.numbered.sha, self.numbered.source),
            Some(Frame::Sharded) => (&self.sharded.sha, self.sharded.source),
        }
    }
}

/// Which variant of a script a connection that numbers its calls runs (link.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Frame {
    /// In the call-number frame ([`LuaScript::numbered`]).
    Numbered,
    /// In the frame, announcing with SPUBLISH ([`LuaScript::sharded`]): a cluster's.
    Sharded,
}

impl Numbered {
    fn new(source: String) -> Self {
        let source: &'static str = Box::leak(source.into_boxed_str());
        Self { source, sha: redis::Script::new(source).get_hash().to_owned() }
    }
}

/// How every script announces a release, and what a cluster's variant says instead: one text substitution,
/// so the scripts themselves, and what one server runs, stay as they are.
const PUBLISH: &str = "redis.call('publish', ";
const SPUBLISH: &str = "redis.call('spublish', ";

/// The call-number frame: the client appends a call number to ARGV, and the script replies `{call number,
/// reply}` (a script's own error still comes back as the call's error). The client uses a reply only if it
/// carries its own call's number (link.rs says why), and the script's body sees ARGV as it was sent. It costs
/// Redis about 4 000 instructions a call (callgrind), a third of an empty script call, so only the
/// connections that need it send scripts in it.
const CALL_FRAME: &str =
    "local call = table.remove(ARGV)\nlocal reply = (function()\n{body}end)()\nreturn {call, reply}\n";

/// Every script.
pub(super) fn all_scripts() -> [&'static LuaScript; 14] {
    [
        &ACQUIRE,
        &ACQUIRE_PLAIN,
        &ACQUIRE_ALL,
        &RELEASE,
        &BATCH,
        &BATCH_SPREAD,
        &RENEW,
        &RENEW_MANY,
        &RENEW_SPREAD,
        &WITHDRAW,
        &REMAINING,
        &INFO,
        &FORCE_UNLOCK,
        &WAITERS,
    ]
}

/// Every script's text as servers receive it, named by its header and variant (`ACQUIRE`, `ACQUIRE numbered`,
/// `ACQUIRE sharded`): what the simulated redis-server's tests run (`distlock::simulation::redis`).
#[cfg(feature = "simulation")]
pub(crate) fn sources() -> Vec<(String, &'static str)> {
    let mut out = Vec::new();
    for script in all_scripts() {
        let header = script.source.lines().next().unwrap_or_default();
        let name = header.trim_start_matches("-- ").split(':').next().unwrap_or(header).to_owned();
        out.push((name.clone(), script.source));
        out.push((format!("{name} numbered"), script.numbered.source));
        out.push((format!("{name} sharded"), script.sharded.source));
    }
    out
}

/// The files scripts include, by name.
const SHARED: [(&str, &str); 17] = [
    ("record", include_str!("lua/record.lua")),
    ("clock", include_str!("lua/clock.lua")),
    ("next_fence", include_str!("lua/next_fence.lua")),
    ("grant", include_str!("lua/grant.lua")),
    ("is_free", include_str!("lua/is_free.lua")),
    ("fence_fns", include_str!("lua/fence_fns.lua")),
    ("fence", include_str!("lua/fence.lua")),
    ("freeing", include_str!("lua/freeing.lua")),
    ("free", include_str!("lua/free.lua")),
    ("hand_over", include_str!("lua/hand_over.lua")),
    ("queue", include_str!("lua/queue.lua")),
    ("acquire_fn", include_str!("lua/acquire_fn.lua")),
    ("acquire_plain_fn", include_str!("lua/acquire_plain_fn.lua")),
    ("release_fn", include_str!("lua/release_fn.lua")),
    ("renew_fn", include_str!("lua/renew_fn.lua")),
    ("batch_slow", include_str!("lua/batch_slow.lua")),
    ("batch_fn", include_str!("lua/batch_fn.lua")),
];

const INCLUDE: &str = "-- #include ";

/// grant.lua composed: what ACQUIRE's fast path and grant() both run.
#[cfg(test)]
static GRANT_SNIPPET: Lazy<String> = Lazy::new(|| compose(include_str!("lua/grant.lua")));

/// freeing.lua: what RELEASE's fast path and free() both run.
#[cfg(test)]
static FREEING_SNIPPET: Lazy<String> = Lazy::new(|| compose(include_str!("lua/freeing.lua")));

fn compose(file: &str) -> String {
    let mut out = String::with_capacity(file.len() * 4);
    for line in file.lines() {
        // An include may be indented (inside a block); what it includes is not re-indented.
        match line.trim_start().strip_prefix(INCLUDE) {
            Some(names) => {
                for name in names.split_whitespace() {
                    let shared = SHARED.iter().find(|(n, _)| *n == name).map(|(_, text)| text);
                    // A misspelt include is caught by the unit tests, which build every script.
                    let shared = shared.unwrap_or_else(|| panic!("lua/{name}.lua is not a shared script file"));
                    // A shared file may include snippets (fence.lua's function bodies).
                    out.push_str(&compose(shared));
                }
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

pub(super) static ACQUIRE: Lazy<LuaScript> = Lazy::new(|| LuaScript::new(include_str!("lua/acquire.lua")));
pub(super) static ACQUIRE_PLAIN: Lazy<LuaScript> = Lazy::new(|| LuaScript::new(include_str!("lua/acquire_plain.lua")));
pub(super) static ACQUIRE_ALL: Lazy<LuaScript> = Lazy::new(|| LuaScript::new(include_str!("lua/acquire_all.lua")));
pub(super) static RELEASE: Lazy<LuaScript> = Lazy::new(|| LuaScript::new(include_str!("lua/release.lua")));
pub(super) static BATCH: Lazy<LuaScript> = Lazy::new(|| LuaScript::new(include_str!("lua/batch.lua")));
pub(super) static BATCH_SPREAD: Lazy<LuaScript> = Lazy::new(|| LuaScript::new(include_str!("lua/batch_spread.lua")));
pub(super) static RENEW: Lazy<LuaScript> = Lazy::new(|| LuaScript::new(include_str!("lua/renew.lua")));
pub(super) static RENEW_MANY: Lazy<LuaScript> = Lazy::new(|| LuaScript::new(include_str!("lua/renew_many.lua")));
pub(super) static RENEW_SPREAD: Lazy<LuaScript> = Lazy::new(|| LuaScript::new(include_str!("lua/renew_spread.lua")));
pub(super) static WITHDRAW: Lazy<LuaScript> = Lazy::new(|| LuaScript::new(include_str!("lua/withdraw.lua")));
pub(super) static REMAINING: Lazy<LuaScript> = Lazy::new(|| LuaScript::new(include_str!("lua/remaining.lua")));
pub(super) static INFO: Lazy<LuaScript> = Lazy::new(|| LuaScript::new(include_str!("lua/info.lua")));
pub(super) static FORCE_UNLOCK: Lazy<LuaScript> = Lazy::new(|| LuaScript::new(include_str!("lua/force_unlock.lua")));
pub(super) static WAITERS: Lazy<LuaScript> = Lazy::new(|| LuaScript::new(include_str!("lua/waiters.lua")));

#[cfg(test)]
mod tests;

/// The name of the script whose SHA or source `script` is, for the simulation's trace.
#[cfg(feature = "simulation")]
pub(crate) fn script_name(script: &[u8]) -> Option<&'static str> {
    const NAMES: [&str; 14] = [
        "ACQUIRE",
        "ACQUIRE_PLAIN",
        "ACQUIRE_ALL",
        "RELEASE",
        "BATCH",
        "BATCH_SPREAD",
        "RENEW",
        "RENEW_MANY",
        "RENEW_SPREAD",
        "WITHDRAW",
        "REMAINING",
        "INFO",
        "FORCE_UNLOCK",
        "WAITERS",
    ];
    let found = all_scripts().into_iter().position(|s| s.sha.as_bytes() == script || s.source.as_bytes() == script)?;
    Some(NAMES[found])
}
