//! Listing a Redlock group's locks: every server in turn, each with SCAN, passing over a minority that does not
//! answer. A lock is held when a quorum of servers holds its record; with `s` servers silent, at most the
//! `n − q` a quorum can spare, it is still on at least `q − s ≥ 2q − n ≥ 1` server that answers, so the listing
//! finds every held lock. With more silent than that, it fails.

use super::{RedlockBackend, Scan, Store};
use crate::backend::redis::RedisCursor;
use crate::LockError;

/// Where a scan of the group stands: the server it is on, where on that server, and how many servers it
/// passed over.
#[derive(Debug, Default)]
pub(crate) struct RedlockCursor {
    server: usize,
    on_server: RedisCursor,
    silent: usize,
}

/// The next page of record keys of `backend`'s group (see the module's text).
pub(super) async fn scan(
    backend: &RedlockBackend,
    scan: &mut Scan<RedlockCursor>,
    pattern: &str,
    count: usize,
) -> Result<Vec<String>, LockError> {
    let at = &mut scan.cursor;
    let Some(server) = backend.servers.get(at.server) else {
        scan.done = true;
        return Ok(Vec::new());
    };
    let mut on_server = Scan { cursor: std::mem::take(&mut at.on_server), ..Scan::default() };
    let found = match server.scan(&mut on_server, pattern, count).await {
        Ok(found) => found,
        Err(LockError::Backend(e)) if e.is_transient() && at.silent < backend.servers.len() - backend.quorum() => {
            at.silent += 1;
            tracing::warn!(
                server = %e.server(),
                error = %e,
                "distlock: a Redlock server did not answer the listing; the locks are listed from the others, \
                 which hold every lock a quorum holds"
            );
            // What it listed before stays listed; the rest of it is passed over.
            on_server.done = true;
            Vec::new()
        }
        Err(e) => return Err(e),
    };
    scan.skipped += on_server.skipped;
    if on_server.done {
        *at = RedlockCursor { server: at.server + 1, on_server: RedisCursor::default(), silent: at.silent };
        scan.done = at.server == backend.servers.len();
    } else {
        at.on_server = on_server.cursor;
    }
    Ok(found)
}
