//! A free function: `?`, early `return` and a `Result` type alias behave as without the attribute.
use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub enum AppError {
    Lock(LockError),
    Parse(std::num::ParseIntError),
}

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError::Lock(e)
    }
}

impl From<std::num::ParseIntError> for AppError {
    fn from(e: std::num::ParseIntError) -> Self {
        AppError::Parse(e)
    }
}

pub type AppResult<T> = Result<T, AppError>;

#[distributed_lock(key = "report:<id>", ttl = "60s", wait = "5s")]
pub async fn build_report(id: u64) -> Result<String, AppError> {
    if id == 0 {
        return Ok(String::from("empty"));
    }
    let n: u64 = "7".parse()?;
    Ok(format!("report {id} ({n})"))
}

#[distributed_lock(key = "totals:<year>")]
async fn totals(year: u16) -> AppResult<u64> {
    let parsed: u64 = year.to_string().parse()?;
    Ok(parsed)
}

/// Doc comments and other attributes stay on the function.
#[distributed_lock(key = "jobs:cleanup")]
#[must_use = "futures do nothing unless awaited"]
async fn cleanup() -> Result<(), LockError> {
    #![allow(unused_variables)]
    let unused = 1;
    Ok(())
}

fn main() {
    drop(build_report(1));
    drop(totals(2024));
    drop(cleanup());
}
