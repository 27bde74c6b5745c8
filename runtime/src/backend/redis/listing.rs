//! Listing: SCAN over record keys (on a cluster, every primary in turn) and a lock's queue, read by the
//! WAITERS script. Reads only; the records themselves are read by INFO, one call per lock.

use std::time::Duration;

use redis::Cmd;

use super::errors::redis_error;
use super::scripts::record::{self, split_holder};
use super::scripts::WAITERS;
use super::{unexpected_reply, RedisBackend};
use crate::backend::{LockKeys, Place, Scan};
use crate::LockError;

/// Where a scan of one Redis deployment stands: the node it is on (a cluster's primary; 0 on one server) and
/// that node's SCAN cursor.
#[derive(Debug, Clone, Default)]
pub(crate) struct RedisCursor {
    server: usize,
    cursor: u64,
    /// A cluster's primaries (host, port), read when the scan starts.
    nodes: Option<Vec<(String, u16)>>,
}

impl RedisBackend {
    /// One SCAN step (see [`Store::scan`](crate::backend::Store::scan)); on a cluster, the primaries are read
    /// once, when the scan starts, and scanned one after another.
    pub(super) async fn scan_step(
        &self,
        scan: &mut Scan<RedisCursor>,
        pattern: &str,
        count: usize,
    ) -> Result<Vec<String>, LockError> {
        let failed = |e| LockError::from(redis_error(&self.server, None, e));
        let at = &mut scan.cursor;
        if at.nodes.is_none() {
            at.nodes = Some(self.commands.cluster_primaries().await.map_err(failed)?.unwrap_or_default());
        }
        let nodes = at.nodes.as_deref().unwrap_or_default();
        let mut cmd = Cmd::new();
        cmd.arg("SCAN").arg(at.cursor).arg("MATCH").arg(pattern).arg("COUNT").arg(count.max(1));
        let (cursor, mut keys): (u64, Vec<String>) = match nodes.get(at.server) {
            Some((host, port)) => self.commands.query_on_address(cmd, host, *port).await,
            None if nodes.is_empty() => cmd.query_async(&mut self.commands.clone()).await,
            None => {
                scan.done = true;
                return Ok(Vec::new());
            }
        }
        .map_err(failed)?;
        at.cursor = cursor;
        if cursor == 0 {
            at.server += 1;
            scan.done = at.server >= nodes.len().max(1);
        }
        scan.skipped += self.drop_freed(&mut keys).await.map_err(failed)?;
        Ok(keys)
    }

    /// Leaves out of `records` the freed ones (a released lock keeping its last fencing token for the rest of
    /// its lease), those gone since the SCAN, and values distlock did not write (counted: the count is
    /// returned): one GETRANGE of the token and its mark each, all sent at once (on a cluster each to its
    /// record's node). A record that cannot be read stays (`lock_infos` tells), unless the user lacks the
    /// right to read it (NOPERM: an error, that names the command to allow).
    async fn drop_freed(&self, records: &mut Vec<String>) -> redis::RedisResult<usize> {
        let heads = futures_util::future::join_all(records.iter().map(|record| {
            let mut cmd = Cmd::new();
            cmd.arg("GETRANGE").arg(record).arg(0).arg(crate::token::TOKEN_LEN);
            let mut conn = self.commands.clone();
            async move { cmd.query_async::<Vec<u8>>(&mut conn).await }
        }))
        .await;
        let (mut held, mut foreign) = (Vec::with_capacity(heads.len()), 0);
        for head in heads {
            held.push(match head {
                Ok(head) if head.is_empty() => false,
                Ok(head) if !is_record_head(&head) => {
                    foreign += 1;
                    false
                }
                Ok(head) => !head.starts_with(record::FREED.as_bytes()),
                Err(refused) if refused.code() == Some("NOPERM") => return Err(refused),
                Err(other) if other.code() == Some("WRONGTYPE") => {
                    foreign += 1;
                    false
                }
                Err(_) => true,
            });
        }
        let mut held = held.into_iter();
        records.retain(|_| held.next().unwrap_or(true));
        Ok(foreign)
    }

    /// The live waiters in `keys`'s queue, from its head, at most `limit` places looked at.
    pub(super) async fn queued(&self, keys: &LockKeys, limit: usize) -> Result<Vec<Place>, LockError> {
        let places: Vec<(String, i64, i64)> = self
            .eval(&WAITERS, keys, |c| {
                c.arg(1).arg(&keys.record).arg(limit.max(1));
            })
            .await?;
        let mut live = Vec::with_capacity(places.len());
        for (holder, waited_us, pttl) in places {
            // A place whose waiter stopped refreshing it: the next release skips it.
            if pttl < 0 && pttl != -1 {
                continue;
            }
            let (owner, metadata) = split_holder(&holder).ok_or_else(|| self.error(keys, unexpected_reply()))?;
            live.push(Place {
                owner: owner.to_owned(),
                metadata: metadata.to_owned(),
                waited: Duration::from_micros(waited_us.max(0) as u64),
            });
        }
        Ok(live)
    }
}

/// Whether `head`, a value's first bytes up to the mark, opens a lock record: 32 characters of a token (hex, or
/// the `=` and `-` that FREED and NOBODY write over it), then the mark `:` or `+` (record.lua).
fn is_record_head(head: &[u8]) -> bool {
    let len = crate::token::TOKEN_LEN;
    head.len() == len + 1
        && head[..len].iter().all(|&b| b.is_ascii_hexdigit() || b == b'=' || b == b'-')
        && matches!(head[len], b':' | b'+')
}
