//! Checks distlock's guarantees against your own Redis server.
//!
//! ```sh
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run -p examples --example safety_check
//! ```
//!
//! It contends for a lock from several clients and tasks with a read-sleep-write counter (no overlap, no
//! lost update, fencing tokens strictly rising), checks that a release wakes a waiter at once, that a lost
//! lock is reported and its body dropped, that a cancelled body releases within 200 ms, that a fenced store
//! rejects a stale holder's write, and that bad keys and ttls are refused before any command. It also notes
//! server settings that weaken the guarantees (an evicting `maxmemory-policy`, no AOF, a replica).
//!
//! It is safe on a shared server: every key it touches is under `distlock-safety-check:<random id>:` (or
//! names that contain the id) and is deleted at the end; it never runs FLUSH, CONFIG, DEBUG or CLIENT.
//! Besides the lock commands it needs GET, SET, SCAN, DEL and INFO.
//!
//! Optional: `SAFETY_CHECK_CLIENTS`, `SAFETY_CHECK_TASKS`, `SAFETY_CHECK_ROUNDS` size the contention test
//! (default 4 x 8 x 4). Exits 0 when every check passed, 1 when one failed, 2 without `REDIS_URL`.

use std::process::ExitCode;

use distlock_tests::checker::SafetyCheck;

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let Ok(url) = std::env::var("REDIS_URL") else {
        eprintln!("set REDIS_URL to the Redis server to check, e.g. REDIS_URL=redis://127.0.0.1:6379/");
        return ExitCode::from(2);
    };
    let check = SafetyCheck::new(url)
        .clients(setting("SAFETY_CHECK_CLIENTS", 4))
        .tasks(setting("SAFETY_CHECK_TASKS", 8))
        .rounds(setting("SAFETY_CHECK_ROUNDS", 4));
    let report = check.run().await;
    println!("{report}");
    if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
