//! The shared subscriber: one RESP3 connection per client, opened on the first wait, carrying the
//! subscriptions of all waiters. A channel is subscribed while at least one waiter watches it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use redis::aio::ConnectionManager;
use redis::{PushInfo, PushKind, Value};
use tokio::sync::watch;

use super::connect::manager_config;
use super::link::{Conn, Epoch, Link};
use super::{timeout_error, Timeouts};
use crate::backend::{Announcement, Hold, ReleaseWatch, WAKE_ALL};
use crate::LockToken;

/// The shared subscriber: one RESP3 connection per client, opened on the first wait, carrying the
/// subscriptions of all waiters. A channel is subscribed while at least one waiter watches it.
///
/// On a Redis Cluster the subscriptions ride on the command connection itself (one RESP3 cluster connection),
/// which moves them to the channel's new owner when the topology changes: a subscriber-only cluster
/// connection sends no command that would make it notice a failover. There they are sharded (SSUBSCRIBE, one
/// channel per command), as the scripts announce with SPUBLISH: an announcement stays on its lock's shard.
pub(super) struct Subscriber {
    /// Where to open the connection on first use; `None` on a cluster, whose connection is given.
    info: Option<redis::ConnectionInfo>,
    timeouts: Timeouts,
    channels: Arc<Mutex<BTreeMap<Vec<u8>, Channel>>>,
    connection: Arc<tokio::sync::OnceCell<Link>>,
    /// Serializes SUBSCRIBE/UNSUBSCRIBE so each is decided on the waiter count at the time it is sent.
    commands: Arc<tokio::sync::Mutex<()>>,
    /// The backend's epoch: a disconnection pushed here moves it (behind Sentinel this connection carries the
    /// scripts too, and the redis crate reconnects on the push without any call failing).
    epoch: Epoch,
}

struct Channel {
    /// Each watching waiter's announcements, by its token: a hand-over wakes its heir only, not every waiter.
    /// Ordered, so that a wake-up of all wakes them in the same order in every run: tokio runs woken tasks in
    /// that order, and a `HashMap`'s differs per process (a simulated schedule did not replay exactly).
    waiters: BTreeMap<String, watch::Sender<Announcement>>,
    subscribed: bool,
}

fn lock_channels(channels: &Mutex<BTreeMap<Vec<u8>, Channel>>) -> MutexGuard<'_, BTreeMap<Vec<u8>, Channel>> {
    // Every critical section leaves the map consistent, so a panic elsewhere cannot have broken it.
    channels.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Subscriber {
    pub(super) fn new(info: redis::ConnectionInfo, timeouts: Timeouts, epoch: Epoch) -> Self {
        Self {
            info: Some(info),
            timeouts,
            channels: Arc::default(),
            connection: Arc::default(),
            commands: Arc::default(),
            epoch,
        }
    }

    /// A subscriber whose connection is made elsewhere ([`use_connection`](Self::use_connection)), with
    /// [`push_handler`](Self::push_handler) installed on it.
    pub(super) fn given(timeouts: Timeouts, epoch: Epoch) -> Self {
        Self {
            info: None,
            timeouts,
            channels: Arc::default(),
            connection: Arc::default(),
            commands: Arc::default(),
            epoch,
        }
    }

    /// Subscribes on `connection` from now on (its pushes must go to [`push_handler`](Self::push_handler)).
    pub(super) fn use_connection(&self, connection: Link) {
        let _ = self.connection.set(connection);
    }

    /// What the connection does with each push: a release announcement wakes its heir; a disconnection makes
    /// every waiter retry (announcements may have been lost meanwhile) and restores the subscriptions
    /// (redis-rs's own resubscription gives up on a failure); a confirmation of a channel already subscribed
    /// is a resubscription (after a reconnect, or on a cluster after its slot moved to another node, such as a
    /// promoted replica), and announcements made before it may have been lost, so that channel's waiters retry.
    /// The confirmation of a first subscription reaches this handler before the subscribing call returns, while
    /// the channel is not yet marked subscribed. On a cluster, a node whose slot moves away (a live migration)
    /// drops that slot's sharded subscriptions and says so (SUNSUBSCRIBE); the redis crate then forgets them, so
    /// that channel is subscribed again, on its new owner, and its waiters retry. Our own unsubscriptions are of
    /// channels already gone from the map.
    pub(super) fn push_handler(
        &self,
    ) -> impl Fn(PushInfo) -> Result<(), std::convert::Infallible> + Send + Sync + 'static {
        let channels = Arc::clone(&self.channels);
        let epoch = self.epoch.clone();
        let resubscribe = Resubscribe {
            channels: Arc::clone(&self.channels),
            connection: Arc::downgrade(&self.connection),
            commands: Arc::clone(&self.commands),
            runtime: tokio::runtime::Handle::try_current().ok(),
        };
        move |push: PushInfo| {
            let channels = lock_channels(&channels);
            match push.kind {
                PushKind::Message | PushKind::SMessage => {
                    if let [Value::BulkString(name), Value::BulkString(text), ..] = push.data.as_slice() {
                        let text = String::from_utf8_lossy(text);
                        let waiters = channels.get(name.as_slice()).map(|c| &c.waiters);
                        if text == WAKE_ALL {
                            for tx in waiters.into_iter().flat_map(BTreeMap::values) {
                                tx.send_replace(Announcement::Retry);
                            }
                        } else {
                            let announced = hand_over_of(&text);
                            let heard = announced.and_then(|(heir, a)| Some((waiters?.get(heir)?, heir, a)));
                            if let Some((tx, heir, (hold, attempt))) = heard {
                                tx.send_replace(Announcement::hand_over(heir, hold, attempt));
                            }
                        }
                    }
                }
                PushKind::Subscribe | PushKind::SSubscribe => {
                    if let Some(Value::BulkString(name)) = push.data.first() {
                        let resubscribed = channels.get(name.as_slice()).filter(|c| c.subscribed);
                        for tx in resubscribed.into_iter().flat_map(|c| c.waiters.values()) {
                            tx.send_replace(Announcement::Retry);
                        }
                    }
                }
                PushKind::SUnsubscribe => {
                    if let Some(Value::BulkString(name)) = push.data.first() {
                        if let Some(dropped) = channels.get(name.as_slice()).filter(|c| c.subscribed) {
                            for tx in dropped.waiters.values() {
                                tx.send_replace(Announcement::Retry);
                            }
                            resubscribe.start(Some(name.clone()));
                        }
                    }
                }
                PushKind::Disconnection => {
                    epoch.bump();
                    for tx in channels.values().flat_map(|c| c.waiters.values()) {
                        tx.send_replace(Announcement::Retry);
                    }
                    resubscribe.start(None);
                }
                _ => {}
            }
            Ok(())
        }
    }

    /// What to do once the connection was replaced: the subscriptions are gone with the old one, and so may
    /// be announcements made meanwhile, so every waiter retries and the subscriptions are restored.
    pub(super) fn after_reconnect(&self) -> impl Fn() + Send + Sync + 'static {
        let resubscribe = Resubscribe {
            channels: Arc::clone(&self.channels),
            connection: Arc::downgrade(&self.connection),
            commands: Arc::clone(&self.commands),
            runtime: tokio::runtime::Handle::try_current().ok(),
        };
        move || {
            for tx in lock_channels(&resubscribe.channels).values().flat_map(|c| c.waiters.values()) {
                tx.send_replace(Announcement::Retry);
            }
            resubscribe.start(None);
        }
    }

    async fn connection(&self) -> redis::RedisResult<Link> {
        self.connection
            .get_or_try_init(|| async {
                let Some(info) = self.info.clone() else {
                    return Err(redis::RedisError::from((
                        redis::ErrorKind::Io,
                        "the cluster connection for subscriptions is not set up",
                    )));
                };
                let config =
                    manager_config(self.timeouts).set_push_sender(self.push_handler()).set_automatic_resubscription();
                let client = redis::Client::open(info)?;
                let connect = ConnectionManager::new_with_config(client, config);
                let epoch = self.epoch.clone();
                // Bounded as the command connection's is: the crate retries a failed attempt, each bounded alone.
                match tokio::time::timeout(self.timeouts.connect, connect).await {
                    Ok(connected) => connected.map(|c| Link::new(Conn::One(c), epoch)),
                    Err(_) => Err(timeout_error("no connection for release announcements within the connect timeout")),
                }
            })
            .await
            .cloned()
    }

    /// Registers the waiter with `token` on `channel` and returns once the server has confirmed the subscription, so no
    /// release published after this returns can be missed.
    pub(super) async fn watch(&self, channel: &str, token: &LockToken) -> redis::RedisResult<ReleaseWatch> {
        let name = channel.as_bytes().to_vec();
        let rx = {
            let mut channels = lock_channels(&self.channels);
            let entry =
                channels.entry(name.clone()).or_insert_with(|| Channel { waiters: BTreeMap::new(), subscribed: false });
            let tx = watch::Sender::new(Announcement::Nothing);
            let rx = tx.subscribe();
            entry.waiters.insert(token.as_str().to_owned(), tx);
            rx
        };
        let watch = ReleaseWatch::new(rx, self.on_waiter_gone(name.clone(), token.clone()));
        let subscribed = lock_channels(&self.channels).get(&name).is_some_and(|c| c.subscribed);
        if !subscribed {
            let mut conn = self.connection().await?;
            let _serial = self.commands.lock().await;
            let subscribed = lock_channels(&self.channels).get(&name).is_some_and(|c| c.subscribed);
            if !subscribed {
                conn.subscribe(&name).await?;
                if let Some(c) = lock_channels(&self.channels).get_mut(&name) {
                    c.subscribed = true;
                }
            }
        }
        Ok(watch)
    }

    /// What a waiter's drop does: leave, and unsubscribe in the background when it was the last one.
    fn on_waiter_gone(&self, name: Vec<u8>, token: LockToken) -> impl FnOnce() + Send + Sync + 'static {
        let channels = Arc::clone(&self.channels);
        let commands = Arc::clone(&self.commands);
        let connection = Arc::clone(&self.connection);
        let runtime = tokio::runtime::Handle::try_current().ok();
        move || {
            let last = {
                let mut map = lock_channels(&channels);
                let Some(entry) = map.get_mut(&name) else { return };
                entry.waiters.remove(token.as_str());
                entry.waiters.is_empty()
            };
            let (Some(runtime), true) = (runtime, last) else { return };
            crate::hooks::spawn_on(&runtime, async move {
                let _serial = commands.lock().await;
                let was_subscribed = {
                    let mut map = lock_channels(&channels);
                    match map.get(&name) {
                        Some(entry) if entry.waiters.is_empty() => map.remove(&name).is_some_and(|c| c.subscribed),
                        _ => false,
                    }
                };
                if let (true, Some(mut conn)) = (was_subscribed, connection.get().cloned()) {
                    if let Err(e) = conn.unsubscribe(&name).await {
                        tracing::debug!(error = %e, "distlock: unsubscribe failed; the subscription lingers harmlessly");
                    }
                }
            });
        }
    }
}

/// Restores the subscriptions of every channel that has waiters, after a disconnection; or of one channel, after
/// a cluster node dropped it (its slot moved away).
#[derive(Clone)]
struct Resubscribe {
    channels: Arc<Mutex<BTreeMap<Vec<u8>, Channel>>>,
    /// Weak: this lives in the push handler of the very connection it names, and a strong reference would
    /// keep that connection (its socket and task) alive after the client is dropped.
    connection: std::sync::Weak<tokio::sync::OnceCell<Link>>,
    commands: Arc<tokio::sync::Mutex<()>>,
    runtime: Option<tokio::runtime::Handle>,
}

impl Resubscribe {
    /// Most attempts, and the longest pause between them: bounded work, about 10 s in all.
    const ATTEMPTS: u32 = 12;
    const MAX_PAUSE: std::time::Duration = std::time::Duration::from_secs(1);

    /// Subscribes again, in the background, to every channel with waiters, or `only` to that one.
    fn start(&self, only: Option<Vec<u8>>) {
        let Some(runtime) = &self.runtime else { return };
        crate::hooks::spawn_on(runtime, self.clone().run(only));
    }

    async fn run(self, only: Option<Vec<u8>>) {
        let wanted = |name: &Vec<u8>| only.as_ref().is_none_or(|only| only == name);
        let mut pause = std::time::Duration::from_millis(20);
        for _ in 0..Self::ATTEMPTS {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Self::MAX_PAUSE);
            let Some(mut conn) = self.connection.upgrade().and_then(|cell| cell.get().cloned()) else { return };
            let _serial = self.commands.lock().await;
            let names: Vec<Vec<u8>> = lock_channels(&self.channels)
                .iter()
                .filter(|(name, c)| !c.waiters.is_empty() && c.subscribed && wanted(name))
                .map(|(name, _)| name.clone())
                .collect();
            if names.is_empty() {
                return;
            }
            if conn.subscribe_all(&names).await.is_ok() {
                // Hand-overs published before the subscription was back were missed: look again.
                let channels = lock_channels(&self.channels);
                let resubscribed = channels.iter().filter(|(name, _)| wanted(name));
                for tx in resubscribed.flat_map(|(_, c)| c.waiters.values()) {
                    tx.send_replace(Announcement::Retry);
                }
                return;
            }
        }
        tracing::warn!("distlock: could not restore release subscriptions after a disconnection or a slot move; waiters fall back to timed retries");
    }
}

/// A hand-over as `hand_over.lua` announces it, `<heir's token>:<fence>:<lease ms>:<attempt>`: the heir, the
/// grant it was given, and the number of its attempt whose registration was used. `None` for any other text.
fn hand_over_of(text: &str) -> Option<(&str, (Hold, u64))> {
    let mut fields = text.split(':');
    let heir = fields.next()?;
    let fence = fields.next()?.parse().ok()?;
    let lease = std::time::Duration::from_millis(fields.next()?.parse().ok()?);
    let attempt = fields.next()?.parse().ok()?;
    Some((heir, (Hold { fence, lease }, attempt)))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn push(kind: PushKind, channel: &str, second: Value) -> PushInfo {
        PushInfo { kind, data: vec![Value::BulkString(channel.as_bytes().to_vec()), second] }
    }

    /// A channel with one waiter, `token`, whose announcements are returned.
    fn waiting(subscriber: &Subscriber, channel: &str, token: &str, subscribed: bool) -> watch::Receiver<Announcement> {
        let tx = watch::Sender::new(Announcement::Nothing);
        let rx = tx.subscribe();
        let waiters = BTreeMap::from([(token.to_owned(), tx)]);
        lock_channels(&subscriber.channels).insert(channel.as_bytes().to_vec(), Channel { waiters, subscribed });
        rx
    }

    /// A confirmation of a channel already subscribed is a resubscription (a reconnect, or a cluster's slot
    /// moved to a promoted replica): that channel's waiters retry, sharded or not. The confirmation of a
    /// first subscription, which arrives before the channel is marked subscribed, wakes nobody.
    #[test]
    fn a_resubscription_makes_that_channels_waiters_retry() {
        let subscriber = Subscriber::given(
            Timeouts { connect: Duration::from_secs(1), response: Duration::from_secs(1) },
            Epoch::default(),
        );
        let handle = subscriber.push_handler();
        let moved = waiting(&subscriber, "d:{a}:released", "ta", true);
        let first = waiting(&subscriber, "d:{b}:released", "tb", false);
        let other = waiting(&subscriber, "d:{c}:released", "tc", true);
        handle(push(PushKind::SSubscribe, "d:{a}:released", Value::Int(3))).unwrap();
        handle(push(PushKind::SSubscribe, "d:{b}:released", Value::Int(4))).unwrap();
        assert_eq!(*moved.borrow(), Announcement::Retry, "the resubscribed channel's waiter");
        assert_eq!(*first.borrow(), Announcement::Nothing, "a first subscription's confirmation");
        assert_eq!(*other.borrow(), Announcement::Nothing, "another channel's waiter");
        handle(push(PushKind::Subscribe, "d:{c}:released", Value::Int(5))).unwrap();
        assert_eq!(*other.borrow(), Announcement::Retry, "a plain SUBSCRIBE's resubscription");
    }

    /// A cluster node that drops a sharded subscription (its slot moved away) makes that channel's waiters
    /// retry; our own SUNSUBSCRIBE, of a channel already gone from the map, and one of a channel still being
    /// subscribed, wake nobody.
    #[test]
    fn a_dropped_sharded_subscription_makes_that_channels_waiters_retry() {
        let subscriber = Subscriber::given(
            Timeouts { connect: Duration::from_secs(1), response: Duration::from_secs(1) },
            Epoch::default(),
        );
        let handle = subscriber.push_handler();
        let moved = waiting(&subscriber, "d:{a}:released", "ta", true);
        let first = waiting(&subscriber, "d:{b}:released", "tb", false);
        handle(push(PushKind::SUnsubscribe, "d:{gone}:released", Value::Int(1))).unwrap();
        handle(push(PushKind::SUnsubscribe, "d:{b}:released", Value::Int(1))).unwrap();
        assert_eq!(*moved.borrow(), Announcement::Nothing);
        assert_eq!(*first.borrow(), Announcement::Nothing);
        handle(push(PushKind::SUnsubscribe, "d:{a}:released", Value::Int(0))).unwrap();
        assert_eq!(*moved.borrow(), Announcement::Retry);
        assert_eq!(*first.borrow(), Announcement::Nothing, "another channel's waiter");
    }

    /// A sharded message is an announcement like a plain one: a hand-over wakes its heir.
    #[test]
    fn sharded_messages_announce_hand_overs() {
        let subscriber = Subscriber::given(
            Timeouts { connect: Duration::from_secs(1), response: Duration::from_secs(1) },
            Epoch::default(),
        );
        let handle = subscriber.push_handler();
        let heir = waiting(&subscriber, "d:{a}:released", "ta", true);
        handle(push(PushKind::SMessage, "d:{a}:released", Value::BulkString(b"ta:7:100:3".to_vec()))).unwrap();
        let hold = Hold { fence: 7, lease: Duration::from_millis(100) };
        assert_eq!(*heir.borrow(), Announcement::hand_over("ta", hold, 3));
    }
}
