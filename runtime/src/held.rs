//! Reentrancy: the grants the current lock body holds, scoped to that body's future with a task-local, so
//! sibling futures in the same task and spawned tasks are not owners.

use std::future::Future;
use std::sync::Arc;

use crate::grant::Grant;
use crate::Client;

#[derive(Clone, Default)]
struct Held(Arc<Vec<Arc<Grant>>>);

tokio::task_local! {
    static HELD: Held;
}

/// The grant of `key` held by the lock body being polled right now, if it was taken through `client`.
pub(crate) fn find(client: &Client, key: &str) -> Option<Arc<Grant>> {
    HELD.try_with(|held| held.0.iter().find(|g| g.keys.name == key && g.client.same_owner(client)).cloned())
        .ok()
        .flatten()
}

/// The grant most recently taken by the lock body being polled right now.
pub(crate) fn innermost() -> Option<Arc<Grant>> {
    HELD.try_with(|held| held.0.last().cloned()).ok().flatten()
}

/// Runs `body` as the owner of `grant`, on top of the grants the enclosing body already holds.
pub(crate) async fn scope<F: Future>(grant: Arc<Grant>, body: F) -> F::Output {
    let mut grants: Vec<Arc<Grant>> = HELD.try_with(|held| held.0.as_ref().clone()).unwrap_or_default();
    grants.push(grant);
    HELD.scope(Held(Arc::new(grants)), body).await
}
