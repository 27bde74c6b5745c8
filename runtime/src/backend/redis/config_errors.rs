//! Errors for a configuration the server or the redis crate refuses at connect time: each says what is wrong
//! and what to do.

use redis::ConnectionInfo;

use super::errors::redis_error_with_hint;
use super::Timeouts;
use crate::error::{BackendError, URL_FORMS};
use crate::LockError;

/// A URL the redis crate cannot use: say which forms it takes, and how to turn TLS on if that was the problem.
pub(super) fn url_error(server: &str, e: &redis::RedisError) -> LockError {
    let text = e.to_string();
    let why = if server.starts_with("rediss://") && text.contains("TLS") {
        "rediss:// needs distlock's `tls` feature; turn it on in Cargo.toml: \
         distlock = { version = \"0.1\", features = [\"tls\"] }"
            .to_owned()
    } else if !server.contains("://") {
        format!("it has no scheme (did you mean {} ?); the accepted forms are {URL_FORMS}", with_scheme(server))
    } else {
        format!("it is not a Redis URL the client understands ({text}); the accepted forms are {URL_FORMS}")
    };
    LockError::InvalidConfig(format!("cannot use Redis URL {server}: {why}"))
}

/// What a URL typed without a scheme was probably meant to be: a socket's path, or a host with its port and
/// perhaps its database (`localhost:6390/` is `redis://localhost:6390/`, not `redis://localhost:6390//`).
fn with_scheme(server: &str) -> String {
    if server.starts_with('/') {
        format!("redis+unix://{server}")
    } else if server.contains('/') {
        format!("redis://{server}")
    } else {
        format!("redis://{server}/")
    }
}

/// `SELECT` was refused: name the index, and the server's `databases` setting when a connection to
/// database 0 can read it.
pub(super) async fn database_error(
    server: &str,
    info: &ConnectionInfo,
    e: redis::RedisError,
    timeouts: Timeouts,
) -> BackendError {
    let db = info.redis_settings().db();
    let zero = info.clone().set_redis_settings(info.redis_settings().clone().set_db(0));
    let databases = async {
        let client = redis::Client::open(zero).ok()?;
        let mut conn = client.get_multiplexed_async_connection().await.ok()?;
        let reply: Vec<String> = redis::cmd("CONFIG").arg("GET").arg("databases").query_async(&mut conn).await.ok()?;
        reply.get(1)?.parse::<u32>().ok()
    };
    let databases = tokio::time::timeout(timeouts.connect, databases).await.ok().flatten();
    let setting = match databases {
        Some(n) => format!("the server has `databases {n}`, so the index must be 0 to {}", n.saturating_sub(1)),
        None => "the index must be below the server's `databases` setting (16 by default)".to_owned(),
    };
    redis_error_with_hint(
        server,
        format!("database {db} does not exist on this server: {setting}; change the /DB at the end of the URL"),
        e,
    )
}

#[cfg(test)]
mod tests {
    use super::{url_error, with_scheme};

    /// The suggestion for a URL without a scheme is a URL the client accepts, with one `/` before the database.
    #[test]
    fn a_url_without_scheme_is_suggested_with_one() {
        use redis::IntoConnectionInfo;
        for (typed, suggested) in [
            ("localhost:6390", "redis://localhost:6390/"),
            ("localhost:6390/", "redis://localhost:6390/"),
            ("cache.internal:6379/2", "redis://cache.internal:6379/2"),
            ("/run/redis/redis.sock", "redis+unix:///run/redis/redis.sock"),
        ] {
            assert_eq!(with_scheme(typed), suggested);
            assert!(suggested.into_connection_info().is_ok(), "{suggested} is not a URL the client accepts");
        }
    }

    /// `rediss://` in a build without TLS support names distlock's feature and the Cargo line. (The workspace's
    /// own test build has TLS on, through the bench, so the redis crate's error is made here.)
    #[test]
    fn rediss_without_tls_names_the_feature() {
        let e = redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "can't connect with TLS, the feature is not enabled",
        ));
        let message = url_error("rediss://:***@cache.example:6380/", &e).to_string();
        assert!(message.contains("distlock's `tls` feature"), "{message}");
        assert!(message.contains(r#"features = ["tls"]"#), "{message}");
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn rediss_without_tls_is_refused_with_the_feature_named() {
        use redis::IntoConnectionInfo;
        let e = "rediss://localhost:6380/".into_connection_info().expect_err("no TLS support in this build");
        assert!(url_error("rediss://localhost:6380/", &e).to_string().contains(r#"features = ["tls"]"#));
    }
}
