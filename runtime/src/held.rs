//! Reentrancy: the grants the current lock body holds, scoped to that body's future with a task-local, so
//! sibling futures in the same task and spawned tasks are not owners.

use std::future::Future;
use std::sync::Arc;

use crate::grant::Grant;
use crate::Client;

/// The holds of the lock bodies around the code being polled, innermost last; each is every key of one
/// request (one key, or several from `lock_all`).
#[derive(Clone, Default)]
struct Held(Arc<Vec<Arc<[Arc<Grant>]>>>);

tokio::task_local! {
    static HELD: Held;
}

/// The grant of `key` held by the lock body being polled right now, if it was taken through `client`.
pub(crate) fn find(client: &Client, key: &str) -> Option<Arc<Grant>> {
    HELD.try_with(|held| {
        held.0.iter().flat_map(|hold| hold.iter()).find(|g| g.keys.name == key && g.client.same_owner(client)).cloned()
    })
    .ok()
    .flatten()
}

/// The grants of the innermost lock body being polled right now.
pub(crate) fn innermost() -> Option<Vec<Arc<Grant>>> {
    HELD.try_with(|held| held.0.last().map(|hold| hold.to_vec())).ok().flatten()
}

/// Runs `body` as the owner of `grants` (one request's keys), on top of the grants the enclosing body already
/// holds.
pub(crate) async fn scope<F: Future>(grants: Vec<Arc<Grant>>, body: F) -> F::Output {
    let mut holds: Vec<Arc<[Arc<Grant>]>> = HELD.try_with(|held| held.0.as_ref().clone()).unwrap_or_default();
    holds.push(grants.into());
    HELD.scope(Held(Arc::new(holds)), body).await
}
