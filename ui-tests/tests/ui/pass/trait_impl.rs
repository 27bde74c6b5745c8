//! `async fn` in a trait, implemented with the attribute.
use distlock::{distributed_lock, LockError};

trait Job {
    async fn run(&self, tick: u64) -> Result<u64, LockError>;
}

pub struct Cleanup {
    name: &'static str,
}

impl Job for Cleanup {
    #[distributed_lock(key = "job:<self.name>:<tick>", min_hold = "1s")]
    async fn run(&self, tick: u64) -> Result<u64, LockError> {
        Ok(tick + 1)
    }
}

fn main() {
    let job = Cleanup { name: "cleanup" };
    drop(job.run(1));
}
