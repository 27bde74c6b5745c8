//! Test support for distlock: a real `redis-server` per test ([`RedisServer`]; a real PostgreSQL server:
//! [`PostgresServer`], also one whose wall clock the
//! test steps: [`RedisServer::with_stepped_clock`]), a [`Fixture`] that runs one behaviour suite against both
//! backends, and the fault-injection harness: a TCP [`proxy`], process signals ([`sys`]), a lock holder in
//! another process ([`agent`]), event logs and an overlap checker ([`events`]), a fenced store and a lost-update
//! counter ([`store`]), `MONITOR` recording ([`monitor`]), captured `tracing` output ([`logs`]), held locks'
//! renewals watched from outside ([`renewals`]), a client runtime to freeze ([`stall`]), the [`checker`] users
//! can run against their own Redis, and the randomized fault [`soak`]'s event log and history checker, and [`wall_clock`], which runs a
//! scenario again when the machine's wall clock stepped while it failed.

pub mod agent;
pub mod checker;
mod clock;
pub mod cluster;
pub mod events;
mod fixture;
pub mod logs;
pub mod monitor;
mod pgbouncer;
mod postgres;
pub mod proxy;
pub mod redlock;
pub mod renewals;
pub mod sentinel;
mod server;
#[cfg(feature = "engine-test-features")]
pub mod sim_keyspace;
#[cfg(feature = "engine-test-features")]
pub mod simulation;
pub mod soak;
pub mod stall;
pub mod store;
pub mod sys;
pub mod wall_clock;

pub use fixture::{
    acquire_after_recovery, busy_for_outsiders, eventually, within, Backend, Counter, Fixture, RawConnection,
};

/// What a released lock leaves in its Redis record, for the rest of its lease: FREED written over the first half
/// of the holder's token, `<FREED><token's second half><mark><last fencing token>:…` (the README's "What is
/// stored in Redis"). A lock whose record is gone or freed is free.
pub const FREED: &str = "================";

/// A freed record as a release leaves it, with `fence` as its last token (and no real token's second half).
pub fn freed_record(fence: u64) -> String {
    format!("{FREED}{}:{fence}", "=".repeat(FREED.len()))
}

/// The last fencing token a freed record keeps, or `None` when `value` is not a freed record.
pub fn freed_fence(value: &str) -> Option<u64> {
    let fields = value.strip_prefix(FREED)?.get(FREED.len() + 1..)?;
    fields.split(':').next()?.parse().ok()
}

/// Whether the lock whose record is `record` is free on the server behind `conn`: no record, or a freed one.
pub async fn record_is_free(conn: &mut impl redis::aio::ConnectionLike, record: &str) -> bool {
    let value: Option<Vec<u8>> = redis::cmd("GET").arg(record).query_async(conn).await.expect("GET");
    value.is_none_or(|v| v.starts_with(FREED.as_bytes()))
}

/// Short names for the durations tests are full of.
pub mod time {
    use std::time::Duration;

    /// `n` milliseconds.
    pub const fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// `n` seconds.
    pub const fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    /// The engine's drift allowance (README, S6): ttl·1% + 2 ms.
    pub fn drift(ttl: Duration) -> Duration {
        ttl / 100 + ms(2)
    }
}

/// Runs each named `async fn(Fixture)` as three tests, `with_redis::NAME` on a private redis-server,
/// `with_memory::NAME` on the in-process backend and `with_postgres::NAME` on the test binary's shared
/// PostgreSQL server, so one behaviour suite covers each store.
#[macro_export]
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        $crate::backend_tests!(with_redis, redis, $($name),*);
        $crate::backend_tests!(with_memory, memory, $($name),*);
        $crate::backend_tests!(with_postgres, postgres, $($name),*);
    };
}

/// As [`both_backends!`], and `with_cluster::NAME` and `with_sentinel::NAME` on the test binary's shared Redis
/// Cluster and Sentinel group: for scenarios
/// written against the client's API alone (no server process to stop, no `MONITOR`).
#[macro_export]
macro_rules! all_backends {
    ($($name:ident),* $(,)?) => {
        $crate::both_backends!($($name),*);
        $crate::backend_tests!(with_cluster, cluster, $($name),*);
        $crate::backend_tests!(with_sentinel, sentinel, $($name),*);
    };
}

/// As [`all_backends!`], and `with_redlock::NAME` on three private servers under Redlock for the scenarios
/// before `; not_on_redlock:`. Redlock has neither a fair queue nor release wake-ups (queue.rs stays on
/// [`all_backends!`]) nor fencing tokens: scenarios on it check tokens only where
/// [`Fixture::gives_fencing_tokens`].
#[macro_export]
macro_rules! all_backends_and_redlock {
    ($($name:ident),* $(,)? $(; not_on_redlock: $($other:ident),* $(,)?)?) => {
        $crate::all_backends!($($name,)* $($($other),*)?);
        $crate::backend_tests!(with_redlock, redlock, $($name),*);
    };
}

/// One module of tests, each running its scenario on `Fixture::$fixture()`.
#[doc(hidden)]
#[macro_export]
macro_rules! backend_tests {
    ($module:ident, $fixture:ident, $($name:ident),*) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    $crate::wall_clock::again_if_the_wall_clock_stepped(|| async {
                        super::$name($crate::Fixture::$fixture().await).await
                    })
                    .await
                }
            )*
        }
    };
}
pub use clock::NO_C_COMPILER;
pub use pgbouncer::{PgBouncer, PGBOUNCER_INSTALL_HINT};
pub use postgres::{PostgresServer, POSTGRES_INSTALL_HINT};
pub use server::{free_port, RedisServer, INSTALL_HINT};

/// Serializes the timing-sensitive tests of one test binary: hold the guard for the whole test. Tests of
/// one binary otherwise run in parallel, and on a 2-core machine one test's load can delay another's
/// timers by more than the margins those tests check.
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

/// A raw connection to the server at `url` with the given response timeout (`None`: wait forever), for
/// commands that block the server on purpose (`DEBUG SLEEP`, a busy script).
pub async fn raw_connection(
    url: &str,
    response_timeout: Option<std::time::Duration>,
) -> redis::aio::MultiplexedConnection {
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(response_timeout);
    redis::Client::open(url)
        .unwrap_or_else(|e| panic!("bad url {url}: {e}"))
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"))
}
