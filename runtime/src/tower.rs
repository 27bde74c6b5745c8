//! A tower [`Layer`](tower_layer::Layer) that puts a client in scope for every request of a service, so
//! `#[distributed_lock]` handlers of an axum, tonic or hyper service under test use the test's own client.
//!
//! [`with_client`](crate::with_client) scopes a client to one future and does not cross `tokio::spawn`: a
//! server that spawns a task per connection (as `axum::serve` does) runs its handlers outside it. The layer
//! wraps each request's future instead, inside whatever task runs it.

use std::task::{Context, Poll};

use tokio::task::futures::TaskLocalFuture;

use crate::Client;

/// Runs every request of the wrapped service with `client` as the client in scope (overriding the installed
/// one), as [`with_client`](crate::with_client) does for one future.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
/// use tower_layer::Layer;
/// use tower_service::Service;
///
/// # #[derive(Clone)] struct Handler;
/// # impl Service<&'static str> for Handler {
/// #     type Response = String;
/// #     type Error = distlock::LockError;
/// #     type Future = std::pin::Pin<Box<dyn std::future::Future<Output = Result<String, distlock::LockError>> + Send>>;
/// #     fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
/// #         std::task::Poll::Ready(Ok(()))
/// #     }
/// #     fn call(&mut self, key: &'static str) -> Self::Future {
/// #         Box::pin(async move { Ok(distlock::current_client()?.record_key(key)) })
/// #     }
/// # }
/// let client = distlock::Client::builder().memory().key_prefix("test:").build().await?;
/// // `Handler` is any service whose requests call `distlock::current_client()` (as `#[distributed_lock]` does).
/// let mut service = distlock::tower::ClientLayer::new(client).layer(Handler);
/// // Spawned, as a server runs each connection: the client is still in scope.
/// let record = tokio::spawn(async move { service.call("job").await }).await.unwrap()?;
/// assert_eq!(record, "test:{job}");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ClientLayer {
    client: Client,
}

impl ClientLayer {
    /// A layer that puts `client` in scope for every request.
    pub fn new(client: Client) -> Self {
        Self { client }
    }
}

impl<S> tower_layer::Layer<S> for ClientLayer {
    type Service = ClientService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ClientService { inner, client: self.client.clone() }
    }
}

/// The service [`ClientLayer`] makes: `inner`, with the layer's client in scope while each request runs.
#[derive(Debug, Clone)]
pub struct ClientService<S> {
    inner: S,
    client: Client,
}

impl<S, Request> tower_service::Service<Request> for ClientService<S>
where
    S: tower_service::Service<Request>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = TaskLocalFuture<Client, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        crate::client::scoped(self.client.clone(), self.inner.call(request))
    }
}
