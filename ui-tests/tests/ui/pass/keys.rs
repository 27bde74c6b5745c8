//! Key templates: field paths, tuple indices, escapes, raw identifiers, keys without placeholders.
use distlock::{distributed_lock, LockError};

pub struct Tenant {
    pub id: u32,
}

pub struct Req {
    pub tenant: Tenant,
    pub pair: (u8, &'static str),
}

#[distributed_lock(key = "t:<req.tenant.id>:p:<req.pair.0>:<req.pair.1>")]
async fn paths(req: Req) -> Result<(), LockError> {
    let _ = req;
    Ok(())
}

#[distributed_lock(key = "<<literal>>:<id>:<<<id>>>")]
async fn escapes(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(key = "kw:<type>:<r#type>")]
async fn raw_identifier(r#type: &str) -> Result<(), LockError> {
    let _ = r#type;
    Ok(())
}

#[distributed_lock(key = "jobs:nightly")]
async fn constant_key() -> Result<(), LockError> {
    Ok(())
}

fn main() {
    drop(paths(Req { tenant: Tenant { id: 1 }, pair: (2, "x") }));
    drop(escapes(1));
    drop(raw_identifier("t"));
    drop(constant_key());
}
