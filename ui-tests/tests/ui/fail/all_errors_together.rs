use distlock::{distributed_lock, LockError};

// Every problem is reported at once: the template, both durations, the unknown and the duplicate argument,
// and the function itself.
#[distributed_lock(key = "report:<idd>:<>", ttl = "5", wait = "1x", colour = "red", wait = "1s")]
fn build_report(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {
    let _ = build_report(1);
}
