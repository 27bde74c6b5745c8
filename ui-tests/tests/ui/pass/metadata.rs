//! Metadata templates: parameters, field paths of `self` and of parameters, tuple indices, escapes, a
//! constant text, the empty text, and no metadata at all (the function's path).
use distlock::{distributed_lock, LockError};

pub struct Worker {
    pub name: String,
}

pub struct Req {
    pub pair: (u8, &'static str),
}

impl Worker {
    #[distributed_lock(key = "job:<id>", metadata = "<self.name> runs <id> for <req.pair.1> (<req.pair.0>) <<#1>>")]
    async fn run(&self, id: u64, req: &Req) -> Result<(), LockError> {
        let _ = (id, req);
        Ok(())
    }
}

#[distributed_lock(key = "constant", metadata = "nightly job")]
async fn constant() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "empty", metadata = "")]
async fn empty() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "default:<id>")]
async fn default_metadata(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {
    let worker = Worker { name: "w".into() };
    drop(worker.run(1, &Req { pair: (2, "x") }));
    drop(constant());
    drop(empty());
    drop(default_metadata(1));
}
