//! What only the PostgreSQL store has, each on a private server: its schema, made on first use in a schema the
//! user names, and usable by a role with only the rights the README lists; the server settings it refuses;
//! a new key raced by many clients (one grant); the sweep that keeps the tables to the keys in use; and every
//! operation through PgBouncer in transaction mode.

use std::time::Duration;

use distlock::{BackendErrorKind, Client, LockError, ReleaseOutcome};
use distlock_tests::time::{ms, secs};
use distlock_tests::{within, PgBouncer, PostgresServer};

async fn private_server() -> PostgresServer {
    tokio::task::spawn_blocking(PostgresServer::new).await.expect("postgres start")
}

async fn client(url: &str, schema: &str) -> Result<Client, LockError> {
    Client::builder().postgres(url).postgres_schema(schema).build().await
}

/// The README's least-privilege role: with USAGE on the schema, DML on its tables, the sequence and EXECUTE on
/// its functions (and no CREATE anywhere), every operation works; without the schema made for it, the error
/// says to run `distlock migrate`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_least_privilege_role_can_do_everything_once_the_schema_is_made() {
    let server = private_server().await;
    server.psql("CREATE ROLE app LOGIN; REVOKE CREATE ON SCHEMA public FROM PUBLIC");
    let app_url = format!("postgres://app@127.0.0.1:{}/postgres", server.port());

    let refused = client(&app_url, "app_locks").await.expect_err("app cannot create the schema");
    match &refused {
        LockError::Backend(e) => {
            assert_eq!(e.kind(), BackendErrorKind::Refused);
            assert!(refused.to_string().contains("distlock migrate"), "{refused}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }

    // The owner makes it (as `distlock migrate` does), then grants what the README lists.
    drop(client(&server.url(), "app_locks").await.expect("the owner makes the schema"));
    server.psql(
        "GRANT USAGE ON SCHEMA app_locks TO app; \
         GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA app_locks TO app; \
         GRANT USAGE ON ALL SEQUENCES IN SCHEMA app_locks TO app; \
         GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA app_locks TO app",
    );
    let app = client(&app_url, "app_locks").await.expect("the app's client");
    let other = client(&app_url, "app_locks").await.expect("a second client");
    let guard = app.lock("job").ttl(secs(5)).metadata("nightly").acquire().await.expect("acquire");
    let waiting = tokio::spawn({
        let other = other.clone();
        async move { other.lock("job").wait(secs(10)).acquire().await }
    });
    within(secs(5), "the waiter queues", async {
        while app.lock_info("job").await.expect("lock_info").is_some_and(|i| i.waiting == 0) {
            tokio::time::sleep(ms(10)).await;
        }
    })
    .await;
    let mut listing = app.list_locks("*");
    assert_eq!(listing.next_page().await.expect("list_locks"), Some(vec!["job".to_owned()]));
    assert_eq!(app.lock_waiters("job").await.expect("lock_waiters").len(), 1);
    guard.extend(secs(10)).await.expect("extend");
    assert_eq!(guard.release().await.expect("release"), ReleaseOutcome::Released);
    let next = waiting.await.expect("task").expect("the hand-over");
    assert!(other.force_unlock("job").await.expect("force_unlock"));
    assert_eq!(next.release().await.expect("release"), ReleaseOutcome::Expired);
}

/// Settings that would break a guarantee are refused at build, each with what to change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_that_break_a_guarantee_are_refused_with_the_fix() {
    let server = private_server().await;
    let url = server.url();
    drop(client(&url, "distlock").await.expect("a client on a sound server"));
    let refused = |setting: &'static str| {
        let url = url.clone();
        async move {
            let e = client(&url, "distlock").await.expect_err(setting).to_string();
            assert!(e.contains(setting), "{setting}: {e}");
            e
        }
    };

    server.psql("ALTER ROLE postgres SET synchronous_commit = off");
    let e = refused("synchronous_commit").await;
    assert!(e.contains("reissue fencing tokens"), "{e}");
    server.psql("ALTER ROLE postgres RESET synchronous_commit");

    server.psql("ALTER ROLE postgres SET default_transaction_isolation = 'serializable'");
    let e = refused("READ COMMITTED").await;
    assert!(e.contains("serializable"), "{e}");
    server.psql("ALTER ROLE postgres RESET default_transaction_isolation");

    server.psql("ALTER SEQUENCE distlock.fence CACHE 20");
    refused("CACHE 1").await;
    server.psql("ALTER SEQUENCE distlock.fence CACHE 1");
    drop(client(&url, "distlock").await.expect("sound again"));

    let e = client(&url, "Locks; DROP TABLE x").await.expect_err("a schema name that needs quoting");
    assert!(matches!(e, LockError::InvalidConfig(_)), "{e:?}");
}

/// A key nobody used yet, raced by 64 tasks on 8 clients: exactly one grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_key_raced_by_many_clients_is_granted_once() {
    let server = private_server().await;
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(client(&server.url(), "distlock").await.expect("client"));
    }
    for round in 0..5 {
        let key = format!("fresh:{round}");
        let tasks: Vec<_> = (0..64)
            .map(|i| {
                let (client, key) = (clients[i % clients.len()].clone(), key.clone());
                tokio::spawn(async move { client.lock(key).ttl(secs(10)).try_acquire().await })
            })
            .collect();
        let mut granted = Vec::new();
        for task in tasks {
            if let Some(guard) = task.await.expect("task").expect("try_acquire") {
                granted.push(guard);
            }
        }
        assert_eq!(granted.len(), 1, "round {round}: {} grants of one new key", granted.len());
    }
}

/// One-off keys leave rows behind only until the sweep: a client sweeps when it starts and every 30 s, deleting
/// places and lock rows dead for a minute, in batches. Here 2,500 released locks are made a minute old, and a
/// client that starts clears all of them (more than two batches), while a held lock and its row stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_deletes_rows_dead_for_a_minute_and_keeps_the_live_ones() {
    const KEYS: usize = 2_500;
    let server = private_server().await;
    let app = client(&server.url(), "distlock").await.expect("client");
    let held = app.lock("kept").ttl(secs(60)).acquire().await.expect("acquire");
    // 250 at a time: each commit waits for its WAL flush, and a burst of thousands on one client queues past
    // the response timeout on a slow disk.
    for chunk in (0..KEYS).collect::<Vec<_>>().chunks(250) {
        let tasks: Vec<_> = chunk
            .iter()
            .map(|i| {
                let app = app.clone();
                let key = format!("once:{i}");
                tokio::spawn(async move { app.lock(key).acquire().await?.release().await })
            })
            .collect();
        for task in tasks {
            assert_eq!(task.await.expect("task").expect("cycle"), ReleaseOutcome::Released);
        }
    }
    let rows = || server.psql("SELECT count(*) FROM distlock.locks").parse::<usize>().expect("a count");
    assert_eq!(rows(), KEYS + 1, "a released lock's row stays (it keeps its last fencing token) until swept");
    server.psql(
        "UPDATE distlock.locks SET expires_at = expires_at - interval '61 seconds', \
         granted_at = granted_at - interval '61 seconds' WHERE token IS NULL",
    );

    let _starting = client(&server.url(), "distlock").await.expect("a client that starts, and sweeps");
    within(secs(30), "the sweep", async {
        while rows() > 1 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert_eq!(server.psql("SELECT key FROM distlock.locks"), app.record_key("kept"));
    assert!(!held.is_lost());
    assert_eq!(held.release().await.expect("release"), ReleaseOutcome::Released);
}

/// Through PgBouncer in transaction mode (4 server sessions for every client): grants, renewals, the queue's
/// hand-over, listing, info and a forced unlock all work, since every call is one unnamed statement in a
/// transaction of its own; the waiters listen on the server itself (`postgres_listen_url`), and hear the
/// hand-over at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_works_through_pgbouncer_in_transaction_mode() {
    distlock_tests::wall_clock::again_if_the_wall_clock_stepped(|| async {
        let server = private_server().await;
        let bouncer = tokio::task::block_in_place(|| PgBouncer::start(&server, "transaction"));
        let pooled = || {
            Client::builder()
                .postgres(bouncer.url())
                .postgres_listen_url(server.url())
                .response_timeout(secs(5))
                .build()
        };
        let (holder, waiter) = (pooled().await.expect("a client through the pool"), pooled().await.expect("another"));

        let guard = holder.lock("pooled").ttl(ms(900)).metadata("via pgbouncer").acquire().await.expect("acquire");
        // Through three leases: only renewals through the pool can have kept it.
        tokio::time::sleep(secs(3)).await;
        assert!(!guard.is_lost(), "renewals through the pool failed");
        let waiting = tokio::spawn({
            let waiter = waiter.clone();
            async move { waiter.lock("pooled").ttl(secs(5)).wait(secs(20)).acquire().await }
        });
        within(secs(5), "the waiter queues", async {
            while holder.lock_info("pooled").await.expect("lock_info").is_some_and(|i| i.waiting == 0) {
                tokio::time::sleep(ms(10)).await;
            }
        })
        .await;
        let info = waiter.lock_info("pooled").await.expect("lock_info").expect("held");
        assert_eq!((info.metadata.as_str(), info.fencing_token), ("via pgbouncer", guard.fencing_token()));
        let mut listing = holder.list_locks("*");
        assert_eq!(listing.next_page().await.expect("list_locks"), Some(vec!["pooled".to_owned()]));

        let released = tokio::time::Instant::now();
        assert_eq!(guard.release().await.expect("release"), ReleaseOutcome::Released);
        let next = within(secs(10), "the hand-over", waiting).await.expect("task").expect("the waiter gets it");
        assert!(released.elapsed() < secs(1), "heard the hand-over only after {:?}", released.elapsed());
        assert!(holder.force_unlock("pooled").await.expect("force_unlock"));
        assert_eq!(next.release().await.expect("release"), ReleaseOutcome::Expired);
        assert!(bouncer.log().contains("login attempt"), "the clients did not go through the pool:\n{}", bouncer.log());
    })
    .await
}
