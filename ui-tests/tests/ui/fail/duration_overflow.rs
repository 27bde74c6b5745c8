use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "report:<id>", min_hold = "99999999999999999999h")]
async fn build_report(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {
    drop(build_report(1));
}
