//! [`RedisCluster`]: a private Redis Cluster of real `redis-server` processes, created with
//! `redis-cli --cluster create`, for the scale-out tests.
//!
//! Each node listens on a free loopback port with its cluster bus on another free port (`--cluster-port`, so
//! no port above 55535 is needed), persists nothing, and is tuned for tests: a 1 s node timeout (failover in
//! about 2 s) and `cluster-require-full-coverage no` (a failed shard does not stop the healthy ones).
//! Starting one takes a few seconds: a test binary shares one ([`RedisCluster::shared`]).

use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use crate::server::{free_port, reaper, RedisServer};

/// How long the cluster may take to agree on its slots and link its replicas.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// A Redis Cluster owned by a test (or, through [`shared`](RedisCluster::shared), by a test binary).
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    // Kills the nodes when this process exits, also when the cluster lives in a static that is never dropped.
    reaper: Option<Child>,
}

impl RedisCluster {
    /// Starts `primaries` primaries with `replicas` replicas each and waits until every node reports
    /// `cluster_state:ok` and every replica's link to its primary is up.
    pub fn start(primaries: usize, replicas: usize) -> Self {
        assert!(primaries >= 3, "Redis Cluster needs at least 3 primaries");
        let nodes: Vec<RedisServer> = (0..primaries * (1 + replicas))
            .map(|_| {
                let bus = free_port().to_string();
                RedisServer::with_args([
                    "--cluster-enabled",
                    "yes",
                    "--cluster-port",
                    bus.as_str(),
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "1000",
                    "--cluster-require-full-coverage",
                    "no",
                    "--repl-diskless-sync-delay",
                    "0",
                ])
            })
            .collect();
        let reaper = Some(reaper(&nodes.iter().collect::<Vec<_>>()));
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for node in &nodes {
            create.arg(format!("127.0.0.1:{}", node.port()));
        }
        create.args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"]);
        let output = create
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run `redis-cli --cluster create`: {e}; {}", crate::INSTALL_HINT));
        let cluster = Self { nodes, reaper };
        assert!(
            output.status.success(),
            "`redis-cli --cluster create` failed: {}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        cluster.wait_ready(primaries * replicas);
        cluster
    }

    /// One cluster of 3 primaries with one replica each for the whole test binary, started by the first
    /// caller. Tests that share it use keys of their own and never stop or reconfigure its nodes.
    pub fn shared() -> &'static RedisCluster {
        static SHARED: OnceLock<RedisCluster> = OnceLock::new();
        SHARED.get_or_init(|| RedisCluster::start(3, 1))
    }

    /// The nodes' URLs, to seed a cluster client with.
    pub fn seeds(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Every node, primaries and replicas, in the order they were started.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The node answering on `port`, if it is one of this cluster's.
    pub fn node(&self, port: u16) -> Option<&RedisServer> {
        self.nodes.iter().find(|n| n.port() == port)
    }

    /// Runs `args` on the node on `port` with redis-cli and returns its output.
    pub fn cli(&self, port: u16, args: &[&str]) -> String {
        let output = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli: {e}"));
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// How many subscribers `channel` has on the node on `port`: plain ones (`PUBSUB NUMSUB`), or with
    /// `sharded` those of sharded pub/sub (`PUBSUB SHARDNUMSUB`).
    pub fn subscribers(&self, port: u16, channel: &str, sharded: bool) -> u64 {
        let which = if sharded { "SHARDNUMSUB" } else { "NUMSUB" };
        let reply = self.cli(port, &["PUBSUB", which, channel]);
        // `<channel>` then `<count>`, a line each.
        let count = reply.lines().nth(1).map(str::trim);
        count.and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("PUBSUB {which} on {port}: {reply:?}"))
    }

    /// How many times the node on `port` ran `command`, also from scripts (`INFO commandstats`).
    pub fn calls(&self, port: u16, command: &str) -> u64 {
        let stats = self.cli(port, &["INFO", "commandstats"]);
        let prefix = format!("cmdstat_{command}:calls=");
        stats
            .lines()
            .find_map(|line| line.trim().strip_prefix(prefix.as_str()))
            .map_or(0, |rest| rest.split(',').next().and_then(|n| n.parse().ok()).expect("a call count"))
    }

    /// `CLUSTER NODES` as one live node sees it (any node that answers).
    fn cluster_nodes(&self) -> String {
        self.nodes
            .iter()
            .map(|n| self.cli(n.port(), &["CLUSTER", "NODES"]))
            .find(|text| text.contains("myself"))
            .unwrap_or_default()
    }

    /// The hash slot of `key`, as the cluster computes it (`CLUSTER KEYSLOT`).
    pub fn slot(&self, key: &str) -> u16 {
        self.nodes
            .iter()
            .map(|n| self.cli(n.port(), &["CLUSTER", "KEYSLOT", key]))
            .find_map(|text| text.trim().parse().ok())
            .expect("CLUSTER KEYSLOT")
    }

    /// The port of the primary that serves `key`'s slot now.
    pub fn primary_for(&self, key: &str) -> u16 {
        let slot = self.slot(key);
        let nodes = self.cluster_nodes();
        nodes
            .lines()
            .filter(|l| l.contains("master") && !l.contains("fail"))
            .find(|l| {
                l.split_whitespace().skip(8).any(|range| match range.split_once('-') {
                    Some((a, b)) => {
                        a.parse::<u16>().is_ok_and(|a| a <= slot) && b.parse::<u16>().is_ok_and(|b| slot <= b)
                    }
                    None => range.parse::<u16>() == Ok(slot),
                })
            })
            .and_then(node_port)
            .unwrap_or_else(|| panic!("no live primary serves slot {slot} of {key}: {nodes}"))
    }

    /// The ports of the replicas of the primary on `primary`.
    pub fn replicas_of(&self, primary: u16) -> Vec<u16> {
        let nodes = self.cluster_nodes();
        let id = nodes.lines().find(|l| node_port(l) == Some(primary)).and_then(|l| l.split_whitespace().next());
        let Some(id) = id else { return Vec::new() };
        nodes.lines().filter(|l| l.split_whitespace().nth(3) == Some(id)).filter_map(node_port).collect()
    }

    /// Waits until the node on `port` reports itself a primary; panics after `limit`.
    pub fn wait_primary(&self, port: u16, limit: Duration) {
        let deadline = Instant::now() + limit;
        while !self.cli(port, &["ROLE"]).starts_with("master") {
            assert!(Instant::now() < deadline, "127.0.0.1:{port} was not promoted within {limit:?}");
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// The node id (as `CLUSTER NODES` names it) of the node on `port`.
    pub fn node_id(&self, port: u16) -> String {
        let nodes = self.cluster_nodes();
        nodes
            .lines()
            .find(|l| node_port(l) == Some(port))
            .and_then(|l| l.split_whitespace().next())
            .unwrap_or_else(|| panic!("no node on port {port}: {nodes}"))
            .to_owned()
    }

    /// The first slot the primary on `port` serves.
    pub fn first_slot(&self, port: u16) -> u16 {
        let nodes = self.cluster_nodes();
        let line = nodes.lines().find(|l| node_port(l) == Some(port)).expect("the node");
        let range = line.split_whitespace().nth(8).expect("a primary with slots");
        range.split('-').next().and_then(|a| a.parse().ok()).expect("a slot number")
    }

    /// Moves the first `slots` slots of the primary on `from` to the primary on `to` with
    /// `redis-cli --cluster reshard`, keys included (blocking; run it off the async runtime).
    pub fn reshard(&self, from: u16, to: u16, slots: u16) {
        let output = Command::new("redis-cli")
            .args(["--cluster", "reshard", &format!("127.0.0.1:{from}")])
            .args(["--cluster-from", &self.node_id(from), "--cluster-to", &self.node_id(to)])
            .args(["--cluster-slots", &slots.to_string(), "--cluster-yes", "--cluster-pipeline", "2"])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run `redis-cli --cluster reshard`: {e}"));
        assert!(
            output.status.success(),
            "`redis-cli --cluster reshard` failed: {}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// The node on `port`, mutably (to kill it).
    pub fn node_mut(&mut self, port: u16) -> Option<&mut RedisServer> {
        self.nodes.iter_mut().find(|n| n.port() == port)
    }

    /// Until every node reports `cluster_state:ok`, every replica's link to its primary is up, and every node's
    /// view of the cluster counts all `replicas` replicas. A node that `redis-cli` has not yet made a replica
    /// reports itself a primary with a state of ok, so the first two alone were seen to pass too early.
    fn wait_ready(&self, replicas: usize) {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let pending: Vec<String> = self
                .nodes
                .iter()
                .filter_map(|node| {
                    let info = self.cli(node.port(), &["CLUSTER", "INFO"]);
                    let replication = self.cli(node.port(), &["INFO", "replication"]);
                    let seen = self.cli(node.port(), &["CLUSTER", "NODES"]);
                    let ok = info.contains("cluster_state:ok")
                        && (replication.contains("role:master") || replication.contains("master_link_status:up"))
                        && seen.lines().filter(|l| l.contains("slave")).count() == replicas;
                    (!ok).then(|| format!("127.0.0.1:{}", node.port()))
                })
                .collect();
            if pending.is_empty() {
                return;
            }
            assert!(Instant::now() < deadline, "cluster not ready after {READY_TIMEOUT:?}: {pending:?} are not");
            thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        // The nodes kill themselves on drop; the reaper is no longer needed.
        if let Some(mut reaper) = self.reaper.take() {
            let _ = reaper.kill();
            let _ = reaper.wait();
        }
    }
}

/// The client port in a `CLUSTER NODES` line (`<id> <ip>:<port>@<bus> ...`).
fn node_port(line: &str) -> Option<u16> {
    let address = line.split_whitespace().nth(1)?;
    address.split('@').next()?.rsplit(':').next()?.parse().ok()
}
