use distlock::distributed_lock;

#[distributed_lock(key = "report:<id>")]
async fn build_report(id: u64) -> impl std::fmt::Display {
    id
}

fn main() {
    drop(build_report(1));
}
