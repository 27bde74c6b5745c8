//! `impl Trait` arguments (in and out of the key) and `impl Trait` inside the return type.
use std::fmt::Display;

use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "user:<id>")]
async fn by_display(id: impl Display, names: impl IntoIterator<Item = String>) -> Result<usize, LockError> {
    Ok(id.to_string().len() + names.into_iter().count())
}

#[distributed_lock(key = "user:<id>")]
async fn returns_impl(id: u64) -> Result<impl Display, LockError> {
    Ok(id * 2)
}

fn main() {
    drop(by_display(1, vec![String::new()]));
    drop(returns_impl(1));
}
