//! Lock requests: settings, the acquire loop (one round trip per attempt, woken by releases), and `run`.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{Instrument, Span};

use crate::grant::HoldLimits;
use crate::{held, observe, Client, LockError, LockGuard, RetryStrategy};

/// The shortest lease accepted: below it, one slow round trip would eat the whole lease.
const MIN_TTL: Duration = Duration::from_millis(100);
/// The longest lease accepted: far inside what Redis's PEXPIRE can represent.
const MAX_TTL: Duration = Duration::from_millis(i64::MAX as u64 / 4);
/// Keys longer than this are almost surely a bug (a whole document rendered into a key).
const MAX_KEY_BYTES: usize = 1024;

/// What a lock body does when the lock is lost while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnLost {
    /// Drop the body at once and return [`LockError::Lost`].
    #[default]
    Abort,
    /// Let the body finish, log a warning, and return its output.
    Continue,
}

/// A request for one lock, made with [`Client::lock`] (one key) or [`Client::lock_all`] (several keys, taken
/// together); set options, then [`acquire`](LockRequest::acquire), [`try_acquire`](LockRequest::try_acquire)
/// or [`run`](LockRequest::run).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
/// # let client = distlock::Client::builder().memory().build().await?;
/// use std::time::Duration;
/// let total = client.lock("billing:run")
///     .ttl(Duration::from_secs(30))
///     .wait(Duration::from_secs(5))
///     .metadata("billing-worker")
///     .run(async { 2 + 2 })
///     .await?;
/// assert_eq!(total, 4);
/// # Ok(()) }
/// ```
///
/// # Nested requests
///
/// A request for a key that the lock body being polled already holds (through the same client) is
/// *nested*: it uses the outer grant, and asks the store nothing for that key. It checks that grant as a fresh
/// request's is checked: if the outer grant is lost (its lease ran out, or another owner took the key), the
/// request fails with [`LockError::Lost`] at once — `acquire` and `try_acquire` too, and `run` without running
/// its body, whatever its `on_lost` — and sends nothing; otherwise it succeeds at once, whatever the key's
/// state on the server. Its guard neither renews nor releases: the outer request's `ttl`, `wait`, `retry`,
/// `metadata`, `min_hold` and `max_hold` govern the one hold, and [`release`](LockGuard::release) reports
/// [`ReleaseOutcome::Nested`](crate::ReleaseOutcome::Nested).
///
/// A nested `run` body is watched like any other, under the nested request's own `on_lost`: with
/// [`OnLost::Abort`] (the default) it is dropped when the outer grant is lost and `run` returns `Lost`, also
/// when the body ends after the grant's deadline; with [`OnLost::Continue`] it runs to its end. The outer
/// request's `on_lost` governs the outer body, which contains the nested one: an outer `Abort` drops both.
///
/// A request of several keys of which the body holds only some takes the others (with its own settings) and
/// leaves the held ones to the outer body; if a held one is lost, it fails with `Lost` and gives back the keys
/// it took. It waits for the others while holding the outer body's keys, outside the one sorted order that
/// keeps waiting for keys deadlock-free.
#[derive(Debug, Clone)]
#[must_use = "a lock request does nothing until acquired or run"]
pub struct LockRequest {
    pub(crate) client: Client,
    /// One key, or several from `lock_all` (sorted and deduplicated when taken).
    pub(crate) keys: Vec<String>,
    pub(crate) ttl: Duration,
    pub(crate) wait: Duration,
    pub(crate) metadata: String,
    pub(crate) retry: RetryStrategy,
    on_lost: OnLost,
    pub(crate) limits: HoldLimits,
    /// Whether a request that is not granted looks up who holds the lock for its error
    /// ([`LockError::holder`]); `try_acquire` discards that error, so it does not.
    pub(crate) describe_holder: bool,
}

impl LockRequest {
    pub(crate) fn new(client: Client, keys: Vec<String>) -> Self {
        Self {
            client,
            keys,
            ttl: Duration::from_secs(30),
            wait: Duration::ZERO,
            metadata: String::new(),
            retry: RetryStrategy::default(),
            on_lost: OnLost::default(),
            limits: HoldLimits::default(),
            describe_holder: true,
        }
    }

    /// The lease length. Default 30 s; at least 100 ms. The watchdog renews it every `ttl / 3`, so it only
    /// bounds how long a crashed holder keeps the lock.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long to wait while another owner holds the lock. Default zero: one attempt. Within it a transient
    /// failure ([`LockError::is_transient`](crate::LockError::is_transient): a timeout, a lost connection) is
    /// retried on the [`retry`](LockRequest::retry) strategy; when the wait runs out first, the last failure is
    /// the error, its message saying that the wait ran out.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Text stored with the lock, readable by anyone through [`Client::lock_info`] (e.g. which worker holds it).
    pub fn metadata(mut self, metadata: impl Into<String>) -> Self {
        self.metadata = metadata.into();
        self
    }

    /// How often a waiting request goes back to the store (see [`RetryStrategy`]: waiters are served by
    /// hand-over, so this is how often they refresh their place). Default exponential from 25 ms to 1 s.
    pub fn retry(mut self, retry: RetryStrategy) -> Self {
        self.retry = retry;
        self
    }

    /// What [`run`](LockRequest::run) does when the lock is lost under the body. Default [`OnLost::Abort`].
    pub fn on_lost(mut self, on_lost: OnLost) -> Self {
        self.on_lost = on_lost;
        self
    }

    /// Keeps the lock (held by nobody) until at least this long after it was acquired, even when released
    /// sooner: a job that must run once per period across replicas whose clocks differ slightly. The
    /// counterpart of [`max_hold`](LockRequest::max_hold).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// # let client = distlock::Client::builder().memory().build().await?;
    /// use std::time::Duration;
    /// client.lock("nightly").min_hold(Duration::from_secs(50)).run(async { /* a 1 s job */ }).await?;
    /// assert!(client.lock("nightly").try_acquire().await?.is_none(), "kept after the job ended");
    /// # Ok(()) }
    /// ```
    pub fn min_hold(mut self, hold: Duration) -> Self {
        self.limits.min_hold = Some(hold);
        self
    }

    /// Stops renewing this long after the lock was acquired, so a body that hangs cannot hold the lock forever:
    /// the lease then runs out and the lock is lost (the body is dropped unless [`OnLost::Continue`]). The
    /// counterpart of [`min_hold`](LockRequest::min_hold).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// # let client = distlock::Client::builder().memory().build().await?;
    /// use std::time::Duration;
    /// let outcome = client.lock("job")
    ///     .ttl(Duration::from_millis(200))
    ///     .max_hold(Duration::from_millis(300))
    ///     .run(std::future::pending::<()>()) // a body that never ends
    ///     .await;
    /// assert!(matches!(outcome, Err(distlock::LockError::Lost { .. })));
    /// # Ok(()) }
    /// ```
    pub fn max_hold(mut self, max: Duration) -> Self {
        self.limits.max_hold = Some(max);
        self
    }

    fn check(&self) -> Result<(), LockError> {
        if self.keys.is_empty() {
            return Err(LockError::InvalidConfig(
                "Client::lock_all was given no key: a lock needs at least one".into(),
            ));
        }
        for key in &self.keys {
            check_key(key)?;
        }
        check_ttl(self.ttl)?;
        if self.limits.min_hold.is_some_and(|hold| hold > MAX_TTL) {
            return Err(LockError::InvalidConfig("min_hold is above what Redis can store".into()));
        }
        if self.limits.max_hold.is_some_and(|max| max.is_zero()) {
            return Err(LockError::InvalidConfig("max_hold must be above zero".into()));
        }
        if let Some(problem) = self.retry.problem() {
            return Err(LockError::InvalidConfig(problem));
        }
        Ok(())
    }

    /// Takes the lock, waiting up to `wait` while it is busy; [`LockError::NotObtained`] when the wait runs out.
    ///
    /// Several keys ([`Client::lock_all`]) are taken all or nothing: in one step when all are free, else one by
    /// one in sorted order, all within the one `wait`; if one cannot be had, those already taken are released before the error (which names that
    /// key) is returned.
    ///
    /// Inside a [`run`](LockRequest::run) body that holds this key (through the same client) it succeeds at
    /// once with a nested guard that shares the outer grant and leaves the outer hold in place, or fails with
    /// [`LockError::Lost`] if that grant is lost: see [Nested requests](LockRequest#nested-requests).
    ///
    /// Fails with [`LockError::ShuttingDown`] once the client's [`shutdown`](Client::shutdown) has started,
    /// also while waiting (the request then leaves the queue).
    ///
    /// Traced as a `lock` span (see [Observability](crate#observability)) that covers the acquisition only:
    /// it opens with this call and closes when it returns, with the outcome `held`, `not_obtained` or `error`;
    /// the guard's later life is not part of it.
    pub async fn acquire(self) -> Result<LockGuard, LockError> {
        let span = self.span();
        // With nobody listening, the span needs no entering: awaited bare, the acquisition's future (a few KB)
        // is not moved into a wrapper, a memcpy on every call.
        let result = if span.is_disabled() {
            self.acquire_in(&span).await
        } else {
            self.acquire_in(&span).instrument(span.clone()).await
        };
        observe::record_outcome(&span, result.as_ref().map(|_| false));
        result
    }

    /// The request's `lock` span, named after its key (its keys, for several).
    fn span(&self) -> Span {
        match self.keys.as_slice() {
            [key] => observe::lock_span(key, None),
            keys => observe::lock_span(&keys.join(", "), None),
        }
    }

    /// The acquisition of [`acquire`](Self::acquire) and [`run`](Self::run): records the grant's fencing token
    /// and the time to the answer in `span`, and counts it (nested requests ask the store nothing and are not
    /// counted).
    async fn acquire_in(self, span: &Span) -> Result<LockGuard, LockError> {
        let started = observe::wants_timing(span).then(Instant::now);
        let result = match self.check() {
            Ok(()) => {
                // A request for keys the running lock body holds asks the server for nothing: nested, it is
                // granted also while the client shuts down (unless an outer grant is lost: then `Lost`).
                if self.keys.iter().all(|key| held::find(&self.client, key).is_some()) {
                    let nested = crate::acquire::acquire_all(self).await;
                    if let Ok(guard) = &nested {
                        span.record("fencing_token", guard.fencing_token());
                        span.record("waited_ms", 0);
                    }
                    return nested;
                }
                self.acquire_unless_shutting_down().await
            }
            Err(e) => Err(e),
        };
        let waited = started.map(|started| started.elapsed());
        // Even a disabled span looks its fields up by name when recording: skipped when nobody listens.
        if !span.is_disabled() {
            if let Some(waited) = waited.filter(|_| matches!(result, Ok(_) | Err(LockError::NotObtained { .. }))) {
                span.record("waited_ms", observe::millis(waited));
            }
            if let Ok(guard) = &result {
                span.record("fencing_token", guard.fencing_token());
            }
        }
        if let Ok(guard) = &result {
            observe::granted(guard, waited);
        }
        observe::acquired(&result, waited);
        result
    }

    /// Takes the keys from the store, unless the client's shutdown has started or starts meanwhile.
    async fn acquire_unless_shutting_down(self) -> Result<LockGuard, LockError> {
        let client = self.client.clone();
        let shutdown = &client.inner.shutdown;
        if shutdown.is_started() {
            return Err(LockError::ShuttingDown);
        }
        tokio::select! {
            biased;
            outcome = crate::acquire::acquire_all(self) => match outcome {
                // Granted as shutdown started: given back, as a waiter would have stopped.
                Ok(guard) if shutdown.is_started() => {
                    let _ = guard.release().await;
                    Err(LockError::ShuttingDown)
                }
                outcome => outcome,
            },
            // The attempt is dropped: its clean-up leaves the queue and gives back a grant it may have made.
            () = shutdown.started() => Err(LockError::ShuttingDown),
        }
    }

    /// One attempt: the guard, or `None` when another owner holds the lock. Nested in a lock body whose grant
    /// of the key is lost, [`LockError::Lost`] (not `None`: see [Nested requests](LockRequest#nested-requests)).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// # let client = distlock::Client::builder().memory().build().await?;
    /// let first = client.lock("job").try_acquire().await?.expect("free");
    /// assert!(client.lock("job").try_acquire().await?.is_none());
    /// # drop(first); Ok(()) }
    /// ```
    pub async fn try_acquire(self) -> Result<Option<LockGuard>, LockError> {
        let request = Self { describe_holder: false, ..self.wait(Duration::ZERO) };
        match request.acquire().await {
            Ok(guard) => Ok(Some(guard)),
            Err(LockError::NotObtained { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Takes the lock, runs `body` while the watchdog keeps it, and releases it when the body ends — or when
    /// the body panics or this future is dropped (then in the background, promptly). If the lock is lost while
    /// the body runs, the body is dropped and the result is [`LockError::Lost`] (unless
    /// [`on_lost`](LockRequest::on_lost) says [`OnLost::Continue`]). The body never runs without the lock.
    ///
    /// Inside `body`, requests for the same key through the same client are reentrant (see
    /// [Nested requests](LockRequest#nested-requests)); other futures and spawned tasks are not owners.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// # let client = distlock::Client::builder().memory().build().await?;
    /// let c = client.clone();
    /// let inner = client.lock("account:7").run(async move {
    ///     // Reentrant: the body already holds "account:7".
    ///     c.lock("account:7").run(async { "nested" }).await
    /// }).await??;
    /// assert_eq!(inner, "nested");
    /// # Ok(()) }
    /// ```
    ///
    /// Traced as a `lock` span (see [Observability](crate#observability)) entered for the whole future: the
    /// wait and the body, whose own spans and events are its children.
    pub async fn run<F: Future>(self, body: F) -> Result<F::Output, LockError> {
        let span = self.span();
        self.run_in(span, body).await
    }

    /// [`run`](Self::run) in `span` (the attribute's, which names its function). The span is entered around
    /// the acquisition, the body and the release, not as one more future around all of them: in debug builds
    /// every layer of future around a lock body costs stack in each nested lock body.
    pub(crate) async fn run_in<F: Future>(self, span: Span, body: F) -> Result<F::Output, LockError> {
        // Declared first, so dropped last: the client's shutdown waits until the body is gone.
        let _running = self.client.inner.shutdown.activity();
        let on_lost = self.on_lost;
        // Boxed, as the body is below: the acquisition is most of a lock body's future, and nested lock bodies
        // would otherwise carry it in each level's frames (a debug build's test of three nested `run`s
        // overflowed its 2 MiB stack with the span's fields added). One allocation per cycle.
        let guard = match Box::pin(self.acquire_in(&span).instrument(span.clone())).await {
            Ok(guard) => guard,
            Err(e) => {
                observe::record_outcome(&span, Err(&e));
                return Err(e);
            }
        };
        // A loss seen here may be the clock's alone (the lease ran out before the renewer noticed): marked, so
        // that it is reported and counted once, like one the renewer found (also when a nested guard sees the
        // outer grant's loss first: the grant reports it, once).
        let lost = |guard: &LockGuard| {
            guard.mark_lost_by_clock();
            observe::record_outcome(&span, Ok(true));
            guard.loss().unwrap_or_else(|| guard.grant().lost_error())
        };
        if guard.is_lost() {
            // Lost before the body's first poll (e.g. a shutdown's grace ended, or a nested request's outer
            // grant ran out since it was checked): the body never starts.
            return Err(lost(&guard));
        }
        if guard.is_nested() {
            // Nested: the outer body's grants, which the outer `run` renews and releases. The body is watched
            // all the same, under this request's own `on_lost`, as a fresh body is below: the outer body's
            // `on_lost` governs the outer body only. It runs in the outer body's scope and span (not wrapped
            // again: each wrapper is a body-sized temporary in every nested lock body's frame in debug builds),
            // and boxed, like a fresh body: pinned in place instead, the body took one more slot at each level,
            // and a debug build's three nested `run`s needed twice the future and nearly twice the stack.
            let (output, lost_under_body) =
                watched(Box::pin(body), &guard, on_lost).await.ok_or_else(|| lost(&guard))?;
            observe::record_outcome(&span, Ok(lost_under_body));
            return Ok(output);
        }
        // Boxed: nested lock bodies (an annotated fn calling another) would otherwise each copy the whole body
        // future into their poll frames, which in debug builds overflows a thread's stack after a few levels.
        let body = Box::pin(held::scope(guard.grants(), body).instrument(span.clone()));
        let (output, lost_under_body) = watched(body, &guard, on_lost).await.ok_or_else(|| lost(&guard))?;
        // The body's output is never thrown away over a failed release: the lease frees the lock anyway. (A
        // release that found the lock no longer ours is reported by the release itself.)
        let key = guard.key().to_owned();
        if let Err(e) = guard.release().instrument(span.clone()).await {
            let _entered = span.enter();
            tracing::warn!(%key, error = %e, "distlock: release failed; the lock frees when its lease runs out");
        }
        observe::record_outcome(&span, Ok(lost_under_body));
        Ok(output)
    }

    /// [`run`](LockRequest::run) for a body that returns a `Result` whose error converts from [`LockError`],
    /// as a `#[distributed_lock]` function does: a lock failure comes back as `Err(E::from(lock_error))` beside
    /// the body's own errors, not as a nested `Result`.
    ///
    /// ```
    /// #[derive(Debug)]
    /// enum AppError { Lock(distlock::LockError), Parse(std::num::ParseIntError) }
    /// impl From<distlock::LockError> for AppError {
    ///     fn from(e: distlock::LockError) -> Self { AppError::Lock(e) }
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), AppError> {
    /// # let client = distlock::Client::builder().memory().build().await?;
    /// let n: u32 = client.lock("import").try_run(async { "42".parse().map_err(AppError::Parse) }).await?;
    /// assert_eq!(n, 42);
    ///
    /// let _held = client.lock("import").acquire().await?;
    /// let busy = client.lock("import").try_run(async { Ok::<_, AppError>(()) }).await;
    /// assert!(matches!(busy, Err(AppError::Lock(distlock::LockError::NotObtained { .. }))));
    /// # Ok(()) }
    /// ```
    pub async fn try_run<F, T, E>(self, body: F) -> Result<T, E>
    where
        F: Future<Output = Result<T, E>>,
        E: From<LockError>,
    {
        self.run(body).await.unwrap_or_else(|e| Err(e.into()))
    }
}

/// Runs a lock body, fresh or nested, watched under `on_lost`: with [`OnLost::Abort`] it is dropped when `guard`'s
/// lock is lost, and one that ends past the deadline (blocking code kept its thread) counts as lost too: `None`;
/// with [`OnLost::Continue`] it runs to its end. Its output, and whether the lock was lost under a `Continue`
/// body (then marked lost, so the loss is reported once).
async fn watched<F: Future + ?Sized>(
    mut body: std::pin::Pin<Box<F>>,
    guard: &LockGuard,
    on_lost: OnLost,
) -> Option<(F::Output, bool)> {
    let output = match on_lost {
        OnLost::Abort => {
            // The loss first: a body whose task was not run for a while (a process pause, a starved
            // executor) past its deadline is dropped before it runs another step without its lock (found by
            // the simulation once a stall stopped the client's own tasks: memory seed 10).
            tokio::select! {
                biased;
                () = guard.lost() => return None,
                output = &mut body => {
                    // A body that kept its thread past the deadline finished without the lock: its work may
                    // have overlapped another holder's, and the caller must know.
                    if guard.is_lost() {
                        return None;
                    }
                    output
                }
            }
        }
        OnLost::Continue => body.await,
    };
    // (Under `OnLost::Abort` the body's end was checked above.)
    let lost_under_body = on_lost == OnLost::Continue && guard.is_lost();
    if lost_under_body {
        guard.mark_lost_by_clock();
    }
    Some((output, lost_under_body))
}

pub(crate) fn check_ttl(ttl: Duration) -> Result<(), LockError> {
    if ttl < MIN_TTL {
        return Err(LockError::InvalidConfig(format!("ttl {ttl:?} is below the minimum of {MIN_TTL:?}")));
    }
    if ttl > MAX_TTL {
        return Err(LockError::InvalidConfig(format!("ttl {ttl:?} is above what Redis can store")));
    }
    Ok(())
}

pub(crate) fn check_key(key: &str) -> Result<(), LockError> {
    let reason = if key.is_empty() {
        "the key is empty"
    } else if key.len() > MAX_KEY_BYTES {
        "the key is longer than 1024 bytes"
    } else if key.chars().any(char::is_control) {
        "the key contains a control character"
    } else {
        return Ok(());
    };
    let shown: String = key.chars().take(64).collect();
    Err(LockError::InvalidKey { key: shown, reason })
}

#[cfg(test)]
mod tests;
