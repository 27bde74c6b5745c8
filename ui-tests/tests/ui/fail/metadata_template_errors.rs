//! Every problem in a metadata template is reported at once, with the key's: a word in angle brackets that is no
//! parameter (`<<` writes a `<`), a stray `>`, an unclosed `<`, a name bound by a pattern, `self` in a free fn.
use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "job:<ide>", metadata = "a<b> c > d: <x> <self.name> <rest")]
async fn job(id: u64, (x, y): (u8, u8)) -> Result<(), LockError> {
    let _ = (id, x, y);
    Ok(())
}

fn main() {
    drop(job(1, (2, 3)));
}
