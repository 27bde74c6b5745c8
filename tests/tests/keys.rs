//! Every key a lock's scripts touch, and the channel they publish on, hash to the lock record's Redis
//! Cluster slot (issue 10): the scripts receive only the record in KEYS and derive the rest from it, so
//! this must hold by construction, also for user keys with braces of their own.

use std::collections::BTreeSet;

use distlock::Client;
use distlock_tests::time::secs;
use distlock_tests::{eventually, within, RedisServer};
use redis::aio::MultiplexedConnection;

/// User keys that try to end the record's hash tag early, open another, or look like an escape.
const KEYS: [&str; 7] = ["report:42", "a{b}c", "}{", "{", "}", "%7B", "x}:fence:{y"];

/// Locks `key` with a holder while a second client waits in the queue, and returns every key and channel on
/// the server at that moment (the record, the queue, the waiter's details, the channel the waiter listens on);
/// then lets the waiter through.
async fn names_of_one_contended_lock(server: &RedisServer, conn: &mut MultiplexedConnection, key: &str) -> Vec<String> {
    let () = redis::cmd("FLUSHALL").query_async(conn).await.unwrap();
    let holder = Client::builder().redis(server.url()).build().await.expect("holder's client");
    let waiter = Client::builder().redis(server.url()).build().await.expect("waiter's client");
    let guard = holder.lock(key).ttl(secs(10)).acquire().await.unwrap_or_else(|e| panic!("acquire {key:?}: {e}"));
    let waiting = tokio::spawn({
        let key = key.to_owned();
        async move { waiter.lock(key).ttl(secs(10)).wait(secs(10)).acquire().await }
    });
    let probe = conn.clone();
    eventually(secs(5), "the waiter queued", move || {
        let mut probe = probe.clone();
        async move {
            let queues: Vec<String> = redis::cmd("KEYS").arg("*:queue").query_async(&mut probe).await.unwrap();
            let waiters: Vec<String> = redis::cmd("KEYS").arg("*:waiter:*").query_async(&mut probe).await.unwrap();
            !queues.is_empty() && !waiters.is_empty()
        }
    })
    .await;
    let mut names: Vec<String> = redis::cmd("KEYS").arg("*").query_async(conn).await.unwrap();
    let channels: Vec<String> = redis::cmd("PUBSUB").arg("CHANNELS").query_async(conn).await.unwrap();
    names.extend(channels);
    guard.release().await.expect("release");
    let handed = within(secs(10), "the hand-over", waiting).await.unwrap();
    handed.expect("the waiter gets the lock").release().await.expect("release");
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_and_channel_of_a_lock_hashes_to_its_record_slot() {
    let server = RedisServer::new();
    // A cluster-enabled node computes slots (CLUSTER KEYSLOT) even with no slot assigned; distlock itself
    // refuses to run on one, so the names are made on the plain server.
    let slots = RedisServer::with_args(["--cluster-enabled", "yes"]);
    let mut conn = server.connection().await;
    let mut slot_conn = slots.connection().await;
    let mut records = BTreeSet::new();
    for key in KEYS {
        let names = names_of_one_contended_lock(&server, &mut conn, key).await;
        let kinds = [":queue", ":waiter:", ":released"];
        for kind in kinds {
            assert!(names.iter().any(|n| n.contains(kind)), "no {kind} name for {key:?} among {names:?}");
        }
        // The record is the one name that every other name starts with.
        let record = names
            .iter()
            .find(|r| names.iter().all(|n| n.starts_with(r.as_str())))
            .unwrap_or_else(|| panic!("no record among {names:?} for {key:?}"));
        let mut slots = BTreeSet::new();
        for name in &names {
            let slot: u16 = redis::cmd("CLUSTER").arg("KEYSLOT").arg(name).query_async(&mut slot_conn).await.unwrap();
            slots.insert(slot);
        }
        assert_eq!(slots.len(), 1, "the names of lock {key:?} span slots {slots:?}: {names:?}");
        records.insert(record.clone());
    }
    assert_eq!(records.len(), KEYS.len(), "two user keys shared a record: {records:?}");
}
