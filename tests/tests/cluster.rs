//! The cluster harness: a 6-node Redis Cluster (3 primaries, 3 replicas) of real servers comes up with every
//! slot served, once per test binary, and goes away with it.

use distlock_tests::cluster::RedisCluster;

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
