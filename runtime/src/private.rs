//! What `#[distributed_lock]` expands to. Not a public API: names and signatures change without notice.

use std::fmt::{self, Write as _};

pub use core::future::Future;
pub use core::result::Result;
pub use core::time::Duration;

pub use crate::{LockError, OnLost, RetryStrategy};

/// The settings of one annotated function, built by the macro in a `static`.
#[derive(Debug)]
pub struct LockSpec {
    /// The annotated function's path, `module_path!()::name`: the `function` field of its `lock` span.
    pub function: &'static str,
    /// Lease length.
    pub ttl: Duration,
    /// How long to wait while busy.
    pub wait: Duration,
    /// How retries are spaced; `None` for the default.
    pub retry: Option<RetryStrategy>,
    /// Minimum hold, if any.
    pub min_hold: Option<Duration>,
    /// Maximum hold, if any.
    pub max_hold: Option<Duration>,
    /// What to do when the lock is lost under the body.
    pub on_lost: OnLost,
}

/// Renders a template of the attribute: text verbatim, placeholder values formatted with `Display`. In a key
/// ([`key`](Self::key)) the values are escaped, so that distinct values never render to the same key
/// (`a="1:2", b="3"` vs `a="1", b="2:3"`) and plain values pass unchanged; in metadata
/// ([`text`](Self::text)), which identifies nothing, they are written as they are.
#[derive(Debug)]
pub struct TemplateBuf {
    rendered: String,
    escape: bool,
}

impl TemplateBuf {
    /// An empty key.
    pub fn key() -> Self {
        Self { rendered: String::new(), escape: true }
    }

    /// An empty text (the metadata).
    pub fn text() -> Self {
        Self { rendered: String::new(), escape: false }
    }

    /// Appends template text as it is.
    pub fn push_literal(&mut self, text: &str) {
        self.rendered.push_str(text);
    }

    /// Appends a placeholder's value, formatted with `Display` (and escaped in a key).
    pub fn push_value<T: fmt::Display + ?Sized>(&mut self, value: &T) {
        // Writing into a String cannot fail; a Display impl that returns Err leaves what it wrote.
        let _ =
            if self.escape { write!(Escaper(&mut self.rendered), "{value}") } else { write!(self.rendered, "{value}") };
    }

    /// The rendered text.
    pub fn finish(self) -> String {
        self.rendered
    }
}

/// Percent-encodes the characters that have a meaning in keys: separators, hash tags, glob patterns, the
/// escape character itself, and control characters.
struct Escaper<'a>(&'a mut String);

impl fmt::Write for Escaper<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for c in s.chars() {
            match c {
                '%' | ':' | '{' | '}' | '*' | '?' | '[' | ']' | '\\' | '<' | '>' => {
                    write!(self.0, "%{:02X}", u32::from(c))?;
                }
                c if c.is_control() => {
                    let mut utf8 = [0u8; 4];
                    for byte in c.encode_utf8(&mut utf8).bytes() {
                        write!(self.0, "%{byte:02X}")?;
                    }
                }
                c => self.0.push(c),
            }
        }
        Ok(())
    }
}

/// Takes `key` on the client in scope, with `metadata` in its record, and runs `body` under it; every lock
/// failure comes back as the function's error type, through `From<LockError>`.
///
/// `R` is the annotated function's return type, named by the macro: a return type that is not a valid
/// [`LockedReturn`] is reported once, on that type, with the message below.
pub async fn run_locked<R, F>(spec: &'static LockSpec, key: String, metadata: String, body: F) -> R
where
    R: LockedReturn,
    F: Future<Output = R>,
{
    // Created here, on the first poll, so that it is a child of the caller's current span.
    let span = crate::observe::lock_span(&key, Some(spec.function));
    run(spec, span, |client| client.lock(key), metadata, body).await
}

/// [`run_locked`] for `keys = [..]`: takes every rendered key together (`Client::lock_all`, which merges keys
/// that rendered alike). The span's `key` lists them.
pub async fn run_locked_all<R, F, const N: usize>(
    spec: &'static LockSpec,
    keys: [String; N],
    metadata: String,
    body: F,
) -> R
where
    R: LockedReturn,
    F: Future<Output = R>,
{
    let span = crate::observe::lock_span(&keys.join(", "), Some(spec.function));
    run(spec, span, |client| client.lock_all(keys), metadata, body).await
}

async fn run<R, F>(
    spec: &'static LockSpec,
    span: tracing::Span,
    request: impl FnOnce(&crate::Client) -> crate::LockRequest,
    metadata: String,
    body: F,
) -> R
where
    R: LockedReturn,
    F: Future<Output = R>,
{
    let client = match crate::current_client() {
        Ok(client) => client,
        Err(e) => {
            crate::observe::record_outcome(&span, Err(&e));
            return R::from_result(Err(e.into()));
        }
    };
    let mut request = request(&client).ttl(spec.ttl).wait(spec.wait).metadata(metadata).on_lost(spec.on_lost);
    if let Some(retry) = spec.retry {
        request = request.retry(retry);
    }
    if let Some(hold) = spec.min_hold {
        request = request.min_hold(hold);
    }
    if let Some(max) = spec.max_hold {
        request = request.max_hold(max);
    }
    let outcome = request.run_in(span, async { body.await.into_result() }).await;
    R::from_result(outcome.unwrap_or_else(|e| Err(e.into())))
}

/// The return types an annotated function may have: a `Result` whose error converts from [`LockError`].
#[diagnostic::on_unimplemented(
    message = "a #[distributed_lock] function must return `Result<_, E>` where `E: From<distlock::LockError>`, not `{Self}`",
    label = "the lock can fail (not configured, busy, lost, Redis down), so this must be a Result whose error converts from distlock::LockError",
    note = "e.g. `-> Result<Report, AppError>` with `impl From<distlock::LockError> for AppError`, or `-> Result<Report, distlock::LockError>`"
)]
pub trait LockedReturn: Sized {
    /// The success type.
    type Ok;
    /// The error type, which every lock failure converts into.
    type Err: From<LockError>;

    /// Splits the value into success and error.
    fn into_result(self) -> Result<Self::Ok, Self::Err>;

    /// Builds the value back from success or error.
    fn from_result(r: Result<Self::Ok, Self::Err>) -> Self;
}

// `do_not_recommend`: a `Result` whose `E` lacks `From<LockError>` is reported as "`Result<T, E>` is not a valid
// return type", with the message above, rather than as a bare "`E: From<LockError>` is not satisfied".
#[diagnostic::do_not_recommend]
impl<T, E: From<LockError>> LockedReturn for Result<T, E> {
    type Ok = T;
    type Err = E;

    fn into_result(self) -> Result<T, E> {
        self
    }

    fn from_result(r: Result<T, E>) -> Self {
        r
    }
}

#[cfg(test)]
mod tests {
    use super::TemplateBuf;

    fn render(parts: &[(&str, &str)]) -> String {
        let mut key = TemplateBuf::key();
        for (text, value) in parts {
            key.push_literal(text);
            key.push_value(*value);
        }
        key.finish()
    }

    #[test]
    fn plain_values_pass_unchanged_and_separators_are_escaped() {
        assert_eq!(render(&[("report:", "42")]), "report:42");
        let a = render(&[("", "1:2"), (":", "3")]);
        let b = render(&[("", "1"), (":", "2:3")]);
        assert_ne!(a, b);
        assert_eq!(a, "1%3A2:3");
        assert_eq!(render(&[("", "{x}*?[]\\%\n")]), "%7Bx%7D%2A%3F%5B%5D%5C%25%0A");
    }

    #[test]
    fn metadata_values_are_written_as_they_are() {
        let mut text = TemplateBuf::text();
        text.push_literal("replica ");
        text.push_value("eu:west {1}");
        text.push_literal(" <#>");
        text.push_value(&7);
        assert_eq!(text.finish(), "replica eu:west {1} <#>7");
    }
}
