//! Requests' settings as the builder checks them, and a lock body's error as the caller gets it.

use std::time::Duration;

use crate::RetryStrategy;
use crate::{Client, LockError};

#[derive(Debug)]
enum AppError {
    Lock(LockError),
    Body(&'static str),
}

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError::Lock(e)
    }
}

/// `try_run` gives one `Result`: the body's value, the body's own error, or the lock's error converted.
#[tokio::test]
async fn try_run_flattens_lock_and_body_errors() {
    let client = Client::builder().memory().build().await.expect("memory");
    let ok = client.lock("k").try_run(async { Ok::<_, AppError>(7) }).await;
    assert!(matches!(ok, Ok(7)), "{ok:?}");
    let body = client.lock("k").try_run(async { Err::<u8, _>(AppError::Body("no")) }).await;
    assert!(matches!(body, Err(AppError::Body("no"))), "{body:?}");
    assert!(client.lock_info("k").await.expect("info").is_none(), "released after the body's error");
    let lost = client
        .lock("k")
        .ttl(Duration::from_millis(200))
        .max_hold(Duration::from_millis(1))
        .try_run(async { std::future::pending::<Result<(), AppError>>().await })
        .await;
    assert!(matches!(lost, Err(AppError::Lock(LockError::Lost { .. }))), "{lost:?}");
}

/// A lease that ran out before anything noticed (the thread was blocked: no renewal, no timer ran) says
/// why by the clock alone: `max_hold` when the cap was reached, else that no renewal came in time.
#[tokio::test(flavor = "current_thread")]
async fn a_lease_run_out_by_the_clock_says_whether_max_hold_ended_it() {
    use crate::LossReason;

    let client = Client::builder().memory().build().await.expect("memory");
    let ttl = Duration::from_millis(150);
    for (max_hold, reason) in
        [(Some(Duration::from_millis(50)), LossReason::MaxHold), (None, LossReason::NotRenewedInTime)]
    {
        let mut request = client.lock("k").ttl(ttl);
        if let Some(max_hold) = max_hold {
            request = request.max_hold(max_hold);
        }
        let guard = request.acquire().await.expect("acquire");
        // Blocks the runtime's only thread past the lease: neither the renewer nor its timers run.
        std::thread::sleep(ttl * 2);
        match guard.extend(ttl).await {
            Err(LockError::Lost { reason: found, .. }) => assert_eq!(found, reason, "max_hold {max_hold:?}"),
            other => panic!("max_hold {max_hold:?}: {other:?}"),
        }
    }
}

/// A retry strategy that would make a waiter hammer the store is refused before any call.
#[tokio::test]
async fn zero_delays_are_invalid_config() {
    let client = Client::builder().memory().build().await.expect("memory");
    let (zero, second) = (Duration::ZERO, Duration::from_secs(1));
    for retry in [
        RetryStrategy::Linear { step: zero },
        RetryStrategy::Exponential { base: zero, max: second },
        RetryStrategy::Exponential { base: second * 2, max: second },
    ] {
        let outcome = client.lock("k").retry(retry).acquire().await;
        assert!(matches!(outcome, Err(LockError::InvalidConfig(_))), "{retry:?}: {outcome:?}");
    }
    for retry in [RetryStrategy::None, RetryStrategy::default(), RetryStrategy::Linear { step: second }] {
        client.lock("k").retry(retry).acquire().await.expect("valid").release().await.expect("release");
    }
}
