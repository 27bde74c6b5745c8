//! A delayed restart, kept by the client: a server that lost its keys does not vote for a new holder until
//! every record it may have lost would have expired anyway.
//!
//! A Redlock server restarted without persistence (or flushed) forgets the records it held. A holder whose
//! majority included it still counts on that majority for the rest of its lease; if the group's other
//! servers are not all its own (one answered busy with a record a release missed, or did not answer at its
//! grant), a second acquirer can take the emptied server and one of those, and both read valid (issue 31,
//! schedule 4). Redlock's answer is to keep a restarted server out of the group for the longest lease. Here
//! the server tells on itself: each one keeps a lock-state mark (`<prefix>redlock:since`, no expiry), the
//! server's clock when a grant found the mark missing and wrote it, which after a loss of every key happens at
//! the first grant; every grant's reply carries the age of that mark (acquire_plain_fn.lua). A grant from a
//! server whose lock state is younger than the lock's ttl does not count toward a new holder's quorum.
//!
//! Why that suffices: a record lasts at most a lease past its last write, and a lost record was last written
//! before the loss, which is before the mark was written; so once the mark is a lease old, every record the
//! server may have lost would have expired by its own clock, and its grant is one it would have made had it
//! kept them. This assumes:
//! - no holder of the lock uses a longer lease than the acquirer's ttl (the same ttl for a key everywhere,
//!   and no `extend` beyond it); a longer one is covered only once the mark is that old;
//! - the server's clock does not jump (it dates the mark, as it expires the records);
//! - a group is taken for a new one when a client built on it finds no server marked, every server answering
//!   (`mark_fresh_group`): a group every server of which lost its state before any client asked it for a lock
//!   looks the same.
//!
//! The holder's side is renewal.rs: its renewals take the lock again where its record is gone, so it stands on
//! the restarted server again (and on any server that freed meanwhile) and keeps its majority.

use std::sync::Arc;
use std::time::Duration;

use crate::backend::{Attempt, Hold, RedisBackend};
use crate::LockError;

/// The key of a server's lock-state mark, for a client with this key prefix (under it, beside the records,
/// which are `<prefix>{<key>}`: no lock's record has this name).
pub(super) fn mark_key(prefix: &str) -> String {
    format!("{prefix}redlock:since")
}

/// A new group (no server has a mark) is marked as if its state began long ago: none of its servers can have
/// lost a record anyone counts on. A group where some server has one is left alone: an unmarked server there
/// lost its keys, and its first grant marks it, young.
///
/// A client built while a server is `silent` (it did not answer) leaves the group alone: the silent one may
/// have a mark, which would make the unmarked ones servers that lost their keys, and marking them old could
/// count a record they lost. Unmarked servers are then marked young by their first grants, so a new group
/// with a server down grants its first lock a ttl late.
pub(super) async fn mark_fresh_group(servers: &[Arc<RedisBackend>], silent: bool) -> Result<(), LockError> {
    if silent {
        return Ok(());
    }
    let marked = futures_util::future::join_all(servers.iter().map(|s| s.has_state_mark())).await;
    if marked.into_iter().collect::<Result<Vec<bool>, _>>()?.contains(&true) {
        return Ok(());
    }
    futures_util::future::join_all(servers.iter().map(|s| s.mark_state_old())).await.into_iter().collect()
}

/// One server's answer in an acquire round, as the round counts it.
#[derive(Debug, Clone, Copy)]
pub(super) enum Vote {
    /// Granted by a server whose lock state is at least the ttl old: it counts.
    Granted(Hold),
    /// Granted by a server whose lock state began `age` ago, less than the ttl: it may have lost a record a
    /// holder still counts on, so it does not count. The grant is kept if the round succeeds without it (one
    /// more server holding the lock), and given back if the round fails.
    Young(Duration),
    /// Held by another token, for this long if known.
    Busy(Option<Duration>),
}

impl Vote {
    /// The vote of a server that answered `attempt`, its lock state `age` old, for a lock of `ttl`.
    pub(super) fn of((attempt, age): (Attempt, Duration), ttl: Duration) -> Self {
        match attempt {
            Attempt::Granted(_) if age < ttl => Vote::Young(age),
            Attempt::Granted(hold) => Vote::Granted(hold),
            Attempt::Busy { remaining, .. } => Vote::Busy(remaining),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{mark_key, Vote};
    use crate::backend::{Attempt, Hold, LockKeys};

    #[test]
    fn a_grant_counts_once_the_server_s_state_is_a_ttl_old() {
        let ttl = Duration::from_secs(2);
        let granted = Attempt::Granted(Hold { fence: 0, lease: ttl });
        assert!(matches!(Vote::of((granted, Duration::from_millis(1999)), ttl), Vote::Young(_)));
        assert!(matches!(Vote::of((granted, ttl), ttl), Vote::Granted(_)));
        let busy = Attempt::Busy { fence: 0, remaining: Some(ttl) };
        assert!(matches!(Vote::of((busy, Duration::ZERO), ttl), Vote::Busy(Some(_))));
    }

    #[test]
    fn the_mark_is_no_lock_s_record() {
        let mark = mark_key("distlock:");
        assert_eq!(mark, "distlock:redlock:since");
        assert_ne!(LockKeys::new("distlock:", "redlock:since".into()).record, mark);
    }
}
