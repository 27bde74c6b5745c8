//! Distributed locks on Redis for async Rust.
//!
//! Mark an async function and its body runs while holding a lock, across every replica of a service:
//!
//! ```
//! #[derive(Debug)]
//! enum AppError { Lock(distlock::LockError) }
//! impl From<distlock::LockError> for AppError {
//!     fn from(e: distlock::LockError) -> Self { AppError::Lock(e) }
//! }
//!
//! #[distlock::distributed_lock(key = "report:<id>", ttl = "60s", wait = "5s")]
//! async fn build_report(id: u64) -> Result<String, AppError> {
//!     Ok(format!("report {id}")) // runs under the lock `report:<id>`
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), AppError> {
//! // Once at startup: `.redis("redis://127.0.0.1:6379/")` for a real server.
//! distlock::install(distlock::Client::builder().memory().build().await?)?;
//! assert_eq!(build_report(42).await?, "report 42");
//! # Ok(()) }
//! ```
//!
//! Or use the lock directly:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
//! use std::time::Duration;
//! let client = distlock::Client::builder().memory().build().await?;
//! let guard = client.lock("report:42").ttl(Duration::from_secs(60)).wait(Duration::from_secs(5)).acquire().await?;
//! println!("holding {} with fencing token {}", guard.key(), guard.fencing_token());
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! ## Shutdown
//!
//! At the end of a process, [`Client::shutdown`] stops new and waiting requests at once
//! ([`LockError::ShuttingDown`]), gives lock bodies a grace period, then releases what is still held (those
//! bodies see [`LockError::Lost`]), and resolves when no body of the client runs and nothing of it is left in
//! the store but freed records keeping their last fencing tokens, which expire with their leases.
//!
//! ## Cargo features
//!
//! None is on by default.
//!
//! - **`tls`**: `rediss://` URLs, with rustls (ring as its crypto provider) and the webpki root certificates.
//! - **`tls-insecure`**: `tls`, and also `rediss://…/#insecure` URLs, which turn certificate checks off; the
//!   builder still refuses them unless [`ClientBuilder::allow_insecure_tls`] is set.
//! - **`tower`**: `distlock::tower::ClientLayer`, which runs each request of a tower service (axum,
//!   tonic, hyper) with a client in scope, where a [`with_client`] scope would not reach.
//! - **`metrics`**: counters, histograms and gauges of acquisitions, losses, renewals, holds and store calls
//!   through the [`metrics`](https://docs.rs/metrics) facade (install any recorder); see
//!   [Observability](#observability).
//! - **`axum`**: `IntoResponse` for [`LockError`] (axum 0.8, through `axum-core` and `http` only): 409 with
//!   `Retry-After` for a busy lock, 503 with `Retry-After` while shutting down or for transient errors, 500
//!   otherwise; see [`LockError::http_status`] and [`LockError::retry_after`], which any framework can use.
//! - **`postgres`**: `ClientBuilder::postgres`: locks in a PostgreSQL database, with tokio-postgres (the
//!   README's PostgreSQL section says what it guarantees).
//! - **`simulation`**: not for users and not covered by semver: the deterministic simulation of the lock
//!   engine (a simulated store, seeded faults, paused time) that this repository's tests drive; it turns on
//!   tokio's `test-util`.
//!
//! Rust 1.88 or later (the `rust-version` in Cargo.toml); Redis 7.0 or later; PostgreSQL 15 is the one tested.
//!
//! ## Safety model
//!
//! On one Redis server (standalone, or a primary):
//!
//! - **S1** at most one valid guard per key, while clocks drift less than the drift allowance and the holder
//!   is not paused past its deadline;
//! - **S2** release, renew and extend act only with the grant's own 128-bit token, atomically (one script);
//! - **S3** grant, fencing token and lease are set by one script; all of a lock's keys share one hash slot;
//! - **S4** fencing tokens rise strictly per key, also across a restart without persistence, a FLUSHALL or a
//!   failover (`max(last + 1, the server's clock in µs)`; below 2^53; the last token is kept at least the ttl of
//!   the key's last grant), while the server's clock does not step back by more than that ttl;
//! - **S5** the body never runs without a grant: not configured, busy, lost and backend errors are errors; a
//!   nested (reentrant) request checks the outer grant like a fresh one, and fails with [`LockError::Lost`]
//!   once it is lost (see [Nested requests](LockRequest#nested-requests));
//! - **S6** a guard's deadline never lies past the server's expiry of its grant: a lease counts from the
//!   monotonic instant taken before sending the request the server answered, for the lease its reply reports,
//!   minus drift (lease·1% + 2 ms); an announced hand-over only when it names the waiter's last busy attempt
//!   (never because its fencing token is higher: tokens go back with the server's clock); an ambiguous outcome
//!   (timeout, dropped reply, `NotReplicated`) counts as the worse one;
//! - **S7** a lost lock stops the body (by default) at its deadline, and a body that outlived its deadline
//!   returns [`LockError::Lost`]; a guard kept after its body ended reads as lost;
//! - **S8** after release, drop, panic or cancellation no renewal or extend carries the grant's token; a guard
//!   lost by the clock alone sends one compare-and-delete release, one the server reported gone nothing.
//!
//! Liveness: a crashed holder's lock frees within `ttl` of its last renewal; release happens on return,
//! error, panic or cancellation without blocking the runtime; every Redis call has connect and response
//! timeouts; [`LockRequest::max_hold`] caps renewals; connections recover after resets and restarts;
//! waiters are served in arrival order, and retries are jittered; [`Client::force_unlock`] frees a stuck lock
//! at once for the live waiters, never handing it to one that may have died.
//!
//! Not guaranteed: mutual exclusion across process pauses longer than the lease without fencing (pass
//! [`LockGuard::fencing_token`] to the storage and have it reject older tokens), across failover with
//! asynchronous replication, or across server restarts without persistence; nor under server clock jumps.
//!
//! On [Redlock](ClientBuilder::redlock) (N independent servers, a majority per lock), S1 holds while a
//! majority of the servers holds the lock, with no fencing token (S4 does not apply) and no queue, and also
//! across restarts without persistence and flushes of any servers: a grant counts toward a new holder's
//! majority only from a server whose lock state (its `<prefix>redlock:since` mark) is at least the lock's
//! ttl old, by when every record it may have lost would have expired. This assumes every holder of a lock
//! uses a lease no longer than the next acquirer's ttl (no `extend` beyond it), servers whose clocks do not
//! jump and that lose no record without the mark (no eviction, `appendfsync always` if persisted, no failover
//! behind an address), and that not every server of the group lost its state before a client was built on it
//! (a group with no mark is taken for a new one). Renewals take the lock again by the same token where a
//! server no longer has its record, so a holder stands on every server that answers; such a server counts
//! toward the renewal's majority only if it lost every key since (nobody could count it meanwhile). The
//! README's Redlock section has the details and the tests.
//!
//! ## Observability
//!
//! **Tracing** (always on; with no subscriber interested, a lock cycle costs what it did without it). Every
//! lock body gets a span named `lock`, target `distlock`, level DEBUG, with the fields `key`, `function` (the
//! annotated function's path, `module::name`; the attribute only), `fencing_token` and `waited_ms` (once
//! granted; `waited_ms` also when refused) and `outcome`: `held`, `not_obtained`, `lost` (also when
//! [`OnLost::Continue`] let the body finish) or `error`. It is a child of the span current when the lock body
//! starts (for the attribute, the caller's), so a request's trace shows its lock:
//!
//! - [`LockRequest::run`], [`LockRequest::try_run`] and the attribute: the span is entered for the whole
//!   future, the wait and the body; the body's own spans and events are its children.
//! - [`LockRequest::acquire`] and [`LockRequest::try_acquire`]: the span covers the acquisition only, from the
//!   call until it returns; the guard's hold and release are not in it.
//!
//! Events: a lock granted and a lock released (DEBUG, target `distlock`, in the lock's span where there is one:
//! `key`, `owner`, `fencing_token`, and `waited_ms` or `held_ms`, the release's `outcome` and, with
//! [`LockRequest::min_hold`], `kept_by_min_hold_ms`), a lock lost (WARN, target `distlock::grant`, with `key`,
//! `why` (the [`LossReason`]) and the token redacted), a renewal failed and retried (DEBUG,
//! `distlock::renewer`), a release that found the lock no longer held (WARN, with the [`ReleaseOutcome`]),
//! [`Client::force_unlock`] (INFO), a waiter handed the lock by a release (DEBUG, with its fencing token and
//! `how` it learnt of it; a waiter whose own refresh of its place reaches the store just after the release
//! takes the lock with that attempt, and logs only the grant). Tokens are never printed whole, only their first 8 characters.
//! `RUST_LOG=distlock=debug` (with `tracing-subscriber`'s `EnvFilter`) shows all of them; the span's own
//! line, with its outcome and how long it took, needs the subscriber's span events (`fmt`'s
//! `with_span_events(FmtSpan::CLOSE)`).
//!
//! ```
//! use tracing::Instrument;
//!
//! #[distlock::distributed_lock(key = "report:<id>")]
//! async fn build_report(id: u64) -> Result<String, distlock::LockError> {
//!     tracing::info!("building"); // an event inside the `lock` span
//!     Ok(format!("report {id}"))
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
//! # let client = distlock::Client::builder().memory().build().await?;
//! // The `lock` span of `build_report` is a child of `request`.
//! let report = distlock::with_client(client, build_report(42))
//!     .instrument(tracing::info_span!("request", id = 42))
//!     .await?;
//! assert_eq!(report, "report 42");
//! # Ok(()) }
//! ```
//!
//! **Metrics** (feature `metrics`, through the [`metrics`](https://docs.rs/metrics) facade: install any
//! recorder, e.g. `metrics-exporter-prometheus`; `examples/axum_service.rs` serves them on `/metrics`). Label
//! values come from small fixed sets, never from a key:
//!
//! | metric | type | labels | what |
//! |---|---|---|---|
//! | `distlock_acquire_total` | counter | `outcome`: `acquired`, `not_obtained`, `error` | acquisitions (nested ones ask the store nothing and are not counted) |
//! | `distlock_lost_total` | counter | — | grants found lost, once each |
//! | `distlock_renewals_total` | counter | `result`: `renewed`, `lost`, `failed` | the watchdog's renewals (`failed`: an error, retried) |
//! | `distlock_wait_seconds` | histogram | — | from the request to its grant or refusal |
//! | `distlock_hold_seconds` | histogram | — | from the grant to its release (or drop) |
//! | `distlock_backend_call_seconds` | histogram | `op`: `acquire`, `withdraw`, `renew`, `renew_many`, `release`, `remaining`, `info`, `force_unlock`, `watch_releases` | each call to the store |
//! | `distlock_held` | gauge | — | grants of this process not yet released or dropped |
//! | `distlock_waiting` | gauge | — | requests of this process waiting for a busy lock |

#![warn(missing_docs, unreachable_pub)]
// docs.rs (Cargo.toml's `package.metadata.docs.rs`) marks the items a feature gates.
#![cfg_attr(docsrs, feature(doc_cfg))]

/// The README, whose code blocks (the Tour among them) run as doc tests, so it cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

mod acquire;
mod backend;
mod builder;
mod client;
mod error;
mod grant;
mod guard;
mod held;
mod hooks;
mod http_answers;
mod lease;
mod listing;
mod loss;
mod observe;
mod request;
mod retry;
mod token;
#[cfg(feature = "tower")]
pub mod tower;

#[doc(hidden)]
pub mod __private {
    //! Not public API: what `#[distributed_lock]` expands to.
    pub use crate::private::*;
}
mod private;
mod renewer;
mod shutdown;
/// Not public API: the deterministic simulation of the lock engine (feature `simulation`, for its tests).
#[cfg(feature = "simulation")]
#[doc(hidden)]
pub mod simulation;

pub use client::{current_client, install, with_client, Client, ClientBuilder, LockInfo};
pub use distlock_macros::distributed_lock;
pub use error::{BackendError, BackendErrorKind, LockError};
pub use guard::{current_lock, LockGuard, ReleaseOutcome};
pub use listing::{LockListing, LockWaiter, MAX_WAITERS_LISTED};
pub use loss::LossReason;
pub use request::{LockRequest, OnLost};
pub use retry::RetryStrategy;
pub use token::LockToken;

#[cfg(test)]
mod tests {
    /// Every feature in Cargo.toml has its entry in the crate docs' feature list.
    #[test]
    fn every_cargo_feature_is_documented() {
        let manifest = include_str!("../Cargo.toml");
        let docs = include_str!("lib.rs");
        let features = manifest.split("\n[features]\n").nth(1).expect("a [features] table");
        let features = features.split("\n[").next().unwrap_or(features);
        let names: Vec<&str> = features
            .lines()
            .filter(|line| !line.starts_with('#'))
            .filter_map(|line| line.split_once(" = ").map(|(name, _)| name.trim()))
            .filter(|name| *name != "default")
            .collect();
        assert!(names.len() >= 4, "features read from Cargo.toml: {names:?}");
        for name in names {
            assert!(docs.contains(&format!("//! - **`{name}`**")), "feature `{name}` is not in the crate docs");
        }
    }
}
