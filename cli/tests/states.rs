//! Issue 34, item 4: the `distlock` binary knows `min_hold` — `ls` and `show` tell a running lock from a finished
//! one kept by `min_hold`, `watch` words the end of such a lock by what happened (also as JSON lines, one
//! object a line), and the hints on failures name the tool's own options. Against real redis-servers.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{assert_exit, assert_one_error_line, client, distlock, read_until, stdout, watch_until, TTL};
use distlock_tests::sys::Stopped;
use distlock_tests::RedisServer;
use serde_json::Value;

/// `ls` (table and JSON) and `show` (text and JSON) say `running` for a lock whose holder has it and
/// `finished`, kept until when, for one released under `min_hold`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ls_and_show_tell_a_running_lock_from_a_finished_one() {
    let server = RedisServer::new();
    let url = server.url();
    let holder = client(&url, "cron-a").await;
    let _running = holder.lock("job:running").ttl(TTL).acquire().await.unwrap();
    let kept = holder.lock("job:kept").ttl(TTL).min_hold(Duration::from_secs(60)).acquire().await.unwrap();
    kept.release().await.unwrap();

    let table = distlock(&["--url", &url, "ls"], None).await;
    assert_exit(&table, 0);
    let text = stdout(&table);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("KEY") && lines[0].contains("STATE"), "{text}");
    let row = |key: &str| *lines.iter().find(|l| l.starts_with(key)).unwrap_or_else(|| panic!("{key} in {text}"));
    let state = |line: &str| line.split_whitespace().nth(1).map(str::to_owned);
    assert_eq!(state(row("job:kept ")).as_deref(), Some("finished"), "{text}");
    assert_eq!(state(row("job:running ")).as_deref(), Some("running"), "{text}");

    let json = distlock(&["--url", &url, "ls", "--json"], None).await;
    assert_exit(&json, 0);
    let listed: Value = serde_json::from_slice(&json.stdout).expect("ls --json is JSON");
    let states: BTreeMap<&str, &str> = listed
        .as_array()
        .expect("an array")
        .iter()
        .map(|l| (l["key"].as_str().unwrap(), l["state"].as_str().unwrap()))
        .collect();
    assert_eq!(states, BTreeMap::from([("job:kept", "finished"), ("job:running", "running")]));

    let shown = distlock(&["--url", &url, "show", "job:kept"], None).await;
    assert_exit(&shown, 0);
    let text = stdout(&shown);
    let state = text.lines().find(|l| l.starts_with("state:")).unwrap_or_else(|| panic!("a state line: {text}"));
    assert!(state.contains("finished, kept until ") && state.contains(" UTC") && state.contains("min_hold"), "{text}");
    let shown = distlock(&["--url", &url, "show", "job:running"], None).await;
    assert!(stdout(&shown).lines().any(|l| l.starts_with("state:") && l.contains("running")), "{}", stdout(&shown));
    let json = distlock(&["--url", &url, "show", "job:kept", "--json"], None).await;
    let shown: Value = serde_json::from_slice(&json.stdout).expect("show --json is JSON");
    assert_eq!(shown["state"], "finished");
}

/// A lock released under `min_hold` is `finished` while kept, and `free … min_hold is over` when that ends: never
/// EXPIRED, which is for a holder that stopped renewing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_words_the_end_of_a_min_hold_lock_by_what_happened() {
    let server = RedisServer::new();
    let url = server.url();
    let holder = client(&url, "cron-a").await;
    let guard = holder.lock("cron:1").ttl(TTL).min_hold(Duration::from_secs(2)).acquire().await.unwrap();
    let (mut child, mut out, mut seen) =
        watch_until(&["--url", &url, "watch", "cron:*", "--interval", "500ms"], "cron:1 ").await;
    guard.release().await.unwrap();
    read_until(&mut out, &mut seen, "finished  cron:1  by cron-a: released; min_hold keeps it until ").await;
    read_until(&mut out, &mut seen, "free  cron:1  min_hold is over (finished by cron-a)").await;
    child.kill().await.expect("stop watch");
    let text = String::from_utf8_lossy(&seen);
    assert!(!text.contains("EXPIRED"), "{text}");
}

/// `watch --json`: one JSON object a line — what is held at the first look, then each change — with the event,
/// the time and the lock's fields.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_json_is_one_object_a_line() {
    let server = RedisServer::new();
    let url = server.url();
    let holder = client(&url, "cron-a").await;
    let kept = holder.lock("j:1").ttl(TTL).min_hold(Duration::from_secs(2)).acquire().await.unwrap();
    let plain = holder.lock("j:2").ttl(TTL).acquire().await.unwrap();
    let (mut child, mut out, mut seen) =
        watch_until(&["--url", &url, "watch", "j:*", "--interval", "500ms", "--json"], "\"key\":\"j:2\"").await;
    kept.release().await.unwrap();
    plain.release().await.unwrap();
    let _third = holder.lock("j:3").ttl(TTL).acquire().await.unwrap();
    read_until(&mut out, &mut seen, "\"event\":\"min_hold_over\"").await;
    read_until(&mut out, &mut seen, "\"key\":\"j:3\"").await;
    child.kill().await.expect("stop watch");

    let text = String::from_utf8_lossy(&seen);
    let mut events: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        let object: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?} is not one object"));
        assert!(object["time_ms"].as_u64().is_some_and(|t| t > 0), "{line}");
        assert_eq!(object["owner"], "cron-a", "{line}");
        let key = object["key"].as_str().expect("key").to_owned();
        events.entry(key).or_default().push(object["event"].as_str().expect("event").to_owned());
    }
    assert_eq!(events["j:1"], ["held", "finished", "min_hold_over"], "{text}");
    assert_eq!(events["j:2"], ["held", "released"], "{text}");
    assert_eq!(events["j:3"], ["acquired"], "{text}");
}

/// A failure's hint names the tool's options (`--timeout`, `--password-stdin`, `--prefix`), not the library's
/// builder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hints_name_the_tool_s_options() {
    let stopped_server = RedisServer::new();
    let stopped = Stopped::stop(stopped_server.pid().expect("running"));
    let slow = distlock(&["--url", &stopped_server.url(), "--timeout", "500ms", "ls"], None).await;
    stopped.resume();
    assert_exit(&slow, 3);
    let err = assert_one_error_line(&slow);
    assert!(err.contains("--timeout") && !err.contains("ClientBuilder"), "{err}");

    let secured = RedisServer::with_password("right-password");
    let missing = distlock(&["--url", &format!("redis://127.0.0.1:{}/", secured.port()), "ls"], None).await;
    assert_exit(&missing, 3);
    let err = assert_one_error_line(&missing);
    assert!(err.contains("--password-stdin") && !err.contains("ClientBuilder"), "{err}");

    let server = RedisServer::new();
    let mut conn = server.connection().await;
    let () = redis::cmd("SET").arg("distlock:{x}").arg("another program's").query_async(&mut conn).await.unwrap();
    let foreign = distlock(&["--url", &server.url(), "show", "x"], None).await;
    assert_exit(&foreign, 3);
    let err = assert_one_error_line(&foreign);
    assert!(err.contains("--prefix") && err.contains("`distlock release` deletes it"), "{err}");
    assert!(!err.contains("ClientBuilder") && !err.contains("Client::"), "{err}");
}
