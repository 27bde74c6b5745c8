//! PostgreSQL rows (`--postgres`, issue 35): distlock's cycle on its PostgreSQL store against the least a lease
//! cycle costs there — `INSERT … ON CONFLICT … RETURNING` to take a key (a row with an expiry, taken over once
//! expired) and a `DELETE` by key and token to give it back, on as many pipelined sessions as distlock uses,
//! each call routed by key — and against session advisory locks (`pg_try_advisory_lock` /
//! `pg_advisory_unlock`, which have no lease and no fencing token, and die with their session). One task and 64
//! tasks, each on keys of its own; in each round every contender runs one window, in an order rotated from round
//! to round. Then the hand-off on one key: the time from a release's call to its waiter's acquire returning.
//!
//! The server is a private one the benchmark starts (`initdb` in a temporary directory, a free port, `fsync`
//! on, as in production), never the machine's own.

use std::future::Future;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::Client;
use distlock_tests::PostgresServer;
use tokio_postgres::types::Type;

use crate::measure::{median, ns32, percentile_us};
use crate::scaleout::window;

const TTL: Duration = Duration::from_secs(10);
const TASK_COUNTS: [usize; 2] = [1, 64];
/// As many sessions as a distlock client opens.
const SESSIONS: usize = 4;

type Cycle = Arc<dyn Fn(usize, u64) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

/// Sessions for the raw contenders, a call's session chosen by its key, as distlock chooses.
struct Sessions(Vec<tokio_postgres::Client>);

impl Sessions {
    async fn open(url: &str) -> Self {
        let mut sessions = Vec::with_capacity(SESSIONS);
        for _ in 0..SESSIONS {
            let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("a session");
            tokio::spawn(connection);
            sessions.push(client);
        }
        Self(sessions)
    }

    fn of(&self, key: &str) -> &tokio_postgres::Client {
        let hash = BuildHasherDefault::<DefaultHasher>::default().hash_one(key) as usize;
        &self.0[hash % self.0.len()]
    }
}

const FLOOR_TABLE: &str = "CREATE TABLE IF NOT EXISTS bench_floor (key text COLLATE \"C\" PRIMARY KEY, token text \
                           NOT NULL, expires_at timestamptz NOT NULL) WITH (fillfactor = 70)";
const FLOOR_TAKE: &str = "INSERT INTO bench_floor AS f VALUES ($1, $2, clock_timestamp() + interval '10 seconds') \
                          ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token, expires_at = EXCLUDED.expires_at \
                          WHERE f.expires_at <= clock_timestamp() RETURNING 1";
const FLOOR_GIVE: &str = "DELETE FROM bench_floor WHERE key = $1 AND token = $2";

fn floor_cycle(sessions: Arc<Sessions>) -> Cycle {
    Arc::new(move |task, n| {
        let sessions = Arc::clone(&sessions);
        Box::pin(async move {
            let key = format!("floor:{task}");
            let token = format!("{task}-{n}");
            let session = sessions.of(&key);
            let taken = session
                .query_typed(FLOOR_TAKE, &[(&key, Type::TEXT), (&token, Type::TEXT)])
                .await
                .map_err(|e| e.to_string())?;
            if taken.is_empty() {
                return Err(format!("{key} was not free"));
            }
            session
                .execute_typed(FLOOR_GIVE, &[(&key, Type::TEXT), (&token, Type::TEXT)])
                .await
                .map_err(|e| e.to_string())?;
            Ok(())
        })
    })
}

fn advisory_cycle(sessions: Arc<Sessions>) -> Cycle {
    Arc::new(move |task, _| {
        let sessions = Arc::clone(&sessions);
        Box::pin(async move {
            let key = format!("advisory:{task}");
            let session = sessions.of(&key);
            let taken = session
                .query_typed("SELECT pg_try_advisory_lock(hashtext($1))", &[(&key, Type::TEXT)])
                .await
                .map_err(|e| e.to_string())?;
            if !taken.first().is_some_and(|r| r.get::<_, bool>(0)) {
                return Err(format!("{key} was not free"));
            }
            session
                .query_typed("SELECT pg_advisory_unlock(hashtext($1))", &[(&key, Type::TEXT)])
                .await
                .map_err(|e| e.to_string())?;
            Ok(())
        })
    })
}

fn distlock_cycle(client: Client) -> Cycle {
    Arc::new(move |task, _| {
        let client = client.clone();
        Box::pin(async move {
            let guard = client.lock(format!("distlock:{task}")).ttl(TTL).acquire().await.map_err(|e| e.to_string())?;
            guard.release().await.map(|_| ()).map_err(|e| e.to_string())
        })
    })
}

/// The hand-off on one key: a holder releases while a waiter waits; the time from the release's call to the
/// waiter's acquire returning, `trials` times. Nanoseconds, sorted.
async fn hand_offs(holder: &Client, waiter: &Client, trials: usize) -> Vec<u32> {
    let mut gaps = Vec::with_capacity(trials);
    for _ in 0..trials {
        let guard = holder.lock("handoff").ttl(TTL).acquire().await.expect("holder acquires");
        let waiting = tokio::spawn({
            let waiter = waiter.clone();
            async move {
                let guard = waiter.lock("handoff").ttl(TTL).wait(Duration::from_secs(10)).acquire().await;
                (Instant::now(), guard)
            }
        });
        // Until the waiter is in line.
        while holder.lock_info("handoff").await.expect("lock_info").is_some_and(|i| i.waiting == 0) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let released = Instant::now();
        guard.release().await.expect("release");
        let (acquired, guard) = waiting.await.expect("waiter task");
        guards_release(guard.expect("the waiter gets the lock")).await;
        gaps.push(ns32(acquired.duration_since(released)));
    }
    gaps.sort_unstable();
    gaps
}

async fn guards_release(guard: distlock::LockGuard) {
    guard.release().await.expect("release");
}

/// Runs the rows and returns them as a Markdown table.
pub async fn run(server: &PostgresServer, rounds: usize, each: Duration, hand_off_trials: usize) -> String {
    let url = server.url();
    let client = Client::builder().postgres(&url).build().await.expect("distlock client");
    let other = Client::builder().postgres(&url).build().await.expect("a second distlock client");
    let sessions = Arc::new(Sessions::open(&url).await);
    sessions.0[0].batch_execute(FLOOR_TABLE).await.expect("the floor's table");
    let contenders: Vec<(&str, Cycle)> = vec![
        ("distlock", distlock_cycle(client.clone())),
        ("INSERT … ON CONFLICT + DELETE", floor_cycle(Arc::clone(&sessions))),
        ("advisory lock + unlock", advisory_cycle(Arc::clone(&sessions))),
    ];
    let mut out = String::from("| tasks | contender | cycles/s (median) | distlock ÷ this |\n|---|---|---|---|\n");
    for tasks in TASK_COUNTS {
        let mut rates: Vec<Vec<f64>> = vec![Vec::new(); contenders.len()];
        for round in 0..rounds {
            for i in 0..contenders.len() {
                let at = (i + round) % contenders.len();
                let cycle = Arc::clone(&contenders[at].1);
                let (rate, _) = window(tasks, each, move |task, n| {
                    let c = cycle(task, n);
                    async move { c.await.map(|()| 1) }
                })
                .await;
                eprintln!("  {tasks} tasks, round {round}: {} {rate:.0}/s", contenders[at].0);
                rates[at].push(rate);
            }
        }
        let medians: Vec<f64> = rates.iter().map(|r| median(r.iter().copied())).collect();
        for (i, (name, _)) in contenders.iter().enumerate() {
            let ratio = if i == 0 { "—".to_owned() } else { format!("{:.2}", medians[0] / medians[i]) };
            out.push_str(&format!("| {tasks} | {name} | {:.0} | {ratio} |\n", medians[i]));
        }
    }
    let gaps = hand_offs(&client, &other, hand_off_trials).await;
    out.push_str(&format!(
        "\nHand-off on one key (release called → waiter's acquire returns), {} trials: p50 {:.1} µs, p99 {:.1} µs\n",
        gaps.len(),
        percentile_us(&gaps, 50.0),
        percentile_us(&gaps, 99.0)
    ));
    out
}
