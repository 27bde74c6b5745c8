//! The in-process store's own rules: what a record carries through renewals and hand-overs, several locks taken
//! together without jumping a queue, fences rising and released locks swept.

use std::time::Duration;

use super::{MemoryBackend, FENCE_RETENTION, SWEEP_FROM};
use crate::backend::{Attempt, LockKeys, Queueing, Store};
use crate::{LockToken, ReleaseOutcome};

/// A record names its grant's owner and time; a renewal keeps the time, and a hand-over is a new grant of
/// the heir's, with the owner and metadata the heir queued with (two owners sharing one store here, as
/// two processes share a Redis).
#[tokio::test(start_paused = true)]
async fn records_carry_the_grants_owner_and_time_through_renewals_and_hand_overs() {
    let ttl = Duration::from_secs(10);
    let alpha = MemoryBackend::new("alpha".into());
    let beta = MemoryBackend { owner: "beta".into(), ..alpha.clone() };
    let keys = LockKeys::new("t:", "k".into());
    let (a, b) = (LockToken::random(), LockToken::random());
    assert!(matches!(alpha.acquire(&keys, &a, ttl, "first", None).await.unwrap(), Attempt::Granted(_)));
    tokio::time::advance(Duration::from_secs(3)).await;
    assert!(alpha.renew(&keys, &a, ttl).await.unwrap());
    let info = alpha.info(&keys).await.unwrap().expect("held");
    assert_eq!((info.owner.as_str(), info.metadata.as_str()), ("alpha", "first"));
    assert_eq!(info.held_for, Duration::from_secs(3), "since the grant, not the renewal");
    assert_eq!(info.remaining_ttl, ttl);

    let queueing = Some(Queueing { register: ttl, keep: ttl, client: 1, lease: ttl, attempt: 1 });
    assert!(matches!(beta.acquire(&keys, &b, ttl, "second", queueing).await.unwrap(), Attempt::Busy { .. }));
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(alpha.release(&keys, &a, None, None).await.unwrap(), ReleaseOutcome::Released);
    tokio::time::advance(Duration::from_secs(2)).await;
    let info = alpha.info(&keys).await.unwrap().expect("handed over");
    assert_eq!((info.owner.as_str(), info.metadata.as_str()), ("beta", "second"));
    assert_eq!(info.held_for, Duration::from_secs(2), "a hand-over is a new grant");
}

/// Free locks are granted together, or none is: a held lock, or a free one with somebody queued for it
/// (a lapsed hold whose heir has not been served yet), leaves every key alone, so no waiter is jumped.
#[tokio::test(start_paused = true)]
async fn free_locks_are_granted_together_and_queued_ones_never_jumped() {
    let ttl = Duration::from_secs(10);
    let store = MemoryBackend::new("test".into());
    let (a, b) = (LockKeys::new("t:", "a".into()), LockKeys::new("t:", "b".into()));
    let (mine, holder, waiter) = (LockToken::random(), LockToken::random(), LockToken::random());
    let mine_b = LockToken::random();
    let holds = store.acquire_free(&[(&a, &mine), (&b, &mine_b)], ttl, "m").await.unwrap().expect("both free");
    assert_eq!(holds.len(), 2);
    assert!(holds.iter().all(|h| h.lease == ttl && h.fence > 0));
    assert_eq!(store.info(&b).await.unwrap().expect("held").fencing_token, holds[1].fence);
    store.release(&a, &mine, None, None).await.unwrap();
    store.release(&b, &mine_b, None, None).await.unwrap();

    // b held for 1 s, with a waiter queued behind it; then the hold lapses unreleased.
    let short = Duration::from_secs(1);
    assert!(matches!(store.acquire(&b, &holder, short, "", None).await.unwrap(), Attempt::Granted(_)));
    assert!(store.acquire_free(&[(&a, &mine), (&b, &mine_b)], ttl, "").await.unwrap().is_none(), "b held");
    let queueing = Some(Queueing { register: ttl, keep: ttl, client: 1, lease: ttl, attempt: 1 });
    assert!(matches!(store.acquire(&b, &waiter, ttl, "", queueing).await.unwrap(), Attempt::Busy { .. }));
    tokio::time::advance(short * 2).await;
    assert!(store.acquire_free(&[(&a, &mine), (&b, &mine_b)], ttl, "").await.unwrap().is_none(), "b queued");
    assert!(store.info(&a).await.unwrap().is_none(), "nothing taken");
    // The waiter is served first.
    assert!(matches!(store.acquire(&b, &waiter, ttl, "", None).await.unwrap(), Attempt::Granted(_)));
}

/// The in-process store keeps the Redis store's promise: tokens rise across a new store (a new process)
/// and within one, and a released lock leaves nothing behind once its retention has passed.
#[tokio::test(start_paused = true)]
async fn fences_rise_across_stores_and_released_locks_leave_nothing() {
    let ttl = Duration::from_secs(1);
    let grant = |store: &MemoryBackend, key: &str| {
        let (store, keys, token) = (store.clone(), LockKeys::new("t:", key.into()), LockToken::random());
        async move {
            match store.acquire(&keys, &token, ttl, "", None).await.expect("memory") {
                Attempt::Granted(hold) => {
                    store.release(&keys, &token, None, None).await.expect("memory");
                    hold.fence
                }
                other => panic!("{other:?}"),
            }
        }
    };
    let first = MemoryBackend::new("test".into());
    let a = grant(&first, "k").await;
    let b = grant(&first, "k").await;
    assert!(b > a, "{b} after {a}");
    // A new store knows nothing of the old one's tokens, as a Redis restart without persistence.
    let c = grant(&MemoryBackend::new("test".into()), "k").await;
    assert!(c > b, "{c} after {b} in a new store");
    assert!(c < 1 << 53, "tokens stay exact in JSON: {c}");

    for i in 0..3 * SWEEP_FROM {
        grant(&first, &format!("key:{i}")).await;
    }
    tokio::time::advance(ttl + FENCE_RETENTION + Duration::from_secs(1)).await;
    grant(&first, "one more").await; // sweeps run on grants, once the maps have doubled
    for i in 0..3 * SWEEP_FROM {
        grant(&first, &format!("again:{i}")).await;
    }
    let state = first.state();
    let kept = state.records.len() + state.fences.len() + state.queues.len();
    assert!(kept <= 3 * SWEEP_FROM + 2, "{kept} entries kept for {} live fences", 3 * SWEEP_FROM + 1);
    assert!(!state.fences.contains_key("t:{key:0}"), "a released lock's fence outlived its retention");
}
