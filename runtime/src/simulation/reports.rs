//! What a call of one of the production scripts is about to do, read from its keys and arguments as the
//! scripts read them: what the oracle learns when the call is sent, and what the server reports when it runs.

use super::redis::SimRedis;

/// What a script call is about to do that the oracle checks (outcomes.rs): its releases, renewals and
/// force_unlocks, read from its keys and arguments as the scripts read them.
pub(super) enum Report {
    /// `after_acquire`: an earlier operation of the same BATCH call may grant the same record (to another
    /// token), so what the release finds is not known before the call runs; `after_release`: an earlier one
    /// may free it (a release of the same record, by another token or this one: then this one finds nobody).
    Release {
        record: String,
        token: String,
        resent: bool,
        after_acquire: bool,
        after_release: bool,
    },
    Renew {
        record: String,
        token: String,
        ttl: String,
    },
    ForceUnlock {
        record: String,
    },
    Acquire {
        token: String,
        ttl: String,
    },
}

/// Whether a command runs on `redis` as sent: an EVALSHA the server does not know runs nothing.
pub(super) fn runs_on(redis: &SimRedis, args: &[Vec<u8>]) -> bool {
    let by_sha = args.first().is_some_and(|name| name.eq_ignore_ascii_case(b"EVALSHA"));
    !by_sha || args.get(1).is_some_and(|sha| redis.knows_script(sha))
}

/// The reports of a call of one of the production scripts, read from its arguments when it is sent (whether
/// it runs or not: [`runs_on`] tells where it is applied).
pub(super) fn reports_of(args: &[Vec<u8>]) -> Vec<Report> {
    if args.len() < 3 {
        return Vec::new();
    }
    let text = |i: usize| args.get(i).map(|a| String::from_utf8_lossy(a).into_owned()).unwrap_or_default();
    let Some(script) = crate::backend::script_name(&args[1]) else { return Vec::new() };
    let keys: usize = text(2).parse().unwrap_or(0);
    let (key, arg) = (|i: usize| text(2 + i), |i: usize| text(2 + keys + i));
    match script {
        "RELEASE" => {
            let (record, token, resent) = (key(1), arg(1), arg(4) == "1");
            vec![Report::Release { record, token, resent, after_acquire: false, after_release: false }]
        }
        "RENEW" => vec![Report::Renew { record: key(1), token: arg(1), ttl: arg(2) }],
        "RENEW_MANY" => {
            (1..=keys).map(|i| Report::Renew { record: key(i), token: arg(2 * i - 1), ttl: arg(2 * i) }).collect()
        }
        "FORCE_UNLOCK" => vec![Report::ForceUnlock { record: key(1) }],
        "ACQUIRE" | "ACQUIRE_PLAIN" => vec![Report::Acquire { token: arg(1), ttl: arg(2) }],
        "ACQUIRE_ALL" => (1..=keys).map(|i| Report::Acquire { token: arg(2 + i), ttl: arg(1) }).collect(),
        "BATCH" => {
            // ARGV[1]: one letter per operation; each operation's arguments follow, in order (batch.lua).
            let (mut reports, mut acquired, mut released) = (Vec::new(), Vec::new(), Vec::new());
            let (mut at, mut last_ttl) = (2, String::new());
            for (i, op) in arg(1).bytes().enumerate() {
                let (record, token) = (key(i + 1), arg(at));
                // 'b' takes the ttl of the last 'a' before it.
                if matches!(op, b'a' | b'p' | b'q') {
                    last_ttl = arg(at + 1);
                }
                let Some(arity) = crate::backend::batch_arity(op) else { return reports };
                at += arity;
                if matches!(op, b'r' | b'k' | b's') {
                    let (after_acquire, after_release) = (acquired.contains(&record), released.contains(&record));
                    released.push(record.clone());
                    reports.push(Report::Release { record, token, resent: op == b's', after_acquire, after_release });
                } else {
                    acquired.push(record);
                    reports.push(Report::Acquire { token, ttl: last_ttl.clone() });
                }
            }
            reports
        }
        _ => Vec::new(),
    }
}
