//! Listing locks for operators and tools: which locks are held ([`Client::list_locks`]), what their records
//! say ([`Client::lock_infos`]) and who waits for one ([`Client::lock_waiters`]). The `distlock` command-line
//! tool is built on these; nothing here takes or changes a lock.

use std::time::Duration;

use crate::backend::{name_of_record, record_pattern, BackendCursor, Scan, Store};
use crate::{Client, LockError, LockInfo};

/// How many keys each SCAN step asks a server for: enough that a listing of 100 000 locks takes about 100
/// steps per server, few enough that a step holds Redis for well under a millisecond.
const SCAN_COUNT: usize = 1000;

/// At most this many queue places are read by [`Client::lock_waiters`].
pub const MAX_WAITERS_LISTED: usize = 1000;

/// The names of the held locks matching a pattern, a page at a time (from [`Client::list_locks`]).
///
/// It reads keys with Redis `SCAN` (never `KEYS`), and the first bytes of each record found (to leave out the
/// released ones): each page is one `SCAN` step on one server (on a cluster, every primary in turn), so memory
/// stays bounded by a page and Redis is never blocked for long.
/// As `SCAN` promises, a lock held for the whole listing is listed, one taken or released meanwhile may or may
/// not be, and a name may come twice (when Redis resizes its table meanwhile, or on Redlock, once per server
/// holding it; there a record left on a minority of the servers, as a release's last one for a moment after it
/// returned, is listed too: `lock_infos` says whether a quorum holds it). Pages come in no particular order:
/// sort (and deduplicate) them if the order matters.
#[derive(Debug)]
pub struct LockListing {
    client: Client,
    pattern: String,
    scan: Scan<BackendCursor>,
}

impl LockListing {
    /// The next page of names (never empty), or `None` when the listing is over.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// let client = distlock::Client::builder().memory().build().await?;
    /// let _a = client.lock("report:1").acquire().await?;
    /// let _b = client.lock("report:2").acquire().await?;
    /// let _other = client.lock("invoice:1").acquire().await?;
    /// let mut listing = client.list_locks("report:*");
    /// let mut names = Vec::new();
    /// while let Some(page) = listing.next_page().await? {
    ///     names.extend(page);
    /// }
    /// names.sort();
    /// assert_eq!(names, ["report:1", "report:2"]);
    /// # Ok(()) }
    /// ```
    pub async fn next_page(&mut self) -> Result<Option<Vec<String>>, LockError> {
        let prefix = &self.client.inner.prefix;
        while !self.scan.done {
            let records = self.client.inner.backend.scan(&mut self.scan, &self.pattern, SCAN_COUNT).await?;
            let names: Vec<String> = records.iter().filter_map(|record| name_of_record(prefix, record)).collect();
            if !names.is_empty() {
                return Ok(Some(names));
            }
        }
        Ok(None)
    }

    /// How many keys the listing has left out so far because they sit where a lock's record would, under the
    /// client's key prefix, but hold a value distlock did not write (another program's data, which
    /// [`Client::lock_info`] reports as an error). Always 0 on the in-process store.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// let client = distlock::Client::builder().memory().build().await?;
    /// let mut listing = client.list_locks("*");
    /// while listing.next_page().await?.is_some() {}
    /// assert_eq!(listing.skipped(), 0);
    /// # Ok(()) }
    /// ```
    pub fn skipped(&self) -> usize {
        self.scan.skipped
    }
}

/// One waiter queued for a lock, as [`Client::lock_waiters`] reports it. Its token is never shown.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockWaiter {
    /// The waiter's client, as named by [`ClientBuilder::owner`](crate::ClientBuilder::owner).
    pub owner: String,
    /// The metadata the waiter asked with ([`LockRequest::metadata`](crate::LockRequest::metadata)); it becomes
    /// the record's if the lock is handed to it.
    pub metadata: String,
    /// How long it has been queued, by the store's clock.
    pub waiting_for: Duration,
}

impl Client {
    /// The held locks whose names match `pattern`, a page of names at a time (see [`LockListing`]). The
    /// pattern has Redis's glob syntax over lock names as the program named them: `*` any text, `?` one
    /// character, `[abc]`, `[^a-z]`, and `\` before a character to match it literally; `*` lists every lock of
    /// this client's key prefix. (Inside `[...]`, `%`, `{` and `}` are not matched: keys hold them encoded.)
    /// Read [`lock_infos`](Self::lock_infos) for their records.
    ///
    /// On Redis it needs the `SCAN` and `GETRANGE` commands (on a cluster also `CLUSTER SLOTS`), beyond the
    /// rights of the README's least-privilege user: `GETRANGE` reads the first bytes of each record found, to
    /// leave out released locks (their records stay, freed, for the rest of their lease, keeping the last
    /// fencing token).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// let client = distlock::Client::builder().memory().build().await?;
    /// let _guard = client.lock("job:nightly").acquire().await?;
    /// let page = client.list_locks("job:*").next_page().await?.expect("one lock");
    /// assert_eq!(page, ["job:nightly"]);
    /// # Ok(()) }
    /// ```
    pub fn list_locks(&self, pattern: &str) -> LockListing {
        let pattern = record_pattern(&self.inner.prefix, pattern);
        LockListing { client: self.clone(), pattern, scan: Scan::default() }
    }

    /// What the records of the locks `keys` say, in the same order: as [`lock_info`](Self::lock_info) for each,
    /// `None` for a lock that is free (it may have been released since it was listed). The reads go out at
    /// once on the shared connection (pipelined), so a page of a thousand costs a few round trips, not a
    /// thousand.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// let client = distlock::Client::builder().memory().build().await?;
    /// let guard = client.lock("a").acquire().await?;
    /// let infos = client.lock_infos(&["a", "free"]).await?;
    /// assert_eq!(infos[0].as_ref().map(|i| i.fencing_token), Some(guard.fencing_token()));
    /// assert!(infos[1].is_none());
    /// # Ok(()) }
    /// ```
    pub async fn lock_infos<S: AsRef<str>>(&self, keys: &[S]) -> Result<Vec<Option<LockInfo>>, LockError> {
        futures_util::future::try_join_all(keys.iter().map(|key| self.lock_info(key.as_ref()))).await
    }

    /// The live waiters queued for the lock `key`, first in line first (at most [`MAX_WAITERS_LISTED`]):
    /// the one a release hands the lock to comes first. Places of waiters that stopped refreshing them (and
    /// that a release skips) are left out, so this can be shorter than [`LockInfo::waiting`]. Empty on
    /// Redlock, which has no queue.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// use std::time::Duration;
    /// let client = distlock::Client::builder().memory().owner("worker-1").build().await?;
    /// let guard = client.lock("job").acquire().await?;
    /// let waiting = tokio::spawn({
    ///     let client = client.clone();
    ///     async move { client.lock("job").metadata("second").wait(Duration::from_secs(5)).acquire().await }
    /// });
    /// while client.lock_waiters("job").await?.is_empty() {
    ///     tokio::time::sleep(Duration::from_millis(5)).await;
    /// }
    /// let waiters = client.lock_waiters("job").await?;
    /// assert_eq!((waiters[0].owner.as_str(), waiters[0].metadata.as_str()), ("worker-1", "second"));
    /// guard.release().await?;
    /// waiting.await.expect("no panic")?.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn lock_waiters(&self, key: &str) -> Result<Vec<LockWaiter>, LockError> {
        crate::request::check_key(key)?;
        let places = self.inner.backend.waiters(&self.keys(key), MAX_WAITERS_LISTED).await?;
        Ok(places
            .into_iter()
            .map(|p| LockWaiter { owner: p.owner, metadata: p.metadata, waiting_for: p.waited })
            .collect())
    }
}
