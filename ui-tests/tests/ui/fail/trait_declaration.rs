use distlock::{distributed_lock, LockError};

pub trait Job {
    #[distributed_lock(key = "job")]
    async fn run(&self) -> Result<(), LockError>;
}

fn main() {}
