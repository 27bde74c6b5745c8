//! The store's sessions: a few per client, each carrying many calls at once (tokio-postgres pipelines
//! concurrent queries on one connection, as Redis multiplexing does), each made again when it drops or stops
//! answering; and PostgreSQL's errors as [`BackendError`]s.
//!
//! One session runs its statements one after the other, each commit waiting for its WAL flush; several let
//! the server flush their commits together. A lock's calls always take the same session, so they reach the
//! server in the order they were sent, as on Redis's one connection.

use std::future::Future;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio_postgres::error::SqlState;
use tokio_postgres::{Client as PgClient, NoTls};

use crate::backend::Timeouts;
use crate::error::{BackendError, BackendErrorKind};
use crate::LockError;

/// The store's name in messages.
pub(super) const STORE: &str = "postgres";

/// How many sessions a client opens (each on its first use).
const SESSIONS: usize = 4;

pub(super) struct Connection {
    config: tokio_postgres::Config,
    /// The server as messages name it: never the password.
    pub(super) server: Arc<str>,
    pub(super) timeouts: Timeouts,
    sessions: [Session; SESSIONS],
    /// Where the next call about no lock in particular goes.
    next: AtomicUsize,
}

#[derive(Default)]
struct Session {
    current: Mutex<Option<Arc<PgClient>>>,
    /// One reconnection at a time: the calls that find the session gone wait for it.
    reconnecting: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection").field("server", &self.server).finish_non_exhaustive()
    }
}

impl Connection {
    pub(super) fn new(config: tokio_postgres::Config, timeouts: Timeouts) -> Self {
        let server = describe(&config).into();
        Self { config, server, timeouts, sessions: Default::default(), next: AtomicUsize::new(0) }
    }

    /// A new session of its own (the listener's), within the connect timeout.
    pub(super) async fn open(
        &self,
    ) -> Result<
        (PgClient, tokio_postgres::Connection<tokio_postgres::Socket, tokio_postgres::tls::NoTlsStream>),
        BackendError,
    > {
        match tokio::time::timeout(self.timeouts.connect, self.config.connect(NoTls)).await {
            Ok(Ok(pair)) => Ok(pair),
            Ok(Err(e)) => Err(pg_error(&self.server, None, e)),
            Err(_) => Err(self.timeout(None, "connecting took longer than the connect timeout", "connect_timeout")),
        }
    }

    /// The session for the lock `key` (any, for none), opened again if it dropped.
    async fn client(&self, key: Option<&str>) -> Result<(&Session, Arc<PgClient>), BackendError> {
        let index = match key {
            Some(key) => BuildHasherDefault::<DefaultHasher>::default().hash_one(key) as usize,
            None => self.next.fetch_add(1, Ordering::Relaxed),
        };
        let session = &self.sessions[index % SESSIONS];
        if let Some(client) = session.live() {
            return Ok((session, client));
        }
        let _one = session.reconnecting.lock().await;
        if let Some(client) = session.live() {
            return Ok((session, client));
        }
        let (client, connection) = self.open().await?;
        // The connection's I/O runs on its own task until the session ends (the last handle to it is dropped,
        // or the server goes away).
        tokio::spawn(async move {
            let _ = connection.await;
        });
        let client = Arc::new(client);
        *session.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::clone(&client));
        Ok((session, client))
    }

    /// Runs one statement (`call`) on the lock `key`'s session within the response timeout.
    /// A statement that timed out may still commit (its reply is unknown, as on Redis); its session is
    /// dropped, so that the calls after it do not queue behind a server that stopped answering.
    pub(super) async fn call<T, F, Fut>(&self, key: Option<&str>, call: F) -> Result<T, LockError>
    where
        F: FnOnce(Arc<PgClient>) -> Fut,
        Fut: Future<Output = Result<T, tokio_postgres::Error>>,
    {
        let (session, client) = self.client(key).await.map_err(|e| e.for_key(key))?;
        match tokio::time::timeout(self.timeouts.response, call(Arc::clone(&client))).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(e)) => {
                if e.is_closed() || e.code().is_none() {
                    session.discard(&client);
                }
                Err(pg_error(&self.server, key, e).into())
            }
            Err(_) => {
                session.discard(&client);
                Err(self.timeout(key, "no reply within the response timeout", "response_timeout").into())
            }
        }
    }

    /// No answer in time: `what` did not finish within the timeout `setting` sets.
    pub(super) fn timeout(&self, key: Option<&str>, what: &str, setting: &str) -> BackendError {
        let hint = format!("check that the server is up and not overloaded, or raise ClientBuilder::{setting}");
        BackendError::new(STORE, &self.server, BackendErrorKind::Timeout, hint, what.to_owned()).for_key(key)
    }

    /// An error of distlock's own about this server (a reply it did not expect, a setting it refuses).
    pub(super) fn refused(&self, kind: BackendErrorKind, what: String, hint: &str) -> LockError {
        BackendError::new(STORE, &self.server, kind, hint.into(), what).into()
    }
}

impl Session {
    fn live(&self) -> Option<Arc<PgClient>> {
        let current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        current.as_ref().filter(|c| !c.is_closed()).cloned()
    }

    /// Forgets `client` (if it is still this session's): the next call opens a new one. Calls still in flight
    /// on it keep it until they end.
    fn discard(&self, client: &Arc<PgClient>) {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, client)) {
            *current = None;
        }
    }
}

/// `postgres://USER@HOST:PORT/DBNAME` from the parsed settings: the password is never part of it.
pub(super) fn describe(config: &tokio_postgres::Config) -> String {
    let user = config.get_user().map(|u| format!("{u}@")).unwrap_or_default();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let port = config.get_ports().get(i).or(config.get_ports().first()).copied().unwrap_or(5432);
            match host {
                tokio_postgres::config::Host::Tcp(name) => format!("{name}:{port}"),
                tokio_postgres::config::Host::Unix(path) => format!("{}:{port}", path.display()),
            }
        })
        .collect();
    let db = config.get_dbname().unwrap_or("");
    format!("postgres://{user}{}/{db}", hosts.join(","))
}

/// A failed call to `server`, about the lock `key` if any: its kind and what to do, read from the error.
pub(super) fn pg_error(server: &str, key: Option<&str>, e: tokio_postgres::Error) -> BackendError {
    let (kind, hint) = kind_and_hint(&e);
    BackendError::new(STORE, server, kind, hint.into(), e).for_key(key)
}

fn kind_and_hint(e: &tokio_postgres::Error) -> (BackendErrorKind, &'static str) {
    use BackendErrorKind::{Protocol, Refused, Timeout, Unreachable};
    const DOWN: &str = "could not reach the server: check that PostgreSQL is running and the URL (host, port, \
                        database) is right";
    let Some(code) = e.code() else {
        let text = e.to_string();
        return if e.is_closed() || text.starts_with("error communicating") || text.starts_with("error connecting") {
            (Unreachable, DOWN)
        } else if text.starts_with("timeout") {
            (Timeout, "the server did not answer in time: check that it is up, or raise ClientBuilder::connect_timeout")
        } else if text.starts_with("authentication") || text.starts_with("invalid") {
            (Refused, "check the URL's user and password (postgres://USER:PASSWORD@HOST:PORT/DBNAME)")
        } else {
            (Protocol, "the server's answer was not PostgreSQL's as distlock knows it: check the URL's port")
        };
    };
    match code.code() {
        // Connection exceptions, the server shutting down or starting up, out of connections.
        c if c.starts_with("08") || c.starts_with("57P") || c == "53300" => (Unreachable, DOWN),
        c if c == SqlState::LOCK_NOT_AVAILABLE.code() || c == SqlState::QUERY_CANCELED.code() => {
            (Timeout, "a statement waited too long (lock_timeout or statement_timeout): the server is overloaded")
        }
        // A serialization failure or deadlock is the server's choice of a victim: the next attempt may pass.
        c if c.starts_with("40") => (Unreachable, "the server aborted the statement; it is tried again"),
        c if c.starts_with("28") => (
            Refused,
            "the server refused the user or password: check them in the URL (postgres://USER:PASSWORD@HOST/DB)",
        ),
        c if c == SqlState::INSUFFICIENT_PRIVILEGE.code() => (
            Refused,
            "the role lacks a right on distlock's schema: see the README's PostgreSQL section for the grants it \
             needs, or create the schema as its owner with `distlock migrate --postgres URL`",
        ),
        c if c == SqlState::INVALID_SCHEMA_NAME.code()
            || c == SqlState::UNDEFINED_FUNCTION.code()
            || c == SqlState::UNDEFINED_TABLE.code() =>
        {
            (Refused, "distlock's schema is missing or out of date: run `distlock migrate --postgres URL`")
        }
        c if c == SqlState::ACTIVE_SQL_TRANSACTION.code() => (
            Refused,
            "distlock needs READ COMMITTED: ALTER ROLE <role> SET default_transaction_isolation = 'read committed'",
        ),
        _ => (Refused, "the server refused the statement: its message says why"),
    }
}

#[cfg(test)]
mod tests {
    use super::describe;

    #[test]
    fn the_server_is_named_without_its_password() {
        let config: tokio_postgres::Config = "postgres://app:s3cret@db.example:6543/locks".parse().expect("a URL");
        assert_eq!(describe(&config), "postgres://app@db.example:6543/locks");
        let config: tokio_postgres::Config =
            "host=/run/pg port=5433 user=app password=s3cret dbname=x".parse().expect("key=value settings");
        assert_eq!(describe(&config), "postgres://app@/run/pg:5433/x");
    }
}
