//! Bad input at run time: a clear error, nothing held, no body run. Keys, durations, key templates, URLs,
//! passwords, TLS opt-in, ACL rights (including README's least-privilege user, read from README.md so the
//! doc cannot drift), a cluster address, and what `Debug` shows.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock::__private::TemplateBuf;
use distlock::{distributed_lock, with_client, Client, LockError, ReleaseOutcome, RetryStrategy};
use distlock_tests::monitor::Monitor;
use distlock_tests::time::{ms, secs};
use distlock_tests::{free_port, within, Fixture, RedisServer};
use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

/// Every key on the server, sorted.
async fn all_keys(conn: &mut MultiplexedConnection) -> BTreeSet<String> {
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(conn).await.unwrap();
    keys.into_iter().collect()
}

/// Runs `check` and asserts that the server saw no command from it and holds no new key.
async fn sends_nothing<F: std::future::Future<Output = ()>>(fx: &Fixture, monitor: &Monitor, check: F) {
    let mut conn = fx.redis_connection().unwrap();
    let before = all_keys(&mut conn).await;
    let start = monitor.mark(&mut conn, "bad-input").await;
    check.await;
    let end = monitor.mark(&mut conn, "bad-input-end").await;
    let sent: Vec<String> = monitor.lines()[start + 1..end].to_vec();
    assert!(sent.is_empty(), "refused input still sent commands:\n{}", sent.join("\n"));
    assert_eq!(all_keys(&mut conn).await, before, "refused input left keys behind");
}

fn control_character_keys() -> Vec<String> {
    ["a\nb", "tab\there", "nul\0", "del\u{7f}", "c1\u{85}", "esc\u{1b}[31m", "\r"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect()
}

// ---------------------------------------------------------------------------------------------------------
// Keys
// ---------------------------------------------------------------------------------------------------------

#[distributed_lock(key = "<name>", ttl = "5s")]
async fn locked_name(name: &str, ran: Arc<AtomicBool>) -> Result<(), LockError> {
    ran.store(true, Ordering::SeqCst);
    Ok(())
}

/// Empty keys, keys over 1 KiB and keys with control characters are refused with `InvalidKey` by
/// `acquire`, `try_acquire` and `run` (whose body does not run) — before any command is sent; 1 KiB is fine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_keys_are_invalid_key_nothing_sent_nothing_held_no_body_run() {
    let fx = Fixture::redis().await;
    let monitor = Monitor::start(fx.server().unwrap());
    let client = fx.client().clone();
    let mut bad: Vec<(String, &str)> = vec![(String::new(), "empty"), ("k".repeat(1025), "1024 bytes")];
    bad.extend(control_character_keys().into_iter().map(|k| (k, "control character")));
    for (key, reason) in &bad {
        let ran = Arc::new(AtomicBool::new(false));
        sends_nothing(&fx, &monitor, async {
            let check = |what: &str, r: Result<(), LockError>| match r {
                Err(LockError::InvalidKey { key: shown, reason: why }) => {
                    assert!(why.contains(reason), "{what} {key:?}: reason {why:?}");
                    assert!(shown.chars().count() <= 64, "{what}: the error repeats a {} char key", shown.len());
                    let text = LockError::InvalidKey { key: shown, reason: why }.to_string();
                    assert!(text.contains("invalid lock key"), "unclear message: {text}");
                }
                other => panic!("{what} {key:?}: expected InvalidKey, got {other:?}"),
            };
            check("acquire", client.lock(key.as_str()).wait(secs(1)).acquire().await.map(drop));
            check("try_acquire", client.lock(key.as_str()).try_acquire().await.map(drop));
            let body = {
                let ran = Arc::clone(&ran);
                async move { ran.store(true, Ordering::SeqCst) }
            };
            check("run", client.lock(key.as_str()).run(body).await);
            // Issue 36: the operator's calls validate keys the same way.
            check("lock_info", client.lock_info(key).await.map(drop));
            check("force_unlock", client.force_unlock(key).await.map(drop));
            check("lock_waiters", client.lock_waiters(key).await.map(drop));
        })
        .await;
        assert!(!ran.load(Ordering::SeqCst), "the body ran for key {key:?}");
    }
    // The boundary: exactly 1024 bytes is a valid key.
    let guard = client.lock("k".repeat(1024)).try_acquire().await.unwrap().expect("a 1024-byte key");
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);

    // Through the attribute: an empty or oversized rendered key is refused and the body does not run; a
    // control character in a value is escaped (it is a different, valid key).
    for (name, valid) in [("", false), (&*"n".repeat(2000), false), ("a\nb", true)] {
        let ran = Arc::new(AtomicBool::new(false));
        let result = with_client(client.clone(), locked_name(name, Arc::clone(&ran))).await;
        if valid {
            result.expect("an escaped value makes a valid key");
            assert!(ran.load(Ordering::SeqCst));
        } else {
            assert!(
                matches!(result, Err(LockError::InvalidKey { .. })),
                "name {:?}: {result:?}",
                &name[..name.len().min(8)]
            );
            assert!(!ran.load(Ordering::SeqCst), "the attribute ran its body for a bad key");
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// Durations
// ---------------------------------------------------------------------------------------------------------

/// A ttl of zero, below the 100 ms floor, or above what Redis's PX can take is `InvalidConfig` before any
/// command; the floor itself and long leases are fine. `extend` checks the same, and leaves the lock
/// held. Zero builder timeouts are refused too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_durations_are_invalid_config_nothing_sent() {
    let fx = Fixture::redis().await;
    let monitor = Monitor::start(fx.server().unwrap());
    let client = fx.client().clone();
    let bad = [Duration::ZERO, ms(1), ms(99), Duration::from_millis(i64::MAX as u64), Duration::MAX];
    for ttl in bad {
        let ran = Arc::new(AtomicBool::new(false));
        sends_nothing(&fx, &monitor, async {
            for (what, r) in [
                ("acquire", client.lock("ttl").ttl(ttl).acquire().await.map(drop)),
                ("try_acquire", client.lock("ttl").ttl(ttl).try_acquire().await.map(drop)),
                (
                    "run",
                    client
                        .lock("ttl")
                        .ttl(ttl)
                        .run({
                            let ran = Arc::clone(&ran);
                            async move { ran.store(true, Ordering::SeqCst) }
                        })
                        .await,
                ),
            ] {
                match r {
                    Err(LockError::InvalidConfig(msg)) => assert!(msg.contains("ttl"), "{what}: {msg}"),
                    other => panic!("{what} with ttl {ttl:?}: expected InvalidConfig, got {other:?}"),
                }
            }
        })
        .await;
        assert!(!ran.load(Ordering::SeqCst));
    }
    for ttl in [ms(100), secs(86_400 * 1000)] {
        let guard = client.lock("ttl").ttl(ttl).acquire().await.unwrap_or_else(|e| panic!("ttl {ttl:?}: {e}"));
        let left = guard.remaining_ttl().await.unwrap().expect("ours");
        assert!(left <= ttl && left + secs(1) >= ttl, "ttl {ttl:?}: {left:?} left");
        assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    }

    let guard = client.lock("extend").ttl(secs(10)).acquire().await.unwrap();
    for ttl in [Duration::ZERO, ms(50), Duration::MAX] {
        assert!(matches!(guard.extend(ttl).await, Err(LockError::InvalidConfig(_))), "extend({ttl:?})");
    }
    assert!(!guard.is_lost());
    assert!(guard.remaining_ttl().await.unwrap().is_some(), "a refused extend cost the lock");
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);

    let url = fx.server().unwrap().url();
    for builder in [
        Client::builder().redis(url.as_str()).connect_timeout(Duration::ZERO),
        Client::builder().redis(url.as_str()).response_timeout(Duration::ZERO),
    ] {
        assert!(matches!(builder.build().await, Err(LockError::InvalidConfig(_))));
    }
}

/// `min_hold` above what Redis's PX can take is refused up front like a ttl, instead of failing the
/// release at the end of the body (after which the lock would only free when its lease runs out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_hold_above_the_px_limit_is_invalid_config() {
    let fx = Fixture::redis().await;
    let ran = Arc::new(AtomicBool::new(false));
    let result = fx
        .client()
        .lock("hold-forever")
        .ttl(secs(10))
        .min_hold(Duration::MAX)
        .run({
            let ran = Arc::clone(&ran);
            async move { ran.store(true, Ordering::SeqCst) }
        })
        .await;
    assert!(matches!(result, Err(LockError::InvalidConfig(_))), "min_hold(Duration::MAX): {result:?}");
    assert!(!ran.load(Ordering::SeqCst));
}

// ---------------------------------------------------------------------------------------------------------
// Key templates
// ---------------------------------------------------------------------------------------------------------

fn render(a: &str, b: &str) -> String {
    let mut key = TemplateBuf::key();
    key.push_literal("pair:");
    key.push_value(a);
    key.push_literal(":");
    key.push_value(b);
    key.finish()
}

#[distributed_lock(key = "pair:<a>:<b>", ttl = "10s")]
async fn locked_pair(
    a: &str,
    b: &str,
    inside: Arc<tokio::sync::Notify>,
    leave: Arc<tokio::sync::Notify>,
) -> Result<(), LockError> {
    inside.notify_one();
    leave.notified().await;
    Ok(())
}

/// Placeholder values are escaped so that distinct values never render to the same key, no rendered key
/// leaves its hash tag or names another lock's internal keys, and on a real server every distinct pair is
/// its own lock (through `TemplateBuf::key`, and through the attribute).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_template_values_never_share_a_lock() {
    let values = [
        "",
        "a",
        "b",
        ":",
        "a:b",
        "b:c",
        "%",
        "%3A",
        "%25",
        "{",
        "}",
        "{x}",
        "x}:fence",
        "}:released",
        "*",
        "?",
        "[",
        "]",
        "[a-z]",
        "\\",
        "<",
        ">",
        "<a>",
        "\n",
        "%0A",
        " ",
        "é",
        "a%3Ab",
    ];
    let mut rendered: HashMap<String, (&str, &str)> = HashMap::new();
    for a in values {
        for b in values {
            if let Some(prev) = rendered.insert(render(a, b), (a, b)) {
                panic!("({a:?}, {b:?}) and {prev:?} render to the same key {:?}", render(a, b));
            }
        }
    }
    let fx = Fixture::redis().await;
    let client = fx.client().clone();
    let records: BTreeSet<String> = rendered.keys().map(|k| client.record_key(k)).collect();
    assert_eq!(records.len(), rendered.len(), "two keys share a record");
    for record in &records {
        assert_eq!(record.matches('{').count(), 1, "{record}");
        assert_eq!(record.matches('}').count(), 1, "{record}");
        assert!(record.ends_with('}'), "{record}: the value moved the hash tag");
        for suffix in [":queue", ":released"] {
            if let Some(base) = record.strip_suffix(suffix) {
                assert!(!records.contains(base), "{record} is the internal key of lock {base}");
            }
        }
    }
    // Every pair holds its own lock at the same time.
    let mut guards = Vec::new();
    for key in rendered.keys() {
        let guard = client.lock(key.as_str()).ttl(secs(30)).try_acquire().await.unwrap();
        guards.push(guard.unwrap_or_else(|| panic!("{key:?} shares a lock with another pair")));
    }
    drop(guards);

    // Through the attribute: ("a:b", "c") and ("a", "b:c") are held at once by different owners.
    let (inside, leave) = (Arc::new(tokio::sync::Notify::new()), Arc::new(tokio::sync::Notify::new()));
    let first =
        tokio::spawn(with_client(client.clone(), locked_pair("a:b", "c", Arc::clone(&inside), Arc::clone(&leave))));
    within(secs(10), "the first pair's body", inside.notified()).await;
    let (inside2, leave2) = (Arc::new(tokio::sync::Notify::new()), Arc::new(tokio::sync::Notify::new()));
    leave2.notify_one();
    let second = tokio::spawn(with_client(client.clone(), locked_pair("a", "b:c", Arc::clone(&inside2), leave2)));
    within(secs(10), "the second pair", second).await.unwrap().expect("a different pair is a different lock");
    leave.notify_one();
    within(secs(10), "the first pair", first).await.unwrap().expect("first pair");
}

// ---------------------------------------------------------------------------------------------------------
// URLs, passwords, TLS
// ---------------------------------------------------------------------------------------------------------

/// A wrong or missing password is a clear error at build time, naming the server with the password
/// redacted; with the right password, neither the builder's, the client's nor a guard's `Debug` shows the password, and
/// the guard's shows no full token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_is_a_clear_error_without_the_password_and_debug_redacts() {
    const PASSWORD: &str = "s3cret-Pa55word";
    const WRONG: &str = "wrong-Pa55word";
    let server = RedisServer::new();
    let mut admin = server.connection().await;
    let _: () = redis::cmd("CONFIG").arg("SET").arg("requirepass").arg(PASSWORD).query_async(&mut admin).await.unwrap();
    let port = server.port();
    for (url, what) in [
        (format!("redis://:{WRONG}@127.0.0.1:{port}/"), "wrong password"),
        (format!("redis://default:{WRONG}@127.0.0.1:{port}/"), "wrong password for the default user"),
        (format!("redis://127.0.0.1:{port}/"), "no password"),
    ] {
        let err = within(secs(20), what, Client::builder().redis(url).build()).await.expect_err(what);
        let (text, debug) = (err.to_string(), format!("{err:?}"));
        assert!(matches!(err, LockError::Backend(_)), "{what}: {debug}");
        let lower = text.to_lowercase();
        assert!(lower.contains("auth") || lower.contains("password"), "{what}: the error does not say why: {text}");
        assert!(text.contains(&format!("127.0.0.1:{port}")), "{what}: the error does not name the server: {text}");
        assert!(!text.contains(WRONG) && !debug.contains(WRONG), "{what}: the password is in the error: {debug}");
    }

    let url = format!("redis://:{PASSWORD}@127.0.0.1:{port}/");
    // Every public type that holds the URL: the builder too, before and after configuring it.
    let builder = Client::builder().redis(url.clone()).key_prefix("p:");
    for shown in [format!("{builder:?}"), format!("{:?}", builder.clone().response_timeout(secs(1)))] {
        assert!(!shown.contains(PASSWORD), "the builder's Debug shows the password: {shown}");
        assert!(shown.contains(&format!("127.0.0.1:{port}")), "the builder's Debug hides the server: {shown}");
    }
    let client = Client::builder().redis(url).build().await.expect("the right password");
    let guard = client.lock("secret").acquire().await.unwrap();
    let (client_debug, guard_debug) = (format!("{client:?}"), format!("{guard:?}"));
    for shown in [&client_debug, &guard_debug] {
        assert!(!shown.contains(PASSWORD), "Debug shows the password: {shown}");
    }
    assert!(client_debug.contains(&format!("127.0.0.1:{port}")), "Debug does not say which server: {client_debug}");
    assert!(
        !guard_debug.contains(guard.token().expose_secret()),
        "the guard's Debug shows the whole token: {guard_debug}"
    );
    assert!(!format!("{}", guard.token()).contains(guard.token().expose_secret()));
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
}

/// `rediss://…#insecure` turns off certificate checks: refused (with the reason and the way to opt in,
/// password redacted) unless `allow_insecure_tls(true)`; opting in gets past that check.
#[tokio::test]
async fn insecure_tls_url_is_refused_unless_opted_in() {
    const PASSWORD: &str = "hunter2-secret";
    let url = format!("rediss://:{PASSWORD}@127.0.0.1:{}/#insecure", free_port());
    match Client::builder().redis(url.as_str()).build().await {
        Err(LockError::InvalidConfig(msg)) => {
            assert!(msg.contains("allow_insecure_tls"), "does not say how to opt in: {msg}");
            assert!(!msg.contains(PASSWORD), "password in the message: {msg}");
        }
        other => panic!("an insecure TLS URL was not refused: {other:?}"),
    }
    let opted_in =
        within(secs(20), "opted-in build", Client::builder().redis(url.as_str()).allow_insecure_tls(true).build())
            .await;
    // Nothing listens there (and this build may lack TLS support): any error, but not the refusal.
    let err = opted_in.expect_err("nothing listens on the port");
    let text = format!("{err} {err:?}");
    assert!(!text.contains("allow_insecure_tls"), "still refused after opting in: {text}");
    assert!(!text.contains(PASSWORD), "password in the error: {text}");
}

/// Unusable URLs are `InvalidConfig` naming the URL with its password redacted.
#[tokio::test]
async fn unusable_urls_are_invalid_config_with_the_password_redacted() {
    let urls = [
        "not a url",
        "redis://user:secret-pw@127.0.0.1:notaport/",
        "http://user:secret-pw@127.0.0.1:1/",
        "redis://:secret-pw/with-a-slash@127.0.0.1:1/",
    ];
    for url in urls {
        let err = within(secs(20), url, Client::builder().redis(url).build()).await.expect_err(url);
        let text = format!("{err} {err:?}");
        assert!(!text.contains("secret-pw"), "{url}: password in the error: {text}");
        assert!(matches!(err, LockError::InvalidConfig(_) | LockError::Backend(_)), "{url}: {text}");
    }
}

/// A Redis Cluster node given to this single-server client is explained at build time.
#[tokio::test]
async fn cluster_node_is_explained_at_startup() {
    let server = RedisServer::with_args(["--cluster-enabled", "yes"]);
    match Client::builder().redis(server.url()).build().await {
        Err(LockError::InvalidConfig(msg)) => assert!(msg.contains("Cluster"), "{msg}"),
        other => panic!("a cluster node was accepted: {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------------------
// ACL
// ---------------------------------------------------------------------------------------------------------

async fn acl_setuser(admin: &mut MultiplexedConnection, rules: &[&str]) {
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER");
    for r in rules {
        cmd.arg(*r);
    }
    let _: () = cmd.query_async(admin).await.unwrap_or_else(|e| panic!("ACL SETUSER {rules:?}: {e}"));
}

/// A user missing a right the lock scripts need (running scripts, the lock's keys, publishing the release)
/// fails the startup probe, with an error that points at the ACL and redacts the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_acl_rights_fail_the_startup_probe_naming_the_acl() {
    let server = RedisServer::new();
    let mut admin = server.connection().await;
    let users: [(&str, &[&str]); 4] = [
        ("noscript", &["~*", "&*", "+@all", "-evalsha", "-eval"]),
        ("nokeys", &["~other:*", "&*", "+@all"]),
        ("nopublish", &["~*", "&*", "+@all", "-publish"]),
        ("noping", &["~*", "&*", "+@all", "-ping"]),
    ];
    for (user, rules) in users {
        let mut all = vec![user, "on", ">acl-pw-123"];
        all.extend_from_slice(rules);
        acl_setuser(&mut admin, &all).await;
        let url = format!("redis://{user}:acl-pw-123@127.0.0.1:{}/", server.port());
        let err = within(secs(20), user, Client::builder().redis(url).build()).await.expect_err(user);
        let text = err.to_string();
        assert!(text.contains("ACL"), "{user}: the error does not point at the ACL: {text}");
        assert!(text.contains("NOPERM") || text.to_lowercase().contains("permission"), "{user}: {text}");
        assert!(!format!("{text} {err:?}").contains("acl-pw-123"), "{user}: password in the error: {text}");
    }
}

/// A user without the right to subscribe to the release channels passes `build()` today and fails only at
/// the first wait. The issue asks for missing ACL rights to be reported by the startup probe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_subscribe_right_fails_the_startup_probe() {
    let server = RedisServer::new();
    let mut admin = server.connection().await;
    acl_setuser(&mut admin, &["nosub", "on", ">acl-pw-123", "~*", "&*", "+@all", "-subscribe"]).await;
    let url = format!("redis://nosub:acl-pw-123@127.0.0.1:{}/", server.port());
    let result = within(secs(20), "build", Client::builder().redis(url).build()).await;
    let err = result.expect_err("a user that cannot subscribe cannot wait for a lock");
    assert!(err.to_string().contains("ACL"), "{err}");
}

/// The `ACL SETUSER` line of README's "A least-privilege Redis user" section.
fn readme_acl_line() -> String {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).expect("README.md");
    let section = readme.split("### A least-privilege Redis user").nth(1).expect("README has the ACL section");
    section
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("ACL SETUSER"))
        .expect("the section has an ACL SETUSER line")
        .to_owned()
}

/// README's least-privilege user, created exactly as README writes it, runs a full lock cycle: startup
/// probe, acquire, renewals, `lock_info`, `remaining_ttl`, `extend`, release, `min_hold`,
/// `force_unlock`, a waiter woken by a release (pub/sub), and the EVAL fallback after `SCRIPT FLUSH`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readme_least_privilege_acl_user_runs_a_full_lock_cycle() {
    let line = readme_acl_line();
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(&words[..2], ["ACL", "SETUSER"], "{line}");
    let user = words[2];
    let password = words.iter().find_map(|w| w.strip_prefix('>')).expect("the line sets a password");
    let server = RedisServer::new();
    let mut admin = server.connection().await;
    acl_setuser(&mut admin, &words[2..]).await;

    let url = format!("redis://{user}:{password}@127.0.0.1:{}/", server.port());
    let build = || Client::builder().redis(url.as_str()).build();
    let client = build().await.unwrap_or_else(|e| panic!("README's user fails the startup probe: {e}\n{line}"));
    let other = build().await.expect("a second client");

    let cycle = async {
        let ttl = ms(300);
        let guard = client.lock("job").ttl(ttl).metadata("least-privilege").acquire().await?;
        // Work time: several renewal periods.
        tokio::time::sleep(ms(700)).await;
        assert!(!guard.is_lost(), "renewals failed for README's user");
        let info = other.lock_info("job").await?.expect("held");
        assert_eq!((info.metadata.as_str(), info.fencing_token), ("least-privilege", guard.fencing_token()));
        assert!(guard.remaining_ttl().await?.is_some());
        guard.extend(secs(5)).await?;
        assert_eq!(guard.release().await?, ReleaseOutcome::Released);

        client.lock("at-least").min_hold(ms(200)).run(async {}).await?;
        assert!(other.lock("at-least").try_acquire().await?.is_none(), "min_hold did not keep the lock");
        let held = other.lock("forced").acquire().await?;
        assert!(client.force_unlock("forced").await?);
        drop(held);

        // A waiter that retries only every 10-20 s is woken by the release announcement.
        let holder = client.lock("waited").ttl(secs(30)).acquire().await?;
        let waiter = tokio::spawn({
            let other = other.clone();
            async move {
                other.lock("waited").wait(secs(30)).retry(RetryStrategy::Linear { step: secs(20) }).acquire().await
            }
        });
        let mut channel_subscribed = false;
        for _ in 0..500 {
            let (_, n): (String, i64) = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(format!("{}:released", client.record_key("waited")))
                .query_async(&mut admin)
                .await
                .unwrap();
            if n == 1 {
                channel_subscribed = true;
                break;
            }
            tokio::time::sleep(ms(10)).await;
        }
        assert!(channel_subscribed, "the waiter never subscribed");
        let released = Instant::now();
        assert_eq!(holder.release().await?, ReleaseOutcome::Released);
        let woken = within(secs(5), "the waiter", waiter).await.unwrap()?;
        assert!(released.elapsed() < secs(1), "the waiter was woken only {:?} after the release", released.elapsed());
        drop(woken);

        // After SCRIPT FLUSH every call falls back to EVAL once.
        let _: () = redis::cmd("SCRIPT").arg("FLUSH").query_async(&mut admin).await.unwrap();
        let guard = client.lock("flushed").acquire().await?;
        assert_eq!(guard.release().await?, ReleaseOutcome::Released);
        Ok::<(), LockError>(())
    };
    within(secs(30), "the lock cycle", cycle).await.unwrap_or_else(|e| panic!("README's user: {e}\n{line}"));
}
