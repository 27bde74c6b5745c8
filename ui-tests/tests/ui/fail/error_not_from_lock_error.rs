use distlock::distributed_lock;

#[derive(Debug)]
pub struct AppError;

#[distributed_lock(key = "report:<id>")]
async fn build_report(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

fn main() {
    drop(build_report(1));
}
