//! Procedural macros for distlock; use them through the `distlock` crate (`distlock::distributed_lock`).

#![warn(missing_docs, unreachable_pub)]

mod duration;
mod expand;
mod parse;
mod retry;
mod template;
mod validate;

use proc_macro::TokenStream;

/// Runs an `async fn` under a distributed lock whose key is built from the function's arguments.
///
/// ```
/// # #[derive(Debug)] struct AppError(distlock::LockError);
/// # impl From<distlock::LockError> for AppError { fn from(e: distlock::LockError) -> Self { AppError(e) } }
/// # #[derive(Debug, PartialEq)] struct Report(u64);
/// #[distlock::distributed_lock(key = "report:<id>", ttl = "60s", wait = "5s")]
/// async fn build_report(id: u64) -> Result<Report, AppError> {   // AppError: From<distlock::LockError>
///     // runs on at most one process at a time for a given `id`
///     Ok(Report(id))
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), AppError> {
/// distlock::install(distlock::Client::builder().memory().build().await?)?; // once, at startup
/// assert_eq!(build_report(42).await?, Report(42));
/// # Ok(()) }
/// ```
///
/// Each call renders the key from its arguments, acquires the lock on the current client (the
/// `distlock::with_client` override, else the client given to `distlock::install`), runs the body while a
/// watchdog renews the lease, and releases the lock (awaiting the release) before returning. If the lock cannot
/// be had, the body does not run and the call returns `Err(E::from(lock_error))`: `NotConfigured` before
/// `install`, `NotObtained` when it is busy past `wait`, `Lost` if it is lost mid-run (see `on_lost`), or a
/// backend error. `?` and `return` in the body behave exactly as without the attribute.
///
/// # Arguments
///
/// All values are string literals (`keys` a list of them), checked at compile time.
///
/// - **`key`** (required, or `keys`): the lock key template. Text is copied verbatim; `<name>` inserts the parameter
///   `name` formatted with `Display`; a field path reaches into a parameter or `self`: `<self.tenant>`,
///   `<req.user.id>`, `<pair.0>`. Write `<<` and `>>` for literal `<` and `>`. Inserted values have the reserved
///   characters (`%`, `:`, `{`, `}`, `*`, `?`, `[`, `]`, `\`, control characters) percent-encoded, so
///   `a = "1:2", b = "3"` and `a = "1", b = "2:3"` never share a lock, while plain values pass unchanged:
///   `key = "report:<id>"` with `id = 42` is exactly the lock `client.lock("report:42")`.
///   The template's text cannot contain control characters nor exceed 1024 bytes (the runtime's key rules).
///   Placeholders must name a whole parameter (not a name bound inside a pattern such as `(a, b): (u8, u8)`),
///   and its type must implement `Display`; both are compile errors otherwise.
///   Example: `key = "tenant:<self.tenant>:report:<id>"`.
/// - **`keys`** (instead of `key`): several key templates, `keys = ["account:<from>", "account:<to>"]`, each
///   written and checked like `key`'s; the body runs holding every rendered key (`Client::lock_all`): they are
///   taken in one step when all are free, else one by one in sorted order, so two calls naming the same keys
///   in opposite orders cannot deadlock, and if one cannot be had within `wait`, those taken are released and
///   the body does not run. Keys that render alike at run time (`<from>` equal to `<to>`) are one lock. Compile errors: an empty list, an
///   element that is not a string literal, the same template twice, and `key` and `keys` together.
///   `distlock::current_lock()` in the body holds every key (`keys()`, `fencing_token_of(key)`).
/// - **`ttl`** (default `"30s"`): the lease. The lock expires this long after the last renewal if the process
///   holding it stops; the watchdog renews it while the body runs. At least `"100ms"`.
///   Example: `ttl = "60s"`.
/// - **`wait`** (default `"0s"`, a single attempt): how long to wait for a busy lock before returning
///   `LockError::NotObtained`; a transient failure (a timeout, a lost connection) within it is retried on
///   `retry`'s schedule. Example: `wait = "5s"`.
/// - **`retry`** (default `"exponential 25ms..1s"`): how often a waiting call goes back to the store
///   (`distlock::RetryStrategy`; a release hands the lock to the longest waiter at once regardless).
///   `"none"` (a single attempt; `wait` is then a compile error), `"linear <step>"`, or
///   `"exponential <base>..<max>"` (the first delay, doubled each time up to the longest); delays above zero.
///   Example: `retry = "linear 100ms"`.
/// - **`min_hold`** (default: none): keep the lock at least this long after it was acquired, even when
///   the body finishes sooner, so that replicas whose clocks or schedules differ slightly do not run the same
///   job twice. Example: `min_hold = "30s"`.
/// - **`max_hold`** (default: none): stop renewing this long after the lock was acquired, so a body that hangs
///   cannot hold the lock forever: the lease then runs out, the lock is lost and (with `on_lost = "abort"`)
///   the call returns `LockError::Lost`. Above zero. Example: `max_hold = "10m"`.
/// - **`on_lost`** (default `"abort"`): what happens when the lock is lost while the body runs (renewal failed
///   or the record disappeared). `"abort"` drops the body future and returns `LockError::Lost`; `"continue"`
///   lets the body finish without the lock. Example: `on_lost = "continue"`.
/// - **`metadata`** (default: the function's module path and name, e.g. `"my_app::jobs::build_report"`):
///   text stored with the lock record, visible with `Client::lock_info` and `LockError::holder`. A template
///   like `key`'s: `<name>`, `<self.field>` and `<req.user.id>` insert the parameters' values, checked at
///   compile time the same way, but written as they are (metadata names no lock, so nothing is escaped);
///   `<<` and `>>` write literal `<` and `>`, and any other `<` or `>` is a compile error. Unlike a key it may
///   be empty or hold control characters. Example: `metadata = "replica <replica>, report <id>"`.
/// - **`crate`** (default `"::distlock"`): the path to the distlock crate, for crates that re-export it or
///   rename the dependency. Example: `crate = "my_app::deps::distlock"`.
///
/// Durations are whole numbers with a unit, largest unit first, no spaces: `"500ms"`, `"5s"`, `"2m"`, `"1h"`,
/// `"1m30s"`. Units: `h`, `m`, `s`, `ms`.
///
/// # Requirements on the function
///
/// It must be an `async fn` (not `const`) with a body, returning `Result<T, E>` where
/// `E: From<distlock::LockError>` (type aliases such as `anyhow::Result<T>` are fine). Methods (`&self`,
/// `&mut self`, `self`), generics, `impl Trait` arguments, lifetimes and `async fn` in trait impls are all
/// supported. The signature is kept verbatim.
///
/// # Compile errors
///
/// Every problem is reported at once, pointing at the offending token, and the function is still emitted
/// unchanged beside the errors so the rest of the crate keeps compiling:
///
/// ```text
/// error: unknown placeholder `<ide>`: `build_report` has no parameter `ide`; did you mean `id`? parameters: id, tenant
///  --> src/reports.rs:3:34
///   |
/// 3 | #[distributed_lock(key = "report:<ide>")]
///   |                          ^^^^^^^^^^^^^^
/// ```
///
/// # More examples
///
/// ```
/// use distlock::distributed_lock;
///
/// struct Reports { tenant: String }
///
/// impl Reports {
///     // A field of `self` and a parameter; wait up to 5 s for a busy lock, going back every 100 ms.
///     #[distributed_lock(key = "tenant:<self.tenant>:report:<id>", wait = "5s", retry = "linear 100ms")]
///     async fn build(&self, id: u64) -> Result<String, distlock::LockError> {
///         let lock = distlock::current_lock().expect("inside the lock body");
///         assert_eq!(lock.key(), format!("tenant:{}:report:{id}", self.tenant));
///         Ok(format!("report {id} for {}", self.tenant))
///     }
/// }
///
/// // Two accounts locked together, whichever way the money goes.
/// #[distributed_lock(keys = ["account:<from>", "account:<to>"], wait = "2s")]
/// async fn transfer(from: u64, to: u64, amount: u64) -> Result<u64, distlock::LockError> {
///     let lock = distlock::current_lock().expect("inside the lock body");
///     assert!(lock.fencing_token_of(&format!("account:{to}")).is_some());
///     Ok(amount)
/// }
///
/// // A scheduled job that runs once per tick across replicas: skipped when another replica holds the lock,
/// // the lock kept for 50 s even when the job takes 1 s, and never held past 10 minutes.
/// #[distributed_lock(key = "jobs:nightly-cleanup", ttl = "2m", min_hold = "50s", max_hold = "10m")]
/// async fn nightly_cleanup() -> Result<(), distlock::LockError> {
///     Ok(())
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
/// // A client in scope for one future (tests, or one client per tenant) instead of `install`.
/// let client = distlock::Client::builder().memory().build().await?;
/// let reports = Reports { tenant: "acme".into() };
/// distlock::with_client(client.clone(), async {
///     assert_eq!(reports.build(7).await?, "report 7 for acme");
///     assert_eq!(transfer(1, 2, 50).await? + transfer(2, 1, 50).await?, 100);
///     nightly_cleanup().await?;
///     // Another replica's tick, moments later: the lock is kept for `min_hold`, so it is skipped.
///     let skipped = nightly_cleanup().await;
///     assert!(matches!(skipped, Err(distlock::LockError::NotObtained { .. })));
///     Ok::<_, distlock::LockError>(())
/// })
/// .await
/// # }
/// ```
#[proc_macro_attribute]
pub fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::distributed_lock(args.into(), item.into()).into()
}

/// Collects errors so that all of them are reported together (`syn::Error::combine`).
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    /// Adds an error.
    pub(crate) fn push(&mut self, error: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(error),
            None => self.0 = Some(error),
        }
    }

    /// Whether no error has been recorded.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// All recorded errors as one, if any.
    pub(crate) fn take(&mut self) -> Option<syn::Error> {
        self.0.take()
    }
}
