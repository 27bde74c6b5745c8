//! Redlock's own rules, without servers: quorum leases, a release's verdict, the client's memory of held locks.

use std::time::Duration;

use tokio::time::Instant;

use super::{quorum_lease, quorum_remaining, release_verdict, Live, RedlockBackend, Unfinished};
use crate::backend::{LockKeys, Store};
use crate::LockToken;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn the_quorum_lease_is_its_shortest_and_a_late_quorum_has_none() {
    let start = Instant::now();
    // The shortest lease of the quorum, while its validity (lease − 1% − 2 ms from the start) lasts.
    assert_eq!(quorum_lease(start, start + ms(5), &[ms(1000), ms(990)]), Some(ms(990)));
    // 1000 ms − 12 ms of drift = 988 ms: a quorum reached later than that is a failure.
    assert_eq!(quorum_lease(start, start + ms(987), &[ms(1000)]), Some(ms(1000)));
    assert_eq!(quorum_lease(start, start + ms(988), &[ms(1000)]), None);
    assert_eq!(quorum_lease(start, start + ms(500), &[ms(1000), ms(400)]), None);
    assert_eq!(quorum_lease(start, start, &[]), None);
}

/// A release forgets the lock it gives back: `Live` holds only the locks still held, so the client's
/// memory does not grow with every lock it ever took (the mutation report's `Live::leave` -> `()`). No
/// server is needed: the token is forgotten before any is asked, whatever they answer.
#[tokio::test]
async fn a_release_forgets_the_lock_it_gives_back() {
    let backend = RedlockBackend {
        servers: Vec::new(),
        unfinished: Unfinished::default(),
        live: Live::default(),
        names: "none".into(),
        response: ms(100),
        health: std::sync::Arc::new(super::Health::new(Vec::new(), &[])),
    };
    let (keys, token) = (LockKeys::new("t:", "k".to_owned()), LockToken::random());
    backend.live.enter(&token, "meta");
    assert!(backend.live.is_held(&token));
    let _no_quorum_of_no_servers = backend.release(&keys, &token, None, None).await;
    assert!(!backend.live.is_held(&token), "a released lock stays among the held ones");
}

#[test]
fn a_quorum_holds_as_long_as_its_quorum_th_longest_lease() {
    assert_eq!(quorum_remaining(vec![ms(10), ms(30), ms(20)], 2), Some(ms(20)));
    assert_eq!(quorum_remaining(vec![ms(10)], 2), None);
}

/// A release is what a quorum says: confirmed by a quorum, `Unconfirmed` when the servers that may have freed
/// it (a resent release finding no trace) make one with those that did, and an error, not `Expired`, while
/// the servers that failed could hide a quorum that still held it.
#[test]
fn a_release_is_what_a_quorum_of_its_servers_says() {
    use crate::ReleaseOutcome::{Expired, Released, TakenByOther, Unconfirmed};
    use crate::{LockError, ReleaseOutcome};

    // Any error: the verdict counts failures, whatever they were.
    let failed = || Err(LockError::InvalidConfig("server b timed out".into()));
    let verdict = |replies: Vec<Result<ReleaseOutcome, LockError>>| {
        let quorum = replies.len() / 2 + 1;
        release_verdict(&replies, quorum)
    };
    // Three servers, a quorum of two.
    assert_eq!(verdict(vec![Ok(Released), Ok(Released), Ok(Expired)]), Ok(Released));
    assert_eq!(verdict(vec![Ok(Released), Ok(Unconfirmed), Ok(Expired)]), Ok(Unconfirmed));
    assert_eq!(verdict(vec![Ok(Unconfirmed), Ok(Unconfirmed), Ok(Expired)]), Ok(Unconfirmed));
    assert_eq!(verdict(vec![Ok(TakenByOther), Ok(Unconfirmed), Ok(Unconfirmed)]), Ok(Unconfirmed));
    assert_eq!(verdict(vec![Ok(Released), Ok(TakenByOther), Ok(Expired)]), Ok(TakenByOther));
    assert_eq!(verdict(vec![Ok(Released), failed(), Ok(Expired)]), Err(1));
    assert_eq!(verdict(vec![failed(), failed(), Ok(Expired)]), Err(0));
    assert_eq!(verdict(vec![Ok(Released), Ok(Expired), Ok(Expired)]), Ok(Expired));
    assert_eq!(verdict(vec![Ok(Unconfirmed), failed(), Ok(Expired)]), Err(0));
    assert_eq!(verdict(vec![Ok(Unconfirmed), Ok(Expired), Ok(Expired)]), Ok(Expired));
    // Five servers, a quorum of three.
    assert_eq!(verdict(vec![Ok(Released), Ok(Released), Ok(Unconfirmed), Ok(Expired), Ok(Expired)]), Ok(Unconfirmed));
    assert_eq!(verdict(vec![Ok(Released), Ok(Released), failed(), Ok(Expired), Ok(Expired)]), Err(2));
    assert_eq!(verdict(vec![Ok(Released), Ok(Released), Ok(Expired), Ok(Expired), Ok(Expired)]), Ok(Expired));
}
