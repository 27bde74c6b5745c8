//! What the Redlock test binaries share: where a lock's keys are on the group's servers, a lock held on one
//! server alone, a grant given back, a client with its own response timeout.

use std::time::Duration;

use distlock::{Client, LockGuard};
use redis::AsyncCommands;

use crate::monitor::Monitor;
use crate::time::secs;
use crate::{eventually, Fixture, RedisServer};

/// How many of `fixture`'s running Redlock servers have `key` (a record or a derived key) right now, asked on
/// fresh connections (a restarted server's old one is gone; a killed one is not asked).
pub async fn servers_with(fixture: &Fixture, key: &str) -> usize {
    let mut n = 0;
    for server in fixture.redlock_servers().filter(|server| !server.is_killed()) {
        let exists: bool = server.connection().await.exists(key).await.expect("EXISTS");
        n += usize::from(exists);
    }
    n
}

/// `key` taken by `fixture`'s client for 5 s, once its record is on all three servers; and that record's key.
pub async fn held_on_every_server(fixture: &Fixture, key: &str) -> (LockGuard, String) {
    let record = fixture.client().record_key(key);
    let guard = fixture.client().lock(key).ttl(secs(5)).acquire().await.expect("acquire");
    on_every_server(fixture, &record).await;
    (guard, record)
}

/// Waits until `record` is on all three servers: an acquire returns at a quorum, so the last server's grant
/// may still be on its way.
pub async fn on_every_server(fixture: &Fixture, record: &str) {
    eventually(secs(5), "the record on all three servers", || async { servers_with(fixture, record).await == 3 }).await;
}

/// `key` held on `server` alone by a client of its own (the guard keeps it): there, that server answers busy.
pub async fn held_alone(server: &RedisServer, key: &str, ttl: Duration) -> LockGuard {
    let client = Client::builder().redis(server.url()).build().await.expect("a client on one server");
    client.lock(key).ttl(ttl).acquire().await.expect("held on one server")
}

/// Waits until the server behind `conn` no longer has `record`, and checks that it was given back: `monitor`
/// (started on that server before the round) saw the record deleted, which a release does only for the
/// token's own grant. So it was a grant given back, not one never made.
pub async fn given_back(conn: &redis::aio::MultiplexedConnection, monitor: &Monitor, record: &str, what: &str) {
    eventually(secs(8), what, || {
        let (mut conn, record) = (conn.clone(), record.to_owned());
        async move { !conn.exists::<_, bool>(&record).await.expect("EXISTS") }
    })
    .await;
    let deleted = format!("\"del\" \"{record}\"");
    monitor.wait_for(0, &deleted, secs(8)).await;
}

/// A Redlock client on `fixture`'s servers with the given response timeout.
pub async fn client_with_response_timeout(fixture: &Fixture, response: Duration) -> Client {
    let urls: Vec<String> = fixture.redlock_servers().map(RedisServer::url).collect();
    Client::builder().redlock(urls).response_timeout(response).build().await.expect("redlock client")
}
