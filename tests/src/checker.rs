//! [`SafetyCheck`]: checks distlock's guarantees against a Redis server you name — your own, in your
//! environment — without disturbing it: it uses only keys under a fresh random name, deletes them at the
//! end, and never runs FLUSH, CONFIG, DEBUG or CLIENT commands.
//!
//! ```no_run
//! # #[tokio::main(flavor = "multi_thread")] async fn main() {
//! let report = distlock_tests::checker::SafetyCheck::new("redis://127.0.0.1:6379/").run().await;
//! println!("{report}");
//! assert!(report.passed());
//! # }
//! ```
//!
//! `cargo run -p examples --example safety_check` runs it on `$REDIS_URL`. Besides the lock commands (see
//! README's least-privilege user) it needs GET, SET, SCAN, DEL and INFO for its own bookkeeping.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use distlock::{Client, LockError, ReleaseOutcome, RetryStrategy};
use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

use crate::events::{EventLog, Kind};
use crate::store::{Counter, Store, Write};

/// One check's outcome.
#[derive(Debug, Clone)]
pub struct CheckResult {
    /// What was checked.
    pub name: &'static str,
    /// Whether the guarantee held.
    pub passed: bool,
    /// What was observed.
    pub detail: String,
    /// How long the check took.
    pub took: Duration,
}

/// Every check's outcome, and notes about the server.
#[derive(Debug, Clone, Default)]
pub struct CheckReport {
    /// The server, password redacted.
    pub server: String,
    /// Facts about the server that bear on the guarantees (eviction policy, persistence, role).
    pub notes: Vec<String>,
    /// The checks, in the order they ran.
    pub results: Vec<CheckResult>,
}

impl CheckReport {
    /// Whether every check passed.
    pub fn passed(&self) -> bool {
        !self.results.is_empty() && self.results.iter().all(|r| r.passed)
    }

    /// The failed checks.
    pub fn failures(&self) -> Vec<&CheckResult> {
        self.results.iter().filter(|r| !r.passed).collect()
    }
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "distlock safety check against {}", self.server)?;
        for note in &self.notes {
            writeln!(f, "  note: {note}")?;
        }
        for r in &self.results {
            let mark = if r.passed { "PASS" } else { "FAIL" };
            writeln!(f, "  {mark} {:<48} {:>8.1?}  {}", r.name, r.took, r.detail)?;
        }
        let failed = self.failures().len();
        write!(f, "{} passed, {} failed", self.results.len() - failed, failed)
    }
}

/// The settings of a safety check; [`run`](SafetyCheck::run) it.
#[derive(Debug, Clone)]
pub struct SafetyCheck {
    url: String,
    id: String,
    clients: usize,
    tasks: usize,
    rounds: usize,
}

impl SafetyCheck {
    /// A check of the server at `url`, with 4 clients x 8 tasks x 4 rounds of contention.
    pub fn new(url: impl Into<String>) -> Self {
        let id = format!("{:016x}", getrandom::u64().expect("OS randomness"));
        Self { url: url.into(), id, clients: 4, tasks: 8, rounds: 4 }
    }

    /// How many separate clients (connections) contend.
    pub fn clients(mut self, n: usize) -> Self {
        self.clients = n.max(1);
        self
    }

    /// How many tasks per client contend.
    pub fn tasks(mut self, n: usize) -> Self {
        self.tasks = n.max(1);
        self
    }

    /// How many lock calls each task makes.
    pub fn rounds(mut self, n: usize) -> Self {
        self.rounds = n.max(1);
        self
    }

    /// The key prefix of every lock the check takes (`distlock-safety-check:<random id>:`).
    pub fn prefix(&self) -> String {
        format!("distlock-safety-check:{}:", self.id)
    }

    async fn client(&self) -> Result<Client, LockError> {
        Client::builder().redis(self.url.as_str()).key_prefix(self.prefix()).build().await
    }

    /// Runs every check, then deletes the keys it made. A server it cannot reach gives a report with one
    /// failed check saying why.
    pub async fn run(&self) -> CheckReport {
        let mut report = CheckReport { server: redact(&self.url), ..CheckReport::default() };
        let started = Instant::now();
        let (client, mut conn) = match self.connect().await {
            Ok(pair) => pair,
            Err(e) => {
                report.results.push(CheckResult {
                    name: "connect and pass the startup probe",
                    passed: false,
                    detail: e,
                    took: started.elapsed(),
                });
                return report;
            }
        };
        report.results.push(CheckResult {
            name: "connect and pass the startup probe",
            passed: true,
            detail: String::from("PING, probe lock granted and released"),
            took: started.elapsed(),
        });
        report.notes = server_notes(&mut conn).await;

        macro_rules! check {
            ($name:literal, $fut:expr) => {
                report.results.push(timed($name, $fut).await)
            };
        }
        check!("refuses bad keys and ttls before any command", self.bad_input(&client));
        check!("mutual exclusion under contention, rising fences", self.contention(&conn));
        check!("a release wakes a waiter at once", self.wake_up(&client));
        check!("a lost lock is reported and drops the body", self.loss(&client));
        check!("a cancelled lock body releases within 200 ms", self.cancellation(&client));
        check!("a fenced store rejects the stale holder's write", self.fencing(&client, &conn));
        self.cleanup(&mut conn).await;
        report
    }

    async fn connect(&self) -> Result<(Client, MultiplexedConnection), String> {
        let client = self.client().await.map_err(|e| e.to_string())?;
        let conn = redis::Client::open(self.url.as_str())
            .map_err(|e| format!("{}: {e}", redact(&self.url)))?
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| format!("{}: {e}", redact(&self.url)))?;
        Ok((client, conn))
    }

    async fn bad_input(&self, client: &Client) -> Result<String, String> {
        for key in ["", "a\nb", &"k".repeat(1025)] {
            match client.lock(key).try_acquire().await {
                Err(LockError::InvalidKey { .. }) => {}
                other => return Err(format!("key {:?}: expected InvalidKey, got {other:?}", preview(key))),
            }
        }
        for ttl in [Duration::ZERO, Duration::from_millis(99), Duration::MAX] {
            match client.lock("ttl").ttl(ttl).try_acquire().await {
                Err(LockError::InvalidConfig(_)) => {}
                other => return Err(format!("ttl {ttl:?}: expected InvalidConfig, got {other:?}")),
            }
        }
        Ok(String::from("3 bad keys -> InvalidKey, 3 bad ttls -> InvalidConfig"))
    }

    async fn contention(&self, conn: &MultiplexedConnection) -> Result<String, String> {
        const KEY: &str = "contention";
        let wait = Duration::from_secs(60);
        let log = EventLog::new();
        let counter = Arc::new(Counter::new(Store::unfenced(conn.clone(), &format!("{}contention", self.prefix()))));
        let mut set = tokio::task::JoinSet::new();
        for c in 0..self.clients {
            let client = self.client().await.map_err(|e| e.to_string())?;
            for t in 0..self.tasks {
                let (client, log, counter, rounds) =
                    (client.clone(), Arc::clone(&log), Arc::clone(&counter), self.rounds);
                let actor = format!("c{c}t{t}");
                set.spawn(async move {
                    for _ in 0..rounds {
                        let start = Instant::now();
                        let guard = match client.lock(KEY).ttl(Duration::from_secs(10)).wait(wait).acquire().await {
                            Ok(guard) => guard,
                            Err(e) => return Err(format!("{actor}: {e} after {:?}", start.elapsed())),
                        };
                        let fence = guard.fencing_token();
                        log.record(&actor, Kind::Entered { fence });
                        counter.increment(0, Duration::from_millis(1)).await;
                        log.record(&actor, Kind::Left { fence });
                        match guard.release().await {
                            Ok(ReleaseOutcome::Released) => {}
                            other => return Err(format!("{actor}: release gave {other:?}")),
                        }
                    }
                    Ok(())
                });
            }
        }
        while let Some(done) = set.join_next().await {
            done.map_err(|e| format!("task failed: {e}"))??;
        }
        log.check_no_overlap()?;
        let lost = counter.lost_updates().await;
        if lost != 0 {
            return Err(format!("{lost} lost updates out of {}", counter.accepted()));
        }
        Ok(format!(
            "{} critical sections by {} clients x {} tasks: 0 overlaps, 0 lost updates, fences strictly rising",
            counter.accepted(),
            self.clients,
            self.tasks
        ))
    }

    async fn wake_up(&self, client: &Client) -> Result<String, String> {
        const KEY: &str = "wake-up";
        let holder = client.lock(KEY).ttl(Duration::from_secs(30)).acquire().await.map_err(|e| e.to_string())?;
        let other = self.client().await.map_err(|e| e.to_string())?;
        // Retries 20 s apart: only the release announcement can wake it within a second.
        let waiter = tokio::spawn(async move {
            other
                .lock(KEY)
                .wait(Duration::from_secs(20))
                .retry(RetryStrategy::Linear { step: Duration::from_secs(20) })
                .acquire()
                .await
        });
        // Let the waiter try once and start listening.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let released = Instant::now();
        holder.release().await.map_err(|e| e.to_string())?;
        let guard = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .map_err(|_| String::from("the waiter was not woken within 5 s"))?
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        let took = released.elapsed();
        drop(guard);
        if took > Duration::from_secs(1) {
            return Err(format!("the waiter got the lock {took:?} after the release"));
        }
        Ok(format!("waiter got the lock {took:?} after the release"))
    }

    async fn loss(&self, client: &Client) -> Result<String, String> {
        const KEY: &str = "loss";
        let ttl = Duration::from_secs(1);
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let run = tokio::spawn(client.lock(KEY).ttl(ttl).run(async move {
            let _ = started_tx.send(());
            tokio::time::sleep(Duration::from_secs(30)).await;
        }));
        started_rx.await.map_err(|_| String::from("the body never started"))?;
        let forced = Instant::now();
        if !client.force_unlock(KEY).await.map_err(|e| e.to_string())? {
            return Err(String::from("the lock was not held while its body ran"));
        }
        let result = tokio::time::timeout(ttl * 2, run)
            .await
            .map_err(|_| format!("run did not notice the loss within {:?}", ttl * 2))?
            .map_err(|e| e.to_string())?;
        let took = forced.elapsed();
        match result {
            Err(LockError::Lost { .. }) if took <= ttl => {
                Ok(format!("run returned Lost {took:?} after the record vanished"))
            }
            Err(LockError::Lost { .. }) => Err(format!("Lost only {took:?} after the record vanished (ttl {ttl:?})")),
            other => Err(format!("expected Err(Lost), got {other:?}")),
        }
    }

    async fn cancellation(&self, client: &Client) -> Result<String, String> {
        const KEY: &str = "cancel";
        let mut worst = Duration::ZERO;
        for _ in 0..20 {
            let (started_tx, started_rx) = tokio::sync::oneshot::channel();
            let task = tokio::spawn(client.lock(KEY).ttl(Duration::from_secs(30)).wait(Duration::from_secs(5)).run(
                async move {
                    let _ = started_tx.send(());
                    std::future::pending::<()>().await;
                },
            ));
            started_rx.await.map_err(|_| String::from("the body never started"))?;
            task.abort();
            let _ = task.await;
            let aborted = Instant::now();
            while client.lock_info(KEY).await.map_err(|e| e.to_string())?.is_some() {
                if aborted.elapsed() > Duration::from_millis(200) {
                    return Err(String::from("the lock was still held 200 ms after its body was cancelled"));
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            worst = worst.max(aborted.elapsed());
        }
        Ok(format!("20 cancellations, lock free at most {worst:?} after each"))
    }

    async fn fencing(&self, client: &Client, conn: &MultiplexedConnection) -> Result<String, String> {
        const KEY: &str = "fencing";
        let fenced = Store::fenced(conn.clone(), &format!("{}fenced", self.prefix()));
        let stale = client.lock(KEY).ttl(Duration::from_secs(10)).acquire().await.map_err(|e| e.to_string())?;
        // The stale holder's lease "runs out" (as during a long pause) and another holder takes over.
        client.force_unlock(KEY).await.map_err(|e| e.to_string())?;
        let other = self.client().await.map_err(|e| e.to_string())?;
        let current = other.lock(KEY).ttl(Duration::from_secs(10)).acquire().await.map_err(|e| e.to_string())?;
        if current.fencing_token() <= stale.fencing_token() {
            return Err(format!(
                "fencing token did not rise: {} then {}",
                stale.fencing_token(),
                current.fencing_token()
            ));
        }
        let (stale_fence, current_fence) = (stale.fencing_token(), current.fencing_token());
        let fresh = fenced.write(1, current_fence).await;
        let late = fenced.write(2, stale_fence).await;
        drop(stale);
        current.release().await.map_err(|e| e.to_string())?;
        match (fresh, late) {
            (Write::Accepted, Write::Rejected { .. }) if fenced.read().await == 1 => {
                Ok(format!("write with token {current_fence} accepted, stale token {stale_fence} rejected"))
            }
            other => Err(format!("expected (Accepted, Rejected), got {other:?}")),
        }
    }

    async fn cleanup(&self, conn: &mut MultiplexedConnection) {
        let pattern = format!("*{}*", self.id);
        let mut cursor: u64 = 0;
        loop {
            let scanned: redis::RedisResult<(u64, Vec<String>)> = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(conn)
                .await;
            let Ok((next, keys)) = scanned else { return };
            if !keys.is_empty() {
                let _: redis::RedisResult<i64> = redis::cmd("DEL").arg(&keys).query_async(conn).await;
            }
            if next == 0 {
                return;
            }
            cursor = next;
        }
    }
}

async fn timed(name: &'static str, check: impl Future<Output = Result<String, String>>) -> CheckResult {
    let start = Instant::now();
    let outcome = match tokio::time::timeout(Duration::from_secs(120), check).await {
        Ok(outcome) => outcome,
        Err(_) => Err(String::from("did not finish within 120 s")),
    };
    let took = start.elapsed();
    match outcome {
        Ok(detail) => CheckResult { name, passed: true, detail, took },
        Err(detail) => CheckResult { name, passed: false, detail, took },
    }
}

async fn server_notes(conn: &mut MultiplexedConnection) -> Vec<String> {
    let mut notes = Vec::new();
    let info: redis::RedisResult<String> = redis::cmd("INFO").query_async(conn).await;
    let Ok(info) = info else {
        notes.push(String::from("INFO is not allowed: eviction policy, persistence and role unknown"));
        return notes;
    };
    let field = |name: &str| info.lines().find_map(|l| l.strip_prefix(name)).map(str::trim).map(str::to_owned);
    if let Some(v) = field("redis_version:") {
        notes.push(format!("redis {v}"));
    }
    match field("maxmemory_policy:").as_deref() {
        Some("noeviction") | None => {}
        Some(policy) => notes.push(format!(
            "maxmemory-policy is {policy}: under memory pressure Redis may evict lock records (set noeviction)"
        )),
    }
    if field("aof_enabled:").as_deref() == Some("0") {
        notes.push(String::from(
            "AOF is off: a restart frees every lock at once (fencing tokens still rise: they follow the server's clock)",
        ));
    }
    if let Some(role) = field("role:") {
        if role != "master" {
            notes.push(format!("role is {role}: locks must be taken on the primary"));
        }
    }
    notes
}

fn preview(key: &str) -> String {
    key.chars().take(16).collect()
}

/// The URL with everything before its last `@` hidden (`scheme://:***@host/`), as the library shows URLs: a
/// password with an unencoded `@ / ? #` in it is hidden whole; a socket URL's `pass=` value and what follows it
/// too.
fn redact(url: &str) -> String {
    let (head, rest) = url.find("://").map_or(("", url), |i| url.split_at(i + 3));
    let mut shown = match rest.rfind('@') {
        Some(at) => format!("{head}:***{}", &rest[at..]),
        None => url.to_owned(),
    };
    if let Some(at) = shown.find("?pass=").or_else(|| shown.find("&pass=")) {
        shown.replace_range(at + 6.., "***");
    }
    shown
}
