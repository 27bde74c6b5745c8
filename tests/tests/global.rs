//! The process-global client: `install`, `client()` and the `with_client` override.
//!
//! Global state lives in its own test binary, and in ONE test, so that the order of its steps is fixed and no
//! other test sees (or changes) the installed client.

use std::time::Duration;

use distlock::{Client, LockError};

/// Whether `key` is free in the store of `client`; the probe's guard is released (and awaited) at once.
async fn is_free(client: &Client, key: &str) -> bool {
    match client.lock(key).try_acquire().await.expect("try_acquire") {
        Some(guard) => {
            guard.release().await.expect("release");
            true
        }
        None => false,
    }
}

async fn memory_client() -> Client {
    Client::builder().memory().build().await.expect("memory client")
}

#[tokio::test]
async fn global_client_lifecycle() {
    // Nothing installed yet.
    match distlock::current_client() {
        Err(LockError::NotConfigured) => {}
        other => panic!("expected NotConfigured before install, got {other:?}"),
    }
    let err = distlock::current_client().expect_err("not configured");
    assert!(err.to_string().contains("install"), "the error says what to do: {err}");

    // A scoped override works without a global client, and only inside its future.
    let scoped = memory_client().await;
    let seen = distlock::with_client(scoped.clone(), async {
        let c = distlock::current_client().expect("with_client's client");
        let guard = c.lock("scoped").acquire().await.expect("acquire");
        guard.fencing_token()
    })
    .await;
    assert!(seen > 0);
    assert!(matches!(distlock::current_client(), Err(LockError::NotConfigured)));

    // install once; a second install is refused and leaves the first in place.
    let global = memory_client().await;
    distlock::install(global.clone()).expect("first install");
    match distlock::install(memory_client().await) {
        Err(LockError::AlreadyInstalled) => {}
        other => panic!("expected AlreadyInstalled, got {other:?}"),
    }
    let installed = distlock::current_client().expect("installed client");
    let held = installed
        .lock("global")
        .ttl(Duration::from_secs(10))
        .metadata("via-global")
        .acquire()
        .await
        .expect("acquire via the global client");
    let info = global.lock_info("global").await.unwrap().expect("held in the installed client's store");
    assert_eq!(info.metadata, "via-global");
    assert_eq!(info.fencing_token, held.fencing_token());

    // with_client overrides the global client inside its future (and nests), not outside it.
    let other = memory_client().await;
    distlock::with_client(other.clone(), async {
        let c = distlock::current_client().expect("override");
        assert!(is_free(&c, "global").await, "the override must use its own store, not the installed client's");
        let inner = memory_client().await;
        distlock::with_client(inner.clone(), async {
            let c = distlock::current_client().expect("nested override");
            let _g = c.lock("nested").metadata("inner").acquire().await.unwrap();
            assert_eq!(inner.lock_info("nested").await.unwrap().unwrap().metadata, "inner");
            assert!(other.lock_info("nested").await.unwrap().is_none());
        })
        .await;
    })
    .await;
    let c = distlock::current_client().expect("global again after with_client");
    assert!(!is_free(&c, "global").await, "back on the installed client");

    // The override follows its future across threads (it is task-local, not thread-local).
    let spawned = tokio::spawn(distlock::with_client(other.clone(), async {
        tokio::task::yield_now().await;
        is_free(&distlock::current_client().expect("override in a spawned task"), "global").await
    }))
    .await
    .expect("task");
    assert!(spawned);
    drop(held);
}
