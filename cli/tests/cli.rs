//! The `distlock` binary against real redis-server processes, with locks held by the library in the same test.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::{assert_exit, assert_one_error_line, client, distlock, stderr, stdout, watch_until, TTL};
use distlock_tests::RedisServer;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ls_lists_held_locks_sorted_as_a_table_and_as_json() {
    let server = RedisServer::new();
    let url = server.url();
    let client = client(&url, "web-3").await;
    let r2 = client.lock("report:2").ttl(TTL).metadata("weekly").acquire().await.unwrap();
    let r1 = client.lock("report:1").ttl(TTL).metadata("monthly").acquire().await.unwrap();
    let _other = client.lock("invoice:{7}").ttl(TTL).acquire().await.unwrap();

    let table = distlock(&["--url", &url, "ls"], None).await;
    assert_exit(&table, 0);
    // The library's warnings reach stderr (topologies.rs); a healthy server gives none.
    assert!(table.stderr.is_empty(), "stderr: {}", stderr(&table));
    let text = stdout(&table);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    assert!(
        lines[0].starts_with("KEY") && lines[0].contains("FENCING TOKEN") && lines[0].contains("WAITERS"),
        "{text}"
    );
    assert!(
        lines[1].starts_with("invoice:{7} ") && lines[2].starts_with("report:1 ") && lines[3].starts_with("report:2 ")
    );
    assert!(
        lines[2].contains("web-3")
            && lines[2].contains("monthly")
            && lines[2].contains(&r1.fencing_token().to_string())
    );

    let json = distlock(&["--url", &url, "ls", "report:*", "--json"], None).await;
    assert_exit(&json, 0);
    let listed: Value = serde_json::from_slice(&json.stdout).expect("ls --json is JSON");
    let listed = listed.as_array().expect("an array");
    assert_eq!(listed.len(), 2, "{listed:?}");
    for (entry, (key, guard, metadata)) in
        listed.iter().zip([("report:1", &r1, "monthly"), ("report:2", &r2, "weekly")])
    {
        assert_eq!(entry["key"], key);
        assert_eq!(entry["owner"], "web-3");
        assert_eq!(entry["metadata"], metadata);
        assert_eq!(entry["fencing_token"], guard.fencing_token());
        assert_eq!(entry["waiters"], 0);
        let lease = entry["lease_left_ms"].as_u64().expect("lease");
        assert!(lease > 0 && lease <= TTL.as_millis() as u64, "{entry}");
        assert!(entry["held_for_ms"].as_u64().expect("held") < 60_000, "{entry}");
    }

    let unsorted = distlock(&["--url", &url, "ls", "--json", "--unsorted"], None).await;
    assert_exit(&unsorted, 0);
    let unsorted: Value = serde_json::from_slice(&unsorted.stdout).expect("JSON");
    let mut keys: Vec<&str> = unsorted.as_array().unwrap().iter().map(|e| e["key"].as_str().unwrap()).collect();
    keys.sort();
    assert_eq!(keys, ["invoice:{7}", "report:1", "report:2"]);

    let none = distlock(&["--url", &url, "ls", "nothing:*", "--json"], None).await;
    assert_exit(&none, 0);
    assert_eq!(serde_json::from_slice::<Value>(&none.stdout).unwrap(), serde_json::json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_gives_the_holder_and_its_queue() {
    let server = RedisServer::new();
    let url = server.url();
    let holder = client(&url, "holder-1").await;
    let guard = holder.lock("job").ttl(TTL).metadata("nightly").acquire().await.unwrap();
    let waiter = client(&url, "waiter-2").await;
    let waiting = tokio::spawn(async move {
        waiter.lock("job").ttl(TTL).metadata("second in line").wait(Duration::from_secs(60)).acquire().await
    });
    distlock_tests::eventually(Duration::from_secs(10), "the waiter queued", || {
        let holder = holder.clone();
        async move { !holder.lock_waiters("job").await.unwrap().is_empty() }
    })
    .await;

    let shown = distlock(&["--url", &url, "show", "job"], None).await;
    assert_exit(&shown, 0);
    let text = stdout(&shown);
    assert!(text.contains("holder-1") && text.contains("nightly"), "{text}");
    assert!(text.contains(&guard.fencing_token().to_string()), "{text}");
    assert!(text.contains("1 waiting") && text.contains("1. waiter-2") && text.contains("second in line"), "{text}");

    let json = distlock(&["--url", &url, "show", "job", "--json"], None).await;
    assert_exit(&json, 0);
    let shown: Value = serde_json::from_slice(&json.stdout).expect("show --json is JSON");
    assert_eq!(shown["key"], "job");
    assert_eq!(shown["owner"], "holder-1");
    assert_eq!(shown["fencing_token"], guard.fencing_token());
    assert_eq!(shown["waiters"], 1);
    assert_eq!(shown["queue"][0]["position"], 1);
    assert_eq!(shown["queue"][0]["owner"], "waiter-2");
    assert_eq!(shown["queue"][0]["metadata"], "second in line");
    assert!(!json.stdout.windows(32).any(|w| w.iter().all(u8::is_ascii_hexdigit)), "a token in {shown}");

    guard.release().await.unwrap();
    waiting.await.unwrap().expect("handed over").release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_is_refused_without_a_terminal_unless_yes() {
    let server = RedisServer::new();
    let url = server.url();
    let client = client(&url, "stuck-owner").await;
    let guard = client.lock("stuck").ttl(TTL).acquire().await.unwrap();

    let refused = distlock(&["--url", &url, "release", "stuck"], None).await;
    assert_exit(&refused, 4);
    let err = assert_one_error_line(&refused);
    assert!(err.contains("not a terminal") && err.contains("--yes"), "{err}");
    assert!(client.lock_info("stuck").await.unwrap().is_some(), "refused, yet released");

    let released = distlock(&["--url", &url, "release", "stuck", "--yes"], None).await;
    assert_exit(&released, 0);
    assert!(stdout(&released).contains("released `stuck`"));
    assert!(client.lock_info("stuck").await.unwrap().is_none(), "still held");
    assert_eq!(guard.release().await.unwrap(), distlock::ReleaseOutcome::Expired);

    let again = distlock(&["--url", &url, "release", "stuck", "--yes"], None).await;
    assert_exit(&again, 1);
    assert!(assert_one_error_line(&again).contains("is not held"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_redraws_count_times_and_reports_a_release() {
    let server = RedisServer::new();
    let url = server.url();
    let client = client(&url, "watched").await;
    let guard = client.lock("w:1").ttl(TTL).acquire().await.unwrap();
    let _kept = client.lock("w:2").ttl(TTL).acquire().await.unwrap();

    let (mut child, mut out, mut seen) =
        watch_until(&["--url", &url, "watch", "w:*", "--count", "2", "--interval", "2s"], "w:2 ").await;
    // The first screen is out: release one lock before the second.
    guard.release().await.unwrap();
    out.read_to_end(&mut seen).await.unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait()).await.expect("watch ended").unwrap();
    let text = String::from_utf8_lossy(&seen);
    assert_eq!(status.code(), Some(0), "{text}");
    assert_eq!(text.matches("distlock watch `w:*`").count(), 2, "two screens: {text}");
    assert!(text.contains("2 held") && text.contains("1 held"), "{text}");
    assert!(text.contains("released  w:1"), "{text}");
    assert!(!text.contains('\x1b'), "escape sequences when not on a terminal: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_one_line_with_their_exit_code() {
    let server = RedisServer::new();
    let url = server.url();

    let unknown = distlock(&["--url", &url, "show", "no-such-lock"], None).await;
    assert_exit(&unknown, 1);
    assert!(assert_one_error_line(&unknown).contains("lock `no-such-lock` is not held"));

    let port = distlock_tests::free_port();
    let unreachable = distlock(&["--url", &format!("redis://127.0.0.1:{port}/"), "ls"], None).await;
    assert_exit(&unreachable, 3);
    assert!(assert_one_error_line(&unreachable).contains("could not reach the server"));

    let bad_url = distlock(&["--url", "http://:hunter2@example.com/", "ls"], None).await;
    assert_exit(&bad_url, 2);
    assert!(!assert_one_error_line(&bad_url).contains("hunter2"));

    let usage = distlock(&["ls", "--no-such-flag"], None).await;
    assert_exit(&usage, 2);
    let several = distlock(&["--url", &url, "--url", &url, "ls"], None).await;
    assert_exit(&several, 2);
    assert!(assert_one_error_line(&several).contains("--cluster"));

    let help = distlock(&["--help"], None).await;
    assert_exit(&help, 0);
    assert!(stdout(&help).contains("Exit codes") && stdout(&help).contains("4  `release` not confirmed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_reported_and_never_echoed() {
    let server = RedisServer::with_password("right-password");
    let url = format!("redis://127.0.0.1:{}/", server.port());
    let wrong =
        distlock(&["--url", &format!("redis://:wrong-password@127.0.0.1:{}/", server.port()), "ls"], None).await;
    assert_exit(&wrong, 3);
    let err = assert_one_error_line(&wrong);
    assert!(!err.contains("wrong-password") && err.contains(":***@") && err.contains("password"), "{err}");

    let missing = distlock(&["--url", &url, "ls"], None).await;
    assert_exit(&missing, 3);
    assert!(assert_one_error_line(&missing).contains("requires a password"));

    let wrong_stdin = distlock(&["--url", &url, "--password-stdin", "ls"], Some("not-it\n")).await;
    assert_exit(&wrong_stdin, 3);
    assert!(!assert_one_error_line(&wrong_stdin).contains("not-it"));

    let holder = client(&format!("redis://:right-password@127.0.0.1:{}/", server.port()), "secured").await;
    let _guard = holder.lock("secured").ttl(TTL).acquire().await.unwrap();
    let right = distlock(&["--url", &url, "--password-stdin", "ls", "--json"], Some("right-password\n")).await;
    assert_exit(&right, 0);
    let listed: Value = serde_json::from_slice(&right.stdout).expect("JSON");
    assert_eq!(listed[0]["key"], "secured");
}

/// The README's least-privilege user cannot list without `+scan` (nor with it, without `+getrange`): NOPERM, one
/// line, exit 3; with the rights the README adds for the tool, every read works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_acl_right_is_reported() {
    let server = RedisServer::new();
    let mut admin = server.connection().await;
    let rights = "~distlock:* &distlock:* +ping +hello +info +evalsha +eval +script|load +get +set +del +exists \
                  +pttl +pexpire +time +getdel +setrange +zadd +zpopmin +zrem +zscore +zcard +publish +subscribe +unsubscribe";
    for (user, extra) in [("locks", ""), ("operator", " +scan +getrange +zrange"), ("scanner", " +scan +zrange")] {
        let mut cmd = redis::cmd("ACL");
        cmd.arg("SETUSER").arg(user).arg("on").arg(">pw");
        for right in format!("{rights}{extra}").split_whitespace() {
            cmd.arg(right);
        }
        let _: () = cmd.query_async(&mut admin).await.expect("ACL SETUSER");
    }
    let holder = client(&server.url(), "acl-test").await;
    let _guard = holder.lock("acl").ttl(TTL).acquire().await.unwrap();

    let as_locks = format!("redis://locks:pw@127.0.0.1:{}/", server.port());
    let refused = distlock(&["--url", &as_locks, "ls"], None).await;
    assert_exit(&refused, 3);
    let err = assert_one_error_line(&refused);
    assert!(err.contains("NOPERM") && !err.contains(":pw@"), "{err}");

    let as_operator = format!("redis://operator:pw@127.0.0.1:{}/", server.port());
    let listed = distlock(&["--url", &as_operator, "ls", "--json"], None).await;
    assert_exit(&listed, 0);
    assert_eq!(serde_json::from_slice::<Value>(&listed.stdout).unwrap()[0]["key"], "acl");
    assert_exit(&distlock(&["--url", &as_operator, "show", "acl"], None).await, 0);

    // Without `+getrange` a listing cannot tell a released lock's freed record from a held one: refused too.
    let as_scanner = format!("redis://scanner:pw@127.0.0.1:{}/", server.port());
    let refused = distlock(&["--url", &as_scanner, "ls"], None).await;
    assert_exit(&refused, 3);
    let err = assert_one_error_line(&refused);
    assert!(err.contains("NOPERM") && err.contains("getrange"), "{err}");
}

/// On a terminal (a pseudo-terminal from util-linux's `script`), `release` asks: "n" keeps the lock, "y" frees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_asks_on_a_terminal() {
    let server = RedisServer::new();
    let url = server.url();
    let client = client(&url, "asked").await;
    let _guard = client.lock("asked").ttl(TTL).metadata("the nightly run").acquire().await.unwrap();
    let on_terminal = |answer: &'static str| {
        let command = format!("{} --url {url} release asked", env!("CARGO_BIN_EXE_distlock"));
        async move {
            let mut child = tokio::process::Command::new("script")
                .args(["-qec", &command, "/dev/null"])
                .env_remove("REDIS_URL")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("util-linux `script` runs a command on a pseudo-terminal: install util-linux");
            child.stdin.take().expect("stdin").write_all(answer.as_bytes()).await.expect("answer");
            tokio::time::timeout(Duration::from_secs(60), child.wait_with_output()).await.expect("hung").expect("wait")
        }
    };

    let declined = on_terminal("n\n").await;
    assert_exit(&declined, 4);
    let text = stdout(&declined);
    assert!(text.contains("held by asked (the nightly run)") && text.contains("Release `asked`? [y/N]"), "{text}");
    assert!(client.lock_info("asked").await.unwrap().is_some(), "declined, yet released");

    let confirmed = on_terminal("y\n").await;
    assert_exit(&confirmed, 0);
    assert!(stdout(&confirmed).contains("released `asked`"));
    assert!(client.lock_info("asked").await.unwrap().is_none(), "confirmed, yet still held");
}

/// Ctrl-C (SIGINT) ends `watch` cleanly, with exit code 0, also in the middle of a long interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_ends_cleanly_on_ctrl_c() {
    let server = RedisServer::new();
    let url = server.url();
    let client = client(&url, "watched").await;
    let _guard = client.lock("ctrl-c").ttl(TTL).acquire().await.unwrap();
    let (mut child, _out, _seen) = watch_until(&["--url", &url, "watch", "--interval", "60s"], "ctrl-c ").await;
    distlock_tests::sys::signal(child.id().expect("running"), "INT");
    let status =
        tokio::time::timeout(Duration::from_secs(10), child.wait()).await.expect("watch ended on SIGINT").unwrap();
    assert_eq!(status.code(), Some(0), "{status:?}");
}

/// On a terminal (a pseudo-terminal of 10 lines from `script`), `watch` draws in place and cuts the table to
/// the screen, saying how many locks it left out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_fits_the_terminal() {
    let server = RedisServer::new();
    let url = server.url();
    let client = client(&url, "many").await;
    let mut guards = Vec::new();
    for i in 0..20 {
        guards.push(client.lock(format!("fit:{i:02}")).ttl(TTL).acquire().await.unwrap());
    }
    let command = format!("stty rows 10 cols 200; {} --url {url} watch --count 1", env!("CARGO_BIN_EXE_distlock"));
    let output = tokio::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env_remove("REDIS_URL")
        .stdin(Stdio::null())
        .output()
        .await
        .expect("util-linux `script` runs a command on a pseudo-terminal: install util-linux");
    assert_exit(&output, 0);
    let text = stdout(&output);
    assert!(text.starts_with("\x1b[H\x1b[J"), "not drawn in place: {text:?}");
    let rows = text.lines().filter(|l| l.starts_with("fit:")).count();
    // 10 lines: the title, the table's header, 6 locks, the "more" line, and the cursor's line.
    assert_eq!(rows, 6, "{text}");
    assert!(text.contains("… and 14 more"), "{text}");
}

/// Issue 36: owners and metadata with direction-changing or invisible characters are shown escaped by `ls` and
/// `show`, as control characters are, so `evil\u{202E}nimda` cannot read as "…admin".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invisible_and_direction_changing_characters_are_escaped() {
    let server = RedisServer::new();
    let url = server.url();
    let holder = client(&url, "evil\u{202E}nimda").await;
    let _guard = holder.lock("job\u{200B}").ttl(TTL).metadata("zero\u{200B}width").acquire().await.unwrap();
    for args in [vec!["--url", url.as_str(), "ls"], vec!["--url", url.as_str(), "show", "job\u{200B}"]] {
        let shown = distlock(&args, None).await;
        assert_exit(&shown, 0);
        let text = stdout(&shown);
        assert!(text.contains("evil\\u{202e}nimda"), "{args:?}: {text}");
        assert!(!text.contains('\u{202E}') && !text.contains('\u{200B}'), "{args:?} printed them raw: {text:?}");
    }
}

/// Issue 36: a wrong password in every URL form, also with `@ / % : ? #` in it, is never echoed: not in the
/// error line, from `--url` or from `$REDIS_URL`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_in_any_url_form_is_never_echoed() {
    let server = RedisServer::with_password("right-password");
    let port = server.port();
    let socket = server.unix_socket();
    let socket = socket.display();
    let secrets = ["WRONG-SECRET", "hunter2?x", "p@ss/w%rd:x?y#z", "hunter#2", "ab%3Fcd%23ef"];
    let urls = [
        format!("redis+unix://{socket}?pass={}", secrets[0]),
        format!("redis://:{}@127.0.0.1:{port}/", secrets[1]),
        format!("redis://:{}@127.0.0.1:{port}/", secrets[2]),
        format!("redis://user:{}@127.0.0.1:{port}/", secrets[3]),
        format!("redis://:{}@127.0.0.1:{port}/", secrets[4]),
    ];
    for (url, secret) in urls.iter().zip(secrets) {
        for from_env in [false, true] {
            let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_distlock"));
            if from_env {
                cmd.arg("ls").env("REDIS_URL", url);
            } else {
                cmd.args(["--url", url, "ls"]).env_remove("REDIS_URL");
            }
            cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
            let output = tokio::time::timeout(Duration::from_secs(60), cmd.output()).await.expect("hung").expect("run");
            let text = format!("{}{}", stdout(&output), stderr(&output));
            assert!(!output.status.success(), "{url}: accepted a wrong password");
            for piece in secret.as_bytes().windows(4) {
                let piece = String::from_utf8_lossy(piece);
                assert!(!text.contains(piece.as_ref()), "{url} (env: {from_env}): `{piece}` of the password in {text}");
            }
        }
    }
}

/// Issue 36, defect 4: values another program wrote under the key prefix, where a lock's record would be (a
/// string, a list), do not break `ls` (sorted or not) or `watch`: they are skipped, counted and reported, and
/// the locks are listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_keys_under_the_prefix_are_skipped_counted_and_reported() {
    let (server, holder, _guard) = holding_real().await;
    let mut conn = server.connection().await;
    let () = redis::cmd("SET").arg("distlock:{x}").arg("hello").query_async(&mut conn).await.unwrap();
    let _: i64 = redis::cmd("RPUSH").arg("distlock:{y}").arg("a").query_async(&mut conn).await.unwrap();
    let mut listing = holder.list_locks("*");
    let mut names = Vec::new();
    while let Some(page) = listing.next_page().await.unwrap() {
        names.extend(page);
    }
    assert_eq!((names, listing.skipped()), (vec!["real".to_owned()], 2));
    ls_lists_real_and_says(&server.url(), &[&["watch", "--count", "1"]], "skipped 2 keys").await;
}

/// A value that looks like a lock's record to the listing (a token and its mark) but is not one: `ls` (sorted or
/// not) lists the other locks, and says on standard error that it skipped a record it could not read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ls_skips_a_record_it_cannot_read_and_says_so() {
    let (server, holder, _guard) = holding_real().await;
    let lookalike = holder.record_key("lookalike");
    let value = "0123456789abcdef0123456789abcdef:not a record";
    let () = redis::cmd("SET").arg(&lookalike).arg(value).query_async(&mut server.connection().await).await.unwrap();
    assert!(holder.lock_info("lookalike").await.is_err(), "the look-alike reads as a record");
    ls_lists_real_and_says(&server.url(), &[], "skipped 1 lock whose record could not be read").await;
}

/// A server on which `holder-1` holds the lock `real`.
async fn holding_real() -> (RedisServer, distlock::Client, distlock::LockGuard) {
    let server = RedisServer::new();
    let holder = client(&server.url(), "holder-1").await;
    let guard = holder.lock("real").ttl(TTL).acquire().await.unwrap();
    (server, holder, guard)
}

/// `ls` (sorted, unsorted, JSON) and each of `also` exit 0, list `real` and not the look-alike, and say `note`
/// on standard error.
async fn ls_lists_real_and_says(url: &str, also: &[&[&str]], note: &str) {
    let ls: [&[&str]; 3] = [&["ls"], &["ls", "--unsorted"], &["ls", "--json"]];
    for args in ls.iter().chain(also) {
        let mut full = vec!["--url", url];
        full.extend(args.iter().copied());
        let output = distlock(&full, None).await;
        assert_exit(&output, 0);
        assert!(stdout(&output).contains("real"), "{args:?}: {}", stdout(&output));
        assert!(!stdout(&output).contains("lookalike"), "{args:?}: {}", stdout(&output));
        assert!(stderr(&output).contains(note), "{args:?}: {}", stderr(&output));
    }
}

/// A server whose eviction policy may drop lock records: the tool says so on stderr (the library's warning at
/// connect, one line naming the policy and what to set), lists as usual on stdout and exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicting_server_is_warned_of_on_stderr_only() {
    let server = RedisServer::with_args(["--maxmemory-policy", "allkeys-lru"]);
    let url = server.url();
    let client = client(&url, "web-1").await;
    let _held = client.lock("evictable").ttl(TTL).acquire().await.unwrap();
    let output = distlock(&["--url", &url, "ls", "--json"], None).await;
    assert_exit(&output, 0);
    let listed: Value = serde_json::from_slice(&output.stdout).expect("stdout is the listing alone");
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
    let err = stderr(&output);
    let warnings: Vec<&str> = err.lines().filter(|l| l.contains("WARN")).collect();
    assert_eq!(warnings.len(), 1, "stderr: {err}");
    assert!(warnings[0].contains("allkeys-lru") && warnings[0].contains("noeviction"), "stderr: {err}");
}
