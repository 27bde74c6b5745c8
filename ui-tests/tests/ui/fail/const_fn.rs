use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "report:<id>")]
const fn build_report(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {
    let _ = build_report(1);
}
