//! Generic parameters, where clauses, and a generic error type.
use std::fmt::{Debug, Display};

use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "item:<id>")]
async fn generic<T: Display + Send, E>(id: T) -> Result<String, E>
where
    E: From<LockError> + Debug,
{
    Ok(id.to_string())
}

#[distributed_lock(key = "pair:<a>:<b>")]
async fn two<A, B>(a: A, b: B) -> Result<(A, B), LockError>
where
    A: Display,
    B: Display + Clone,
{
    Ok((a, b))
}

pub struct Store<K> {
    key: K,
}

impl<K: Display + Sync> Store<K> {
    #[distributed_lock(key = "store:<self.key>:<n>")]
    pub async fn get<const N: usize>(&self, n: usize) -> Result<[u8; N], LockError> {
        let _ = n;
        Ok([0; N])
    }
}

fn main() {
    drop(generic::<u64, LockError>(1));
    drop(two(1, "x"));
    let store = Store { key: "k" };
    drop(store.get::<4>(1));
}
