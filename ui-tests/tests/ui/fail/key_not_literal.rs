use distlock::{distributed_lock, LockError};

const KEY: &str = "report";

#[distributed_lock(key = KEY)]
async fn build_report(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(key = format!("report:{}", id))]
async fn build_other(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {
    drop(build_report(1));
    drop(build_other(1));
    let _ = KEY;
}
