//! `tower::ClientLayer` puts a test's own client in scope for every request of a service, also when the
//! request runs in a task of its own (as `axum::serve` runs each connection), where `with_client` does not
//! reach. No client is installed in this test binary.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use distlock::tower::ClientLayer;
use distlock::LockError;
use distlock_tests::Fixture;
use tower_layer::Layer;
use tower_service::Service;

/// The handler: the locked body reports its fencing token.
#[distlock::distributed_lock(key = "order:<id>", ttl = "10s")]
async fn handle(id: u64) -> Result<u64, LockError> {
    let guard = distlock::current_lock().expect("the body runs under its lock");
    Ok(guard.fencing_token())
}

/// A tower service over `handle`, as a web framework makes one of a handler.
#[derive(Clone)]
struct Orders;

impl Service<u64> for Orders {
    type Response = u64;
    type Error = LockError;
    type Future = Pin<Box<dyn Future<Output = Result<u64, LockError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), LockError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, id: u64) -> Self::Future {
        Box::pin(handle(id))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_in_spawned_tasks_use_the_layers_client() {
    let fx = Fixture::redis().await;
    let mut service = ClientLayer::new(fx.client().clone()).layer(Orders);
    let token = tokio::spawn(async move { service.call(7).await })
        .await
        .expect("request task")
        .expect("the handler ran with the layer's client");
    // Without a client in scope the handler would have failed with `NotConfigured` (none is installed here).
    assert!(token > 0);
}

/// The limit the layer exists for: `with_client` scopes one future, and a task spawned inside it does not
/// inherit the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_client_does_not_cross_tokio_spawn() {
    let fx = Fixture::memory().await;
    let inside = distlock::with_client(fx.client().clone(), async {
        let direct = handle(1).await;
        let spawned = tokio::spawn(handle(2)).await.expect("task");
        (direct, spawned)
    })
    .await;
    assert!(inside.0.is_ok(), "{:?}", inside.0);
    assert!(matches!(inside.1, Err(LockError::NotConfigured)), "{:?}", inside.1);
}
