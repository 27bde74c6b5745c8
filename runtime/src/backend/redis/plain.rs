//! A server as one of a Redlock group: grants without a queue or a fencing token, and the server's lock-state
//! mark, by which the group tells a server that lost its keys (redlock/restart.rs).

use std::sync::Arc;
use std::time::Duration;

use super::errors::redis_error;
use super::RedisBackend;
use crate::backend::{Attempt, Hold, LockKeys};
use crate::{LockError, LockToken};

impl RedisBackend {
    /// This server as one of a Redlock group: its grants take neither a fencing token nor a place in a queue
    /// (ACQUIRE_PLAIN: one SET NX PX, no last token read, no queue check). Redlock refuses fencing and has no
    /// queue, so they would cost Redis time for nothing; with 64 tasks on 5 servers sharing one CPU, that time
    /// was the difference between 0.88 and 1.15 of rslock's Redlock (docs/performance.md). Each grant also
    /// reads `mark`, the key of the server's lock-state mark (acquire_plain_fn.lua), and writes it when it is
    /// missing.
    pub(crate) fn plain(mut self, mark: &str) -> Self {
        self.plain = Some(Arc::from(mark));
        self
    }

    /// One attempt, as [`Store::acquire`](crate::backend::Store::acquire) makes it on a Redlock group's server
    /// (no queue), and on a grant how long ago this server's lock state began, by its clock: since the grant
    /// that found its mark missing (the server had lost every key), or long ago on a group set up fresh.
    pub(crate) async fn acquire_plain(
        &self,
        keys: &LockKeys,
        token: &LockToken,
        ttl: Duration,
        metadata: &str,
    ) -> Result<(Attempt, Duration), LockError> {
        match self.attempt(keys, token, ttl, metadata, None).await? {
            Attempt::Granted(hold) => {
                Ok((Attempt::Granted(Hold { fence: 0, ..hold }), Duration::from_millis(hold.fence)))
            }
            busy => Ok((busy, Duration::ZERO)),
        }
    }

    /// Whether this server has its lock-state mark.
    pub(crate) async fn has_state_mark(&self) -> Result<bool, LockError> {
        let mut conn = self.commands.clone();
        redis::cmd("EXISTS").arg(self.mark()).query_async(&mut conn).await.map_err(|e| self.mark_error(e))
    }

    /// Marks this server's lock state as begun long ago, unless it has a mark: for a group set up fresh, whose
    /// servers cannot have lost a record anyone counts on.
    pub(crate) async fn mark_state_old(&self) -> Result<(), LockError> {
        let mut conn = self.commands.clone();
        let _: Option<String> = redis::cmd("SET")
            .arg(self.mark())
            .arg("0")
            .arg("NX")
            .query_async(&mut conn)
            .await
            .map_err(|e| self.mark_error(e))?;
        Ok(())
    }

    fn mark(&self) -> &str {
        self.plain.as_deref().unwrap_or_default()
    }

    fn mark_error(&self, e: redis::RedisError) -> LockError {
        redis_error(&self.server, None, e).into()
    }
}
