use distlock::{distributed_lock, LockError};

// Not a list.
#[distributed_lock(keys = "account:<from>")]
async fn not_a_list(from: u64) -> Result<(), LockError> {
    let _ = from;
    Ok(())
}

// An element that is not a string literal, one that is not a valid key, and the same template twice.
#[distributed_lock(keys = ["account:<from>", 7, "", "account:<to", "account:<from>"])]
async fn bad_elements(from: u64, to: u64) -> Result<(), LockError> {
    let _ = (from, to);
    Ok(())
}

fn main() {
    drop(not_a_list(1));
    drop(bad_elements(1, 2));
}
