use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "report:<id")]
async fn build_report(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {
    drop(build_report(1));
}
