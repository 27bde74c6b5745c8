//! Quickstart: several workers race to build the same report; the lock lets one run at a time.
//!
//! ```text
//! cargo run -p distlock --example quickstart                                   # in-process backend
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run -p distlock --example quickstart  # a real Redis
//! ```
//!
//! It builds only distlock and tokio. Round 1 uses `wait = "0s"` (the default): one worker builds the report,
//! the others are told the lock is busy and skip it. Round 2 uses `wait = "5s"`: every worker builds it in
//! turn, each under a new, higher fencing token. Each line is printed as it happens: a worker says it is
//! releasing while it still holds the lock, before the next one starts building.

use std::time::Duration;

use distlock::{distributed_lock, Client, LockError};

/// The application's error type: lock failures convert into it, so `?` works on both.
#[derive(Debug)]
enum AppError {
    Lock(LockError),
}

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError::Lock(e)
    }
}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AppError::Lock(e) => write!(f, "{e}"),
        }
    }
}

/// Only one process at a time builds a given report; a busy lock is skipped (`wait` defaults to "0s").
#[distributed_lock(key = "report:<id>", ttl = "10s")]
async fn build_report(id: u64, worker: usize) -> Result<(), AppError> {
    build(id, worker, Duration::from_millis(300)).await
}

/// The same, but a busy lock is waited for, up to 5 s.
#[distributed_lock(key = "report:<id>", ttl = "10s", wait = "5s")]
async fn build_report_waiting(id: u64, worker: usize) -> Result<(), AppError> {
    build(id, worker, Duration::from_millis(100)).await
}

/// The work both do under the lock.
async fn build(id: u64, worker: usize, work: Duration) -> Result<(), AppError> {
    // The lock this call holds. Its fencing token is higher than that of every earlier grant of the key: storage
    // that rejects writes carrying a lower token than it has seen is safe even against a holder that paused past
    // its lease.
    let token = distlock::current_lock().expect("inside the lock body").fencing_token();
    println!("  worker {worker}: building report {id} under fencing token {token}");
    tokio::time::sleep(work).await; // the slow part

    // Still holding the lock: it is released when this body returns.
    println!("  worker {worker}: built report {id}; releasing report:{id}");
    Ok(())
}

const WORKERS: usize = 4;
const REPORT: u64 = 42;

#[tokio::main]
async fn main() -> Result<(), AppError> {
    let client = match std::env::var("REDIS_URL") {
        Ok(url) => {
            println!("backend: Redis at {url} (from REDIS_URL)");
            Client::builder().redis(url).key_prefix("distlock-example:").build().await?
        }
        Err(_) => {
            println!("backend: in-process memory (set REDIS_URL=redis://host:port/ to use Redis)");
            Client::builder().memory().build().await?
        }
    };
    // Once at startup: every #[distributed_lock] function uses this client.
    distlock::install(client)?;

    println!("round 1: {WORKERS} workers race for report:{REPORT}, without waiting");
    let mut tasks = Vec::new();
    for worker in 1..=WORKERS {
        tasks.push(tokio::spawn(async move {
            match build_report(REPORT, worker).await {
                Err(AppError::Lock(LockError::NotObtained { key, .. })) => {
                    println!("  worker {worker}: {key} is busy: skipped");
                    Ok(())
                }
                other => other,
            }
        }));
    }
    for task in tasks {
        task.await.expect("worker task panicked")?;
    }

    println!("round 2: {WORKERS} workers race for report:{REPORT}, waiting up to 5s");
    let mut tasks = Vec::new();
    for worker in 1..=WORKERS {
        tasks.push(tokio::spawn(build_report_waiting(REPORT, worker)));
    }
    for task in tasks {
        task.await.expect("worker task panicked")?;
    }
    Ok(())
}
