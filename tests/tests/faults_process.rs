//! Fault injection on lock holders in other processes (the `hold_lock` helper): a holder killed with
//! SIGKILL (scenario 1), a holder frozen with SIGSTOP past its lease and thawed with SIGCONT while a fenced
//! or an unfenced store protects the data (scenario 2), and a contention storm of 4 processes x 16 tasks
//! (scenario 13).

use std::collections::HashMap;
use std::time::Duration;

use distlock::ReleaseOutcome;
use distlock_tests::agent::Agent;
use distlock_tests::events::Witness;
use distlock_tests::monitor::Monitor;
use distlock_tests::store::{Store, Write};
use distlock_tests::time::{ms, secs};
use distlock_tests::{serial, Fixture};
use tokio::time::Instant;

const BIN: &str = env!("CARGO_BIN_EXE_hold_lock");

fn args(url: &str, key: &str, ttl: Duration, rest: &[&str]) -> Vec<String> {
    let mut v = vec![url.to_owned(), key.to_owned(), ttl.as_millis().to_string()];
    v.extend(rest.iter().map(|s| (*s).to_owned()));
    v
}

/// `k=v` fields of an event line.
fn fields(line: &str) -> HashMap<String, String> {
    line.split_whitespace().filter_map(|f| f.split_once('=')).map(|(k, v)| (k.to_owned(), v.to_owned())).collect()
}

/// Scenario 1. A holder process that keeps its lease alive is killed with SIGKILL. The next holder gets
/// the lock once the lease left at the kill has run out — never earlier — and about one ttl after the kill
/// at most, with a higher fencing token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s01_killed_holder_frees_after_its_lease_never_earlier_with_a_higher_token() {
    const KEY: &str = "killed-holder";
    let ttl = ms(1500);
    let _serial = serial().await;
    let fx = Fixture::redis().await;
    let url = fx.server().unwrap().url();
    let mut holder = Agent::spawn("holder", BIN, &args(&url, KEY, ttl, &["hold"]));
    let (fence, _) = holder.expect("ACQUIRED", secs(20)).await;
    let fence: u64 = fence.parse().expect("fence");

    // Kill it once its watchdog has renewed the lease at least once.
    let mut last = fx.client().lock_info(KEY).await.unwrap().expect("held").remaining_ttl;
    let watching = Instant::now();
    loop {
        tokio::time::sleep(ms(20)).await;
        let now = fx.client().lock_info(KEY).await.unwrap().expect("held").remaining_ttl;
        if now > last {
            break;
        }
        last = now;
        assert!(watching.elapsed() < secs(5), "the holder's watchdog never renewed:\n{}", holder.transcript());
    }
    holder.kill9().await;
    let killed = Instant::now();
    // What the server still grants the dead holder: the lock cannot be free before that has run out.
    let asked = Instant::now();
    let info = fx.client().lock_info(KEY).await.unwrap().expect("a killed holder does not release");
    assert_eq!(info.fencing_token, fence);
    let earliest = asked + info.remaining_ttl;

    let next = fx.other_client().await;
    let guard = next.lock(KEY).wait(secs(10)).acquire().await.expect("free once the dead holder's lease ran out");
    let granted = Instant::now();
    assert!(
        granted + ms(5) >= earliest,
        "granted {:?} before the dead holder's lease ran out",
        earliest.saturating_duration_since(granted)
    );
    let after_kill = granted - killed;
    assert!(after_kill <= ttl + ms(500), "freed {after_kill:?} after the kill (ttl {ttl:?})");
    assert!(guard.fencing_token() > fence, "token {} after {fence}", guard.fencing_token());
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
}

/// What scenario 2 observed.
struct PausedOutcome {
    /// Accepted increments minus the final value.
    lost_updates: i64,
    /// The resumed holder's write after the pause (`<value> accepted|rejected ...`).
    stale_write: String,
    /// Lines from the helper.
    transcript: String,
}

/// Scenario 2's story, on a fenced or an unfenced store. The holder (another process) increments a shared
/// value under the lock: read, a synchronous 400 ms pause, write with its fencing token. It is frozen with
/// SIGSTOP during a pause, for longer than its 1 s lease. Another holder takes the lock (never before the
/// frozen one's lease ran out) and increments the value with its higher token. Then SIGCONT: the resumed
/// holder finishes its write (the value it read before the pause, with its old token), finds its lock lost,
/// and its body is dropped.
async fn paused_holder(fenced: bool) -> PausedOutcome {
    const KEY: &str = "paused-holder";
    let ttl = secs(1);
    let fx = Fixture::redis().await;
    let server = fx.server().unwrap();
    let name = if fenced { "paused-fenced" } else { "paused-unfenced" };
    let conn = fx.redis_connection().unwrap();
    let store = if fenced { Store::fenced(conn.clone(), name) } else { Store::unfenced(conn.clone(), name) };
    let monitor = Monitor::start(server);
    let fencing = if fenced { "fenced" } else { "unfenced" };
    let mut paused = Agent::spawn("paused", BIN, &args(&server.url(), KEY, ttl, &["rmw", name, fencing, "400"]));
    let (fence, _) = paused.expect("ACQUIRED", secs(20)).await;
    let fence: u64 = fence.parse().unwrap();
    let (token, _) = paused.expect("TOKEN", secs(5)).await;
    for _ in 0..2 {
        let (write, _) = paused.expect("WRITE", secs(5)).await;
        assert!(write.ends_with("accepted"), "{write}");
    }
    // Freeze it in the middle of its next read-pause-write.
    paused.expect("READ", secs(5)).await;
    let frozen = paused.stop();
    let stopped = Instant::now();

    let next = fx.other_client().await;
    let guard = next.lock(KEY).ttl(secs(10)).wait(secs(10)).acquire().await.expect("the new holder");
    let waited = stopped.elapsed();
    assert!(guard.fencing_token() > fence, "token {} after {fence}", guard.fencing_token());
    assert!(waited >= ttl / 3, "the lock was free only {waited:?} after its 1 s holder froze");
    let v = store.read().await;
    assert_eq!(store.write(v + 1, guard.fencing_token()).await, Write::Accepted);

    let mut mark_conn = conn.clone();
    let resumed_mark = monitor.mark(&mut mark_conn, "resume").await;
    frozen.resume();
    let (stale_write, _) = paused.expect("WRITE", secs(10)).await;
    let (result, _) = paused.expect("RESULT", secs(10)).await;
    paused.read_to_end(secs(10)).await;
    assert_eq!(paused.wait_exit(secs(10)).await, Some(0), "{}", paused.transcript());
    assert!(result.starts_with("lost "), "the resumed holder's run must report Lost: RESULT {result}");
    assert!(paused.saw("BODY_DROPPED"), "the resumed holder's body was not dropped:\n{}", paused.transcript());
    let accepted: i64 = fields(&result)["accepted"].parse().unwrap();
    let lost_updates = accepted + 1 - store.read().await;

    // The new holder is intact, and nothing was sent with the frozen holder's token after it resumed.
    let end = monitor.mark(&mut mark_conn, "end").await;
    let late: Vec<String> = monitor.lines()[resumed_mark..end].iter().filter(|l| l.contains(&token)).cloned().collect();
    assert!(late.is_empty(), "commands with the stale holder's token after it resumed:\n{}", late.join("\n"));
    let info = next.lock_info(KEY).await.unwrap().expect("still held by the new holder");
    assert_eq!(info.fencing_token, guard.fencing_token());
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    PausedOutcome { lost_updates, stale_write, transcript: paused.transcript() }
}

/// Scenario 2 with fencing: the resumed holder's stale write is rejected by the store, so no update is
/// lost, and its lock body reports `Lost` and is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s02_paused_holder_is_lost_and_its_stale_write_is_rejected_by_the_fenced_store() {
    let _serial = serial().await;
    let outcome = paused_holder(true).await;
    assert!(outcome.stale_write.contains("rejected"), "stale write: {}\n{}", outcome.stale_write, outcome.transcript);
    assert_eq!(outcome.lost_updates, 0, "{}", outcome.transcript);
}

/// Scenario 2 without fencing: the documented violation (README, "What it does not guarantee: process
/// pauses without fencing"). The resumed holder's write, already past its check, overwrites the new
/// holder's update: exactly one update is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s02_paused_holder_overwrites_the_new_holder_in_an_unfenced_store_documented_violation() {
    let _serial = serial().await;
    let outcome = paused_holder(false).await;
    assert!(outcome.stale_write.contains("accepted"), "stale write: {}\n{}", outcome.stale_write, outcome.transcript);
    assert_eq!(outcome.lost_updates, 1, "{}", outcome.transcript);
}

/// Scenario 13. 4 processes x 16 tasks contend for one key, 10 lock calls each (a quarter of the tasks
/// wait only 30 ms; half use `acquire`/`release`, half `run`); every critical section does a
/// read-sleep-write increment on an unfenced counter. No two critical sections overlap (the cross-process
/// witness sees an occupancy of 1 every time), fencing tokens rise, no update is lost, and every call ends
/// Ok or NotObtained within its wait (plus one response timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s13_contention_storm_4_processes_x_16_tasks_no_overlap_no_lost_update() {
    const KEY: &str = "storm";
    const PROCESSES: usize = 4;
    const ROUNDS: usize = 10;
    let _serial = serial().await;
    let fx = Fixture::redis().await;
    let url = fx.server().unwrap().url();
    let conn = fx.redis_connection().unwrap();
    let mut agents: Vec<Agent> = (0..PROCESSES)
        .map(|i| {
            Agent::spawn(
                &format!("storm-{i}"),
                BIN,
                &args(&url, KEY, secs(2), &["storm", "16", &ROUNDS.to_string(), "20000", KEY]),
            )
        })
        .collect();
    let mut totals: HashMap<String, i64> = HashMap::new();
    let mut problems = Vec::new();
    for agent in &mut agents {
        let (summary, _) = agent.expect("STORM", secs(120)).await;
        for (k, v) in fields(&summary) {
            let v: i64 = v.parse().unwrap();
            let total = totals.entry(k.clone()).or_default();
            if k == "max_over_wait_ms" {
                *total = (*total).max(v);
            } else {
                *total += v;
            }
        }
        for (_, line) in agent.seen() {
            if !line.starts_with("STORM") && !line.starts_with("READY") {
                problems.push(line.clone());
            }
        }
    }
    let witness = Witness::new(conn.clone(), KEY);
    let counter = Store::unfenced(conn, KEY);
    let value = counter.read().await;
    eprintln!("storm totals: {totals:?}, counter {value}");
    assert!(problems.is_empty(), "unexpected reports:\n{}", problems.join("\n"));
    for bad in ["errors", "late", "overlaps", "regressions"] {
        assert_eq!(totals[bad], 0, "{bad}: {totals:?}");
    }
    assert_eq!(witness.overlaps().await, 0, "the witness saw overlapping critical sections");
    assert_eq!(witness.regressions().await, 0, "the witness saw fencing tokens that did not rise");
    let ok = totals["ok"];
    assert_eq!(ok + totals["not_obtained"], (PROCESSES * 16 * ROUNDS) as i64, "{totals:?}");
    assert!(ok >= (PROCESSES * 12 * ROUNDS) as i64, "the tasks with a long wait must all get the lock: {totals:?}");
    assert_eq!(totals["accepted"], ok, "every critical section incremented once: {totals:?}");
    assert_eq!(totals["accepted"] - value, 0, "lost updates: {} accepted, counter {value}", totals["accepted"]);
    for agent in &mut agents {
        assert_eq!(agent.wait_exit(secs(10)).await, Some(0));
    }
}
