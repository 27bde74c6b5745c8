//! The generated future is `Send` when the body's is, so it can be spawned; it is `'static` with owned arguments.
use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "report:<id>")]
async fn build_report(id: u64) -> Result<u64, LockError> {
    tokio::task::yield_now().await;
    Ok(id)
}

fn assert_send_static<F: std::future::Future + Send + 'static>(_: F) {}

fn main() {
    assert_send_static(build_report(1));
}
