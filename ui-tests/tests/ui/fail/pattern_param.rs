use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "cell:<a>")]
async fn cell((a, b): (u8, u8)) -> Result<(), LockError> {
    let _ = (a, b);
    Ok(())
}

fn main() {
    drop(cell((1, 2)));
}
