use distlock::distributed_lock;

#[distributed_lock(key = "report:<id>")]
async fn build_report(id: u64) -> u64 {
    id
}

fn main() {
    drop(build_report(1));
}
