//! distlock's schema on the server (`schema.sql`): created on first use, or by `distlock migrate`, in a schema
//! the user names; and the server settings the store's guarantees rest on, checked when a client connects.

use super::connection::Connection;
use crate::error::BackendErrorKind;
use crate::LockError;

const SCHEMA_SQL: &str = include_str!("schema.sql");

/// The schema's version: `<schema>.schema_version()` answers it once [`SCHEMA_SQL`] is loaded. Raise it with
/// every change to schema.sql; a client that finds an older one loads its own (every statement of it is
/// idempotent).
const VERSION: i32 = 2;

/// The default schema's name.
pub(crate) const DEFAULT_SCHEMA: &str = "distlock";

/// A schema name distlock accepts: lower-case letters, digits and `_`, starting with a letter, at most 49
/// characters (so that its NOTIFY channel, `distlock_<schema>`, stays within PostgreSQL's 63). No quoting is
/// then ever needed, and the name reads the same in SQL, `psql` and the channel.
pub(crate) fn check_name(schema: &str) -> Result<(), LockError> {
    let ok = schema.len() <= 49
        && schema.starts_with(|c: char| c.is_ascii_lowercase())
        && schema.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(LockError::InvalidConfig(format!(
            "PostgreSQL schema name {schema:?}: use lower-case letters, digits and `_`, starting with a letter, at \
             most 49 characters"
        )))
    }
}

/// The NOTIFY channel hand-overs of `schema`'s locks are announced on.
pub(super) fn channel(schema: &str) -> String {
    format!("distlock_{schema}")
}

/// schema.sql for `schema`, with the version function, as one script.
fn sql(schema: &str) -> String {
    let mut sql = SCHEMA_SQL.replace("{schema}", schema).replace("{channel}", &format!("'{}'", channel(schema)));
    sql.push_str(&format!(
        "\nCREATE OR REPLACE FUNCTION {schema}.schema_version() RETURNS int LANGUAGE sql IMMUTABLE AS 'SELECT {VERSION}';\n"
    ));
    sql
}

/// Loads the schema unless the server has this version already: one simple query, so one implicit
/// transaction (all of it or none). Concurrent clients take turns (an advisory lock for that transaction):
/// `CREATE OR REPLACE FUNCTION` run twice at once fails.
pub(super) async fn ensure(conn: &Connection, schema: &str) -> Result<(), LockError> {
    let current = format!("SELECT {schema}.schema_version()");
    let version = conn.call(None, |c| async move { c.query_typed(&current, &[]).await }).await;
    match version {
        Ok(rows) if rows.first().and_then(|r| r.try_get::<_, i32>(0).ok()) >= Some(VERSION) => return Ok(()),
        Ok(_) => {}
        Err(LockError::Backend(e)) if e.kind() == BackendErrorKind::Refused => {}
        Err(e) => return Err(e),
    }
    let script = format!("SELECT pg_advisory_xact_lock(hashtext('distlock migrate {schema}'));\n{}", sql(schema));
    conn.call(None, |c| async move { c.batch_execute(&script).await }).await
}

/// Refuses a server whose settings would break a guarantee: a default isolation other than READ COMMITTED
/// (the functions refuse it: every call would fail), `synchronous_commit = off` or `fsync = off` (a crash loses
/// acknowledged grants and reissues fencing tokens), a cached fence sequence (tokens out of order across
/// sessions).
pub(super) async fn check_settings(conn: &Connection, schema: &str) -> Result<(), LockError> {
    let query = format!(
        "SELECT current_setting('transaction_isolation'), current_setting('synchronous_commit'), \
         current_setting('fsync'), (SELECT cache_size FROM pg_sequences WHERE schemaname = '{schema}' AND \
         sequencename = 'fence')"
    );
    let rows = conn.call(None, |c| async move { c.query_typed(&query, &[]).await }).await?;
    let row = rows.first().ok_or_else(|| {
        conn.refused(BackendErrorKind::Protocol, "the settings query returned no row".into(), "check the server")
    })?;
    let setting = |i| row.try_get::<_, Option<String>>(i).ok().flatten().unwrap_or_default();
    let (isolation, sync, fsync) = (setting(0), setting(1), setting(2));
    let cache = row.try_get::<_, Option<i64>>(3).ok().flatten();
    let refuse = |what: String, hint: &str| Err(conn.refused(BackendErrorKind::Refused, what, hint));
    if isolation != "read committed" {
        return refuse(
            format!("the session's transaction isolation is {isolation}"),
            "distlock needs READ COMMITTED: ALTER ROLE <role> SET default_transaction_isolation = 'read committed'",
        );
    }
    if sync == "off" || fsync == "off" {
        return refuse(
            format!("synchronous_commit = {sync}, fsync = {fsync}"),
            "a crash would lose acknowledged grants and reissue fencing tokens: ALTER ROLE <role> SET \
             synchronous_commit = 'on' (and fsync = on in postgresql.conf)",
        );
    }
    if cache != Some(1) {
        return refuse(
            format!("the fence sequence's cache is {cache:?}"),
            "a cached sequence hands out fencing tokens out of order: ALTER SEQUENCE <schema>.fence CACHE 1",
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{check_name, sql};

    #[test]
    fn schema_names_need_no_quoting_and_fit_the_channel() {
        for good in ["distlock", "app_locks2", "a"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in ["", "Distlock", "2locks", "a-b", "a;drop", "x\"y", &"a".repeat(50)] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
        let sql = sql("app");
        assert!(!sql.contains("{schema}") && !sql.contains("{channel}"));
        assert!(sql.contains("pg_notify('distlock_app'") && sql.contains("app.schema_version()"));
    }
}
