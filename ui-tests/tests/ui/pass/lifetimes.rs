//! References and lifetimes, named and elided, in parameters and the return type.
use distlock::{distributed_lock, LockError};

pub struct User {
    pub id: u64,
    pub name: String,
}

pub struct Request<'a> {
    pub user: &'a User,
}

#[distributed_lock(key = "user:<user.id>")]
async fn rename<'a>(user: &'a mut User, name: &str) -> Result<&'a str, LockError> {
    user.name = name.to_owned();
    Ok(&user.name)
}

#[distributed_lock(key = "req:<req.user.id>:<tag>")]
async fn handle(req: &Request<'_>, tag: &str) -> Result<String, LockError> {
    Ok(format!("{}:{}", req.user.name, tag))
}

#[distributed_lock(key = "first:<name>")]
async fn first(name: &str) -> Result<&str, LockError> {
    Ok(&name[..1])
}

fn main() {
    let mut user = User { id: 1, name: "a".into() };
    drop(rename(&mut user, "b"));
    let req = Request { user: &user };
    drop(handle(&req, "t"));
    drop(first("name"));
}
