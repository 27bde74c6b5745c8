use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "a", max_hold = "0s")]
async fn zero() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "b", max_hold = "10")]
async fn no_unit() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "c", max_hold = 10)]
async fn not_a_string() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "d", min_hold = "1000000000000h")]
async fn min_hold_too_long() -> Result<(), LockError> {
    Ok(())
}

fn main() {
    drop((zero(), no_unit(), not_a_string(), min_hold_too_long()));
}
