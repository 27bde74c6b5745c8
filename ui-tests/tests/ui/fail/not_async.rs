use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "report:<id>")]
fn build_report(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {
    let _ = build_report(1);
}
