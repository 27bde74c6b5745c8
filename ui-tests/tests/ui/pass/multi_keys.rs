//! Several keys: templates over parameters, `self` fields and field paths, one key in a list, and the rendered
//! keys taken together (a key rendered twice is one lock), seen through `current_lock()` in the body.
use distlock::{distributed_lock, LockError};

pub struct Bank {
    pub name: String,
}

pub struct Leg {
    pub account: u64,
}

impl Bank {
    #[distributed_lock(keys = ["<self.name>:account:<from.account>", "<self.name>:account:<to.account>"], wait = "1s")]
    async fn transfer(&self, from: Leg, to: Leg) -> Result<Vec<String>, LockError> {
        let _ = (from, to);
        let lock = distlock::current_lock().expect("inside the lock body");
        Ok(lock.keys().map(str::to_owned).collect())
    }
}

#[distributed_lock(keys = ["only:<id>"], metadata = "one <id>")]
async fn one(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), LockError> {
    let client = distlock::Client::builder().memory().build().await?;
    let bank = Bank { name: "b".into() };
    distlock::with_client(client.clone(), async {
        let keys = bank.transfer(Leg { account: 9 }, Leg { account: 1 }).await?;
        assert_eq!(keys, ["b:account:1", "b:account:9"]);
        let keys = bank.transfer(Leg { account: 5 }, Leg { account: 5 }).await?;
        assert_eq!(keys, ["b:account:5"]);
        one(3).await
    })
    .await?;
    assert!(client.lock_info("b:account:9").await?.is_none(), "released");
    Ok(())
}
