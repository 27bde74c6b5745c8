//! `crate = "..."` for a renamed or re-exported distlock.
extern crate distlock as dlx;

use distlock as dl;

mod deps {
    pub use distlock;
}

#[dl::distributed_lock(key = "a:<id>", crate = "dl")]
async fn renamed_by_use(id: u64) -> Result<u64, dl::LockError> {
    Ok(id)
}

#[dlx::distributed_lock(key = "b:<id>", crate = "::dlx")]
async fn renamed_extern_crate(id: u64) -> Result<u64, dlx::LockError> {
    Ok(id)
}

#[deps::distlock::distributed_lock(key = "c:<id>", crate = "crate::deps::distlock")]
async fn re_exported(id: u64) -> Result<u64, deps::distlock::LockError> {
    Ok(id)
}

mod nested {
    #[super::dl::distributed_lock(key = "d", crate = "super::dl")]
    pub async fn relative() -> Result<(), super::dl::LockError> {
        Ok(())
    }
}

fn main() {
    drop(renamed_by_use(1));
    drop(renamed_extern_crate(1));
    drop(re_exported(1));
    drop(nested::relative());
}
