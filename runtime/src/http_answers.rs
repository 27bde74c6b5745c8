//! What a web handler answers for a [`LockError`]: a status code and a `Retry-After`, for any framework
//! ([`LockError::http_status`], [`LockError::retry_after`]), and with the feature `axum` the response itself.

use std::time::Duration;

use crate::{LockError, LockInfo};

/// The least `Retry-After` says: the header counts whole seconds, and `0` would invite a retry storm.
const AT_LEAST: Duration = Duration::from_secs(1);

impl LockError {
    /// The HTTP status a handler should answer with, for a request that failed on its lock:
    ///
    /// | error | status |
    /// |---|---|
    /// | [`NotObtained`](LockError::NotObtained) (busy) | 409 Conflict |
    /// | [`ShuttingDown`](LockError::ShuttingDown), and [transient](LockError::is_transient) ones (a timeout or lost connection, [`NotReplicated`](LockError::NotReplicated)) | 503 Service Unavailable |
    /// | everything else: [`Lost`](LockError::Lost), configuration errors, a bad key, a server that refused a command | 500 Internal Server Error |
    ///
    /// Each of the first two comes with a [`retry_after`](LockError::retry_after).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let client = distlock::Client::builder().memory().build().await.unwrap();
    /// let _held = client.lock("report:7").acquire().await.unwrap();
    /// let busy = client.lock("report:7").acquire().await.unwrap_err();
    /// assert_eq!(busy.http_status(), 409);
    /// assert_eq!(distlock::LockError::ShuttingDown.http_status(), 503);
    /// assert_eq!(distlock::LockError::NotConfigured.http_status(), 500);
    /// # }
    /// ```
    pub fn http_status(&self) -> u16 {
        match self {
            LockError::NotObtained { .. } => 409,
            LockError::ShuttingDown => 503,
            e if e.is_transient() => 503,
            _ => 500,
        }
    }

    /// How long a client should wait before trying again (the `Retry-After` header of a 409 or 503), in whole
    /// seconds, at least one; `None` for errors a retry would not cure (a 500).
    ///
    /// For a busy lock ([`NotObtained`](LockError::NotObtained)) it is an estimate from what the lock's record
    /// says ([`holder`](LockError::holder)): the time until the holder is likely done, once for the holder and
    /// once more for each request queued ahead of a retry.
    /// - A holder that is still working has held the lock for `held_for`; with nothing else known, it is taken
    ///   to need as long again, but no longer than its lease left: by then it has released the lock, renewed it
    ///   (a retry gets a new 409 with a longer estimate, so the retries of a long job back off as it runs), or
    ///   lost it. A job of 500 ms answers `Retry-After: 1`, whatever its `ttl`.
    /// - A holder that has finished, with [`min_hold`](crate::LockRequest::min_hold) keeping the lock: its lease
    ///   left, when the lock frees.
    /// - Holder unknown (the lock was free by the time it was looked up, or the look-up failed): one second.
    ///
    /// For [`ShuttingDown`](LockError::ShuttingDown) and transient errors, one second: nothing known says
    /// longer, and a load balancer sends the retry to a replica that may be up.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// let client = distlock::Client::builder().memory().build().await.unwrap();
    /// let _held = client.lock("report:7").ttl(Duration::from_secs(60)).acquire().await.unwrap();
    /// let busy = client.lock("report:7").acquire().await.unwrap_err();
    /// // Just taken, with a 60 s lease: not 60 s, but the least, one second.
    /// assert_eq!(busy.retry_after(), Some(Duration::from_secs(1)));
    /// assert_eq!(distlock::LockError::NotConfigured.retry_after(), None);
    /// # }
    /// ```
    pub fn retry_after(&self) -> Option<Duration> {
        let estimate = match self {
            LockError::NotObtained { holder, .. } => holder.as_deref().map_or(AT_LEAST, turns_ahead),
            _ if self.http_status() == 503 => AT_LEAST,
            _ => return None,
        };
        Some(whole_seconds(estimate).max(AT_LEAST))
    }
}

/// The time until a retry may find the lock free: the holder's turn, and as long again for each one queued.
fn turns_ahead(holder: &LockInfo) -> Duration {
    let turn = if holder.kept_by_min_hold { holder.remaining_ttl } else { holder.held_for.min(holder.remaining_ttl) };
    turn.saturating_mul(u32::try_from(holder.waiting).unwrap_or(u32::MAX).saturating_add(1))
}

/// `d` rounded up to whole seconds.
fn whole_seconds(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs() + u64::from(d.subsec_nanos() > 0))
}

#[cfg(feature = "axum")]
mod axum {
    use axum_core::response::{IntoResponse, Response};
    use http::header::RETRY_AFTER;
    use http::StatusCode;

    use crate::LockError;

    /// The response [`LockError::http_status`] and [`LockError::retry_after`] describe (feature `axum`), with
    /// a short plain-text body that says nothing of the lock's key, holder or servers: those are for the logs.
    /// A 500 is logged as an ERROR and a 503 as a WARN (target `distlock`, the error's message in the field
    /// `error`), so that the cause of an answer is not lost; a 409 is a normal answer and is not logged.
    ///
    /// ```
    /// use axum_core::response::IntoResponse;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let client = distlock::Client::builder().memory().build().await.unwrap();
    /// let _held = client.lock("report:7").acquire().await.unwrap();
    /// let response = client.lock("report:7").acquire().await.unwrap_err().into_response();
    /// assert_eq!(response.status(), 409);
    /// assert_eq!(response.headers()["retry-after"], "1");
    /// # }
    /// ```
    ///
    /// In a handler, `?` on a lock call (or a `#[distributed_lock]` function returning
    /// `Result<T, LockError>`) answers with it:
    ///
    /// ```
    /// #[distlock::distributed_lock(key = "report:<id>", ttl = "10s")]
    /// async fn build_report(id: u64) -> Result<String, distlock::LockError> {
    ///     Ok(format!("report {id}\n"))
    /// }
    ///
    /// // An axum handler: `post(post_report)` on `/reports/{id}`.
    /// async fn post_report(id: u64) -> Result<String, distlock::LockError> {
    ///     build_report(id).await
    /// }
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # let client = distlock::Client::builder().memory().build().await.unwrap();
    /// # assert_eq!(distlock::with_client(client, post_report(7)).await.unwrap(), "report 7\n");
    /// # }
    /// ```
    impl IntoResponse for LockError {
        fn into_response(self) -> Response {
            let status = StatusCode::from_u16(self.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let body = match status {
                StatusCode::CONFLICT => "busy: another request holds the lock for this; try again later\n",
                StatusCode::SERVICE_UNAVAILABLE => {
                    tracing::warn!(target: "distlock", error = %self, "distlock: a lock error answered 503");
                    "temporarily unavailable: try again later\n"
                }
                _ => {
                    tracing::error!(target: "distlock", error = %self, "distlock: a lock error answered 500");
                    "internal error\n"
                }
            };
            match self.retry_after() {
                Some(after) => (status, [(RETRY_AFTER, after.as_secs())], body).into_response(),
                None => (status, body).into_response(),
            }
        }
    }
}
