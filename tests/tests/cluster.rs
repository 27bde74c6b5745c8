//! The cluster harness: a 6-node Redis Cluster (3 primaries, 3 replicas) of real servers comes up with every
//! slot served, once per test binary, and goes away with it; locks on it across every primary.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use distlock::{Client, LockError};
use distlock_tests::cluster::RedisCluster;
use distlock_tests::monitor::{is_client_command, Monitor};
use distlock_tests::{eventually, Fixture};
use tokio::task::JoinSet;

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

/// Renewals that come due together go to each node as one call, whatever their slots (RENEW_SPREAD), not one
/// call per slot: a lock over 30 keys, spread over the three primaries and renewed together, renews on one
/// primary with one script call per round for all of that primary's keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_due_renewals_share_one_call() {
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
