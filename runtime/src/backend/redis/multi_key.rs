//! The multi-key fast path on Redis: free locks taken in one ACQUIRE_ALL call (one round trip) instead of one
//! ACQUIRE each, where one script may touch them all: on one server, or on a cluster when every record hashes
//! to one slot.

use std::time::Duration;

use redis::cluster_routing::Slot;
use redis::RedisWrite;

use super::scripts::record::write_holder;
use super::scripts::ACQUIRE_ALL;
use super::{millis, unexpected_reply, RedisBackend};
use crate::backend::{Hold, LockKeys};
use crate::{LockError, LockToken};

impl RedisBackend {
    /// [`Store::acquire_free`](crate::backend::Store::acquire_free) on Redis.
    pub(super) async fn acquire_all_free(
        &self,
        locks: &[(&LockKeys, &LockToken)],
        ttl: Duration,
        metadata: &str,
    ) -> Result<Option<Vec<Hold>>, LockError> {
        let Some(&(first, _)) = locks.first() else { return Ok(Some(Vec::new())) };
        // With replica acknowledgement every grant waits for its own WAIT: one key at a time.
        if self.replicas.is_some() {
            return Ok(None);
        }
        if self.commands.is_cluster() {
            let slot = Slot::for_key(&first.record);
            if locks.iter().any(|(keys, _)| Slot::for_key(&keys.record) != slot) {
                return Ok(None); // a script's keys must share one slot
            }
        }
        let fences: Vec<i64> = self
            .eval(&ACQUIRE_ALL, first, |c| {
                c.arg(locks.len());
                for (keys, _) in locks {
                    c.arg(&keys.record);
                }
                c.arg(millis(ttl));
                write_holder(&mut c.writer_for_next_arg(), &self.owner, metadata);
                for (_, token) in locks {
                    c.arg(token.as_str());
                }
            })
            .await?;
        if fences.is_empty() {
            return Ok(None);
        }
        let holds: Option<Vec<Hold>> =
            fences.iter().map(|&fence| u64::try_from(fence).ok().map(|fence| Hold { fence, lease: ttl })).collect();
        match holds {
            Some(holds) if holds.len() == locks.len() => Ok(Some(holds)),
            _ => Err(self.error(first, unexpected_reply())),
        }
    }
}
