//! Held locks on a Redis Cluster (`--scale-out`, issue 11): 100 000 locks held at once by one client on a
//! 3-primary cluster, and what one renewal period (ttl/3, in which every lock is renewed once) costs the client
//! and the cluster's nodes, in % of one core, beside what the nodes spend idle over as long a time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::{Client, LockGuard};
use distlock_tests::cluster::RedisCluster;
use tokio::sync::Mutex;

use crate::measure::{cpu_now, process_cpu};

const LOCKS: usize = 100_000;
const TTL: Duration = Duration::from_secs(30);
/// Concurrent acquisitions while filling up.
const FILLERS: usize = 64;

/// Takes [`LOCKS`] locks on `cluster` through `client`, then measures one renewal period; a Markdown table.
pub async fn run(cluster: &RedisCluster, client: &Client) -> String {
    let period = TTL / 3;
    let nodes: Vec<u32> = cluster.nodes().iter().filter_map(|n| n.pid()).collect();
    let nodes_cpu = || nodes.iter().map(|&p| process_cpu(p)).sum::<Duration>();
    // What the nodes spend with no lock held (cluster bus, cron), over the same length of time.
    let idle_before = nodes_cpu();
    tokio::time::sleep(period).await;
    let idle = nodes_cpu() - idle_before;
    let guards = Arc::new(Mutex::new(Vec::with_capacity(LOCKS)));
    let filled = Instant::now();
    let fillers: Vec<_> = (0..FILLERS)
        .map(|f| {
            let (client, guards) = (client.clone(), guards.clone());
            tokio::spawn(async move {
                let mut mine: Vec<LockGuard> = Vec::with_capacity(LOCKS / FILLERS + 1);
                for i in (f..LOCKS).step_by(FILLERS) {
                    mine.push(client.lock(format!("held:{i}")).ttl(TTL).acquire().await.expect("acquire a held lock"));
                }
                guards.lock().await.extend(mine);
            })
        })
        .collect();
    for filler in fillers {
        filler.await.expect("filler");
    }
    let fill_s = filled.elapsed().as_secs_f64();
    eprintln!("  cluster: {LOCKS} locks taken in {fill_s:.1} s");
    // Every lock was taken before now, so in the next ttl/3 each is renewed exactly once.
    let (client_before, nodes_before) = (cpu_now(), nodes_cpu());
    tokio::time::sleep(period).await;
    let client_cpu = cpu_now() - client_before;
    let renewing = nodes_cpu() - nodes_before;
    let guards = std::mem::take(&mut *guards.lock().await);
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    eprintln!("  cluster: one renewal period measured; releasing");
    let releases: Vec<_> = guards.into_iter().map(|g| tokio::spawn(async move { g.release().await })).collect();
    for release in releases {
        let _ = release.await;
    }
    let pct = |cpu: Duration| 100.0 * cpu.as_secs_f64() / period.as_secs_f64();
    format!(
        "### Held locks on a Redis Cluster (3 primaries, 1 replica each)\n\n\
         | locks | ttl | taken in | renewal period | client CPU | the 6 nodes' CPU | the nodes idle | lost |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|\n\
         | {LOCKS} | {} s | {fill_s:.1} s | {} s | {:.1}% of a core | {:.1}% of a core | {:.1}% | {lost} |\n",
        TTL.as_secs(),
        period.as_secs(),
        pct(client_cpu),
        pct(renewing),
        pct(idle),
    )
}
