use distlock::{distributed_lock, LockError};

// A single attempt never waits: `wait` would be silently ignored.
#[distributed_lock(key = "report:<id>", wait = "5s", retry = "none")]
async fn build_report(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {
    drop(build_report(1));
}
