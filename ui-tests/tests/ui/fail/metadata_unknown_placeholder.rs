use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "report:<id>", metadata = "replica <replika> builds <id>")]
async fn build_report(id: u64, replica: &str) -> Result<(), LockError> {
    let _ = (id, replica);
    Ok(())
}

fn main() {
    // The function is still emitted beside the error, so this compiles.
    drop(build_report(1, "a"));
}
