use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "report:<ide>")]
async fn build_report(id: u64, tenant: String) -> Result<(), LockError> {
    let _ = (id, tenant);
    Ok(())
}

fn main() {
    // The function is still emitted beside the error, so this compiles.
    drop(build_report(1, String::new()));
}
