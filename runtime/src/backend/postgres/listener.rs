//! The listener: one session per client, opened on the first wait, LISTENing on the schema's channel for the
//! hand-overs that `hand_over` and `force_unlock` announce (`<md5 of the key>:<heir>:<fence>:<lease ms>:<attempt>`,
//! or `<md5 of the key>:*`). A lost session (or one that stops answering its heartbeat) is opened again, and
//! every waiter is told to try again: announcements made meanwhile were lost.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use md5::{Digest, Md5};
use tokio::sync::watch;
use tokio_postgres::AsyncMessage;

use super::connection::Connection;
use super::AbortOnDrop;
use crate::backend::{Announcement, Hold, LockKeys, ReleaseWatch, WAKE_ALL};
use crate::error::BackendError;
use crate::{LockError, LockToken};

/// How often the session is asked to answer: a session the network silently dropped is noticed within this
/// plus the response timeout.
const HEARTBEAT: Duration = Duration::from_secs(10);

/// The waiters' announcements, by the MD5 of their lock's key and then by token: a hand-over wakes its heir
/// only. Ordered by token, so a wake-up of all wakes them in the same order every run.
type Waiters = HashMap<String, BTreeMap<String, watch::Sender<Announcement>>>;

pub(super) struct Listener {
    conn: Arc<Connection>,
    channel: String,
    waiters: Arc<Mutex<Waiters>>,
    /// Whether LISTEN is in effect now, and the last failure to make it so.
    listening: watch::Sender<Listening>,
    task: OnceLock<AbortOnDrop>,
}

#[derive(Debug, Clone, Default)]
enum Listening {
    #[default]
    Not,
    Yes,
    Failed(BackendError),
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener").field("channel", &self.channel).finish_non_exhaustive()
    }
}

fn lock(waiters: &Mutex<Waiters>) -> MutexGuard<'_, Waiters> {
    // Every critical section leaves the map consistent, so a panic elsewhere cannot have broken it.
    waiters.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Listener {
    pub(super) fn new(conn: Arc<Connection>, channel: String) -> Self {
        Self {
            conn,
            channel,
            waiters: Arc::default(),
            listening: watch::Sender::new(Listening::Not),
            task: OnceLock::new(),
        }
    }

    /// Listens, as the waiter with `token`, for hand-overs of the lock; resolves once the session LISTENs, so
    /// that no announcement after it can be missed (one lost with a session is followed by `Retry`).
    pub(super) async fn watch(&self, keys: &LockKeys, token: &LockToken) -> Result<ReleaseWatch, LockError> {
        self.task.get_or_init(|| {
            let session = Session {
                conn: Arc::clone(&self.conn),
                channel: self.channel.clone(),
                waiters: Arc::clone(&self.waiters),
                listening: self.listening.clone(),
            };
            AbortOnDrop(tokio::spawn(session.run()))
        });
        let key = md5_hex(&keys.record);
        let (tx, rx) = watch::channel(Announcement::Nothing);
        lock(&self.waiters).entry(key.clone()).or_default().insert(token.as_str().to_owned(), tx);
        let on_drop = {
            let (waiters, token) = (Arc::clone(&self.waiters), token.as_str().to_owned());
            let key = key.clone();
            move || {
                let mut waiters = lock(&waiters);
                if let Some(of_key) = waiters.get_mut(&key) {
                    of_key.remove(&token);
                    if of_key.is_empty() {
                        waiters.remove(&key);
                    }
                }
            }
        };
        let watch = ReleaseWatch::new(rx, on_drop);
        let waited = self.conn.timeouts.connect + self.conn.timeouts.response;
        let mut listening = self.listening.subscribe();
        let ready = tokio::time::timeout(waited, listening.wait_for(|l| !matches!(l, Listening::Not))).await;
        let failed = match ready {
            Ok(Ok(l)) => match &*l {
                Listening::Failed(e) => Some(e.clone().for_key(Some(&keys.name))),
                _ => None,
            },
            _ => Some(self.conn.timeout(
                Some(&keys.name),
                "the listener's session did not start in time",
                "connect_timeout",
            )),
        };
        match failed {
            None => Ok(watch),
            Some(e) => Err(e.into()),
        }
    }
}

/// The listener's task: open, LISTEN, deliver, and again after a loss.
struct Session {
    conn: Arc<Connection>,
    channel: String,
    waiters: Arc<Mutex<Waiters>>,
    listening: watch::Sender<Listening>,
}

impl Session {
    async fn run(self) {
        let mut pause = Duration::from_millis(50);
        loop {
            if let Err(e) = self.listen_until_lost().await {
                self.listening.send_replace(Listening::Failed(e));
            } else {
                self.listening.send_replace(Listening::Not);
                pause = Duration::from_millis(50);
            }
            self.wake_all_of(None);
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(2));
        }
    }

    /// One session, from LISTEN to its loss: `Ok` once it was listening and then lost.
    async fn listen_until_lost(&self) -> Result<(), BackendError> {
        let (client, mut connection) = self.conn.open().await?;
        let waiters = Arc::clone(&self.waiters);
        // The session's I/O, delivering notifications as they come; aborted when this session ends.
        let io = AbortOnDrop(tokio::spawn(async move {
            while let Some(Ok(message)) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                if let AsyncMessage::Notification(n) = message {
                    deliver(&lock(&waiters), n.payload());
                }
            }
        }));
        let listen = format!("LISTEN {}", self.channel);
        match tokio::time::timeout(self.conn.timeouts.response, client.batch_execute(&listen)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(super::connection::pg_error(&self.conn.server, None, e)),
            Err(_) => return Err(self.conn.timeout(None, "LISTEN was not answered in time", "response_timeout")),
        }
        self.listening.send_replace(Listening::Yes);
        // Announcements made before LISTEN took effect were not heard: every waiter already here tries again.
        self.wake_all_of(None);
        let mut io = io;
        loop {
            tokio::select! {
                _ = &mut io.0 => return Ok(()),
                () = tokio::time::sleep(HEARTBEAT) => {
                    let alive = tokio::time::timeout(self.conn.timeouts.response, client.simple_query("SELECT 1"));
                    if !matches!(alive.await, Ok(Ok(_))) {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// Tells every waiter (of one lock, or all) to try again now.
    fn wake_all_of(&self, key: Option<&str>) {
        wake(&lock(&self.waiters), key);
    }
}

fn wake(waiters: &Waiters, key: Option<&str>) {
    let all: Box<dyn Iterator<Item = &BTreeMap<_, _>>> = match key {
        Some(key) => Box::new(waiters.get(key).into_iter()),
        None => Box::new(waiters.values()),
    };
    for tx in all.flat_map(BTreeMap::values) {
        tx.send_replace(Announcement::Retry);
    }
}

/// Hands one announcement to the waiter it is for (or, for a forced unlock, to every waiter of the lock).
fn deliver(waiters: &Waiters, payload: &str) {
    let Some((key, rest)) = payload.split_once(':') else { return };
    if rest == WAKE_ALL {
        return wake(waiters, Some(key));
    }
    let Some((heir, hold, attempt)) = hand_over_of(rest) else { return };
    if let Some(tx) = waiters.get(key).and_then(|of_key| of_key.get(heir)) {
        tx.send_replace(Announcement::hand_over(heir, hold, attempt));
    }
}

/// `<heir>:<fence>:<lease ms>:<attempt>`.
fn hand_over_of(text: &str) -> Option<(&str, Hold, u64)> {
    let mut fields = text.rsplitn(4, ':');
    let attempt = fields.next()?.parse().ok()?;
    let lease = Duration::from_millis(fields.next()?.parse().ok()?);
    let fence = fields.next()?.parse().ok()?;
    let heir = fields.next()?;
    Some((heir, Hold { fence, lease }, attempt))
}

/// The MD5 of a lock's key, in hex, as the server's `md5()` writes it.
pub(super) fn md5_hex(key: &str) -> String {
    Md5::digest(key.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::{hand_over_of, md5_hex};
    use crate::backend::Hold;
    use std::time::Duration;

    #[test]
    fn announcements_parse_and_keys_hash_as_the_server_hashes_them() {
        // RFC 1321's test vector, as PostgreSQL's md5() gives it.
        assert_eq!(md5_hex("abc"), "900150983cd24fb0d6963f7d28e17f72");
        let hold = Hold { fence: 42, lease: Duration::from_millis(1500) };
        assert_eq!(hand_over_of("tok:42:1500:3"), Some(("tok", hold, 3)));
        assert_eq!(hand_over_of("tok:42:1500"), None);
        assert_eq!(hand_over_of("tok:x:1500:3"), None);
    }
}
