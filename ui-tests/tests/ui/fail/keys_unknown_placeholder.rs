use distlock::{distributed_lock, LockError};

#[distributed_lock(keys = ["account:<from>", "account:<too>"])]
async fn transfer(from: u64, to: u64, amount: u64) -> Result<(), LockError> {
    let _ = (from, to, amount);
    Ok(())
}

fn main() {
    drop(transfer(1, 2, 3));
}
