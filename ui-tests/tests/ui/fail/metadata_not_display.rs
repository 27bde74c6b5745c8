use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct Replica(u8);

#[distributed_lock(key = "job", metadata = "run by <replica>")]
async fn job(replica: Replica) -> Result<(), LockError> {
    let _ = replica;
    Ok(())
}

fn main() {
    drop(job(Replica(1)));
}
