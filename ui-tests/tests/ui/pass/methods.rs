//! Methods taking `&self`, `&mut self` and `self`, with `self` field paths in the key.
use distlock::{distributed_lock, LockError};

pub struct Inner {
    pub id: u32,
}

pub struct Reports {
    tenant: String,
    inner: Inner,
    built: u32,
}

impl Reports {
    #[distributed_lock(key = "tenant:<self.tenant>:report:<id>")]
    pub async fn build(&self, id: u64) -> Result<String, LockError> {
        Ok(format!("{} {}", self.tenant, id))
    }

    #[distributed_lock(key = "tenant:<self.tenant>:inner:<self.inner.id>")]
    pub async fn build_mut(&mut self) -> Result<u32, LockError> {
        self.built += 1;
        Ok(self.built)
    }

    #[distributed_lock(key = "tenant:<self.tenant>")]
    pub async fn into_tenant(self) -> Result<String, LockError> {
        Ok(self.tenant)
    }

    #[distributed_lock(key = "reports:new:<tenant>")]
    pub async fn create(tenant: String) -> Result<Self, LockError> {
        Ok(Self { tenant, inner: Inner { id: 1 }, built: 0 })
    }
}

fn main() {
    let mut reports = Reports { tenant: "acme".into(), inner: Inner { id: 7 }, built: 0 };
    drop(reports.build(1));
    drop(reports.build_mut());
    drop(reports.into_tenant());
    drop(Reports::create("acme".into()));
}
