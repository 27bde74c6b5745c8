use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "account:<from>", keys = ["account:<from>", "account:<to>"])]
async fn transfer(from: u64, to: u64) -> Result<(), LockError> {
    let _ = (from, to);
    Ok(())
}

#[distributed_lock(keys = ["account:<from>", "account:<to>"], ttl = "5s", key = "account:<from>")]
async fn transfer_back(from: u64, to: u64) -> Result<(), LockError> {
    let _ = (from, to);
    Ok(())
}

fn main() {
    drop(transfer(1, 2));
    drop(transfer_back(2, 1));
}
