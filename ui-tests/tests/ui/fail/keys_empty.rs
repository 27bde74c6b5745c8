use distlock::{distributed_lock, LockError};

#[distributed_lock(keys = [])]
async fn transfer(from: u64, to: u64) -> Result<(), LockError> {
    let _ = (from, to);
    Ok(())
}

fn main() {
    drop(transfer(1, 2));
}
