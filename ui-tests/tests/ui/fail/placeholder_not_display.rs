use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct UserId(u64);

#[distributed_lock(key = "user:<user>")]
async fn load(user: UserId) -> Result<(), LockError> {
    let _ = user;
    Ok(())
}

fn main() {
    drop(load(UserId(1)));
}
