//! Every argument, with raw string literals and unusual but valid parameter patterns.
use distlock::{distributed_lock, LockError};

#[distributed_lock(
    key = r"all:<id>",
    ttl = "1m30s",
    wait = "500ms",
    retry = "exponential 10ms..200ms",
    min_hold = "2s",
    max_hold = "1h",
    on_lost = "continue",
    metadata = "all arguments",
    crate = "distlock",
)]
async fn all(mut id: u64, (a, b): (u8, u8), _: bool) -> Result<u64, LockError> {
    id += u64::from(a) + u64::from(b);
    Ok(id)
}

#[distributed_lock(key = "abort:<id>", on_lost = "abort", ttl = "1h", wait = "0s")]
async fn abort(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {
    drop(all(1, (2, 3), true));
    drop(abort(1));
}
