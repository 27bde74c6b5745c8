//! Fencing: storage that rejects writes from a holder whose lock has moved on.
//!
//! ```text
//! cargo run -p examples --example fenced_store                                   # in-process backend
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run -p examples --example fenced_store  # a real Redis
//! ```
//!
//! A lease cannot stop a holder that paused (GC, swap, SIGSTOP) past its lease from writing after it woke up:
//! by then another holder has the lock. The fencing token can: every grant of a key gets a higher token than
//! every earlier grant of that key, also after Redis restarted without persistence or was flushed. The store
//! keeps the highest token it has accepted per row and refuses a write carrying a lower one, in the same
//! statement that writes, so the check and the write cannot be separated.

use std::time::Duration;

use distlock::{Client, LockError};
use rusqlite::{params, Connection};

/// Reports in SQLite, each row guarded by the highest fencing token that wrote it.
#[derive(Debug)]
struct FencedStore {
    db: Connection,
}

impl FencedStore {
    fn open_in_memory() -> rusqlite::Result<Self> {
        let db = Connection::open_in_memory()?;
        db.execute_batch("CREATE TABLE reports (id INTEGER PRIMARY KEY, body TEXT NOT NULL, fence INTEGER NOT NULL)")?;
        Ok(Self { db })
    }

    /// Writes `body` for `id` unless a writer with a higher or equal token already wrote it; whether the write
    /// was accepted.
    fn write(&self, id: u64, body: &str, fence: u64) -> rusqlite::Result<bool> {
        // SQLite integers are i64; tokens stay below 2^53.
        let fence = i64::try_from(fence).expect("fencing tokens stay below 2^53");
        let changed = self.db.execute(
            "INSERT INTO reports (id, body, fence) VALUES (?1, ?2, ?3)
             ON CONFLICT (id) DO UPDATE SET body = excluded.body, fence = excluded.fence
             WHERE excluded.fence > reports.fence",
            params![id as i64, body, fence],
        )?;
        Ok(changed == 1)
    }

    fn read(&self, id: u64) -> rusqlite::Result<(String, u64)> {
        self.db.query_row("SELECT body, fence FROM reports WHERE id = ?1", params![id as i64], |row| {
            Ok((row.get(0)?, row.get::<_, i64>(1)? as u64))
        })
    }
}

/// Builds report `id` under its lock and stores it with the lock's fencing token.
async fn build_report(client: &Client, store: &FencedStore, id: u64, by: &str) -> Result<bool, LockError> {
    let request = client.lock(format!("report:{id}")).ttl(Duration::from_secs(10)).wait(Duration::from_secs(5));
    let guard = request.acquire().await?;
    let accepted = store.write(id, &format!("report {id} by {by}"), guard.fencing_token()).expect("sqlite");
    guard.release().await?;
    Ok(accepted)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let builder = match std::env::var("REDIS_URL") {
        Ok(url) => {
            println!("using Redis at {}", url.split('@').next_back().unwrap_or_default());
            Client::builder().redis(url)
        }
        Err(_) => {
            println!("REDIS_URL not set: using the in-process backend");
            Client::builder().memory()
        }
    };
    let client = builder.build().await?;
    let store = FencedStore::open_in_memory()?;

    // A holder takes the lock and then stalls: its renewals stop (`max_hold` stands in for the pause here),
    // its lease runs out, and another holder builds the report.
    let stalled =
        client.lock("report:7").ttl(Duration::from_millis(200)).max_hold(Duration::from_millis(1)).acquire().await?;
    stalled.lost().await;
    assert!(build_report(&client, &store, 7, "the new holder").await?);
    // The stalled holder wakes up and, without looking at its guard, writes with its old token: refused.
    let stale_token = stalled.fencing_token();
    let accepted = store.write(7, "report 7 by the paused holder", stale_token)?;
    let (body, fence) = store.read(7)?;
    println!("paused holder's write (token {stale_token}) accepted: {accepted}");
    println!("stored: {body:?} under token {fence}");
    assert!(!accepted);
    Ok(())
}

#[cfg(test)]
mod tests {
    use distlock_tests::RedisServer;

    use super::*;

    /// The pattern survives Redis losing all its state: after a restart without persistence, the next
    /// holder's token is still above the last one the store accepted, so its write goes through, and a
    /// holder from before the restart is still refused.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_go_on_after_a_redis_restart_and_stale_ones_are_refused() {
        let mut server = RedisServer::new();
        let client = Client::builder().redis(server.url()).build().await.expect("client");
        let store = FencedStore::open_in_memory().expect("sqlite");
        assert!(build_report(&client, &store, 1, "first").await.unwrap());
        // Held across the restart: it still believes in its lock until its next renewal finds it gone.
        let before_restart = client.lock("report:1").acquire().await.unwrap();
        let old_token = before_restart.fencing_token();

        server.restart();
        assert!(build_report(&client, &store, 1, "after restart").await.unwrap(), "a fresh holder was refused");
        assert_eq!(store.read(1).unwrap().0, "report 1 by after restart");
        assert!(!store.write(1, "stale", old_token).unwrap(), "a holder from before the restart wrote");
        drop(before_restart);
    }

    #[test]
    fn the_store_refuses_equal_and_lower_tokens() {
        let store = FencedStore::open_in_memory().unwrap();
        assert!(store.write(1, "a", 10).unwrap());
        assert!(!store.write(1, "b", 10).unwrap());
        assert!(!store.write(1, "c", 9).unwrap());
        assert!(store.write(1, "d", 11).unwrap());
        assert_eq!(store.read(1).unwrap(), ("d".to_owned(), 11));
    }
}
