//! The randomized fault soak (`tests/tests/soak.rs`, workers in `src/bin/soak_worker.rs`): the events the
//! worker processes log, one JSON object per line, the fenced register they write to, a seeded random
//! generator, and the [`check`]er that judges a run's history, Jepsen style.
//!
//! Every event is stamped on CLOCK_MONOTONIC ([`now_ns`]), which all processes on the machine share, so
//! events of different workers compare. A stamp pair `t0`/`t1` is taken just before and just after what the
//! event reports: whatever happened, happened between them.
//!
//! What the checker verifies (each a [`Check`]):
//! 1. [`Check::Overlap`]: no two grants of one key (different tokens) were *certainly* believed valid at
//!    overlapping moments. `is_lost()` is monotone (once true it stays true), so a grant was certainly
//!    valid from the `t1` of its acquire returning to the `t0` of its last `is_lost() == false`
//!    observation: whatever pauses happened in between, the holder believed in it throughout. And fencing
//!    tokens rise with real time: a grant whose acquire started after another's had returned has a higher
//!    token.
//! 2. [`Check::Register`]: the fenced register (on a server no fault touches) accepted tokens in strictly
//!    increasing order per key; every write a worker logged as accepted is in it, and every token in it was
//!    logged as granted; and no write was rejected while its grant was certainly valid (a rejection means a
//!    higher token had written already, i.e. a later grant existed while this one was held).
//! 3. [`Check::Progress`]: every worker was granted a lock, and released it as `Released`, after the faults
//!    healed.
//! 4. [`Check::Exit`]: no worker panicked, and every worker process not killed on purpose exited cleanly
//!    (status 0, an `exit` event) when told to stop — not hung, not crashed.
//!
//! A line that is not a valid event is tolerated only as the last line of a worker killed with SIGKILL (it
//! may have been cut mid-write); anywhere else it is a [`Check::Log`] violation.

mod check;
mod events;
mod logs;
#[cfg(test)]
mod tests;
mod worker;

pub use self::check::{check, rel, Check, History, Incarnation, Stats, Verdict, Violation};
pub use self::events::{now_ns, parse_log, Event};
pub use self::logs::{grant_lines, progressed, tail};
pub use self::worker::{register_keys, Rng, REGISTER_WRITE};
