//! [`Fixture`]: one backend (a private Redis server, or the in-process store) with a client on it, so
//! that one behaviour suite runs against both.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use distlock::{Client, LockError, LockGuard};
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;
use tokio::time::Instant;

use crate::RedisServer;

/// Which backend a [`Fixture`] runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A private `redis-server` process.
    Redis,
    /// `ClientBuilder::memory()`.
    Memory,
}

/// A backend with a connected client.
#[derive(Debug)]
pub struct Fixture {
    backend: Backend,
    client: Client,
    redis: Option<(RedisServer, MultiplexedConnection)>,
}

impl Fixture {
    /// A fresh `redis-server` and a client on it.
    pub async fn redis() -> Self {
        let server = RedisServer::new();
        let client = Client::builder()
            .redis(server.url())
            .build()
            .await
            .unwrap_or_else(|e| panic!("client for {}: {e}", server.url()));
        let conn = server.connection().await;
        Fixture { backend: Backend::Redis, client, redis: Some((server, conn)) }
    }

    /// A fresh in-process backend and a client on it.
    pub async fn memory() -> Self {
        let client = Client::builder().memory().build().await.expect("memory client");
        Fixture { backend: Backend::Memory, client, redis: None }
    }

    /// Which backend this is.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The fixture's main client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Another client on the same backend: a separately built one (its own connections) on Redis; on the
    /// in-process backend, which is one store per built client, a clone.
    pub async fn other_client(&self) -> Client {
        match &self.redis {
            Some((server, _)) => Client::builder()
                .redis(server.url())
                .build()
                .await
                .unwrap_or_else(|e| panic!("client for {}: {e}", server.url())),
            None => self.client.clone(),
        }
    }

    /// The Redis server, on the Redis backend.
    pub fn server(&self) -> Option<&RedisServer> {
        self.redis.as_ref().map(|(s, _)| s)
    }

    /// The Redis server, mutably (to kill or restart it), on the Redis backend.
    pub fn server_mut(&mut self) -> Option<&mut RedisServer> {
        self.redis.as_mut().map(|(s, _)| s)
    }

    /// A raw connection to the Redis server, on the Redis backend.
    pub fn redis_connection(&self) -> Option<MultiplexedConnection> {
        self.redis.as_ref().map(|(_, c)| c.clone())
    }

    /// A counter outside the lock library: a Redis key, or a value in this process.
    pub fn counter(&self, name: &str) -> Counter {
        match &self.redis {
            Some((_, conn)) => Counter::Redis { conn: conn.clone(), key: format!("test:counter:{name}") },
            None => Counter::Memory(Arc::new(Mutex::new(0))),
        }
    }

    /// Makes the lock record of `key` disappear behind its holder's back, as if its lease had run out or an
    /// operator had deleted it. Redis: `DEL` of `client.record_key(key)` on a raw connection (no release
    /// announcement). Memory: the client's forced unlock.
    pub async fn vanish_record(&self, key: &str) {
        match &self.redis {
            Some((_, conn)) => {
                let mut conn = conn.clone();
                let record = self.client.record_key(key);
                let deleted: i64 = conn.del(&record).await.expect("DEL record");
                assert_eq!(deleted, 1, "record {record} of lock {key:?} was not there");
            }
            None => {
                let existed = self.client.force_unlock(key).await.expect("memory force_unlock");
                assert!(existed, "lock {key:?} was not held");
            }
        }
    }
}

/// A counter that is read and written in two separate steps, so that concurrent read-modify-writes lose
/// updates unless something serialises them.
#[derive(Debug, Clone)]
pub enum Counter {
    /// `GET` / `SET` of a Redis key.
    Redis {
        /// The connection.
        conn: MultiplexedConnection,
        /// The key.
        key: String,
    },
    /// A value in this process.
    Memory(Arc<Mutex<i64>>),
}

impl Counter {
    /// Reads the value (0 when unset).
    pub async fn get(&self) -> i64 {
        match self {
            Counter::Redis { conn, key } => {
                let v: Option<i64> = conn.clone().get(key).await.expect("GET counter");
                v.unwrap_or(0)
            }
            Counter::Memory(v) => *v.lock().unwrap_or_else(PoisonError::into_inner),
        }
    }

    /// Writes the value.
    pub async fn set(&self, value: i64) {
        match self {
            Counter::Redis { conn, key } => {
                let _: () = conn.clone().set(key, value).await.expect("SET counter");
            }
            Counter::Memory(v) => *v.lock().unwrap_or_else(PoisonError::into_inner) = value,
        }
    }

    /// A deliberately racy increment: read, pause, write.
    pub async fn racy_increment(&self, pause: Duration) {
        let v = self.get().await;
        tokio::time::sleep(pause).await;
        self.set(v + 1).await;
    }
}

/// Awaits `fut`, panicking with `what` if it takes longer than `limit`.
pub async fn within<F: Future>(limit: Duration, what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {limit:?}: {what}"),
    }
}

/// Takes a lock with a client that is reconnecting after a fault (a restart, a killed connection): calls
/// `acquire` again every 50 ms while it fails with a backend error and less than `grace` has passed since
/// `since` (when the fault ended); any other error, a backend error after that, or no answer within `grace`
/// plus 10 s, fails the test.
pub async fn acquire_after_recovery<F, Fut>(since: Instant, grace: Duration, mut acquire: F) -> LockGuard
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<LockGuard, LockError>>,
{
    let retrying = async {
        loop {
            match acquire().await {
                Ok(guard) => break guard,
                Err(LockError::Backend(e)) if since.elapsed() < grace => {
                    eprintln!("not reconnected yet: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("cannot lock {:?} after the fault: {e}", since.elapsed()),
            }
        }
    };
    within(grace + Duration::from_secs(10), "a lock after the fault", retrying).await
}

/// Polls `cond` every 10 ms until it is true, panicking with `what` after `limit`.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    while !cond().await {
        if tokio::time::Instant::now() >= deadline {
            panic!("not true after {limit:?}: {what}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether someone outside any lock body (a freshly spawned task) fails to take `key` at once.
/// If it does get the lock, that is a test failure anyway, so the guard is just dropped.
pub async fn busy_for_outsiders(client: &Client, key: &str) -> bool {
    let client = client.clone();
    let key = key.to_owned();
    tokio::spawn(async move { client.lock(key).try_acquire().await })
        .await
        .expect("outsider task")
        .expect("outsider try_acquire")
        .is_none()
}
