//! Fenced writes: a SQLite database that refuses the write of a worker that paused past its lease.
//!
//! ```text
//! cargo run -p examples --example fenced_writes                                   # in-process backend
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run -p examples --example fenced_writes  # a real Redis
//! ```
//!
//! A lease cannot stop a worker that paused (a GC pause, swap, SIGSTOP) past its lease from writing once it
//! wakes up: by then another worker holds the lock and has written. The fencing token can: every grant of a
//! key gets a higher token than every earlier grant of that key, also after Redis restarted without
//! persistence or was flushed. Each row keeps the token of its last write, and the write itself says
//! `UPDATE ... WHERE fence < ?`, so the check and the write cannot be separated.
//!
//! Here worker A takes the lock on account 7, reads the balance and then pauses on purpose: its thread and
//! everything on it, the watchdog that renews the lease included, stop for three times the lease. Worker B
//! waits for the lock, gets it when A's lease has run out, and adds 50. A wakes up, adds 10 to the balance it
//! read before the pause and writes with its old token: refused. Without the fence, B's deposit would be lost.

use std::path::{Path, PathBuf};
use std::time::Duration;

use distlock::Client;
use rusqlite::{params, Connection};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Worker A's lease; it pauses for three times as long.
const LEASE: Duration = Duration::from_millis(500);
const PAUSE: Duration = Duration::from_millis(1500);
const ACCOUNT: i64 = 7;

/// Accounts in SQLite; each row keeps the fencing token of the write that last changed it.
#[derive(Debug)]
struct Ledger {
    db: Connection,
}

impl Ledger {
    /// Opens the database at `path`, creating the table and account [`ACCOUNT`] (balance 100) if missing.
    fn open(path: &Path) -> rusqlite::Result<Self> {
        let db = Connection::open(path)?;
        db.execute_batch(
            "CREATE TABLE IF NOT EXISTS accounts (
                 id INTEGER PRIMARY KEY, balance INTEGER NOT NULL, fence INTEGER NOT NULL DEFAULT 0)",
        )?;
        db.execute("INSERT OR IGNORE INTO accounts (id, balance) VALUES (?1, 100)", params![ACCOUNT])?;
        Ok(Self { db })
    }

    /// The balance and the token of the last accepted write.
    fn read(&self, id: i64) -> rusqlite::Result<(i64, u64)> {
        self.db.query_row("SELECT balance, fence FROM accounts WHERE id = ?1", params![id], |row| {
            Ok((row.get(0)?, row.get::<_, i64>(1)? as u64))
        })
    }

    /// Sets the balance unless a write with this or a higher token came first; whether it was accepted.
    fn write(&self, id: i64, balance: i64, fence: u64) -> rusqlite::Result<bool> {
        // SQLite integers are i64; tokens stay below 2^53.
        let fence = i64::try_from(fence).expect("fencing tokens stay below 2^53");
        let changed = self.db.execute(
            "UPDATE accounts SET balance = ?2, fence = ?3 WHERE id = ?1 AND fence < ?3",
            params![id, balance, fence],
        )?;
        Ok(changed == 1)
    }
}

/// Where the workers' locks live: each worker connects on its own to Redis, as separate processes would; the
/// in-process store can only be shared through one client.
#[derive(Debug, Clone)]
enum Locks {
    Redis(String),
    Memory(Client),
}

impl Locks {
    async fn client(&self) -> Result<Client, Error> {
        Ok(match self {
            Locks::Redis(url) => Client::builder().redis(url.clone()).key_prefix("distlock-example:").build().await?,
            Locks::Memory(client) => client.clone(),
        })
    }
}

/// What happened to each worker's write.
#[derive(Debug)]
struct Outcome {
    paused: Write,
    other: Write,
    /// The balance and fence in the database at the end.
    stored: (i64, u64),
}

#[derive(Debug, Clone, Copy)]
struct Write {
    fence: u64,
    accepted: bool,
}

/// Worker A: takes the lock, reads, pauses past its lease, writes with its stale token. Runs on a thread and
/// runtime of its own, which the pause stops as a GC pause or SIGSTOP would stop a process. (On the
/// in-process backend the shared client's watchdog runs on the runtime that first took a lock, this one, so
/// the pause stops its renewals too.)
fn paused_worker(locks: Locks, db: PathBuf, holding: tokio::sync::oneshot::Sender<()>) -> Result<Write, Error> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let client = locks.client().await?;
        let ledger = Ledger::open(&db)?;
        let guard = client.lock(format!("account:{ACCOUNT}")).ttl(LEASE).acquire().await?;
        let (balance, _) = ledger.read(ACCOUNT)?;
        println!("worker A: holds the lock (token {}), read balance {balance}, pauses", guard.fencing_token());
        let _ = holding.send(());
        std::thread::sleep(PAUSE); // the pause: nothing on this thread runs, renewals included
        let fence = guard.fencing_token();
        let accepted = ledger.write(ACCOUNT, balance + 10, fence)?;
        println!("worker A: woke up and wrote balance {} with token {fence}: accepted = {accepted}", balance + 10);
        // By token: it cannot touch B's grant. It finds the lock long gone.
        println!("worker A: gives the lock back: {:?}", guard.release().await?);
        Ok(Write { fence, accepted })
    })
}

/// Worker B: once A holds the lock, waits for it, and deposits 50 under it.
async fn other_worker(locks: &Locks, db: &Path) -> Result<Write, Error> {
    let client = locks.client().await?;
    let ledger = Ledger::open(db)?;
    let guard =
        client.lock(format!("account:{ACCOUNT}")).ttl(Duration::from_secs(10)).wait(PAUSE * 4).acquire().await?;
    let (balance, _) = ledger.read(ACCOUNT)?;
    let fence = guard.fencing_token();
    let accepted = ledger.write(ACCOUNT, balance + 50, fence)?;
    println!("worker B: got the lock after A's lease ran out, wrote balance {} with token {fence}", balance + 50);
    guard.release().await?;
    Ok(Write { fence, accepted })
}

/// Runs both workers on a fresh database at `db` and reports what was written.
fn paused_worker_against(locks: Locks, db: &Path) -> Result<Outcome, Error> {
    let _ = std::fs::remove_file(db);
    let (holding, held) = tokio::sync::oneshot::channel();
    let paused = std::thread::spawn({
        let (locks, db) = (locks.clone(), db.to_owned());
        move || paused_worker(locks, db, holding)
    });
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let other = runtime.block_on(async {
        held.await.map_err(|_| "worker A failed before it held the lock")?;
        other_worker(&locks, db).await
    });
    let paused = paused.join().map_err(|_| "worker A panicked")??;
    let stored = Ledger::open(db)?.read(ACCOUNT)?;
    let _ = std::fs::remove_file(db);
    Ok(Outcome { paused, other: other?, stored })
}

fn main() -> Result<(), Error> {
    let locks = match std::env::var("REDIS_URL") {
        Ok(url) => {
            println!("using Redis at {}", url.split('@').next_back().unwrap_or_default());
            Locks::Redis(url)
        }
        Err(_) => {
            println!("REDIS_URL not set: using the in-process backend (both workers share one client)");
            let runtime = tokio::runtime::Builder::new_current_thread().build()?;
            Locks::Memory(runtime.block_on(Client::builder().memory().build())?)
        }
    };
    let db = std::env::temp_dir().join(format!("distlock-fenced-writes-{}.sqlite", std::process::id()));
    let outcome = paused_worker_against(locks, &db)?;
    println!("stored: balance {} under token {}", outcome.stored.0, outcome.stored.1);
    if outcome.paused.accepted || !outcome.other.accepted || outcome.stored != (150, outcome.other.fence) {
        return Err(format!("expected A's stale write refused and B's deposit kept: {outcome:?}").into());
    }
    println!("the paused worker's stale write was refused; B's deposit is kept");
    Ok(())
}

#[cfg(test)]
mod tests {
    use distlock_tests::RedisServer;

    use super::*;

    fn db_path(test: &str) -> PathBuf {
        std::env::temp_dir().join(format!("distlock-fenced-writes-{}-{test}.sqlite", std::process::id()))
    }

    fn assert_stale_write_refused(outcome: &Outcome) {
        assert!(!outcome.paused.accepted, "the paused worker's write went through: {outcome:?}");
        assert!(outcome.other.accepted && outcome.other.fence > outcome.paused.fence, "{outcome:?}");
        assert_eq!(outcome.stored, (150, outcome.other.fence), "B's deposit is what is stored");
    }

    #[test]
    fn a_paused_worker_s_write_is_refused_on_the_in_process_backend() {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let client = runtime.block_on(Client::builder().memory().build()).unwrap();
        let outcome = paused_worker_against(Locks::Memory(client), &db_path("memory")).unwrap();
        assert_stale_write_refused(&outcome);
    }

    #[test]
    fn a_paused_worker_s_write_is_refused_on_redis() {
        let server = RedisServer::new();
        let outcome = paused_worker_against(Locks::Redis(server.url()), &db_path("redis")).unwrap();
        assert_stale_write_refused(&outcome);
    }

    /// The pattern survives Redis losing all its state: after a restart without persistence, the next
    /// holder's token is still above the last one the database accepted, so its write goes through, and a
    /// holder from before the restart is still refused.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_go_on_after_a_redis_restart_and_stale_ones_are_refused() {
        let mut server = RedisServer::new();
        let client = Client::builder().redis(server.url()).build().await.expect("client");
        let db = db_path("restart");
        let _ = std::fs::remove_file(&db);
        let ledger = Ledger::open(&db).expect("sqlite");
        let first = client.lock("account:7").acquire().await.unwrap();
        assert!(ledger.write(ACCOUNT, 110, first.fencing_token()).unwrap());
        // Held across the restart: it still believes in its lock until its next renewal finds it gone.
        let old_token = first.fencing_token();

        server.restart();
        let after = distlock_tests::acquire_after_recovery(
            tokio::time::Instant::now() + Duration::from_secs(10),
            "a lock after the restart",
            || client.lock("account:7"),
        )
        .await;
        assert!(ledger.write(ACCOUNT, 120, after.fencing_token()).unwrap(), "a fresh holder was refused");
        assert!(!ledger.write(ACCOUNT, 999, old_token).unwrap(), "a holder from before the restart wrote");
        assert_eq!(ledger.read(ACCOUNT).unwrap(), (120, after.fencing_token()));
        drop((first, after));
        let _ = std::fs::remove_file(&db);
    }

    #[test]
    fn the_ledger_refuses_equal_and_lower_tokens() {
        let db = db_path("tokens");
        let _ = std::fs::remove_file(&db);
        let ledger = Ledger::open(&db).unwrap();
        assert!(ledger.write(ACCOUNT, 1, 10).unwrap());
        assert!(!ledger.write(ACCOUNT, 2, 10).unwrap());
        assert!(!ledger.write(ACCOUNT, 3, 9).unwrap());
        assert!(ledger.write(ACCOUNT, 4, 11).unwrap());
        assert_eq!(ledger.read(ACCOUNT).unwrap(), (4, 11));
        let _ = std::fs::remove_file(&db);
    }
}
