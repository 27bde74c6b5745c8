//! One worker process of the randomized fault soak (`tests/tests/soak.rs`).
//!
//! Usage: `soak_worker <worker> <incarnation> <lock-url> <register-url> <log-file> <stop-file> <seed> <keys>`
//! (`keys` comma-separated).
//!
//! With its own `distlock::Client` on `lock-url` (the test's fault proxy in front of the lock server), it
//! loops until `stop-file` exists: picks a key, a ttl (300–1000 ms), a wait and a hold time at random; calls
//! `acquire`; while holding, checks `is_lost()` every few tens of milliseconds, writes its fencing token once
//! to the fenced register on `register-url` (a server no fault touches), and releases. Then it logs `exit`
//! and exits with status 0.
//!
//! It appends every event to `log-file` as one JSON line ([`distlock_tests::soak::Event`]), stamped on
//! CLOCK_MONOTONIC before and after, each line in one write. It also prints cues on stdout for the test's
//! nemesis, which pauses workers at the moments that matter: `READY`, `WAITING <key>` (about to wait, i.e.
//! to queue if busy), `HOLDING <key>` (just granted), `RELEASING <key>` (about to release).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use distlock::{Client, LockError, LockGuard, ReleaseOutcome};
use distlock_tests::soak::{now_ns, register_keys, Event, Rng, REGISTER_WRITE};

const USAGE: &str =
    "usage: soak_worker <worker> <incarnation> <lock-url> <register-url> <log-file> <stop-file> <seed> <keys>";

/// How often a holder checks `is_lost()` while it holds.
const CHECK_EVERY: Duration = Duration::from_millis(40);

static LOG: OnceLock<Mutex<File>> = OnceLock::new();

fn fail(msg: &str) -> ! {
    eprintln!("soak_worker: {msg}");
    std::process::exit(2)
}

/// Appends one event to the log file, in one write.
fn log(event: &Event) {
    let Some(file) = LOG.get() else { return };
    let mut file = file.lock().unwrap_or_else(PoisonError::into_inner);
    file.write_all(event.to_line().as_bytes()).unwrap_or_else(|e| fail(&format!("log file: {e}")));
}

/// Prints a cue for the nemesis. A closed stdout (the test is gone) is ignored.
fn cue(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

struct Worker {
    client: Client,
    register: redis::aio::MultiplexedConnection,
    script: redis::Script,
    rng: Rng,
    keys: Vec<String>,
    stop: PathBuf,
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [worker, inc, lock_url, register_url, log_path, stop, seed, keys] = args.as_slice() else { fail(USAGE) };
    let worker: usize = worker.parse().unwrap_or_else(|_| fail(USAGE));
    let inc: u32 = inc.parse().unwrap_or_else(|_| fail(USAGE));
    let seed: u64 = seed.parse().unwrap_or_else(|_| fail(USAGE));
    let keys: Vec<String> = keys.split(',').map(str::to_owned).collect();
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_path)
        .unwrap_or_else(|e| fail(&format!("cannot open {log_path}: {e}")));
    let _ = LOG.set(Mutex::new(file));
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        log(&Event::Panic { msg: info.to_string(), t: now_ns() });
        default_hook(info);
    }));
    log(&Event::Start { worker, inc, pid: std::process::id(), t: now_ns() });

    let stop = PathBuf::from(stop);
    let Some(client) = connect(lock_url, &stop).await else {
        log(&Event::Exit { t: now_ns() });
        return;
    };
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(5)));
    let register = redis::Client::open(register_url.as_str())
        .unwrap_or_else(|e| fail(&format!("register url: {e}")))
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .unwrap_or_else(|e| fail(&format!("register connection: {e}")));
    log(&Event::Ready { t: now_ns() });
    cue("READY");

    let mut w =
        Worker { client, register, script: redis::Script::new(REGISTER_WRITE), rng: Rng::new(seed), keys, stop };
    while !w.stop.exists() {
        w.cycle().await;
    }
    log(&Event::Exit { t: now_ns() });
}

/// Builds the client, retrying while faults keep the server away; `None` if told to stop first.
async fn connect(url: &str, stop: &Path) -> Option<Client> {
    loop {
        if stop.exists() {
            return None;
        }
        let built = Client::builder().redis(url).connect_timeout(ms(500)).response_timeout(ms(500)).build().await;
        match built {
            Ok(client) => return Some(client),
            Err(_) => tokio::time::sleep(ms(100)).await,
        }
    }
}

impl Worker {
    /// One lock call: wait, hold (checking the lease and writing to the register), release.
    async fn cycle(&mut self) {
        let key = self.keys[self.rng.below(self.keys.len())].clone();
        let ttl = ms(self.rng.range(300, 1000));
        let wait = ms(self.rng.range(100, 2000));
        let hold = match self.rng.range(0, 9) {
            0..=2 => ms(self.rng.range(0, 20)),
            3..=6 => ms(self.rng.range(20, 300)),
            _ => ms(self.rng.range(300, 1500)),
        };
        log(&Event::Wait { key: key.clone(), t: now_ns() });
        cue(&format!("WAITING {key}"));
        let t0 = now_ns();
        let result = self.client.lock(key.as_str()).ttl(ttl).wait(wait).acquire().await;
        let t1 = now_ns();
        let guard = match result {
            Ok(guard) => guard,
            Err(e) => {
                log(&Event::NotGranted { key, err: e.to_string(), t0, t1 });
                if !matches!(e, LockError::NotObtained { .. }) {
                    tokio::time::sleep(ms(self.rng.range(10, 100))).await;
                }
                return;
            }
        };
        let tok: String = guard.token().to_string().trim_end_matches('…').to_owned();
        let fence = guard.fencing_token();
        log(&Event::Grant { key: key.clone(), fence, tok: tok.clone(), t0, t1 });
        cue(&format!("HOLDING {key}"));
        let mut valid = observe(&guard, &key, &tok);

        // Hold, checking the lease as we go; write the token to the register once, mid-hold.
        let started = tokio::time::Instant::now();
        let write_at = started + hold / 2;
        let mut written = false;
        while valid {
            let now = tokio::time::Instant::now();
            if !written && now >= write_at {
                written = true;
                self.write(&key, &tok, fence).await;
                valid = observe(&guard, &key, &tok);
                continue;
            }
            let end = started + hold;
            if now >= end {
                break;
            }
            let next = if written { end } else { write_at };
            tokio::time::sleep((next - now).min(CHECK_EVERY)).await;
            valid = observe(&guard, &key, &tok);
        }
        cue(&format!("RELEASING {key}"));
        // A moment for the nemesis to pause us right before the release.
        tokio::time::sleep(ms(self.rng.range(0, 25))).await;
        observe(&guard, &key, &tok);
        let t0 = now_ns();
        let outcome = match guard.release().await {
            Ok(ReleaseOutcome::Released) => String::from("released"),
            Ok(ReleaseOutcome::Expired) => String::from("expired"),
            Ok(ReleaseOutcome::TakenByOther) => String::from("taken_by_other"),
            Ok(other) => format!("{other:?}"),
            Err(e) => format!("error: {e}"),
        };
        log(&Event::Release { key, tok, outcome, t0, t1: now_ns() });
        tokio::time::sleep(ms(self.rng.range(0, 40))).await;
    }

    /// Writes the grant's fencing token to the register and logs the answer.
    async fn write(&mut self, key: &str, tok: &str, fence: u64) {
        let (highest_key, list_key) = register_keys(key);
        let t0 = now_ns();
        let answer: redis::RedisResult<(i64, u64)> =
            self.script.key(highest_key).key(list_key).arg(fence).invoke_async(&mut self.register).await;
        let t1 = now_ns();
        let (key, tok) = (key.to_owned(), tok.to_owned());
        match answer {
            Ok((accepted, highest)) => log(&Event::Write { key, tok, fence, accepted: accepted == 1, highest, t0, t1 }),
            Err(e) => log(&Event::WriteFailed { key, tok, err: e.to_string(), t0, t1 }),
        }
    }
}

/// Checks `is_lost()`, stamped before and after, and logs what it said; whether the lock is still held.
fn observe(guard: &LockGuard, key: &str, tok: &str) -> bool {
    let t0 = now_ns();
    let lost = guard.is_lost();
    let t1 = now_ns();
    let (key, tok) = (key.to_owned(), tok.to_owned());
    if lost {
        log(&Event::Lost { key, tok, t0, t1 });
    } else {
        log(&Event::Valid { key, tok, t0, t1 });
    }
    !lost
}
