//! Replica acknowledgement (`ClientBuilder::wait_for_replicas`) on a real primary and replica: grants count
//! only once the replica has them, so a failover to it keeps the lock.

use std::time::Duration;

use distlock::{Client, LockError};
use distlock_tests::{eventually, RedisServer};
use redis::AsyncCommands;

const ACK_TIMEOUT: Duration = Duration::from_millis(300);

/// A primary and a replica of it, with the replication link up.
async fn primary_with_replica() -> (RedisServer, RedisServer) {
    let primary = RedisServer::new();
    let port = primary.port().to_string();
    let replica = RedisServer::with_args(["--replicaof", "127.0.0.1", port.as_str()]);
    let mut conn = replica.connection().await;
    eventually(Duration::from_secs(10), "replication link up", || {
        let mut conn = conn.clone();
        async move {
            let info: String = redis::cmd("INFO").arg("replication").query_async(&mut conn).await.expect("INFO");
            info.contains("master_link_status:up")
        }
    })
    .await;
    let _: () = redis::cmd("PING").query_async(&mut conn).await.expect("replica answers");
    (primary, replica)
}

async fn acknowledged_client(primary: &RedisServer) -> Result<Client, LockError> {
    Client::builder().redis(primary.url()).wait_for_replicas(1, ACK_TIMEOUT).build().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_are_on_the_replica_when_acquire_returns() {
    let (primary, replica) = primary_with_replica().await;
    let client = acknowledged_client(&primary).await.expect("client with one replica acknowledging");
    let guard = client.lock("replicated").acquire().await.expect("granted and acknowledged");
    // Read from the replica right away: WAIT returned only after the replica had the write.
    let mut on_replica = replica.connection().await;
    let record: Option<String> = on_replica.get(client.record_key("replicated")).await.expect("GET on the replica");
    let record = record.expect("the grant is on the replica when acquire returns");
    assert!(record.starts_with(guard.token().as_str()), "the replica holds this grant's record");
    guard.extend(Duration::from_secs(60)).await.expect("an acknowledged extension");
    assert_eq!(guard.release().await.expect("release"), distlock::ReleaseOutcome::Released);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_without_the_replicas_fails_at_build() {
    let lonely = RedisServer::new();
    match acknowledged_client(&lonely).await {
        Err(LockError::NotReplicated { acknowledged: 0, required: 1, .. }) => {}
        other => panic!("a primary without replicas was accepted: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_the_replica_did_not_acknowledge_is_given_back() {
    let (primary, mut replica) = primary_with_replica().await;
    let acknowledged = acknowledged_client(&primary).await.expect("client");
    let plain = Client::builder().redis(primary.url()).build().await.expect("client without acknowledgement");
    replica.kill();

    match acknowledged.lock("unreplicated").acquire().await {
        Err(LockError::NotReplicated { key, acknowledged: 0, required: 1 }) => assert_eq!(key, "unreplicated"),
        other => panic!("a grant no replica acknowledged was returned: {other:?}"),
    }
    assert!(plain.lock_info("unreplicated").await.expect("info").is_none(), "the unacknowledged grant was left held");
    // Without the requirement, the same lock is granted at once: the difference is the setting.
    let guard = plain.lock("unreplicated").acquire().await.expect("granted without acknowledgement");
    guard.release().await.expect("release");
}
