//! The cluster harness: a 6-node Redis Cluster (3 primaries, 3 replicas) of real servers comes up with every
//! slot served, once per test binary, and goes away with it; locks on it across every primary.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use distlock::{Client, LockError, RetryStrategy};
use distlock_tests::cluster::RedisCluster;
use distlock_tests::monitor::{is_client_command, Monitor};
use distlock_tests::time::{ms, secs};
use distlock_tests::{eventually, within, Fixture};
use tokio::task::JoinSet;
use tokio::time::Instant;

#[test]
fn a_shared_cluster_serves_every_slot_from_three_primaries() {
    let cluster = RedisCluster::shared();
    assert_eq!(cluster.nodes().len(), 6);
    let port = cluster.nodes()[0].port();
    let info = cluster.cli(port, &["CLUSTER", "INFO"]);
    assert!(info.contains("cluster_state:ok"), "{info}");
    assert!(info.contains("cluster_slots_ok:16384"), "{info}");
    assert!(info.contains("cluster_size:3"), "{info}");
    let nodes = cluster.cli(port, &["CLUSTER", "NODES"]);
    assert_eq!(nodes.lines().filter(|l| l.contains("master")).count(), 3, "{nodes}");
    assert_eq!(nodes.lines().filter(|l| l.contains("slave")).count(), 3, "{nodes}");
    // The same instance for every caller in this binary.
    assert!(std::ptr::eq(cluster, RedisCluster::shared()));
}

/// 64 tasks over keys spread across all three primaries: no two bodies on one key at once, no update lost,
/// fencing tokens rising per key; and the keys really did land on every primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_over_every_primary_never_overlap() {
    let fx = Fixture::cluster().await;
    let cluster = fx.redis_cluster().expect("cluster fixture");
    let keys: Vec<String> = (0..12).map(|i| format!("spread-{i}")).collect();
    let owners: BTreeSet<u16> = keys.iter().map(|k| cluster.primary_for(&fx.client().record_key(k))).collect();
    assert_eq!(owners.len(), 3, "the keys did not spread over the three primaries: {owners:?}");
    let counters: Arc<Vec<distlock_tests::Counter>> = Arc::new(keys.iter().map(|k| fx.counter(k)).collect());
    let inside: Arc<Vec<std::sync::atomic::AtomicUsize>> = Arc::new(keys.iter().map(|_| Default::default()).collect());
    let fences: Arc<std::sync::Mutex<Vec<Vec<u64>>>> = Arc::new(std::sync::Mutex::new(vec![Vec::new(); keys.len()]));
    let mut tasks = JoinSet::new();
    for task in 0..64usize {
        let client = if task % 2 == 0 { fx.client().clone() } else { fx.other_client().await };
        let (keys, counters, inside, fences) = (keys.clone(), counters.clone(), inside.clone(), fences.clone());
        tasks.spawn(async move {
            for round in 0..3 {
                let i = (task + round * 5) % keys.len();
                let guard =
                    client.lock(&keys[i]).ttl(Duration::from_secs(5)).wait(Duration::from_secs(30)).acquire().await?;
                assert_eq!(
                    inside[i].fetch_add(1, std::sync::atomic::Ordering::SeqCst),
                    0,
                    "two holders of {}",
                    keys[i]
                );
                fences.lock().expect("fences")[i].push(guard.fencing_token());
                counters[i].racy_increment(Duration::from_millis(1)).await;
                inside[i].fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                guard.release().await?;
            }
            Ok::<(), LockError>(())
        });
    }
    while let Some(result) = tasks.join_next().await {
        result.expect("task").expect("lock cycle");
    }
    let mut total = 0;
    for counter in counters.iter() {
        total += counter.get().await;
    }
    assert_eq!(total, 64 * 3, "an update was lost");
    for (i, seen) in fences.lock().expect("fences").iter().enumerate() {
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "fencing tokens of {} did not rise: {seen:?}", keys[i]);
    }
}

/// With replica acknowledgement, a grant is on its shard's replica when `acquire` returns (the `WAIT` went to
/// the node that serves the lock's slot); a cluster without seeds is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_are_on_the_shards_replica_with_acknowledgement() {
    let fx = Fixture::cluster().await;
    let cluster = fx.redis_cluster().expect("cluster fixture");
    let prefix = fx.client().record_key("x");
    let prefix = &prefix[..prefix.len() - "{x}".len()];
    let client = Client::builder()
        .redis_cluster(cluster.seeds())
        .key_prefix(prefix)
        .wait_for_replicas(1, Duration::from_millis(500))
        .build()
        .await
        .expect("a cluster client with replica acknowledgement");
    for key in ["acked-a", "acked-b", "acked-c", "acked-d"] {
        let guard = client.lock(key).acquire().await.expect("granted and acknowledged");
        let record = client.record_key(key);
        let primary = cluster.primary_for(&record);
        let replica = cluster.replicas_of(primary)[0];
        let mut conn = cluster.node(replica).expect("replica").connection().await;
        let () = redis::cmd("READONLY").query_async(&mut conn).await.expect("READONLY");
        let value: Option<String> =
            redis::cmd("GET").arg(&record).query_async(&mut conn).await.expect("GET on the replica");
        let value = value.unwrap_or_else(|| panic!("{record} is not on its shard's replica when acquire returned"));
        assert!(value.starts_with(guard.token().expose_secret()), "the replica holds another grant");
        guard.extend(Duration::from_secs(60)).await.expect("an acknowledged extension");
        guard.release().await.expect("release");
    }
    match Client::builder().redis_cluster(Vec::<String>::new()).build().await {
        Err(LockError::InvalidConfig(message)) => assert!(message.contains("at least one"), "{message}"),
        other => panic!("a cluster without seeds was accepted: {other:?}"),
    }
}

/// A cluster node given to the one-server builder says to use `redis_cluster`.
#[tokio::test]
async fn a_cluster_node_given_as_one_server_points_to_redis_cluster() {
    let cluster = tokio::task::spawn_blocking(RedisCluster::shared).await.expect("cluster");
    match Client::builder().redis(cluster.seeds()[0].clone()).build().await {
        Err(LockError::InvalidConfig(message)) => assert!(message.contains("redis_cluster"), "{message}"),
        other => panic!("a cluster node was accepted as one server: {other:?}"),
    }
}

/// Release announcements on a cluster go by sharded pub/sub: while a waiter waits, the primary that serves its
/// lock's slot counts one sharded subscription to the lock's channel (`PUBSUB SHARDNUMSUB`) and no node a plain
/// one (`PUBSUB NUMSUB`); the release reaches the waiter by SPUBLISH on that node, at once (its own retries are
/// seconds apart); and no node ever ran a PUBLISH, which the cluster bus would forward to every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_announcements_use_sharded_pub_sub() {
    const KEY: &str = "sharded";
    let fx = Fixture::cluster().await;
    let cluster = fx.redis_cluster().expect("cluster fixture");
    let record = fx.client().record_key(KEY);
    let channel = format!("{record}:released");
    let node = cluster.primary_for(&record);
    let holder = fx.client().lock(KEY).ttl(secs(30)).acquire().await.expect("holder");
    let client = fx.other_client().await;
    let waiter = tokio::spawn(async move {
        let slow = RetryStrategy::Linear { step: secs(3) };
        let guard = client.lock(KEY).wait(secs(20)).retry(slow).acquire().await?;
        Ok::<_, LockError>((Instant::now(), guard))
    });
    eventually(secs(10), "the waiter subscribed", || async { cluster.subscribers(node, &channel, true) == 1 }).await;
    for other in cluster.nodes() {
        assert_eq!(cluster.subscribers(other.port(), &channel, false), 0, "a plain subscription on {}", other.port());
    }
    eventually(secs(10), "the waiter queued", || async {
        fx.client().lock_info(KEY).await.ok().flatten().is_some_and(|info| info.waiting == 1)
    })
    .await;
    let spublished = cluster.calls(node, "spublish");
    let released = Instant::now();
    holder.release().await.expect("release");
    let (served, guard) = within(secs(10), "the waiter served", waiter).await.expect("no panic").expect("acquired");
    let handoff = served.duration_since(released);
    assert!(handoff < ms(500), "the hand-over took {handoff:?}: not announced");
    assert!(cluster.calls(node, "spublish") > spublished, "the release did not SPUBLISH on the lock's node");
    for other in cluster.nodes() {
        assert_eq!(cluster.calls(other.port(), "publish"), 0, "a PUBLISH on {}", other.port());
    }
    guard.release().await.expect("release");
    // The waiter is gone, and its sharded subscription with it.
    eventually(secs(10), "the waiter unsubscribed", || async { cluster.subscribers(node, &channel, true) == 0 }).await;
}

/// README's least-privilege user with its cluster additions (the `ACL SETUSER` line and the `On a cluster add`
/// rights, read from README.md), created on every node, builds a cluster client (its startup probe takes,
/// queues for and hands over a lock), and a waiter that retries only every 10-20 s is woken by the release
/// through sharded pub/sub, and unsubscribes when done; the same user without `+ssubscribe` fails the
/// startup probe, naming the ACL. (ACL users are per node; these two change nothing for the other tests on
/// the shared cluster, which use the default user.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readme_least_privilege_user_with_the_cluster_rights_is_woken_by_a_release() {
    const KEY: &str = "acl-waited";
    let cluster = tokio::task::spawn_blocking(RedisCluster::shared).await.expect("cluster");
    let (line, cluster_rights) = readme_acl();
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(&words[..2], ["ACL", "SETUSER"], "{line}");
    let (user, password) = (words[2], words.iter().find_map(|w| w.strip_prefix('>')).expect("a password"));
    let rules: Vec<&str> = words[3..].iter().copied().chain(cluster_rights.split_whitespace()).collect();
    let without_ssubscribe: Vec<&str> = rules.iter().copied().filter(|r| *r != "+ssubscribe").collect();
    assert!(without_ssubscribe.len() < rules.len(), "README's cluster rights lack +ssubscribe: {cluster_rights}");
    for node in cluster.nodes() {
        for (name, rules) in [(user, &rules), ("no-ssubscribe", &without_ssubscribe)] {
            let args: Vec<&str> = ["ACL", "SETUSER", name].into_iter().chain(rules.iter().copied()).collect();
            let reply = cluster.cli(node.port(), &args);
            assert_eq!(reply.trim(), "OK", "ACL SETUSER {name} on {}: {reply}", node.port());
        }
    }
    let seeds = |user: &str| -> Vec<String> {
        cluster.nodes().iter().map(|n| format!("redis://{user}:{password}@127.0.0.1:{}/", n.port())).collect()
    };
    let build = || Client::builder().redis_cluster(seeds(user)).build();
    let client = within(secs(20), "build", build()).await.unwrap_or_else(|e| panic!("README's user: {e}\n{line}"));
    let other = build().await.expect("a second client");

    let node = cluster.primary_for(&client.record_key(KEY));
    let channel = format!("{}:released", client.record_key(KEY));
    let holder = client.lock(KEY).ttl(secs(30)).acquire().await.expect("holder");
    let waiter = tokio::spawn(async move {
        let slow = RetryStrategy::Linear { step: secs(20) };
        let guard = other.lock(KEY).wait(secs(30)).retry(slow).acquire().await?;
        Ok::<_, LockError>((Instant::now(), guard))
    });
    eventually(secs(10), "the waiter subscribed", || async { cluster.subscribers(node, &channel, true) == 1 }).await;
    eventually(secs(10), "the waiter queued", || async {
        client.lock_info(KEY).await.ok().flatten().is_some_and(|info| info.waiting == 1)
    })
    .await;
    let released = Instant::now();
    holder.release().await.expect("release");
    let (woken, guard) = within(secs(5), "the waiter", waiter).await.expect("no panic").expect("acquired");
    let waited = woken.duration_since(released);
    assert!(waited < secs(1), "the waiter was woken only {waited:?} after the release");
    assert!(client.force_unlock(KEY).await.expect("force_unlock"), "the waiter's lock was not there to force");
    drop(guard);
    eventually(secs(10), "the waiter unsubscribed", || async { cluster.subscribers(node, &channel, true) == 0 }).await;

    let denied = Client::builder().redis_cluster(seeds("no-ssubscribe")).build();
    let err = within(secs(20), "build without +ssubscribe", denied).await.expect_err("a user that cannot SSUBSCRIBE");
    assert!(err.to_string().contains("ACL"), "{err}");
    assert!(!format!("{err} {err:?}").contains(password), "the password in the error: {err}");
}

/// README's least-privilege `ACL SETUSER` line, and the rights it says to add on a cluster.
fn readme_acl() -> (String, String) {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).expect("README.md");
    let section = readme.split("### A least-privilege Redis user").nth(1).expect("README has the ACL section");
    let line = section.lines().map(str::trim).find(|l| l.starts_with("ACL SETUSER")).expect("an ACL SETUSER line");
    let rights = section
        .split_once("On a cluster add `")
        .and_then(|(_, rest)| rest.split_once('`'))
        .map(|(rights, _)| rights)
        .expect("README names the rights to add on a cluster");
    (line.to_owned(), rights.to_owned())
}

/// Renewals that come due together go to each node as one call, whatever their slots (RENEW_SPREAD), not one
/// call per slot: a lock over 30 keys, spread over the three primaries and renewed together, renews on one
/// primary with one script call per round for all of that primary's keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_due_renewals_share_one_call() {
    distlock_tests::wall_clock::again_if_the_wall_clock_stepped(|| async {
        let fx = Fixture::cluster().await;
        let cluster = fx.redis_cluster().expect("cluster fixture");
        let keys: Vec<String> = (0..30).map(|i| format!("spread-renew-{i}")).collect();
        let records: Vec<String> = keys.iter().map(|k| fx.client().record_key(k)).collect();
        let port = cluster.primary_for(&records[0]);
        let here: Vec<String> =
            records.iter().filter(|r| cluster.primary_for(r) == port).map(|r| format!("\"{r}\"")).collect();
        assert!(here.len() >= 4, "too few of the keys on one primary: {}", here.len());
        let node = cluster.node(port).expect("the primary");
        let monitor = Monitor::start(node);
        let mut conn = node.connection().await;
        let guard = fx.client().lock_all(keys).ttl(Duration::from_millis(600)).acquire().await.expect("lock_all");
        let from = monitor.mark(&mut conn, "held").await;
        let renewals_of_first = |lines: &[String]| {
            lines.iter().filter(|l| !is_client_command(l) && l.contains("\"pexpire\"") && l.contains(&here[0])).count()
        };
        eventually(Duration::from_secs(10), "three renewal rounds", || {
            let rounds = renewals_of_first(&monitor.lines_since(from));
            async move { rounds >= 3 }
        })
        .await;
        let to = monitor.mark(&mut conn, "renewed").await;
        assert!(!guard.is_lost(), "the lock was lost while renewed");
        guard.release().await.expect("release");
        let lines = &monitor.lines()[from..to];
        let ours = |l: &&String| here.iter().any(|r| l.contains(r.as_str()));
        let renewed = lines.iter().filter(|l| !is_client_command(l) && l.contains("\"pexpire\"")).filter(ours).count();
        let calls = lines.iter().filter(|l| is_client_command(l) && l.contains("\"EVALSHA\"")).filter(ours).count();
        assert!(renewed >= 3 * here.len(), "{renewed} renewals of {} keys", here.len());
        // One call per round carries all of this node's keys; one call per slot would make calls == renewed.
        assert!(calls * 2 < renewed, "{calls} script calls for {renewed} renewals:\n{}", monitor.tail(40));
    })
    .await
}

/// Under load, the acquires and releases of one node share calls whatever their slots (a coalescer per node,
/// BATCH_SPREAD): 64 tasks cycling on keys of their own, spread over the primaries, and one primary's
/// MONITOR shows calls that carry several of those locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_acquires_and_releases_share_calls_under_load() {
    let fx = Fixture::cluster().await;
    let cluster = fx.redis_cluster().expect("cluster fixture");
    let record = fx.client().record_key("node-batch-0");
    let node = cluster.node(cluster.primary_for(&record)).expect("the primary");
    let monitor = Monitor::start(node);
    let prefix = record.trim_end_matches("0}").to_owned();
    let mut tasks = JoinSet::new();
    for task in 0..64 {
        let client = fx.client().clone();
        tasks.spawn(async move {
            for _ in 0..40 {
                let guard = client.lock(format!("node-batch-{task}")).acquire().await?;
                guard.release().await?;
            }
            Ok::<(), LockError>(())
        });
    }
    while let Some(result) = tasks.join_next().await {
        result.expect("task").expect("lock cycle");
    }
    let lines = monitor.lines();
    let calls: Vec<&String> = lines.iter().filter(|l| is_client_command(l) && l.contains("\"EVALSHA\"")).collect();
    // KEYS[1] repeats the first record, so a call for several locks names the prefix at least three times.
    let shared = calls.iter().filter(|l| l.matches(prefix.as_str()).count() >= 3).count();
    eprintln!("{} calls on one primary, {shared} of them for several locks", calls.len());
    assert!(shared > 0, "no call carried several locks:\n{}", monitor.tail(20));
}

/// A lock's key whose record another program replaced (with a list here) fails its renewals with the error
/// that node's shared renewal call caught for it alone, which says why (WRONGTYPE), and the lock is reported
/// lost. (The mutation report's `renewal_results`: without its arm for a caught error, the renewal read as an
/// unexpected reply, and nothing said why the lock was lost.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_error_caught_for_one_key_of_a_shared_call_says_why() {
    distlock_tests::wall_clock::again_if_the_wall_clock_stepped(|| async {
        let logs = distlock_tests::logs::capture();
        let fx = Fixture::cluster().await;
        let cluster = fx.redis_cluster().expect("cluster fixture");
        let keys: Vec<String> = (0..30).map(|i| format!("foreign-renew-{i}")).collect();
        let broken = fx.client().record_key(&keys[0]);
        let node = cluster.node(cluster.primary_for(&broken)).expect("its primary");
        let mut conn = node.connection().await;
        let guard = fx.client().lock_all(keys.clone()).ttl(ms(900)).acquire().await.expect("lock_all");
        let () = redis::cmd("DEL").arg(&broken).query_async(&mut conn).await.unwrap();
        let () = redis::cmd("RPUSH").arg(&broken).arg("not a lock").query_async(&mut conn).await.unwrap();
        within(secs(10), "the lock reported lost", guard.lost()).await;
        let failed = logs.matching(tracing::Level::DEBUG, &["renewal failed"]);
        let of_broken: Vec<_> = failed.iter().filter(|line| line.fields.get("key") == Some(&keys[0])).collect();
        assert!(
            of_broken.iter().any(|line| line.fields.get("error").is_some_and(|e| e.contains("WRONGTYPE"))),
            "no renewal error of {} says why: {of_broken:?}",
            keys[0]
        );
        drop(guard);
    })
    .await
}
