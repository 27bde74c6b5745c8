//! A cron job across replicas: three processes run the same tokio interval job, and each tick runs once in
//! total, as a counter shows.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run -p examples --example cron_across_replicas  # three processes
//! cargo run -p examples --example cron_across_replicas                                   # three tasks, in-process
//! ```
//!
//! With `REDIS_URL` the example starts itself three times as replicas (`--replica N`), each a process with its
//! own client. Without it, the in-process backend cannot share locks between processes, so the three replicas
//! are three tasks of this process sharing one client; everything else is the same.
//!
//! Every replica ticks every 500 ms from a common start, each a little later than the one before (their
//! clocks and schedulers never agree exactly). The job takes 30 ms, so with a plain lock a late replica would
//! find it free again and run the tick a second time. `min_hold = "300ms"` keeps the lock (held by nobody) for
//! 300 ms after it was taken: the late replicas find it busy and skip the tick, and it is free again for the
//! next one. Every run appends `<tick> <replica>` to a shared file, the counter; the example then counts the
//! runs per tick and fails unless each tick ran exactly once.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use distlock::{distributed_lock, Client, LockError};
use tokio::time::{interval_at, Instant, MissedTickBehavior};

type Error = Box<dyn std::error::Error + Send + Sync>;

const REPLICAS: usize = 3;
const TICKS: u64 = 6;
const PERIOD: Duration = Duration::from_millis(500);
/// How much later than the previous one each replica ticks.
const SKEW: Duration = Duration::from_millis(60);
/// From the parent's start to the first tick: time for the replicas' processes to start and connect.
const LEAD: Duration = Duration::from_secs(2);

/// The job: runs at most once per 300 ms across all replicas, so once per tick. `run` keeps this run's lock
/// apart from earlier runs' on the same Redis.
#[distributed_lock(key = "cron:report:<run>", ttl = "5s", min_hold = "300ms")]
async fn send_report(run: u32, tick: u64, replica: usize, counter: &Path) -> Result<(), LockError> {
    tokio::time::sleep(Duration::from_millis(30)).await; // the work
    count_run(counter, tick, replica).expect("the counter file");
    Ok(())
}

/// Appends `<tick> <replica>` to the counter: one short write in append mode, whole even with three writers.
fn count_run(counter: &Path, tick: u64, replica: usize) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(counter)?;
    file.write_all(format!("{tick} {replica}\n").as_bytes())
}

/// Milliseconds since the Unix epoch: the one clock the replicas' processes share.
fn wall_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// One replica: ticks every `PERIOD` from `start_ms` (wall clock) plus its skew, running the job each time.
async fn replica(replica: usize, run: u32, start_ms: u64, counter: &Path) {
    let first = Instant::now() + Duration::from_millis(start_ms.saturating_sub(wall_ms())) + SKEW * replica as u32;
    let mut ticks = interval_at(first, PERIOD);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Skip);
    loop {
        ticks.tick().await;
        // Which tick this is, by the shared clock, so that a replica that started late still agrees.
        let tick = wall_ms().saturating_sub(start_ms) / PERIOD.as_millis() as u64;
        if tick >= TICKS {
            return;
        }
        match send_report(run, tick, replica, counter).await {
            Ok(()) => println!("  tick {tick}: replica {replica} ran the job"),
            Err(e) if e.is_busy() => println!("  tick {tick}: replica {replica} skipped it (busy)"),
            Err(e) => println!("  tick {tick}: replica {replica} failed: {e}"),
        }
    }
}

/// The value following `flag` on the command line.
fn arg(flag: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1).cloned())
}

/// A replica process: `--replica N --run ID --start-ms MS --counter PATH`, with `REDIS_URL` set.
async fn replica_process(index: usize) -> Result<(), Error> {
    let (run, start_ms) = (arg("--run").ok_or("--run")?.parse()?, arg("--start-ms").ok_or("--start-ms")?.parse()?);
    let counter = PathBuf::from(arg("--counter").ok_or("--counter")?);
    let url = std::env::var("REDIS_URL")?;
    let client = Client::builder().redis(url).key_prefix("distlock-example:").build().await?;
    distlock::install(client.clone())?;
    println!("  replica {index}: process {}", std::process::id());
    replica(index, run, start_ms, &counter).await;
    client.shutdown(Duration::from_secs(5)).await;
    Ok(())
}

/// The replicas as tasks of this process, on the installed client.
async fn replica_tasks(run: u32, start_ms: u64, counter: &Path) -> Result<(), Error> {
    let tasks: Vec<_> = (0..REPLICAS)
        .map(|index| {
            let counter = counter.to_owned();
            tokio::spawn(async move { replica(index, run, start_ms, &counter).await })
        })
        .collect();
    for task in tasks {
        task.await?;
    }
    Ok(())
}

/// How many times the job ran at each tick, from the counter file.
fn runs_per_tick(counter: &Path) -> Result<Vec<usize>, Error> {
    let text = std::fs::read_to_string(counter).unwrap_or_default();
    let mut runs = vec![0; TICKS as usize];
    for line in text.lines() {
        let tick: usize = line.split(' ').next().ok_or("an empty line")?.parse()?;
        *runs.get_mut(tick).ok_or("a tick past the last")? += 1;
    }
    Ok(runs)
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    if let Some(index) = arg("--replica") {
        return replica_process(index.parse()?).await;
    }
    let run = std::process::id();
    let start_ms = wall_ms() + LEAD.as_millis() as u64;
    let counter = std::env::temp_dir().join(format!("distlock-cron-{run}.count"));
    let _ = std::fs::remove_file(&counter);
    match std::env::var("REDIS_URL") {
        Ok(_) => {
            println!("backend: Redis (from REDIS_URL); {REPLICAS} replica processes");
            let exe = std::env::current_exe()?;
            let mut processes = Vec::new();
            for index in 0..REPLICAS {
                let args = [index.to_string(), run.to_string(), start_ms.to_string()];
                processes.push(
                    Command::new(&exe)
                        .args(["--replica", &args[0], "--run", &args[1], "--start-ms", &args[2], "--counter"])
                        .arg(&counter)
                        .stdin(Stdio::null())
                        .spawn()?,
                );
            }
            for mut process in processes {
                let status = tokio::task::spawn_blocking(move || process.wait()).await??;
                if !status.success() {
                    return Err(format!("a replica process failed: {status}").into());
                }
            }
        }
        Err(_) => {
            println!("backend: in-process memory, which processes cannot share: {REPLICAS} replica tasks, one client");
            let client = Client::builder().memory().build().await?;
            distlock::install(client.clone())?;
            replica_tasks(run, start_ms, &counter).await?;
            client.shutdown(Duration::from_secs(5)).await;
        }
    }
    let runs = runs_per_tick(&counter)?;
    let _ = std::fs::remove_file(&counter);
    println!("runs per tick (the counter): {runs:?}");
    if runs.iter().any(|&n| n != 1) {
        return Err(format!("expected each tick to run exactly once: {runs:?} (is the machine very busy?)").into());
    }
    println!("each of the {TICKS} ticks ran exactly once across {REPLICAS} replicas");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The in-process run (`.ci/run` runs the three processes against its Redis): each tick once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_tick_runs_once_across_three_replica_tasks() {
        let counter = std::env::temp_dir().join(format!("distlock-cron-test-{}.count", std::process::id()));
        let _ = std::fs::remove_file(&counter);
        distlock::install(Client::builder().memory().build().await.unwrap()).unwrap();
        replica_tasks(7, wall_ms() + 200, &counter).await.unwrap();
        let runs = runs_per_tick(&counter).unwrap();
        let _ = std::fs::remove_file(&counter);
        assert_eq!(runs, vec![1; TICKS as usize]);
    }
}
