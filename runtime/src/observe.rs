//! What the engine tells the outside: the `lock` span of every lock body, and (feature `metrics`) counters,
//! histograms and gauges through the `metrics` facade. The engine calls the hooks below and never asks whether
//! anyone listens: a span nobody is interested in is a disabled callsite (its fields are never evaluated), and
//! without the feature every metric hook is an empty inline function. Labels come from small fixed sets: never
//! a key, which is unbounded.

use std::time::Duration;

use tracing::field::Empty;
use tracing::Span;

use crate::grant::Grant;
use crate::{LockError, LockGuard, ReleaseOutcome};

/// The span of one lock body (`run`, the attribute) or acquisition (`acquire`), a child of the current span.
/// `fencing_token` and `waited_ms` are recorded once granted, `outcome` at the end.
pub(crate) fn lock_span(key: &str, function: Option<&'static str>) -> Span {
    tracing::debug_span!(
        target: "distlock",
        "lock",
        key,
        function,
        fencing_token = Empty,
        waited_ms = Empty,
        outcome = Empty,
    )
}

/// Records what a lock body came to: `held` (the body or acquisition had the lock), `lost` (it was lost under
/// the body, also when `OnLost::Continue` let the body finish), `not_obtained` or `error`.
pub(crate) fn record_outcome(span: &Span, result: Result<bool, &LockError>) {
    if span.is_disabled() {
        return;
    }
    let outcome = match result {
        Ok(false) => "held",
        Ok(true) | Err(LockError::Lost { .. }) => "lost",
        Err(LockError::NotObtained { .. }) => "not_obtained",
        Err(_) => "error",
    };
    span.record("outcome", outcome);
}

#[cfg(feature = "metrics")]
mod enabled {
    use std::time::Duration;

    use tokio::time::Instant;

    use crate::LockError;

    /// An acquisition ended (not a nested one, which asks the store nothing): counted by outcome
    /// (`acquired`, `not_obtained`, `error`); the time to a grant or a refusal in `distlock_wait_seconds`.
    pub(crate) fn acquired<T>(result: &Result<T, LockError>, waited: Option<Duration>) {
        let outcome = match result {
            Ok(_) => "acquired",
            Err(LockError::NotObtained { .. }) => "not_obtained",
            Err(_) => "error",
        };
        metrics::counter!("distlock_acquire_total", "outcome" => outcome).increment(1);
        // Only answers: an error (a bad key, a store down) says nothing about how long locks are waited for.
        if let Some(waited) = waited.filter(|_| outcome != "error") {
            metrics::histogram!("distlock_wait_seconds").record(waited.as_secs_f64());
        }
    }

    /// A grant was found lost (once per grant).
    pub(crate) fn lost() {
        metrics::counter!("distlock_lost_total").increment(1);
    }

    /// One watchdog renewal came back: `renewed`, `lost` (gone, taken, or too late to count) or `failed` (an
    /// error; retried).
    pub(crate) fn renewal(result: &'static str) {
        metrics::counter!("distlock_renewals_total", "result" => result).increment(1);
    }

    /// A grant began: one more lock held by this process.
    pub(crate) fn grant_started() {
        metrics::gauge!("distlock_held").increment(1.0);
    }

    /// A grant ended (released, dropped or abandoned); it began at `acquired_at`.
    pub(crate) fn grant_ended(acquired_at: Instant) {
        metrics::gauge!("distlock_held").decrement(1.0);
        metrics::histogram!("distlock_hold_seconds").record(acquired_at.elapsed().as_secs_f64());
    }

    /// One call to the store, by operation.
    pub(crate) fn backend_call(op: &'static str, took: Duration) {
        metrics::histogram!("distlock_backend_call_seconds", "op" => op).record(took.as_secs_f64());
    }

    /// One request waiting for a busy lock, from its first busy attempt until it returns or is dropped.
    #[derive(Debug)]
    pub(crate) struct Waiting(());

    impl Waiting {
        pub(crate) fn start() -> Self {
            metrics::gauge!("distlock_waiting").increment(1.0);
            Self(())
        }
    }

    impl Drop for Waiting {
        fn drop(&mut self) {
            metrics::gauge!("distlock_waiting").decrement(1.0);
        }
    }
}

#[cfg(not(feature = "metrics"))]
mod enabled {
    //! Without the feature: the same hooks, doing nothing.
    use std::time::Duration;

    use tokio::time::Instant;

    use crate::LockError;

    #[inline(always)]
    pub(crate) fn acquired<T>(_: &Result<T, LockError>, _: Option<Duration>) {}
    #[inline(always)]
    pub(crate) fn lost() {}
    #[inline(always)]
    pub(crate) fn renewal(_: &'static str) {}
    #[inline(always)]
    pub(crate) fn grant_started() {}
    #[inline(always)]
    pub(crate) fn grant_ended(_: Instant) {}

    #[derive(Debug)]
    pub(crate) struct Waiting(());

    impl Waiting {
        #[inline(always)]
        pub(crate) fn start() -> Self {
            Self(())
        }
    }
}

pub(crate) use enabled::*;

/// Whether anything needs the time an acquisition took: metrics, a subscriber interested in `span`, or one
/// interested in the grant event.
pub(crate) fn wants_timing(span: &Span) -> bool {
    cfg!(feature = "metrics") || !span.is_disabled() || tracing::enabled!(target: "distlock", tracing::Level::DEBUG)
}

/// A duration in whole milliseconds, for fields.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The DEBUG event of a grant, one per key the request took from the store (nested keys were taken by the
/// lock body around it). Fields are evaluated only when a subscriber wants the event. Its target is `distlock`,
/// like the span's, so its message needs no `distlock:` of its own (`fmt` prints `distlock: lock granted`).
#[inline]
pub(crate) fn granted(guard: &LockGuard, waited: Option<Duration>) {
    // One check for the whole guard, inlined: with nobody listening the lock path pays a load and a branch.
    if tracing::enabled!(target: "distlock", tracing::Level::DEBUG) {
        granted_events(guard, waited);
    }
}

fn granted_events(guard: &LockGuard, waited: Option<Duration>) {
    for grant in guard.owned_grants() {
        tracing::debug!(
            target: "distlock",
            key = %grant.keys.name,
            owner = %grant.client.inner.owner,
            fencing_token = grant.fence,
            waited_ms = waited.map(millis),
            "lock granted"
        );
    }
}

/// The DEBUG event of a release that freed the lock (`outcome` `Released`, or `Unconfirmed` after a resend),
/// or left it to `min_hold` for `kept`.
pub(crate) fn released(grant: &Grant, outcome: ReleaseOutcome, kept: Option<Duration>) {
    tracing::debug!(
        target: "distlock",
        key = %grant.keys.name,
        owner = %grant.client.inner.owner,
        fencing_token = grant.fence,
        held_ms = millis(grant.acquired_at.elapsed()),
        kept_by_min_hold_ms = kept.map(millis),
        ?outcome,
        "lock released"
    );
}

/// `$call` (a store call's `.await`ed expression), timed into `distlock_backend_call_seconds{op = $op}` with the
/// feature `metrics`; just `$call` without it.
macro_rules! timed {
    ($op:literal, $call:expr) => {{
        #[cfg(feature = "metrics")]
        let started = tokio::time::Instant::now();
        let output = $call;
        #[cfg(feature = "metrics")]
        $crate::observe::backend_call($op, started.elapsed());
        output
    }};
}
pub(crate) use timed;
