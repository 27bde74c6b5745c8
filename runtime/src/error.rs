//! The one error type of the crate, and URL redaction for messages.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::{LockInfo, LossReason};

/// Everything that can go wrong when taking, keeping or giving back a lock.
///
/// Every variant says which lock it is about where that is known; backend errors also say which server
/// (with any password redacted) and what to check.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let client = distlock::Client::builder().memory().build().await.unwrap();
/// let held = client.lock("job").acquire().await.unwrap();
/// match client.lock("job").acquire().await {
///     Err(distlock::LockError::NotObtained { key, .. }) => assert_eq!(key, "job"),
///     other => panic!("expected NotObtained, got {other:?}"),
/// }
/// # drop(held);
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// No client was installed with [`install`](crate::install) and none is in scope through
    /// [`with_client`](crate::with_client).
    #[error("no distlock client is configured: call distlock::install(client) at startup, or wrap the call in distlock::with_client(client, ..)")]
    NotConfigured,
    /// [`install`](crate::install) was called a second time.
    #[error(
        "a distlock client is already installed; install it once at startup and clone `distlock::current_client()` elsewhere"
    )]
    AlreadyInstalled,
    /// Another holder kept the lock for the whole wait. More fields may come: match with `..`.
    ///
    /// Its message names the holder when it is known (owner, how long held, lease left, requests queued).
    #[non_exhaustive]
    #[error("lock `{key}` {}; gave up after waiting {}", HolderText(holder.as_deref()), Millis(*waited))]
    NotObtained {
        /// The lock's key, as the caller named it.
        key: String,
        /// How long this request waited before giving up.
        waited: Duration,
        /// Who held the lock when the wait ended, if it was still held then (see [`LockError::holder`]).
        holder: Option<Box<LockInfo>>,
    },
    /// The lock was held but is no longer; `reason` says why. More fields may come: match with `..`.
    #[non_exhaustive]
    #[error("lock `{key}` was lost: {reason}; the work done under it may have overlapped with another holder")]
    Lost {
        /// The lock's key, as the caller named it.
        key: String,
        /// Why it was lost.
        reason: LossReason,
    },
    /// The backend (Redis) failed or did not answer in time.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// With [`ClientBuilder::wait_for_replicas`](crate::ClientBuilder::wait_for_replicas): fewer replicas than
    /// required acknowledged the grant in time, so a failover could lose it. It was given back. At
    /// [`ClientBuilder::build`](crate::ClientBuilder::build), whose check of the server takes a probe lock, `key`
    /// is `"the startup check"`.
    #[error("{}", not_replicated(.key, *.acknowledged, *.required))]
    NotReplicated {
        /// The lock's key, as the caller named it.
        key: String,
        /// How many replicas acknowledged.
        acknowledged: u32,
        /// How many were required.
        required: u32,
    },
    /// The client is shutting down ([`Client::shutdown`](crate::Client::shutdown)): it takes no new lock
    /// requests, and a request that was waiting for a lock stopped waiting.
    #[error("the distlock client is shutting down (Client::shutdown was called): it takes no new lock requests, and waiting ones stopped")]
    ShuttingDown,
    /// A builder or request setting is out of range.
    #[error("invalid distlock configuration: {0}")]
    InvalidConfig(String),
    /// The lock key cannot be used.
    #[error("invalid lock key {key:?}: {reason}")]
    InvalidKey {
        /// The rejected key (shortened when long).
        key: String,
        /// Why it was rejected.
        reason: &'static str,
    },
}

impl LockError {
    /// On [`NotObtained`](LockError::NotObtained): who held the lock when the wait ended (owner, metadata,
    /// fencing token, how long it had been held, remaining lease, queue length), so a handler can answer
    /// "409 Conflict" with something useful. `None` for other errors, and when the lock was free by the time it
    /// was looked up.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let client = distlock::Client::builder().memory().owner("replica-a").build().await.unwrap();
    /// let held = client.lock("report:7").metadata("monthly report").acquire().await.unwrap();
    /// let error = client.lock("report:7").acquire().await.unwrap_err();
    /// assert!(error.is_busy());
    /// let holder = error.holder().expect("held");
    /// assert_eq!((holder.owner.as_str(), holder.metadata.as_str()), ("replica-a", "monthly report"));
    /// assert!(holder.held_for < std::time::Duration::from_secs(5));
    /// # drop(held);
    /// # }
    /// ```
    pub fn holder(&self) -> Option<&LockInfo> {
        match self {
            LockError::NotObtained { holder, .. } => holder.as_deref(),
            _ => None,
        }
    }

    /// Whether another holder kept the lock for the whole wait ([`NotObtained`](LockError::NotObtained)):
    /// nothing is wrong, the lock is just taken.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let client = distlock::Client::builder().memory().build().await.unwrap();
    /// let _held = client.lock("job").acquire().await.unwrap();
    /// assert!(client.lock("job").acquire().await.unwrap_err().is_busy());
    /// # }
    /// ```
    pub fn is_busy(&self) -> bool {
        matches!(self, LockError::NotObtained { .. })
    }

    /// Whether trying again later may succeed: a timeout or a lost connection to the server, or replicas that
    /// did not acknowledge in time. Configuration errors, a busy lock and a lost lock are not transient.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let client = distlock::Client::builder().memory().build().await.unwrap();
    /// let _held = client.lock("job").acquire().await.unwrap();
    /// assert!(!client.lock("job").acquire().await.unwrap_err().is_transient());
    /// # }
    /// ```
    pub fn is_transient(&self) -> bool {
        match self {
            LockError::Backend(e) => e.is_transient(),
            LockError::NotReplicated { .. } => true,
            _ => false,
        }
    }
}

/// "is held by …" for a busy lock's message: the holder when known.
struct HolderText<'a>(Option<&'a LockInfo>);

impl fmt::Display for HolderText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(holder) = self.0 else { return f.write_str("is held by another owner") };
        let queued = match holder.waiting {
            0 => String::new(),
            n => format!(", {n} queued"),
        };
        if holder.kept_by_min_hold {
            write!(
                f,
                "was released by {:?} and min_hold keeps it {} more (held for {}{queued})",
                holder.owner,
                Millis(holder.remaining_ttl),
                Millis(holder.held_for)
            )
        } else {
            write!(
                f,
                "is held by {:?} (for {}, lease left {}{queued})",
                holder.owner,
                Millis(holder.held_for),
                Millis(holder.remaining_ttl)
            )
        }
    }
}

/// A duration rounded to the millisecond, as `Duration`'s `Debug` shows it: `0ms`, `850ms`, `1.25s`.
pub(crate) struct Millis(pub(crate) Duration);

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match u64::try_from(self.0.as_millis()) {
            Ok(0) => f.write_str("0ms"),
            Ok(ms) => write!(f, "{:?}", Duration::from_millis(ms)),
            Err(_) => write!(f, "{:?}", self.0),
        }
    }
}

/// [`LockError::NotReplicated`]'s message; at `build()` it speaks of the startup check, not of a lock.
fn not_replicated(key: &str, acknowledged: u32, required: u32) -> String {
    if key == crate::backend::STARTUP_CHECK {
        return format!(
            "the startup check failed: ClientBuilder::build takes and gives back a probe lock, and only \
             {acknowledged} of {required} replicas acknowledged its grant in time, as they would every grant \
             (wait_for_replicas): check that the server has {required} replicas connected and in sync (INFO \
             replication on it), or lower the requirement"
        );
    }
    format!(
        "lock `{key}` was granted but only {acknowledged} of {required} replicas acknowledged it in time; it was \
         given back. Check the replicas' health and lag, or lower the requirement"
    )
}

/// What kind of failure a [`BackendError`] is: whether trying again later may help.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// // Nothing listens on port 1: the server cannot be reached.
/// let built = distlock::Client::builder().redis("redis://127.0.0.1:1/").build().await;
/// match built {
///     Err(distlock::LockError::Backend(e)) => assert_eq!(e.kind(), distlock::BackendErrorKind::Unreachable),
///     other => panic!("expected a backend error, got {other:?}"),
/// }
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendErrorKind {
    /// The server could not be reached, or the connection to it dropped: trying again later may succeed.
    Unreachable,
    /// The server did not answer within the response timeout: trying again later may succeed.
    Timeout,
    /// The server answered with an error (a password, a permission, a setting, a value distlock did not write):
    /// trying again does not help until its cause, which the message names, is fixed.
    Refused,
    /// The server's answer was not one distlock understands (another program on that port, or a server too
    /// old or too new).
    Protocol,
}

/// A failed or timed-out call to the backend, with the lock and server it concerned and what to do about it.
///
/// Its message holds the server's own error text; it has no further [`source`](std::error::Error::source), so
/// a printer of the whole chain (anyhow's `{:#}`) shows each cause once.
#[derive(Clone)]
pub struct BackendError {
    /// The store's name in messages ("redis").
    store: &'static str,
    key: Option<String>,
    server: String,
    kind: BackendErrorKind,
    hint: String,
    /// The store client's own error (shared: a Redlock round hands one failure to several callers).
    source: Arc<dyn std::error::Error + Send + Sync>,
}

/// The forms of Redis URL the client accepts, for messages.
pub(crate) const URL_FORMS: &str = "redis://[[USER]:PASSWORD@]HOST[:PORT][/DB], rediss://… (TLS, distlock's `tls` feature) or redis+unix:///PATH/TO/SOCKET[?db=DB]";

impl BackendError {
    /// A call by the `store` client (its name in messages) to `server` (password redacted) failed with
    /// `source`, of `kind`; `hint` says what to do about it.
    pub(crate) fn new(
        store: &'static str,
        server: &str,
        kind: BackendErrorKind,
        hint: String,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        let source = Arc::from(source.into());
        Self { store, key: None, server: server.to_owned(), kind, hint, source }
    }

    /// The same error, about the lock `key`.
    pub(crate) fn for_key(mut self, key: Option<&str>) -> Self {
        self.key = key.map(str::to_owned);
        self
    }

    /// Adds `note` to the hint (what a caller knows about the failure that the server's error does not say).
    pub(crate) fn with_note(mut self, note: &str) -> Self {
        self.hint = format!("{note}; {}", self.hint);
        self
    }

    /// The lock key the failed call was about, if any (a connection check is about none).
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// The server's URL, password redacted.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> BackendErrorKind {
        self.kind
    }

    /// Whether the call ran out of time rather than failing outright.
    pub fn is_timeout(&self) -> bool {
        self.kind == BackendErrorKind::Timeout
    }

    /// Whether retrying later may succeed: a timeout or a lost connection, not a refusal by the server.
    pub(crate) fn is_transient(&self) -> bool {
        matches!(self.kind, BackendErrorKind::Timeout | BackendErrorKind::Unreachable)
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The server's text may echo a command's arguments, a lock token among them ("unknown command 'EVALSHA',
        // with args beginning with: …"): masked, as everywhere a token is shown.
        let source = self.source.to_string();
        let source = mask_tokens(&source);
        match &self.key {
            Some(key) => {
                write!(f, "{} call for lock `{key}` at {} failed: {source}; {}", self.store, self.server, self.hint)
            }
            None => write!(f, "{} at {} failed: {source}; {}", self.store, self.server, self.hint),
        }
    }
}

impl fmt::Debug for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackendError")
            .field("key", &self.key)
            .field("server", &self.server)
            .field("kind", &self.kind)
            .field("hint", &self.hint)
            .field("source", &mask_tokens(&format!("{:?}", self.source)))
            .finish()
    }
}

/// `text` with every lock token in it (a run of exactly 32 hex digits) cut to its first 8 and `…`, as
/// [`LockToken`](crate::LockToken)'s `Display` shows one. Script hashes (40 digits) are left whole.
pub(crate) fn mask_tokens(text: &str) -> std::borrow::Cow<'_, str> {
    let len = crate::token::TOKEN_LEN;
    let bytes = text.as_bytes();
    let mut runs = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let run = bytes[i..].iter().take_while(|b| b.is_ascii_hexdigit()).count();
        if run == len {
            runs.push(i);
        }
        i += run.max(1);
    }
    if runs.is_empty() {
        return text.into();
    }
    let mut out = String::with_capacity(text.len());
    let mut from = 0;
    for at in runs {
        out.push_str(&text[from..at + 8]);
        out.push('…');
        from = at + len;
    }
    out.push_str(&text[from..]);
    out.into()
}

// The server's error is part of the message, so it is not also a `source` (thiserror's convention: a cause is
// either in the message or in the chain, never both).
impl std::error::Error for BackendError {}

/// A URL as messages may show it, with every password hidden, whatever its form and however it was typed:
/// - everything before the URL's last `@` after `scheme://` may be a password (one holding an unencoded `@`,
///   `/`, `?` or `#` ends where the redis crate's parser does not expect it), so it becomes `:***`, the user
///   name too: in `redis://secret:word@host`, typed as a password, the parser finds a user `secret`, and no
///   rule tells the two apart (`redis://secret@host` is read by some clients as a password as well);
/// - a socket URL's password is a query value (`redis+unix:///path?pass=…`): it and everything after it
///   become `***` (an unencoded `&` or `#` in it would end it early);
/// - a URL without a password is returned unchanged.
pub(crate) fn redact_url(url: &str) -> String {
    let (head, rest) = match url.find("://") {
        Some(i) => url.split_at(i + 3),
        None => ("", url),
    };
    let mut shown = match rest.rfind('@') {
        Some(at) => format!("{head}:***{}", &rest[at..]),
        None => url.to_owned(),
    };
    if let Some(at) = secret_query_value(&shown) {
        shown.replace_range(at.., "***");
    }
    shown
}

/// Where the value of a `pass=` or `password=` query parameter starts in `url`, if it has one.
fn secret_query_value(url: &str) -> Option<usize> {
    let query = url.find('?')?;
    ["pass=", "password="].iter().find_map(|name| {
        url[query..].match_indices(name).find_map(|(i, _)| {
            let at = query + i;
            matches!(url.as_bytes()[at - 1], b'?' | b'&').then_some(at + name.len())
        })
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{redact_url, LockError};
    use crate::LockInfo;

    /// Issue 34: a busy lock's message names the holder when it is known, and says it finished when `min_hold`
    /// keeps it; durations are shown to the millisecond.
    #[test]
    fn a_busy_message_names_the_holder_when_known() {
        let busy =
            |holder| LockError::NotObtained { key: "job".into(), waited: Duration::from_micros(5_000_400), holder };
        assert_eq!(busy(None).to_string(), "lock `job` is held by another owner; gave up after waiting 5s");
        let info = LockInfo {
            owner: "web-3".into(),
            metadata: String::new(),
            fencing_token: 7,
            held_for: Duration::from_millis(1250),
            remaining_ttl: Duration::from_micros(8_750_900),
            waiting: 2,
            kept_by_min_hold: false,
        };
        assert_eq!(
            busy(Some(Box::new(info.clone()))).to_string(),
            "lock `job` is held by \"web-3\" (for 1.25s, lease left 8.75s, 2 queued); gave up after waiting 5s"
        );
        let evil = LockInfo { owner: "evil\u{1b}[2J".into(), ..info.clone() };
        assert!(busy(Some(Box::new(evil))).to_string().contains("\"evil\\u{1b}[2J\""), "control characters escaped");
        let kept = LockInfo { kept_by_min_hold: true, waiting: 0, ..info };
        assert_eq!(
            busy(Some(Box::new(kept))).to_string(),
            "lock `job` was released by \"web-3\" and min_hold keeps it 8.75s more (held for 1.25s); gave up after waiting 5s"
        );
    }

    #[test]
    fn redacts_passwords_only() {
        assert_eq!(redact_url("redis://127.0.0.1:6379/"), "redis://127.0.0.1:6379/");
        assert_eq!(redact_url("redis://u:pw@h:1/0"), "redis://:***@h:1/0");
        assert_eq!(redact_url("rediss://:p@ss@h/"), "rediss://:***@h/");
        assert_eq!(redact_url("redis://pw@h/"), "redis://:***@h/");
        assert_eq!(redact_url("redis+unix:///tmp/r.sock"), "redis+unix:///tmp/r.sock");
        assert_eq!(redact_url("not a url"), "not a url");
        assert_eq!(redact_url("redis://u:pa/ss@h/0"), "redis://:***@h/0");
        assert_eq!(redact_url("redis://:pw@h/0?protocol=resp3#insecure"), "redis://:***@h/0?protocol=resp3#insecure");
        assert_eq!(redact_url("rediss://h/#insecure"), "rediss://h/#insecure");
    }

    /// Issue 36: a token echoed by the server is cut to 8 digits; a script's 40-digit hash is not a token.
    #[test]
    fn tokens_in_server_texts_are_masked() {
        let token = "c1d9a0b1c2d3e4f5a6b7c8d9e0f1a29e";
        let sha = "f7951a201c5e8236edbc4983baa8bcb7671f051d";
        let text = format!("unknown command 'EVALSHA', with args beginning with: '{sha}' '1' 'k' '{token}' ");
        let masked = super::mask_tokens(&text);
        assert!(!masked.contains(token) && masked.contains("'c1d9a0b1…'") && masked.contains(sha), "{masked}");
        assert_eq!(super::mask_tokens("no token here"), "no token here");
        let two = format!("{token}:{token}x");
        assert_eq!(super::mask_tokens(&two), "c1d9a0b1…:c1d9a0b1…x");
        let longer = format!("{token}0");
        assert_eq!(super::mask_tokens(&longer), longer, "33 digits are not a token");
    }

    /// Issue 36: a password with an unencoded `?` or `#`, and a socket URL's `pass=`, are hidden whole.
    #[test]
    fn redacts_passwords_the_parser_would_cut_short() {
        assert_eq!(redact_url("redis://:hunter2?x@127.0.0.1:6602/"), "redis://:***@127.0.0.1:6602/");
        assert_eq!(redact_url("redis://:p@ss/w%rd:x?y#z@127.0.0.1/"), "redis://:***@127.0.0.1/");
        assert_eq!(redact_url("redis://:hunter#2@127.0.0.1:6602/"), "redis://:***@127.0.0.1:6602/");
        assert_eq!(redact_url("redis+unix:///tmp/r.sock?pass=WRONG-SECRET"), "redis+unix:///tmp/r.sock?pass=***");
        assert_eq!(
            redact_url("redis+unix:///tmp/r.sock?db=1&user=u&pass=a&b#c"),
            "redis+unix:///tmp/r.sock?db=1&user=u&pass=***"
        );
        assert_eq!(redact_url("unix:///tmp/r.sock?password=s"), "unix:///tmp/r.sock?password=***");
        assert_eq!(redact_url("redis+unix:///tmp/bypass=x.sock"), "redis+unix:///tmp/bypass=x.sock");
    }
}
