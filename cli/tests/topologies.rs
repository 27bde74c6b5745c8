//! The `distlock` binary on a Redis Cluster (every primary scanned), behind Sentinel and on Redlock, with locks
//! held by the library in the same test.

mod common;

use std::process::Output;
use std::time::Duration;

use common::TTL;
use distlock_tests::cluster::RedisCluster;
use distlock_tests::sentinel::{SentinelGroup, SERVICE};
use distlock_tests::RedisServer;
use serde_json::Value;

/// Runs `distlock ARGS` with nothing on its standard input.
async fn distlock(args: &[&str]) -> Output {
    common::distlock(args, None).await
}

/// The keys `ls --json` lists, after checking it exited 0.
fn listed_keys(output: &Output) -> Vec<String> {
    assert_eq!(output.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&output.stderr));
    let listed: Value = serde_json::from_slice(&output.stdout).expect("ls --json is JSON");
    listed.as_array().expect("an array").iter().map(|e| e["key"].as_str().expect("key").to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_every_primary_is_listed() {
    let cluster = RedisCluster::start(3, 0);
    let seeds = cluster.seeds();
    let client = distlock::Client::builder().redis_cluster(seeds.clone()).build().await.expect("cluster client");
    let names: Vec<String> = (0..30).map(|i| format!("c:{i:02}")).collect();
    let mut guards = Vec::new();
    for name in &names {
        guards.push(client.lock(name.as_str()).ttl(TTL).acquire().await.unwrap());
    }
    let primaries: std::collections::HashSet<u16> =
        names.iter().map(|n| cluster.primary_for(&client.record_key(n))).collect();
    assert!(primaries.len() >= 2, "the locks all landed on one primary: {primaries:?}");

    let listed = distlock(&["--cluster", "--url", &seeds[0], "ls", "c:*", "--json"]).await;
    assert_eq!(listed_keys(&listed), names);

    let shown = distlock(&["--cluster", "--url", &seeds[1], "show", "c:07"]).await;
    assert_eq!(shown.status.code(), Some(0), "{}", String::from_utf8_lossy(&shown.stderr));
    let released = distlock(&["--cluster", "--url", &seeds[2], "release", "c:07", "--yes"]).await;
    assert_eq!(released.status.code(), Some(0), "{}", String::from_utf8_lossy(&released.stderr));
    assert!(client.lock_info("c:07").await.unwrap().is_none());
    let listed = distlock(&["--cluster", "--url", &seeds[0], "ls", "c:*", "--json"]).await;
    assert_eq!(listed_keys(&listed).len(), names.len() - 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_sentinel_the_primary_is_listed() {
    let group = SentinelGroup::start(0).await;
    let sentinels = group.sentinel_urls();
    let client = distlock::Client::builder().redis_sentinel(sentinels.clone(), SERVICE).build().await.expect("client");
    let _a = client.lock("s:a").ttl(TTL).acquire().await.unwrap();
    let _b = client.lock("s:b").ttl(TTL).acquire().await.unwrap();
    let mut args = vec!["--sentinel", SERVICE];
    for url in &sentinels {
        args.extend(["--url", url.as_str()]);
    }
    args.extend(["ls", "--json"]);
    assert_eq!(listed_keys(&distlock(&args).await), ["s:a", "s:b"]);
}

/// Sentinels behind a password and data nodes behind another: `--password-stdin` reads the data nodes' from the
/// first line (with `--user`, the ACL user's), `--sentinel-password-stdin` the sentinels' from the next; a wrong
/// one is an error that names the option to fix and shows neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_sentinel_both_passwords_are_read_from_standard_input() {
    use distlock_tests::sentinel::Passwords;
    let passwords = Passwords { data: "d4ta-pw", acl_user: ("locker", "l0cker-pw"), sentinel: "s3ntinel-pw" };
    let group = SentinelGroup::start_with_passwords(0, &passwords).await;
    let client = distlock::Client::builder()
        .redis_sentinel(group.sentinel_urls_with_password(passwords.sentinel), SERVICE)
        .sentinel_primary_password(None, passwords.data)
        .build()
        .await
        .expect("client");
    let _held = client.lock("pw:a").ttl(TTL).acquire().await.unwrap();
    let mut args = vec!["--sentinel", SERVICE, "--password-stdin", "--sentinel-password-stdin"];
    // The data nodes' ACL user, named with --user.
    let mut as_user = args.clone();
    as_user.extend(["--user", passwords.acl_user.0]);
    let urls = group.sentinel_urls();
    for url in &urls {
        args.extend(["--url", url.as_str()]);
    }
    args.extend(["ls", "--json"]);
    let both = format!("{}\n{}\n", passwords.data, passwords.sentinel);
    assert_eq!(listed_keys(&common::distlock(&args, Some(&both)).await), ["pw:a"]);
    for url in &urls {
        as_user.extend(["--url", url.as_str()]);
    }
    as_user.extend(["ls", "--json"]);
    let user_s = format!("{}\n{}\n", passwords.acl_user.1, passwords.sentinel);
    assert_eq!(listed_keys(&common::distlock(&as_user, Some(&user_s)).await), ["pw:a"]);

    for (stdin, option) in [
        (format!("{}\nwr0ng\n", passwords.data), "--sentinel-password-stdin"),
        (format!("wr0ng\n{}\n", passwords.sentinel), "--password-stdin"),
    ] {
        let refused = common::distlock(&args, Some(&stdin)).await;
        let err = common::assert_one_error_line(&refused);
        assert!(err.contains(option), "{stdin:?}: {err}");
        for secret in ["wr0ng", passwords.data, passwords.sentinel] {
            assert!(!err.contains(secret), "a password shown: {err}");
        }
    }
}

/// A failover in the middle of `ls` (the primary killed while the tool is blocked writing its first page): the
/// listing does not stop: it starts over on the promoted replica, says so on standard error, and lists every
/// lock once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ls_rides_out_a_failover_mid_listing() {
    use tokio::io::AsyncReadExt;
    const LOCKS: usize = 3000;
    let mut group = SentinelGroup::start(2).await;
    let sentinels = group.sentinel_urls();
    let client = distlock::Client::builder().redis_sentinel(sentinels.clone(), SERVICE).build().await.expect("client");
    let mut guards = Vec::with_capacity(LOCKS);
    for i in 0..LOCKS {
        guards.push(client.lock(format!("f:{i:04}")).ttl(Duration::from_secs(120)).acquire().await.unwrap());
    }
    let old = group.primary_port().await.expect("a primary");
    let primary = group.servers.iter().find(|s| s.port() == old).expect("the primary");
    let replicated: i64 =
        redis::cmd("WAIT").arg(2).arg(10_000).query_async(&mut primary.connection().await).await.expect("WAIT");
    assert_eq!(replicated, 2, "the replicas did not catch up");

    let mut args = vec!["--sentinel", SERVICE];
    for url in &sentinels {
        args.extend(["--url", url.as_str()]);
    }
    args.extend(["ls", "--unsorted", "--json"]);
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_distlock"))
        .args(&args)
        .env_remove("REDIS_URL")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run distlock");
    let mut out = child.stdout.take().expect("stdout");
    // The first bytes of the first page: the tool has listed, and blocks on the pipe (a page is over 64 KiB).
    let mut seen = vec![0; 4096];
    out.read_exact(&mut seen).await.expect("the first page");

    group.servers.iter_mut().find(|s| s.port() == old).expect("the primary").kill();
    eventually_switched(&group, old).await;
    out.read_to_end(&mut seen).await.expect("the rest");
    let mut err = String::new();
    child.stderr.take().expect("stderr").read_to_string(&mut err).await.expect("stderr");
    let status = tokio::time::timeout(Duration::from_secs(90), child.wait()).await.expect("ls ended").expect("wait");
    assert_eq!(status.code(), Some(0), "stderr: {err}");
    let listed: Value = serde_json::from_slice(&seen).expect("ls --json is JSON");
    let mut keys: Vec<&str> = listed.as_array().expect("an array").iter().map(|e| e["key"].as_str().unwrap()).collect();
    keys.sort_unstable();
    eprintln!("listed {} of {LOCKS} locks across the failover; stderr: {err}", keys.len());
    let held: Vec<String> = (0..LOCKS).map(|i| format!("f:{i:04}")).collect();
    assert_eq!(keys, held, "every lock, once: the listing started over on the promoted replica");
    assert!(err.contains("the listing was interrupted 1 time(s) and started over"), "stderr: {err}");
    drop(guards);
}

/// Waits until the sentinels name another primary than the one on `old`.
async fn eventually_switched(group: &SentinelGroup, old: u16) {
    distlock_tests::eventually(Duration::from_secs(30), "the sentinels switched the primary", || async {
        group.primary_port().await.is_some_and(|port| port != old)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redlock_each_lock_is_listed_once() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::new()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let client = distlock::Client::builder().redlock(urls.clone()).build().await.expect("redlock client");
    let _a = client.lock("r:a").ttl(TTL).acquire().await.unwrap();
    let _b = client.lock("r:b").ttl(TTL).acquire().await.unwrap();
    let mut args = vec!["--redlock"];
    for url in &urls {
        args.extend(["--url", url.as_str()]);
    }
    let table = distlock(&[args.as_slice(), &["ls"]].concat()).await;
    assert_eq!(table.status.code(), Some(0), "{}", String::from_utf8_lossy(&table.stderr));
    assert!(
        String::from_utf8_lossy(&table.stdout).lines().nth(1).is_some_and(|l| l.contains("  -  ")),
        "no fencing token"
    );
    assert_eq!(listed_keys(&distlock(&[args.as_slice(), &["ls", "--json"]].concat()).await), ["r:a", "r:b"]);
}

/// A Redlock group with a server down, which is when an operator reaches for the tool: `ls` lists every lock
/// from the other two, exits 0, and says on stderr which server did not answer (the library's warnings, which
/// the tool prints there, one line each; stdout stays the listing alone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redlock_a_server_down_is_named_and_the_locks_are_listed() {
    let mut servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::new()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let client = distlock::Client::builder().redlock(urls.clone()).build().await.expect("redlock client");
    let _a = client.lock("r:a").ttl(TTL).acquire().await.unwrap();
    let _b = client.lock("r:b").ttl(TTL).acquire().await.unwrap();
    servers[1].kill();
    let mut args = vec!["--redlock"];
    for url in &urls {
        args.extend(["--url", url.as_str()]);
    }
    let output = distlock(&[args.as_slice(), &["ls", "--json"]].concat()).await;
    assert_eq!(listed_keys(&output), ["r:a", "r:b"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("WARN") && stderr.contains("did not answer") && stderr.contains(&urls[1]),
        "stderr: {stderr}"
    );
    assert!(!stderr.contains(&urls[0]) && !stderr.contains(&urls[2]), "only the silent server is named: {stderr}");
}
