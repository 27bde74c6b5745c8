//! Telling a failure of distlock from a step of the test machine's wall clock.
//!
//! Redis and PostgreSQL expire a lease by their wall clock; distlock times it by the monotonic clock. When the
//! machine's wall clock steps forward during a test (seen in CI: a virtual machine paused and resumed, its wall
//! clock then set to the host's), every server's leases end early by the step, and a test of the watchdog or
//! of `min_hold` fails though distlock did what it should: the README's "Server clock jumps". Such a run says
//! nothing of distlock, so the scenario runs once more, and a failure with no step, or a second failure, fails
//! the test as before.

use std::future::Future;
use std::io::{self, Write};
use std::panic::{self, AssertUnwindSafe};
use std::time::{Duration, Instant, SystemTime};

use futures_util::FutureExt;

/// A step smaller than this is not reported: NTP slews the wall clock by at most 0.5 ms a second, so a
/// scenario of under a minute drifts less than 30 ms from the monotonic clock.
const STEP_THRESHOLD: Duration = Duration::from_millis(50);

/// Both clocks read together, to compare how far each advanced since.
struct Reading {
    wall: SystemTime,
    monotonic: Instant,
}

impl Reading {
    fn now() -> Self {
        Self { wall: SystemTime::now(), monotonic: Instant::now() }
    }

    /// How far the wall clock moved against the monotonic clock since this reading, in milliseconds
    /// (positive: forward).
    fn step_ms(&self) -> f64 {
        let monotonic = self.monotonic.elapsed().as_secs_f64();
        let wall = match SystemTime::now().duration_since(self.wall) {
            Ok(ahead) => ahead.as_secs_f64(),
            Err(behind) => -behind.duration().as_secs_f64(),
        };
        (wall - monotonic) * 1e3
    }
}

/// Runs `scenario()`; if it panics and the wall clock stepped by 50 ms or more meanwhile, says so
/// on stderr and runs `scenario()` again, whose panic (step or no step) fails the test. A panic with no step
/// fails the test at once.
pub async fn again_if_the_wall_clock_stepped<F, Fut>(scenario: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = ()>,
{
    let before = Reading::now();
    // Straight to stderr: the test harness captures `eprintln!` of passing tests, and this should show.
    let report = |note: String| drop(writeln!(io::stderr(), "{note}"));
    again_if_stepped(scenario, move || before.step_ms(), report).await
}

/// [`again_if_the_wall_clock_stepped`] with the step measured by `step_ms` after a failure, and the note on a
/// step given to `report`.
async fn again_if_stepped<F, Fut>(scenario: F, step_ms: impl FnOnce() -> f64, report: impl FnOnce(String))
where
    F: Fn() -> Fut,
    Fut: Future<Output = ()>,
{
    let Err(panic) = AssertUnwindSafe(scenario()).catch_unwind().await else { return };
    let step_ms = step_ms();
    if step_ms.abs() < STEP_THRESHOLD.as_secs_f64() * 1e3 {
        panic::resume_unwind(panic);
    }
    let failure = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("(a panic without a message)");
    report(format!(
        "{}: the machine's wall clock moved {step_ms:+.0} ms against its monotonic clock while the scenario \
         failed ({failure}); the servers expire leases by the wall clock, so that run says nothing of distlock: \
         running the scenario again",
        std::thread::current().name().unwrap_or("a test"),
    ));
    scenario().await;
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[test]
    fn clocks_read_together_show_no_step() {
        let reading = Reading::now();
        std::thread::sleep(Duration::from_millis(20));
        assert!(reading.step_ms().abs() < 5.0, "{} ms", reading.step_ms());
    }

    /// Runs `again_if_stepped` with a scenario that fails its first `failures` runs and a measured step of
    /// `step_ms`; returns whether it failed the test, how many runs there were, and the note it reported.
    async fn outcome(failures: u32, step_ms: f64) -> (bool, u32, Option<String>) {
        let runs = AtomicU32::new(0);
        let scenario = || async {
            if runs.fetch_add(1, Ordering::SeqCst) < failures {
                panic!("the scenario's own failure");
            }
        };
        let mut note = None;
        let run = again_if_stepped(scenario, || step_ms, |n| note = Some(n));
        let failed = AssertUnwindSafe(run).catch_unwind().await.is_err();
        (failed, runs.load(Ordering::SeqCst), note)
    }

    #[tokio::test]
    async fn only_a_failure_during_a_step_runs_again() {
        assert_eq!(outcome(0, 0.0).await, (false, 1, None), "a pass runs once");
        assert_eq!(outcome(0, 900.0).await, (false, 1, None), "a pass runs once, step or not");
        assert_eq!(outcome(1, 10.0).await, (true, 1, None), "a failure with no step fails at once");
        let (failed, runs, note) = outcome(1, 900.0).await;
        assert_eq!((failed, runs), (false, 2), "a failure during a step forward runs again");
        let note = note.expect("the rerun is reported");
        assert!(note.contains("+900 ms") && note.contains("the scenario's own failure"), "{note}");
        let (failed, runs, _) = outcome(1, -300.0).await;
        assert_eq!((failed, runs), (false, 2), "a failure during a step back runs again");
        let (failed, runs, _) = outcome(2, 900.0).await;
        assert_eq!((failed, runs), (true, 2), "a second failure fails the test");
    }
}
