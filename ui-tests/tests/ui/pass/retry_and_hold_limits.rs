//! Every `retry` form and the hold limits.
use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "none", retry = "none")]
async fn single_attempt() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "none-no-wait", retry = "none", wait = "0s")]
async fn single_attempt_explicit_zero_wait() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "linear", wait = "5s", retry = "linear 100ms")]
async fn linear() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "exp", wait = "1m", retry = "exponential 10ms..1s", max_hold = "10m", min_hold = "1s")]
async fn exponential() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "exp-equal", wait = "1m", retry = "exponential 1m30s..1m30s")]
async fn exponential_constant() -> Result<(), LockError> {
    Ok(())
}

fn main() {
    drop((single_attempt(), single_attempt_explicit_zero_wait(), linear()));
    drop((exponential(), exponential_constant()));
}
