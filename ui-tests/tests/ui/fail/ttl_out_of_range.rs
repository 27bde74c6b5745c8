use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "a", ttl = "50ms")]
async fn too_short() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "b", ttl = "1000000000000h")]
async fn too_long() -> Result<(), LockError> {
    Ok(())
}

fn main() {
    drop(too_short());
    drop(too_long());
}
