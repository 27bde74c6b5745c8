//! Holds a distlock lock in a separate process, for crash tests.
//!
//! Usage: `hold_lock <redis-url> <key> <ttl-ms> <abort|hold>`
//!
//! Acquires `key` (waiting up to 10 s) with the given lease, prints `ACQUIRED <fencing-token>` on stdout and
//! flushes; then `abort` calls `std::process::abort()` while holding (no release, no destructors), and `hold`
//! keeps the guard (and its watchdog) alive until the process is killed.

use std::io::Write;
use std::time::Duration;

const USAGE: &str = "usage: hold_lock <redis-url> <key> <ttl-ms> <abort|hold>";

fn fail(msg: &str) -> ! {
    eprintln!("hold_lock: {msg}");
    std::process::exit(2)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, key, ttl_ms, mode] = args.as_slice() else { fail(USAGE) };
    let ttl = Duration::from_millis(ttl_ms.parse().unwrap_or_else(|_| fail(USAGE)));
    let abort = match mode.as_str() {
        "abort" => true,
        "hold" => false,
        _ => fail(USAGE),
    };

    let client = distlock::Client::builder()
        .redis(url.as_str())
        .build()
        .await
        .unwrap_or_else(|e| fail(&format!("connect: {e}")));
    let guard = client
        .lock(key.as_str())
        .ttl(ttl)
        .wait(Duration::from_secs(10))
        .metadata(format!("hold_lock pid {}", std::process::id()))
        .acquire()
        .await
        .unwrap_or_else(|e| fail(&format!("acquire: {e}")));

    let mut out = std::io::stdout().lock();
    writeln!(out, "ACQUIRED {}", guard.fencing_token()).unwrap_or_else(|e| fail(&format!("{e}")));
    out.flush().unwrap_or_else(|e| fail(&format!("{e}")));
    drop(out);

    if abort {
        std::process::abort();
    }
    std::future::pending::<()>().await;
    drop(guard);
}
