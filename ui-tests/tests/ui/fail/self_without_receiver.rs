use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "tenant:<self.tenant>")]
async fn build_report(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {
    drop(build_report(1));
}
