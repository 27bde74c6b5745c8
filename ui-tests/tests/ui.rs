//! Compile-time behaviour of `#[distributed_lock]`: every error case in `ui/fail` (with the expected compiler
//! output beside it in a `.stderr` file) and every supported shape of function in `ui/pass`.
//!
//! Regenerate the `.stderr` files after an intended change with `TRYBUILD=overwrite cargo test -p
//! distlock-ui-tests --test ui`, then read the diff.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/fail/*.rs");
    t.pass("tests/ui/pass/*.rs");
}
