//! Redis's errors as [`BackendError`]s: the kind of each failure, and the hint that says what to do about it.

use crate::error::{BackendError, BackendErrorKind};

/// A failed call to the Redis `server` (password redacted), about the lock `key` if any: its kind and hint
/// read from the error.
pub(crate) fn redis_error(server: &str, key: Option<&str>, e: redis::RedisError) -> BackendError {
    let hint = hint_for(&e, server);
    BackendError::new("redis", server, kind_of(&e), hint, e).for_key(key)
}

/// As [`redis_error`], with the hint given (when the caller knows more than the error says).
pub(crate) fn redis_error_with_hint(server: &str, hint: String, e: redis::RedisError) -> BackendError {
    BackendError::new("redis", server, kind_of(&e), hint, e)
}

/// Whether trying again later may help: timeouts and lost connections may pass; an error reply does not.
fn kind_of(e: &redis::RedisError) -> BackendErrorKind {
    if e.is_timeout() {
        BackendErrorKind::Timeout
    } else if e.is_connection_refusal() || e.is_io_error() || e.is_connection_dropped() || super::is_cluster_in_flux(e)
    {
        // A cluster still moving a slot or electing a primary after the settling retries: it may settle yet.
        BackendErrorKind::Unreachable
    } else if matches!(e.kind(), redis::ErrorKind::Parse | redis::ErrorKind::UnexpectedReturnType) {
        BackendErrorKind::Protocol
    } else {
        BackendErrorKind::Refused
    }
}

/// `server` (a redacted URL) is a unix socket's, whose password goes in the query, not the userinfo.
fn is_socket(server: &str) -> bool {
    server.starts_with("redis+unix://") || server.starts_with("unix://")
}

/// How a Sentinel store names itself in messages: "service `<name>` via sentinels <urls>".
pub(crate) const SENTINEL_SERVICE: &str = "service `";

pub(crate) fn is_auth_error(e: &redis::RedisError) -> bool {
    e.code() == Some("NOAUTH")
        || e.code() == Some("WRONGPASS")
        || e.to_string().contains("NOAUTH")
        || matches!(e.kind(), redis::ErrorKind::AuthenticationFailed)
}

/// What to do about `e`, a failure talking to `server`.
fn hint_for(e: &redis::RedisError, server: &str) -> String {
    let hint = if e.is_timeout() {
        "the server did not answer within the response timeout: check that it is up and not overloaded, or raise ClientBuilder::response_timeout"
    } else if e.is_connection_refusal() || e.is_io_error() {
        "could not reach the server: check that redis-server is running and the URL (host, port, TLS) is right"
    } else if super::is_cluster_in_flux(e) {
        "the cluster was moving the lock's slot, electing a primary or reconnecting to the slot's node, and had not settled when the call gave up (a script call is sent again for about a second): try again; if it lasts, check the cluster (redis-cli --cluster check HOST:PORT)"
    } else if server.starts_with(SENTINEL_SERVICE) && is_auth_error(e) {
        "the primary or the sentinels require a password (or refused the one given): give the sentinels' in their URLs (redis://:PASSWORD@HOST:PORT/), the primary's with ClientBuilder::sentinel_primary_password"
    } else if is_socket(server) && is_auth_error(e) {
        "the server requires a password, or refused the one given: give it in the socket URL's query, redis+unix:///PATH/TO/SOCKET?pass=PASSWORD (and &user=USER for an ACL user), special characters percent-encoded"
    } else if e.code() == Some("NOAUTH") || e.to_string().contains("NOAUTH") {
        "the server requires a password: give it in the URL, redis://:PASSWORD@HOST:PORT/ (the default user) or redis://USER:PASSWORD@HOST:PORT/ (an ACL user), with special characters percent-encoded"
    } else if matches!(e.kind(), redis::ErrorKind::AuthenticationFailed) || e.code() == Some("WRONGPASS") {
        if server.contains('@') {
            "the server refused the user name or password in the URL: check them (redis://:PASSWORD@HOST/ for the default user, redis://USER:PASSWORD@HOST/ for an ACL user, special characters percent-encoded)"
        } else {
            "the server requires a password: give it in the URL, redis://:PASSWORD@HOST:PORT/ (the default user) or redis://USER:PASSWORD@HOST:PORT/ (an ACL user)"
        }
    } else if is_foreign(e) {
        "the lock's key holds a value distlock did not write (another program's data under distlock's key prefix): delete it (Client::force_unlock deletes it, as does `distlock release`), or give distlock a key prefix of its own (ClientBuilder::key_prefix)"
    } else if is_permission_error(e) {
        "the Redis user lacks a permission (NOPERM): grant the ACL rights of the README's least-privilege user (EVALSHA and the commands its scripts call, on the key prefix; SUBSCRIBE, or on a cluster SSUBSCRIBE, on its channels)"
    } else {
        "the server refused the command: if other programs write keys under this client's prefix, give distlock a key prefix of its own (ClientBuilder::key_prefix); check the user's ACL rights (see the README's least-privilege user)"
    };
    hint.to_owned()
}

/// A value at a lock's key that distlock did not write: the scripts' FOREIGN error, or WRONGTYPE (not a string).
fn is_foreign(e: &redis::RedisError) -> bool {
    matches!(e.code(), Some("FOREIGN" | "WRONGTYPE")) || {
        let text = e.to_string();
        text.contains("FOREIGN the value at") || text.contains("WRONGTYPE")
    }
}

/// NOPERM, also when a command inside a script was refused (Redis reports that as a plain script error).
fn is_permission_error(e: &redis::RedisError) -> bool {
    matches!(e.kind(), redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm)) || {
        let text = e.to_string();
        text.contains("NOPERM") || text.contains("can't run this command") || text.contains("no permissions")
    }
}
