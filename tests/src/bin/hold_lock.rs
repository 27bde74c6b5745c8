//! Holds a distlock lock in a separate process, for crash, pause and contention tests.
//!
//! Usage:
//! - `hold_lock <redis-url> <key> <ttl-ms> abort|hold`
//! - `hold_lock <redis-url> <key> <ttl-ms> rmw <store> fenced|unfenced <pause-ms>`
//! - `hold_lock <redis-url> <key> <ttl-ms> storm <tasks> <rounds> <wait-ms> <name>`
//!
//! It reports what happens on stdout, one event per line, flushed at once: the first word is the event.
//!
//! `abort` and `hold` acquire `key` (waiting up to 10 s) and print `ACQUIRED <fencing-token>` (always the
//! first line), then `TOKEN <owner-token>`. `abort` then calls `std::process::abort()` while holding (no
//! release, no destructors); `hold` keeps the guard and its watchdog alive until killed, printing `LOST` if
//! the guard reports the lock lost.
//!
//! `rmw` runs a lock body (`LockRequest::run`) that prints `ACQUIRED <fence>` and `TOKEN <token>`, then loops:
//! read the store's value (`READ <v>`), block the whole process for `pause-ms` (a synchronous sleep, like a
//! GC pause or a starved executor), write `v + 1` with its fencing token over a blocking connection
//! (`WRITE <v+1> accepted|rejected`), yield briefly. A test freezes the process (SIGSTOP) between a `READ`
//! and its `WRITE`. When the body is dropped it prints `BODY_DROPPED`; when `run` returns,
//! `RESULT <ok|lost|error> accepted=<accepted writes>` and the process exits.
//!
//! `storm` runs `tasks` tasks of `rounds` lock calls each on `key`; every fourth task waits only 30 ms,
//! the others `wait-ms`. Even tasks use `acquire`/`release`, odd ones `run`. Each critical section enters
//! the cross-process [`Witness`] `<name>`, does a read-sleep-write increment on the unfenced store `<name>`,
//! and leaves. Unexpected outcomes print `ERROR ...`, `OVERLAP ...`, `LATE ...`; the end prints
//! `STORM ok=<n> not_obtained=<n> errors=<n> late=<n> overlaps=<n> regressions=<n> accepted=<n>
//! max_over_wait_ms=<n>`.

use std::io::Write;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::{Client, LockError, ReleaseOutcome};
use distlock_tests::events::Witness;
use distlock_tests::store::{Counter, Store, SyncStore, Write as StoreWrite};

const USAGE: &str = "usage: hold_lock <redis-url> <key> <ttl-ms> abort|hold \
    | rmw <store> fenced|unfenced <pause-ms> | storm <tasks> <rounds> <wait-ms> <name>";

/// The response timeout of the storm's clients: a call may overrun its wait by one of these.
const STORM_RESPONSE_TIMEOUT: Duration = Duration::from_secs(1);
/// Scheduling slack on top of that, on a loaded 2-core machine.
const STORM_SLACK: Duration = Duration::from_millis(500);

fn fail(msg: &str) -> ! {
    eprintln!("hold_lock: {msg}");
    std::process::exit(2)
}

/// Prints one event line and flushes it.
fn report(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").unwrap_or_else(|e| fail(&format!("stdout: {e}")));
    out.flush().unwrap_or_else(|e| fail(&format!("stdout: {e}")));
}

fn number<T: std::str::FromStr>(s: &str) -> T {
    s.parse().unwrap_or_else(|_| fail(USAGE))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, key, ttl_ms, mode, rest @ ..] = args.as_slice() else { fail(USAGE) };
    let ttl = Duration::from_millis(number(ttl_ms));
    match (mode.as_str(), rest) {
        ("abort", []) => hold(url, key, ttl, true).await,
        ("hold", []) => hold(url, key, ttl, false).await,
        ("rmw", [store, fencing, pause_ms]) => {
            let fenced = match fencing.as_str() {
                "fenced" => true,
                "unfenced" => false,
                _ => fail(USAGE),
            };
            rmw(url, key, ttl, store, fenced, Duration::from_millis(number(pause_ms))).await
        }
        ("storm", [tasks, rounds, wait_ms, name]) => {
            storm(url, key, ttl, number(tasks), number(rounds), Duration::from_millis(number(wait_ms)), name).await
        }
        _ => fail(USAGE),
    }
}

async fn connect(url: &str, response_timeout: Option<Duration>) -> Client {
    let mut builder = Client::builder().redis(url);
    if let Some(t) = response_timeout {
        builder = builder.response_timeout(t);
    }
    builder.build().await.unwrap_or_else(|e| fail(&format!("connect: {e}")))
}

async fn hold(url: &str, key: &str, ttl: Duration, abort: bool) {
    let client = connect(url, None).await;
    let guard = client
        .lock(key)
        .ttl(ttl)
        .wait(Duration::from_secs(10))
        .metadata(format!("hold_lock pid {}", std::process::id()))
        .acquire()
        .await
        .unwrap_or_else(|e| fail(&format!("acquire: {e}")));
    report(&format!("ACQUIRED {}", guard.fencing_token()));
    report(&format!("TOKEN {}", guard.token().expose_secret()));
    if abort {
        std::process::abort();
    }
    guard.lost().await;
    report("LOST");
    std::future::pending::<()>().await;
    drop(guard);
}

/// Prints `BODY_DROPPED` when the lock body is dropped before its end.
struct ReportDrop;

impl Drop for ReportDrop {
    fn drop(&mut self) {
        report("BODY_DROPPED");
    }
}

async fn rmw(url: &str, key: &str, ttl: Duration, store: &str, fenced: bool, pause: Duration) {
    let client = connect(url, None).await;
    let mut store = SyncStore::open(url, store, fenced).unwrap_or_else(|e| fail(&format!("store: {e}")));
    let accepted = Arc::new(AtomicI64::new(0));
    let body = {
        let (client, accepted) = (client.clone(), Arc::clone(&accepted));
        async move {
            let fence = client
                .lock_info(key)
                .await
                .ok()
                .flatten()
                .unwrap_or_else(|| fail("lock_info inside the body found no holder"))
                .fencing_token;
            // The record starts with the holder's 32-character token.
            let record: String =
                store.command(&["GET", &client.record_key(key)]).unwrap_or_else(|e| fail(&format!("GET record: {e}")));
            let token: String = record.chars().take(32).collect();
            report(&format!("ACQUIRED {fence}"));
            report(&format!("TOKEN {token}"));
            let _dropped = ReportDrop;
            loop {
                let v = store.read().unwrap_or_else(|e| fail(&format!("read: {e}")));
                report(&format!("READ {v}"));
                // The whole process stops here, watchdog included (current-thread runtime).
                std::thread::sleep(pause);
                match store.write(v + 1, fence).unwrap_or_else(|e| fail(&format!("write: {e}"))) {
                    StoreWrite::Accepted => {
                        accepted.fetch_add(1, Ordering::SeqCst);
                        report(&format!("WRITE {} accepted", v + 1));
                    }
                    StoreWrite::Rejected { highest, .. } => {
                        report(&format!("WRITE {} rejected token={fence} highest={highest}", v + 1))
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let result = client.lock(key).ttl(ttl).wait(Duration::from_secs(10)).run(body).await;
    let accepted = accepted.load(Ordering::SeqCst);
    match result {
        Ok(()) => report(&format!("RESULT ok accepted={accepted}")),
        Err(LockError::Lost { .. }) => report(&format!("RESULT lost accepted={accepted}")),
        Err(e) => report(&format!("RESULT error accepted={accepted} {e}")),
    }
}

#[derive(Debug, Default)]
struct Tally {
    ok: AtomicI64,
    not_obtained: AtomicI64,
    errors: AtomicI64,
    late: AtomicI64,
    overlaps: AtomicI64,
    regressions: AtomicI64,
    max_over_wait_ms: AtomicI64,
}

impl Tally {
    /// Checks that a call ended within its wait plus one response timeout (and slack).
    fn timed(&self, what: &str, elapsed: Duration, wait: Duration) {
        let over = elapsed.saturating_sub(wait);
        self.max_over_wait_ms.fetch_max(over.as_millis() as i64, Ordering::SeqCst);
        if elapsed > wait + STORM_RESPONSE_TIMEOUT + STORM_SLACK {
            self.late.fetch_add(1, Ordering::SeqCst);
            report(&format!("LATE {what} took {elapsed:?} with wait {wait:?}"));
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn storm_task(
    client: Client,
    key: String,
    ttl: Duration,
    wait: Duration,
    rounds: usize,
    use_guard: bool,
    witness: Witness,
    counter: Arc<Counter>,
    tally: Arc<Tally>,
) {
    let section = |fence: u64| {
        let (witness, counter, tally) = (witness.clone(), Arc::clone(&counter), Arc::clone(&tally));
        async move {
            let entry = witness.enter(fence).await;
            if entry.occupancy != 1 {
                tally.overlaps.fetch_add(1, Ordering::SeqCst);
                report(&format!("OVERLAP occupancy={} fence={fence}", entry.occupancy));
            }
            if entry.regressed {
                tally.regressions.fetch_add(1, Ordering::SeqCst);
                report(&format!("REGRESSION fence={fence}"));
            }
            counter.increment(0, Duration::from_millis(1)).await;
            witness.leave().await;
        }
    };
    for _ in 0..rounds {
        let start = Instant::now();
        let request = client.lock(key.as_str()).ttl(ttl).wait(wait);
        let result = if use_guard {
            match request.acquire().await {
                Ok(guard) => {
                    tally.timed("acquire", start.elapsed(), wait);
                    section(guard.fencing_token()).await;
                    match guard.release().await {
                        Ok(ReleaseOutcome::Released) => Ok(()),
                        Ok(other) => {
                            tally.errors.fetch_add(1, Ordering::SeqCst);
                            report(&format!("ERROR release found {other:?}"));
                            Ok(())
                        }
                        Err(e) => Err(e),
                    }
                }
                Err(e) => Err(e),
            }
        } else {
            request.run(section(0)).await
        };
        match result {
            Ok(()) => {
                tally.ok.fetch_add(1, Ordering::SeqCst);
            }
            Err(LockError::NotObtained { .. }) => {
                tally.not_obtained.fetch_add(1, Ordering::SeqCst);
                tally.timed("NotObtained", start.elapsed(), wait);
            }
            Err(e) => {
                tally.errors.fetch_add(1, Ordering::SeqCst);
                report(&format!("ERROR {e}"));
            }
        }
    }
}

async fn storm(url: &str, key: &str, ttl: Duration, tasks: usize, rounds: usize, wait: Duration, name: &str) {
    let client = connect(url, Some(STORM_RESPONSE_TIMEOUT)).await;
    let redis = redis::Client::open(url).unwrap_or_else(|e| fail(&format!("witness url: {e}")));
    let conn =
        redis.get_multiplexed_async_connection().await.unwrap_or_else(|e| fail(&format!("witness connection: {e}")));
    let witness = Witness::new(conn.clone(), name);
    let counter = Arc::new(Counter::new(Store::unfenced(conn, name)));
    let tally = Arc::new(Tally::default());
    report("READY");
    let mut set = tokio::task::JoinSet::new();
    for i in 0..tasks {
        let wait = if i % 4 == 3 { Duration::from_millis(30) } else { wait };
        set.spawn(storm_task(
            client.clone(),
            key.to_owned(),
            ttl,
            wait,
            rounds,
            i % 2 == 0,
            witness.clone(),
            Arc::clone(&counter),
            Arc::clone(&tally),
        ));
    }
    while let Some(done) = set.join_next().await {
        if let Err(e) = done {
            tally.errors.fetch_add(1, Ordering::SeqCst);
            report(&format!("ERROR task failed: {e}"));
        }
    }
    let get = |a: &AtomicI64| a.load(Ordering::SeqCst);
    report(&format!(
        "STORM ok={} not_obtained={} errors={} late={} overlaps={} regressions={} accepted={} max_over_wait_ms={}",
        get(&tally.ok),
        get(&tally.not_obtained),
        get(&tally.errors),
        get(&tally.late),
        get(&tally.overlaps),
        get(&tally.regressions),
        counter.accepted(),
        get(&tally.max_over_wait_ms),
    ));
}
