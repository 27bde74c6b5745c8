//! The `distlock` binary on a Redis Cluster (every primary scanned), behind Sentinel and on Redlock, with locks
//! held by the library in the same test.

use std::process::Output;
use std::time::Duration;

use distlock_tests::cluster::RedisCluster;
use distlock_tests::sentinel::{SentinelGroup, SERVICE};
use distlock_tests::RedisServer;
use serde_json::Value;
use support::distlock;

mod support;

const TTL: Duration = Duration::from_secs(30);

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

    let listed = distlock(&["--cluster", "--url", &seeds[0], "ls", "c:*", "--json"], None).await;
    assert_eq!(listed_keys(&listed), names);

    let shown = distlock(&["--cluster", "--url", &seeds[1], "show", "c:07"], None).await;
    assert_eq!(shown.status.code(), Some(0), "{}", String::from_utf8_lossy(&shown.stderr));
    let released = distlock(&["--cluster", "--url", &seeds[2], "release", "c:07", "--yes"], None).await;
    assert_eq!(released.status.code(), Some(0), "{}", String::from_utf8_lossy(&released.stderr));
    assert!(client.lock_info("c:07").await.unwrap().is_none());
    let listed = distlock(&["--cluster", "--url", &seeds[0], "ls", "c:*", "--json"], None).await;
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
    assert_eq!(listed_keys(&distlock(&args, None).await), ["s:a", "s:b"]);
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
    let table = distlock(&[args.as_slice(), &["ls"]].concat(), None).await;
    assert_eq!(table.status.code(), Some(0), "{}", String::from_utf8_lossy(&table.stderr));
    assert!(
        String::from_utf8_lossy(&table.stdout).lines().nth(1).is_some_and(|l| l.contains("  -  ")),
        "no fencing token"
    );
    assert_eq!(listed_keys(&distlock(&[args.as_slice(), &["ls", "--json"]].concat(), None).await), ["r:a", "r:b"]);
}
