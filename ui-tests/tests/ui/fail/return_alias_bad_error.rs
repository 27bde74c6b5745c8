use distlock::distributed_lock;

#[derive(Debug)]
pub struct AppError;

pub type AppResult<T> = Result<T, AppError>;

#[distributed_lock(key = "report:<id>")]
async fn build_report(id: u64) -> AppResult<u64> {
    Ok(id)
}

fn main() {
    drop(build_report(1));
}
