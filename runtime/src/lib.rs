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
//! ## What it guarantees
//! - The body never runs without the lock: not configured, busy, lost or backend errors all return an error.
//! - A lease (`ttl`) bounds how long a crashed holder keeps a lock; while the holder lives, a watchdog renews it
//!   every `ttl / 3`. A lock whose renewal fails until its lease would run out is reported *lost* and, by
//!   default, the body is dropped.
//! - Every grant carries a fencing token, strictly increasing per key. A lease cannot protect against a process
//!   that pauses past it; storage that rejects writes with a lower token than it has seen can.
//! - Release (on return, error, panic or cancellation) and renewal act only with the grant's own token.

mod acquire;
mod backend;
mod client;
mod error;
mod grant;
mod guard;
mod held;
mod request;
mod token;

#[doc(hidden)]
pub mod __private {
    //! Not public API: what `#[distributed_lock]` expands to.
    pub use crate::private::*;
}
mod private;
mod renewer;

pub use client::{client, install, with_client, Client, ClientBuilder, LockInfo};
pub use distlock_macros::distributed_lock;
pub use error::{BackendError, LockError};
pub use guard::{current_lock, LockGuard, ReleaseOutcome};
pub use request::{LockRequest, OnLost, RetryStrategy};
pub use token::LockToken;
