use distlock::distributed_lock;

// An alias hides what the type is, so the attribute cannot tell from the syntax; the check still points at it.
pub type Count = u64;

#[distributed_lock(key = "report:<id>")]
async fn build_report(id: u64) -> Count {
    id
}

fn main() {
    drop(build_report(1));
}
