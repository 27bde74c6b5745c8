use distlock::{distributed_lock, LockError};

// Each bad `retry` value is reported on the part of the literal that is wrong, all at once.
#[distributed_lock(key = "a", retry = "lineer 100ms")]
async fn misspelled() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "b", retry = "linear")]
async fn no_step() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "c", retry = "linear 0ms")]
async fn zero_step() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "d", retry = "linear 10ms..1s")]
async fn linear_range() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "e", retry = "exponential 10ms")]
async fn no_range() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "f", retry = "exponential 2s..1sec")]
async fn bad_max() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "g", retry = "exponential 2s..1s")]
async fn base_above_max() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "h", retry = "none 1s")]
async fn none_with_value() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "i", retry = 100)]
async fn not_a_literal_string() -> Result<(), LockError> {
    Ok(())
}

fn main() {
    drop((misspelled(), no_step(), zero_step(), linear_range(), no_range()));
    drop((bad_max(), base_above_max(), none_with_value(), not_a_literal_string()));
}
