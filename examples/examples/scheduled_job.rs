//! A scheduled job that must run once per tick although every replica of the service schedules it.
//!
//! ```text
//! cargo run -p examples --example scheduled_job                                   # in-process backend
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run -p examples --example scheduled_job  # a real Redis
//! ```
//!
//! Three replicas fire the job every 500 ms, each a little late compared with the previous one (their clocks
//! and schedulers never agree exactly). The job itself takes 30 ms, so a plain lock would be free again by the
//! time a late replica fires, and that replica would run the job a second time in the same tick.
//! `min_hold = "300ms"` keeps the lock (held by nobody) for 300 ms after it was taken, so the late
//! replicas find it busy and skip the tick. The second phase shows what happens without it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{distributed_lock, with_client, Client, LockError};
use tokio::time::{sleep, sleep_until, Instant};

const REPLICAS: usize = 3;
const PERIOD: Duration = Duration::from_millis(500);
/// How much later than the previous one each replica fires.
const SKEW: Duration = Duration::from_millis(60);

/// Which replica ran the job at which tick.
type RunLog = Mutex<Vec<(u32, usize)>>;

/// The job, kept for at least 300 ms after it starts: replicas firing up to 300 ms late skip the tick.
#[distributed_lock(key = "jobs:cleanup", ttl = "5s", min_hold = "300ms")]
async fn cleanup(replica: usize, tick: u32, log: &RunLog) -> Result<(), LockError> {
    sleep(Duration::from_millis(30)).await; // the actual work
    log.lock().expect("log").push((tick, replica));
    Ok(())
}

/// The same job without `min_hold`, to show why it is needed.
#[distributed_lock(key = "jobs:cleanup-unprotected", ttl = "5s")]
async fn cleanup_unprotected(replica: usize, tick: u32, log: &RunLog) -> Result<(), LockError> {
    sleep(Duration::from_millis(30)).await;
    log.lock().expect("log").push((tick, replica));
    Ok(())
}

/// One replica: its own client, firing the job on the shared schedule, `replica * SKEW` late.
async fn replica(replica: usize, client: Client, ticks: u32, protected: bool, start: Instant, log: Arc<RunLog>) {
    for tick in 0..ticks {
        sleep_until(start + PERIOD * tick + SKEW * replica as u32).await;
        let job = async {
            if protected {
                cleanup(replica, tick, &log).await
            } else {
                cleanup_unprotected(replica, tick, &log).await
            }
        };
        match with_client(client.clone(), job).await {
            Ok(()) => println!("  tick {tick}: replica {replica} ran the job"),
            Err(LockError::NotObtained { .. }) => println!("  tick {tick}: replica {replica} skipped it (busy)"),
            Err(e) => println!("  tick {tick}: replica {replica} failed: {e}"),
        }
    }
}

/// Runs `ticks` ticks on every replica and returns how many times the job ran at each tick.
async fn run_phase(clients: &[Client], ticks: u32, protected: bool) -> Vec<usize> {
    let log = Arc::new(RunLog::default());
    let start = Instant::now() + Duration::from_millis(50);
    let tasks: Vec<_> = (0..REPLICAS)
        .map(|r| tokio::spawn(replica(r, clients[r].clone(), ticks, protected, start, Arc::clone(&log))))
        .collect();
    for task in tasks {
        task.await.expect("replica task panicked");
    }
    let log = log.lock().expect("log");
    (0..ticks).map(|tick| log.iter().filter(|(t, _)| *t == tick).count()).collect()
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    // Each replica has its own client, as separate processes would.
    let clients: Vec<Client> = match std::env::var("REDIS_URL") {
        Ok(url) => {
            println!("backend: Redis at {url} (from REDIS_URL); each replica has its own connection");
            let mut clients = Vec::new();
            for _ in 0..REPLICAS {
                clients.push(Client::builder().redis(url.clone()).key_prefix("distlock-example:").build().await?);
            }
            clients
        }
        Err(_) => {
            println!(
                "backend: in-process memory (set REDIS_URL=redis://host:port/ to use Redis); \
                 the replicas' clients are clones sharing one in-memory store"
            );
            let client = Client::builder().memory().build().await?;
            vec![client; REPLICAS]
        }
    };

    println!("phase 1: with min_hold = \"300ms\"");
    let runs = run_phase(&clients, 5, true).await;
    println!("  runs per tick: {runs:?}");
    let once = runs.iter().all(|&n| n == 1);
    println!("  the job ran exactly once per tick: {}", if once { "yes" } else { "NO" });

    println!("phase 2: the same job without min_hold");
    let runs = run_phase(&clients, 2, false).await;
    println!("  runs per tick: {runs:?} (late replicas found the lock already released and ran the job again)");

    if !once {
        eprintln!("unexpected: a tick ran more than once with min_hold (is the machine very busy?)");
        std::process::exit(1);
    }
    Ok(())
}
