//! The Redis backend on a simulated redis-server (deterministic simulation, tests only): the same backend —
//! scripts, coalescer, resends, subscriber — over the simulation's network instead of sockets.

use std::sync::Arc;

use super::batch::Coalescer;
use super::link::{Conn, Epoch, Link};
use super::subscriber::Subscriber;
use super::{Hot, RedisBackend, ReplicaAcks, Timeouts};
use crate::simulation::{Connection, Push};

impl RedisBackend {
    /// A backend whose connections `open` makes: one for the commands, one (given the push handler) for the
    /// subscriptions, as a standalone server's client has.
    pub(crate) fn simulated(
        open: impl Fn(Option<Push>) -> Connection,
        owner: &str,
        timeouts: Timeouts,
        replicas: Option<ReplicaAcks>,
    ) -> Self {
        let epoch = Epoch::default();
        let subscriber = Subscriber::given(timeouts, epoch.clone());
        let handler = subscriber.push_handler();
        let push: Push = Arc::new(move |push| {
            let _ = handler(push);
        });
        subscriber.use_connection(Link::new(Conn::Simulated(open(Some(push))), epoch.clone()));
        let commands = Link::new(Conn::Simulated(open(None)), epoch);
        let hot = Hot::Coalesced(Coalescer::new(commands.clone()));
        Self {
            server: "sim://redis".into(),
            commands,
            hot,
            subscriber,
            replicas,
            owner: owner.into(),
            plain: None,
            node_map: Default::default(),
        }
    }
}
