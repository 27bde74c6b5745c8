//! The PostgreSQL store: a row per lock and per waiter's place in distlock's schema (`schema.sql`), each
//! operation one autocommit statement and one round trip. Acquire, release and withdraw are plpgsql functions
//! that hold the lock's row lock, so calls on one key run one at a time, as Lua scripts do on Redis; renewals
//! are plain UPDATEs. Leases are by the server's clock (`clock_timestamp()`), fencing tokens come from one
//! uncached sequence (they rise across restarts with no clock assumption), hand-overs are announced with
//! NOTIFY (`listener.rs`).

mod connection;
mod listener;
mod schema;

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Row;

use self::connection::Connection;
use self::listener::Listener;
pub(crate) use self::schema::DEFAULT_SCHEMA;
use super::{
    glob_matches, Attempt, Capabilities, Fencing, Hold, LockKeys, Place, Queueing, ReleaseWatch, Renewal, Scan, Store,
    Timeouts, WakeUps,
};
use crate::error::BackendErrorKind;
use crate::{LockError, LockInfo, LockToken, ReleaseOutcome};

/// Every statement the store sends, with its schema's name in place.
#[derive(Debug)]
struct Statements {
    acquire: String,
    withdraw: String,
    renew: String,
    renew_many: String,
    release: String,
    remaining: String,
    info: String,
    force_unlock: String,
    scan: String,
    waiters: String,
    sweep_places: String,
    sweep_locks: String,
}

impl Statements {
    fn new(s: &str) -> Self {
        // µs of an interval, rounded down: a lease is never reported longer than the server has it.
        let us = |interval: &str| format!("floor(extract(epoch FROM {interval}) * 1000000)::bigint");
        Self {
            acquire: format!("SELECT code, fence, ms FROM {s}.acquire($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"),
            withdraw: format!("SELECT fence, ms FROM {s}.withdraw($1, $2)"),
            // An expired lease is never revived: the lock may be another's by now.
            renew: format!(
                "UPDATE {s}.locks SET expires_at = clock_timestamp() + $3 * interval '1 millisecond' \
                 WHERE key = $1 AND token = $2 AND expires_at > clock_timestamp()"
            ),
            renew_many: format!(
                "UPDATE {s}.locks l SET expires_at = clock_timestamp() + r.ms * interval '1 millisecond' \
                 FROM unnest($1::text[], $2::text[], $3::bigint[]) AS r(key, token, ms) \
                 WHERE l.key = r.key AND l.token = r.token AND l.expires_at > clock_timestamp() \
                 RETURNING l.key, l.token"
            ),
            release: format!("SELECT {s}.release($1, $2, $3)"),
            remaining: format!(
                "SELECT {} FROM {s}.locks WHERE key = $1 AND token = $2 AND expires_at > clock_timestamp()",
                us("expires_at - clock_timestamp()")
            ),
            info: format!(
                "SELECT l.owner, l.metadata, l.fence, {}, {}, l.token IS NULL, \
                 (SELECT count(*) FROM {s}.waiters w WHERE w.key = l.key) \
                 FROM {s}.locks l, clock_timestamp() c WHERE l.key = $1 AND l.expires_at > c",
                us("c - l.granted_at"),
                us("l.expires_at - c")
            ),
            // No hand-over: the queue's head may have died. Every waiter is woken to try again.
            force_unlock: format!(
                "WITH gone AS (DELETE FROM {s}.waiters WHERE key = $1), \
                 unmarked AS (DELETE FROM {s}.marks WHERE key = $1), \
                 freed AS (UPDATE {s}.locks SET token = NULL, expires_at = clock_timestamp() \
                 WHERE key = $1 AND expires_at > clock_timestamp() RETURNING 1) \
                 SELECT EXISTS (SELECT FROM freed), pg_notify($2, md5($1) || ':*')::text"
            ),
            scan: format!(
                "SELECT key FROM {s}.locks WHERE key > $1 AND expires_at > clock_timestamp() ORDER BY key LIMIT $2"
            ),
            waiters: format!(
                "SELECT w.owner, w.metadata, {} FROM {s}.waiters w \
                 JOIN {s}.marks m ON m.key = w.key AND m.client = w.client \
                 WHERE w.key = $1 AND w.until > clock_timestamp() AND m.until > clock_timestamp() \
                 ORDER BY w.since, w.token LIMIT $2",
                us("clock_timestamp() - w.since")
            ),
            // Places a minute past their life, then locks a minute past their lease with nobody waiting: the
            // rows left are those of the keys used in the last minute or so. The row an acquire works on is
            // locked, and skipped; an acquire that finds its row gone makes it again.
            sweep_places: format!(
                "WITH marks AS (DELETE FROM {s}.marks WHERE until < clock_timestamp() - interval '1 minute') \
                 DELETE FROM {s}.waiters WHERE until < clock_timestamp() - interval '1 minute'"
            ),
            sweep_locks: format!(
                "DELETE FROM {s}.locks WHERE key IN (SELECT l.key FROM {s}.locks l \
                 WHERE l.expires_at < clock_timestamp() - interval '1 minute' \
                 AND NOT EXISTS (SELECT FROM {s}.waiters w WHERE w.key = l.key) LIMIT {SWEEP_BATCH} \
                 FOR UPDATE SKIP LOCKED)"
            ),
        }
    }
}

/// The server `url` names, as messages show it: never a password (nor any other setting).
pub(crate) fn describe_postgres_url(url: &str) -> String {
    url.parse().map_or_else(|_| "<a PostgreSQL URL that does not parse>".to_owned(), |c| connection::describe(&c))
}

/// Where a scan of the locks table stands: the last key it gave.
#[derive(Debug, Default)]
pub(crate) struct PostgresCursor {
    after: String,
}

/// The store's connection settings.
pub(crate) struct PostgresSettings<'a> {
    pub(crate) url: &'a str,
    /// Where the listener's session goes, if not to `url` (which may be a transaction-mode pool).
    pub(crate) listen_url: Option<&'a str>,
    pub(crate) schema: &'a str,
    pub(crate) timeouts: Timeouts,
    pub(crate) owner: &'a str,
    pub(crate) prefix: &'a str,
}

#[derive(Debug)]
pub(crate) struct PostgresBackend {
    conn: Arc<Connection>,
    sql: Statements,
    schema: String,
    channel: String,
    owner: Arc<str>,
    listener: Listener,
    _sweeper: AbortOnDrop,
}

/// A task that ends with its owner (the sweeper, the listener and its session's I/O).
#[derive(Debug)]
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How often a client sweeps expired rows, give or take a random tenth (clients started together spread out).
const SWEEP_EVERY: Duration = Duration::from_secs(30);

/// How many rows one sweep statement deletes: a sweep runs statements of this many until one deletes fewer,
/// so that no statement holds many row locks for long.
const SWEEP_BATCH: u64 = 1000;

impl PostgresBackend {
    /// Connects, loads the schema if the server lacks it, checks the server's settings, and takes and gives back
    /// a probe lock (so that a missing right shows now, not on the first lock).
    pub(crate) async fn connect(settings: PostgresSettings<'_>) -> Result<Self, LockError> {
        schema::check_name(settings.schema)?;
        let conn = Arc::new(Connection::new(parse_url(settings.url)?, settings.timeouts));
        let listen_conn = match settings.listen_url {
            Some(url) => Arc::new(Connection::new(parse_url(url)?, settings.timeouts)),
            None => Arc::clone(&conn),
        };
        schema::ensure(&conn, settings.schema).await?;
        schema::check_settings(&conn, settings.schema).await?;
        let channel = schema::channel(settings.schema);
        let sweeper = {
            let conn = Arc::downgrade(&conn);
            let sql = Statements::new(settings.schema);
            AbortOnDrop(tokio::spawn(async move {
                // The first sweep at once: a client starting after a quiet spell clears what piled up meanwhile.
                let mut pause = Duration::ZERO;
                loop {
                    tokio::time::sleep(pause).await;
                    let Some(conn) = conn.upgrade() else { return };
                    // A failed sweep is the next one's work.
                    let _ = sweep(&conn, &sql).await;
                    drop(conn);
                    let jitter = getrandom::u32().unwrap_or(0) % 6_000;
                    pause = SWEEP_EVERY - Duration::from_secs(3) + Duration::from_millis(jitter.into());
                }
            }))
        };
        let backend = Self {
            listener: Listener::new(listen_conn, channel.clone()),
            conn,
            sql: Statements::new(settings.schema),
            schema: settings.schema.to_owned(),
            channel,
            owner: settings.owner.into(),
            _sweeper: sweeper,
        };
        backend.probe_lock_cycle(settings.prefix).await?;
        Ok(backend)
    }

    /// The startup probe ([`probe_lock_cycle`](super::probe_lock_cycle)), then its rows deleted.
    async fn probe_lock_cycle(&self, prefix: &str) -> Result<(), LockError> {
        let keys = super::probe_lock_cycle(self, prefix).await?;
        // Its freed row, which keeps its last fencing token until the sweep, is what it leaves behind; don't.
        let forget = format!(
            "WITH places AS (DELETE FROM {s}.waiters WHERE key = $1), marks AS (DELETE FROM {s}.marks WHERE key = $1) \
             DELETE FROM {s}.locks WHERE key = $1",
            s = self.schema
        );
        let params: [(&(dyn ToSql + Sync), Type); 1] = [(&keys.record, Type::TEXT)];
        self.query(Some(&keys), &forget, &params, |_| Ok(())).await
    }

    /// One statement about the lock `keys`, its rows read by `read`.
    async fn query<T>(
        &self,
        keys: Option<&LockKeys>,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
        read: impl FnOnce(Vec<Row>) -> Result<T, tokio_postgres::Error>,
    ) -> Result<T, LockError> {
        let key = keys.map(|k| k.name.as_str());
        // Boxed: tokio-postgres's query future is large, and the engine's futures hold the store's inline
        // (a reentrant request nests them; debug builds overflowed a worker's stack).
        Box::pin(self.conn.call(key, |c| async move { read(c.query_typed(sql, params).await?) })).await
    }

    fn unexpected(&self, what: &str) -> LockError {
        self.conn.refused(
            BackendErrorKind::Protocol,
            format!("unexpected reply to {what}"),
            "distlock's schema on the server is not this version's: run `distlock migrate --postgres URL`",
        )
    }
}

fn parse_url(url: &str) -> Result<tokio_postgres::Config, LockError> {
    url.parse().map_err(|e| {
        LockError::InvalidConfig(format!(
            "not a PostgreSQL URL ({e}): write postgres://USER:PASSWORD@HOST:PORT/DBNAME or `host=… user=… dbname=…`"
        ))
    })
}

/// Deletes the places and then the lock rows that have been dead for a minute, in batches.
async fn sweep(conn: &Connection, sql: &Statements) -> Result<(), LockError> {
    let places = sql.sweep_places.as_str();
    conn.call(None, |c| async move { c.execute_typed(places, &[]).await }).await?;
    let locks = sql.sweep_locks.as_str();
    while conn.call(None, |c| async move { c.execute_typed(locks, &[]).await }).await? == SWEEP_BATCH {}
    Ok(())
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn from_millis(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

fn from_micros(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

fn fence_of(fence: i64) -> u64 {
    u64::try_from(fence).unwrap_or(0)
}

impl Store for PostgresBackend {
    type Cursor = PostgresCursor;

    fn capabilities(&self) -> Capabilities {
        // Replies and announcements come after the commit, which waits for a synchronous standby where one is
        // configured: nothing for the engine to wait for.
        Capabilities { fair_queue: true, wake_ups: WakeUps::Exact, fencing: Fencing::Monotonic, replica_acks: false }
    }

    async fn acquire(
        &self,
        keys: &LockKeys,
        token: &LockToken,
        ttl: Duration,
        metadata: &str,
        queueing: Option<Queueing>,
    ) -> Result<Attempt, LockError> {
        let (register, lease, attempt, client, keep) = queueing.map_or((0, 0, 0, 0, 0), |q| {
            let attempt = i64::try_from(q.attempt).unwrap_or(i64::MAX);
            // The id's bits as a bigint: any u64 is a client id.
            (millis(q.register), millis(q.lease), attempt, q.client as i64, millis(q.keep))
        });
        let params: [(&(dyn ToSql + Sync), Type); 10] = [
            (&keys.record, Type::TEXT),
            (&token.as_str(), Type::TEXT),
            (&millis(ttl), Type::INT8),
            (&&*self.owner, Type::TEXT),
            (&metadata, Type::TEXT),
            (&register, Type::INT8),
            (&lease, Type::INT8),
            (&attempt, Type::INT8),
            (&client, Type::INT8),
            (&keep, Type::INT8),
        ];
        let reply = self
            .query(Some(keys), &self.sql.acquire, &params, |rows| {
                rows.first()
                    .map(|r| Ok::<_, tokio_postgres::Error>((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
                    .transpose()
            })
            .await?;
        match reply {
            Some((1_i32, fence, ms)) => Ok(Attempt::Granted(Hold { fence: fence_of(fence), lease: from_millis(ms) })),
            Some((0, fence, ms)) => Ok(Attempt::Busy { fence: fence_of(fence), remaining: Some(from_millis(ms)) }),
            _ => Err(self.unexpected("acquire")),
        }
    }

    async fn withdraw(&self, keys: &LockKeys, token: &LockToken) -> Result<Option<Hold>, LockError> {
        let params: [(&(dyn ToSql + Sync), Type); 2] = [(&keys.record, Type::TEXT), (&token.as_str(), Type::TEXT)];
        let reply = self
            .query(Some(keys), &self.sql.withdraw, &params, |rows| {
                rows.first()
                    .map(|r| {
                        Ok::<_, tokio_postgres::Error>((
                            r.try_get::<_, Option<i64>>(0)?,
                            r.try_get::<_, Option<i64>>(1)?,
                        ))
                    })
                    .transpose()
            })
            .await?;
        match reply {
            Some((Some(fence), Some(ms))) => Ok(Some(Hold { fence: fence_of(fence), lease: from_millis(ms) })),
            Some(_) => Ok(None),
            None => Err(self.unexpected("withdraw")),
        }
    }

    async fn renew(&self, keys: &LockKeys, token: &LockToken, ttl: Duration) -> Result<bool, LockError> {
        let params: [(&(dyn ToSql + Sync), Type); 3] =
            [(&keys.record, Type::TEXT), (&token.as_str(), Type::TEXT), (&millis(ttl), Type::INT8)];
        let sql = self.sql.renew.as_str();
        let key = Some(keys.name.as_str());
        let updated = Box::pin(self.conn.call(key, |c| async move { c.execute_typed(sql, &params).await })).await?;
        Ok(updated == 1)
    }

    async fn renew_many(&self, items: &[Renewal<'_>]) -> Result<Vec<Result<bool, LockError>>, LockError> {
        let records: Vec<&str> = items.iter().map(|i| i.keys.record.as_str()).collect();
        let tokens: Vec<&str> = items.iter().map(|i| i.token.as_str()).collect();
        let ttls: Vec<i64> = items.iter().map(|i| millis(i.ttl)).collect();
        let params: [(&(dyn ToSql + Sync), Type); 3] =
            [(&records, Type::TEXT_ARRAY), (&tokens, Type::TEXT_ARRAY), (&ttls, Type::INT8_ARRAY)];
        let renewed: Vec<(String, String)> = self
            .query(None, &self.sql.renew_many, &params, |rows| {
                rows.iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).collect()
            })
            .await?;
        Ok(items
            .iter()
            .map(|i| Ok(renewed.iter().any(|(k, t)| *k == i.keys.record && t == i.token.as_str())))
            .collect())
    }

    async fn release(
        &self,
        keys: &LockKeys,
        token: &LockToken,
        _fence: Option<u64>,
        keep: Option<Duration>,
    ) -> Result<ReleaseOutcome, LockError> {
        let keep = keep.map_or(0, millis);
        let params: [(&(dyn ToSql + Sync), Type); 3] =
            [(&keys.record, Type::TEXT), (&token.as_str(), Type::TEXT), (&keep, Type::INT8)];
        let code: Option<i32> = self
            .query(Some(keys), &self.sql.release, &params, |rows| rows.first().map(|r| r.try_get(0)).transpose())
            .await?;
        match code {
            Some(1) => Ok(ReleaseOutcome::Released),
            Some(0) => Ok(ReleaseOutcome::Expired),
            Some(2) => Ok(ReleaseOutcome::TakenByOther),
            _ => Err(self.unexpected("release")),
        }
    }

    async fn remaining(&self, keys: &LockKeys, token: &LockToken) -> Result<Option<Duration>, LockError> {
        let params: [(&(dyn ToSql + Sync), Type); 2] = [(&keys.record, Type::TEXT), (&token.as_str(), Type::TEXT)];
        let left: Option<i64> = self
            .query(Some(keys), &self.sql.remaining, &params, |rows| rows.first().map(|r| r.try_get(0)).transpose())
            .await?;
        Ok(left.map(from_micros))
    }

    async fn info(&self, keys: &LockKeys) -> Result<Option<LockInfo>, LockError> {
        let params: [(&(dyn ToSql + Sync), Type); 1] = [(&keys.record, Type::TEXT)];
        self.query(Some(keys), &self.sql.info, &params, |rows| {
            rows.first()
                .map(|r| {
                    Ok(LockInfo {
                        owner: r.try_get(0)?,
                        metadata: r.try_get(1)?,
                        fencing_token: fence_of(r.try_get(2)?),
                        held_for: from_micros(r.try_get(3)?),
                        remaining_ttl: from_micros(r.try_get(4)?),
                        kept_by_min_hold: r.try_get(5)?,
                        waiting: usize::try_from(r.try_get::<_, i64>(6)?).unwrap_or(0),
                    })
                })
                .transpose()
        })
        .await
    }

    async fn force_unlock(&self, keys: &LockKeys) -> Result<bool, LockError> {
        let params: [(&(dyn ToSql + Sync), Type); 2] = [(&keys.record, Type::TEXT), (&self.channel, Type::TEXT)];
        let existed: Option<bool> = self
            .query(Some(keys), &self.sql.force_unlock, &params, |rows| rows.first().map(|r| r.try_get(0)).transpose())
            .await?;
        existed.ok_or_else(|| self.unexpected("force_unlock"))
    }

    async fn scan(
        &self,
        scan: &mut Scan<PostgresCursor>,
        pattern: &str,
        count: usize,
    ) -> Result<Vec<String>, LockError> {
        let limit = i64::try_from(count.max(1)).unwrap_or(i64::MAX);
        let params: [(&(dyn ToSql + Sync), Type); 2] = [(&scan.cursor.after, Type::TEXT), (&limit, Type::INT8)];
        let keys: Vec<String> =
            self.query(None, &self.sql.scan, &params, |rows| rows.iter().map(|r| r.try_get(0)).collect()).await?;
        scan.done = keys.len() < count.max(1);
        if let Some(last) = keys.last() {
            scan.cursor.after.clone_from(last);
        }
        Ok(keys.into_iter().filter(|k| glob_matches(pattern.as_bytes(), k.as_bytes())).collect())
    }

    async fn waiters(&self, keys: &LockKeys, limit: usize) -> Result<Vec<Place>, LockError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let params: [(&(dyn ToSql + Sync), Type); 2] = [(&keys.record, Type::TEXT), (&limit, Type::INT8)];
        self.query(Some(keys), &self.sql.waiters, &params, |rows| {
            rows.iter()
                .map(|r| {
                    Ok(Place { owner: r.try_get(0)?, metadata: r.try_get(1)?, waited: from_micros(r.try_get(2)?) })
                })
                .collect()
        })
        .await
    }

    async fn watch_releases(&self, keys: &LockKeys, token: &LockToken) -> Result<ReleaseWatch, LockError> {
        Box::pin(self.listener.watch(keys, token)).await
    }
}
