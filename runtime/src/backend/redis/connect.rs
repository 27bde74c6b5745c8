//! Connecting: to one server, to a Redis Cluster, or to the primary Redis Sentinel names; the connection
//! settings every kind shares; and the startup probe that makes a wrong address or a missing right fail at
//! `build()`.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::io::tcp::TcpSettings;
use redis::{IntoConnectionInfo, ProtocolVersion};

use super::batch::Coalescer;
use super::cluster_nodes::{NodeMap, PerNode};
use super::config_errors::{database_error, url_error};
use super::errors::{is_auth_error, redis_error, redis_error_with_hint, SENTINEL_SERVICE};
use super::link::{self, Conn, Epoch, Link, Rebuilding};
use super::scripts::{self, ACQUIRE_PLAIN, FORCE_UNLOCK, INFO, REMAINING, RENEW, RENEW_MANY};
use super::subscriber::Subscriber;
use super::{timeout_error, ConnectSettings, Hot, RedisBackend, Timeouts};
use crate::error::{redact_url, BackendError};
use crate::LockError;

impl RedisBackend {
    /// Connects and checks the server answers PING; the error names the URL with the password redacted.
    pub(crate) async fn connect(url: &str, settings: ConnectSettings<'_>) -> Result<Self, LockError> {
        let timeouts = settings.timeouts;
        let server = redact_url(url);
        refuse_unchecked_tls(url, &settings)?;
        let info = connection_info(url, &server)?;
        let client = redis::Client::open(info.clone()).map_err(|e| url_error(&server, &e))?;
        let connect = ConnectionManager::new_with_config(client, manager_config(timeouts));
        let mut commands = match bounded_connect(&server, timeouts, connect).await? {
            Ok(commands) => commands,
            Err(e) if e.to_string().contains("DB index is out of range") => {
                return Err(database_error(&server, &info, e, timeouts).await.into())
            }
            Err(e) => return Err(connect_error(&server, timeouts, e).into()),
        };
        let pong: String =
            redis::cmd("PING").query_async(&mut commands).await.map_err(|e| redis_error(&server, None, e))?;
        debug_assert_eq!(pong, "PONG");
        Self::on_manager(server, &info, commands, settings).checked(settings.prefix).await
    }

    /// As [`connect`](Self::connect), for a server of a Redlock group, where a minority may be down: a server that
    /// cannot be reached now (the connection failed or timed out) is given back with that error, as a backend that
    /// connects at its calls until the server answers, unprobed. Every other error (a URL, a password, a right,
    /// a cluster node) is returned as `connect` returns it.
    pub(crate) async fn connect_or_later(
        url: &str,
        settings: ConnectSettings<'_>,
    ) -> Result<Result<Self, (Self, BackendError)>, LockError> {
        match Self::connect(url, settings).await {
            Ok(backend) => Ok(Ok(backend)),
            Err(LockError::Backend(e)) if e.is_transient() => Ok(Err((Self::later(url, settings)?, e))),
            Err(e) => Err(e),
        }
    }

    /// A backend for the server at `url` that connects at its first call (the redis crate's lazy connection
    /// manager, which tries again at each call after one fails), unprobed: [`connect_or_later`](Self::connect_or_later)'s
    /// server that did not answer.
    fn later(url: &str, settings: ConnectSettings<'_>) -> Result<Self, LockError> {
        let server = redact_url(url);
        let info = connection_info(url, &server)?;
        let client = redis::Client::open(info.clone()).map_err(|e| url_error(&server, &e))?;
        let commands = ConnectionManager::new_lazy_with_config(client, manager_config(settings.timeouts))
            .map_err(|e| url_error(&server, &e))?;
        Ok(Self::on_manager(server, &info, commands, settings))
    }

    /// The backend on one server's connection manager (connected, or lazy), unprobed; `info` is the server's,
    /// for the subscriber's connection.
    fn on_manager(
        server: String,
        info: &redis::ConnectionInfo,
        commands: ConnectionManager,
        settings: ConnectSettings<'_>,
    ) -> Self {
        let resp3 = info.clone().set_redis_settings(info.redis_settings().clone().set_protocol(ProtocolVersion::RESP3));
        let epoch = Epoch::default();
        let subscriber = Subscriber::new(resp3, settings.timeouts, epoch.clone());
        let commands = Link::new(Conn::One(commands), epoch);
        let hot = Hot::Coalesced(Coalescer::new(commands.clone()));
        Self::assembled(server, commands, hot, subscriber, Default::default(), settings)
    }

    /// Connects to a Redis Cluster through `seeds` (any of its nodes) and checks it as [`connect`](Self::connect)
    /// checks one server. One RESP3 cluster connection carries the scripts and the subscriptions.
    pub(crate) async fn connect_cluster(seeds: &[String], settings: ConnectSettings<'_>) -> Result<Self, LockError> {
        let timeouts = settings.timeouts;
        let (infos, listed) =
            connection_infos(seeds, "redis_cluster needs at least one node URL to start from", &settings)?;
        let server = format!("cluster {listed}");
        let epoch = Epoch::default();
        let subscriber = Subscriber::given(timeouts, epoch.clone());
        // The crate's defaults wait at least 1.28 s between retries and bound a whole call by one attempt's
        // timeout: set both, so a call in flight completes soon after a replica is promoted.
        let client = redis::cluster::ClusterClientBuilder::new(infos)
            .use_protocol(ProtocolVersion::RESP3)
            .push_sender(subscriber.push_handler())
            .connection_timeout(timeouts.connect)
            .response_timeout(timeouts.response)
            .overall_response_timeout(Some(timeouts.response * 2))
            .retries(4)
            .min_retry_wait(10)
            .max_retry_wait(500)
            .build()
            .map_err(|e| url_error(&server, &e))?;
        // The redis crate connects to the seeds, then to the nodes of the slot map it reads (one hung node costs a
        // connect timeout in each step): a cluster's whole connection is given twice the timeout.
        let limit = timeouts.connect * 2;
        let conn = match tokio::time::timeout(limit, client.get_async_connection()).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) if !timed_out(&e) => return Err(redis_error(&server, None, e).into()),
            _ => {
                return Err(
                    redis_error_with_hint(&server, cluster_timed_out(timeouts), timeout_error("timed out")).into()
                )
            }
        };
        let connect: link::Connect<redis::cluster_async::ClusterConnection> = Box::new(move || {
            let client = client.clone();
            Box::pin(async move { client.get_async_connection().await })
        });
        let link = Rebuilding::new(conn, connect, link::cluster_stale, limit, server.clone(), epoch.clone());
        link.on_rebuilt(subscriber.after_reconnect());
        let link = Link::new(Conn::Cluster(link), epoch);
        subscriber.use_connection(link.clone());
        let node_map = Arc::<NodeMap>::default();
        let hot = Hot::PerNode(PerNode::new(link.clone(), Arc::clone(&node_map)));
        Self::assembled(server, link, hot, subscriber, node_map, settings).checked(settings.prefix).await
    }

    /// Connects to the primary that the sentinels at `sentinels` name for `service`, and follows it: when it
    /// fails, times out or refuses writes (demoted), the client asks the sentinels again and reconnects, its
    /// waiters retry and its subscriptions are restored. One RESP3 connection carries the scripts and the
    /// subscriptions.
    pub(crate) async fn connect_sentinel(
        sentinels: &[String],
        service: &str,
        primary: Option<&crate::builder::PrimaryAuth>,
        settings: ConnectSettings<'_>,
    ) -> Result<Self, LockError> {
        use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
        let timeouts = settings.timeouts;
        let (infos, listed) = connection_infos(sentinels, "redis_sentinel needs at least one sentinel URL", &settings)?;
        let server = format!("{SENTINEL_SERVICE}{service}` via sentinels {listed}");
        // The primary is spoken to in RESP3, so the one connection also receives the release announcements.
        let mut primary_info = redis::RedisConnectionInfo::default().set_protocol(ProtocolVersion::RESP3);
        if let Some(auth) = primary {
            primary_info = primary_info.set_password(&auth.password);
            if let Some(username) = &auth.username {
                primary_info = primary_info.set_username(username);
            }
        }
        let node = SentinelNodeConnectionInfo::default()
            .set_redis_connection_info(primary_info)
            .set_tcp_settings(TcpSettings::default().set_nodelay(true));
        // An owned name: what `build` takes without the redis crate's TLS feature (with it, any `AsRef<str>`).
        let name = String::from(service);
        let sentinel = SentinelClient::build(infos.clone(), name, Some(node), SentinelServerType::Master)
            .map_err(|e| url_error(&server, &e))?;
        let sentinel = Arc::new(tokio::sync::Mutex::new(sentinel));
        let epoch = Epoch::default();
        let subscriber = Subscriber::given(timeouts, epoch.clone());
        let config = manager_config(timeouts).set_push_sender(subscriber.push_handler()).set_automatic_resubscription();
        let connect: link::Connect<ConnectionManager> = Box::new(move || {
            let (sentinel, config) = (sentinel.clone(), config.clone());
            Box::pin(async move {
                let primary = sentinel.lock().await.async_get_client().await?;
                ConnectionManager::new_with_config(primary, config).await
            })
        });
        let conn = match bounded_connect(&server, timeouts, connect()).await? {
            Err(e) if e.kind() == redis::ErrorKind::MasterNameNotFoundBySentinel => {
                return Err(LockError::InvalidConfig(format!(
                    "the sentinels {listed} know no service named `{service}`: check the name \
                     (`SENTINEL MASTERS` on a sentinel lists the services it monitors)"
                )))
            }
            // Before the connect timeout, only the redis crate's own connections time out (the primary's is bounded
            // by the same timeout, started later).
            Err(e) if timed_out(&e) => return Err(redis_error_with_hint(&server, SENTINELS_SILENT.into(), e).into()),
            Err(e) if is_auth_error(&e) => {
                let hint = match sentinels_refuse(&infos, timeouts).await {
                    true => SENTINELS_REFUSE,
                    false => PRIMARY_REFUSES,
                };
                return Err(redis_error_with_hint(&server, hint.into(), e).into());
            }
            Err(e) => return Err(redis_error(&server, None, e).into()),
            Ok(conn) => conn,
        };
        let link =
            Rebuilding::new(conn, connect, link::sentinel_stale, timeouts.connect, server.clone(), epoch.clone());
        link.on_rebuilt(subscriber.after_reconnect());
        let link = Link::new(Conn::Sentinel(link), epoch);
        subscriber.use_connection(link.clone());
        let hot = Hot::Coalesced(Coalescer::new(link.clone()));
        Self::assembled(server, link, hot, subscriber, Default::default(), settings).checked(settings.prefix).await
    }

    /// This backend once [`probe`](Self::probe) passed.
    async fn checked(self, prefix: &str) -> Result<Self, LockError> {
        self.probe(prefix).await?;
        Ok(self)
    }

    /// The backend made of these parts, with the settings' replicas and owner.
    fn assembled(
        server: String,
        commands: Link,
        hot: Hot,
        subscriber: Subscriber,
        node_map: Arc<NodeMap>,
        settings: ConnectSettings<'_>,
    ) -> Self {
        let (replicas, owner) = (settings.replicas, settings.owner.into());
        Self { server, commands, hot, subscriber, replicas, owner, plain: None, node_map }
    }

    /// Takes and gives back a probe lock, so a missing ACL right or a cluster address fails at startup with an
    /// explanation instead of at the first real lock; warns when Redis may evict lock records.
    async fn probe(&self, prefix: &str) -> Result<(), LockError> {
        let mut conn = self.commands.clone();
        let cluster: Option<String> = redis::cmd("INFO").arg("cluster").query_async(&mut conn).await.ok();
        if !self.commands.is_cluster() && cluster.is_some_and(|info| info.contains("cluster_enabled:1")) {
            return Err(LockError::InvalidConfig(format!(
                "{} is a Redis Cluster node; ClientBuilder::redis talks to one Redis server (a standalone server \
                 or a replicated primary). For a cluster, use ClientBuilder::redis_cluster(seeds)",
                self.server
            )));
        }
        let memory: Option<String> = redis::cmd("INFO").arg("memory").query_async(&mut conn).await.ok();
        let policy = memory.as_deref().and_then(|info| {
            info.lines().find_map(|line| line.strip_prefix("maxmemory_policy:")).map(|p| p.trim().to_owned())
        });
        if let Some(policy) = policy.filter(|p| p != "noeviction") {
            tracing::warn!(
                server = %self.server,
                %policy,
                "distlock: maxmemory-policy is not noeviction: under memory pressure Redis may evict lock records, \
                 and a holder then loses its lock at its next renewal. Set maxmemory-policy noeviction"
            );
        }
        self.probe_lock_cycle(prefix).await?;
        // Cached now, so the first burst of renewals after a restart of this process needs no EVAL fallback: each
        // script as this connection sends it (numbered on a cluster or behind Sentinel, see numbered.rs). Also a
        // Redlock server's grant, so that a first acquire is not sent again as EVAL behind calls sent after it
        // (a renewal sent meanwhile would reach the server first and find no record).
        for script in [&*RENEW, &*RENEW_MANY, &*REMAINING, &*INFO, &*FORCE_UNLOCK, &*scripts::BATCH, &*ACQUIRE_PLAIN] {
            let source = self.commands.script_source(script);
            let _: redis::RedisResult<String> =
                redis::cmd("SCRIPT").arg("LOAD").arg(source).query_async(&mut conn).await;
        }
        Ok(())
    }

    /// The startup probe ([`probe_lock_cycle`](crate::backend::probe_lock_cycle)), then its keys deleted.
    async fn probe_lock_cycle(&self, prefix: &str) -> Result<(), LockError> {
        let keys = crate::backend::probe_lock_cycle(self, prefix).await?;
        // The probe's freed record and its hand-over's R:last, which keep its last fencing token for a lease, and
        // its waiter's client mark are the keys it leaves behind; don't.
        let mut conn = self.commands.clone();
        let last = format!("{}:last", keys.record);
        let mark = format!("{}:client:{}", keys.record, super::batch::client_id(crate::backend::PROBE_CLIENT));
        let _: redis::RedisResult<i64> =
            redis::cmd("DEL").arg(&keys.record).arg(&last).arg(&mark).query_async(&mut conn).await;
        Ok(())
    }
}

/// A `#insecure` URL turns off certificate checks: refused unless the builder opted in.
fn refuse_unchecked_tls(url: &str, settings: &ConnectSettings<'_>) -> Result<(), LockError> {
    if url.trim_end().ends_with("#insecure") && !settings.allow_insecure_tls {
        return Err(LockError::InvalidConfig(format!(
            "{} turns off TLS certificate checks; a lock server reached without them can be impersonated. \
             Remove `#insecure`, or opt in with ClientBuilder::allow_insecure_tls(true)",
            redact_url(url)
        )));
    }
    Ok(())
}

/// The connection settings of several URLs (a cluster's seeds, the sentinels), each checked as one server's
/// would be, and their list with passwords hidden, for messages; `empty` is the error for none at all.
fn connection_infos(
    urls: &[String],
    empty: &str,
    settings: &ConnectSettings<'_>,
) -> Result<(Vec<redis::ConnectionInfo>, String), LockError> {
    if urls.is_empty() {
        return Err(LockError::InvalidConfig(empty.to_owned()));
    }
    let mut infos = Vec::with_capacity(urls.len());
    for url in urls {
        refuse_unchecked_tls(url, settings)?;
        infos.push(connection_info(url, &redact_url(url))?);
    }
    Ok((infos, urls.iter().map(|u| redact_url(u)).collect::<Vec<_>>().join(", ")))
}

/// `connect` (every step of making a connection: asking the sentinels, TCP, TLS, the handshake, and the redis
/// crate's own retries), given at most the connect timeout: what `ClientBuilder::connect_timeout` promises.
pub(super) async fn bounded_connect<T>(
    server: &str,
    timeouts: Timeouts,
    connect: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> Result<redis::RedisResult<T>, BackendError> {
    tokio::time::timeout(timeouts.connect, connect).await.map_err(|_| connect_timed_out(server, timeouts))
}

/// A failure to connect to one server; a timeout is the connect timeout's (the redis crate's own attempt,
/// bounded by it too, may end first).
fn connect_error(server: &str, timeouts: Timeouts, e: redis::RedisError) -> BackendError {
    match timed_out(&e) {
        true => connect_timed_out(server, timeouts),
        false => redis_error(server, None, e),
    }
}

/// Whether `e` is a timeout: a cluster's seeds that all timed out are reported as "Failed to create initial
/// connections - Io: timed out", an error whose kind is not one.
fn timed_out(e: &redis::RedisError) -> bool {
    e.is_timeout() || e.to_string().contains("timed out")
}

/// Whether a sentinel refuses the password (or lack of one) its URL gives: the redis crate's error does not
/// say whether a sentinel or the primary refused, so each sentinel is asked alone (PING, all at once, within
/// one connect timeout; one that does not answer tells nothing).
async fn sentinels_refuse(sentinels: &[redis::ConnectionInfo], timeouts: Timeouts) -> bool {
    let pings = sentinels.iter().map(|info| {
        let ping = async move {
            let client = redis::Client::open(info.clone())?;
            let mut conn = client.get_multiplexed_async_connection().await?;
            redis::cmd("PING").query_async::<String>(&mut conn).await
        };
        tokio::time::timeout(timeouts.connect, ping)
    });
    let answers = futures_util::future::join_all(pings).await;
    answers.iter().any(|answer| matches!(answer, Ok(Err(e)) if is_auth_error(e)))
}

/// A sentinel refused its URL's password, or needs one.
const SENTINELS_REFUSE: &str = "the sentinels require a password, or refused the one given: give the \
    sentinels' password in their URLs (redis://:PASSWORD@HOST:PORT/, or redis://USER:PASSWORD@HOST:PORT/ for an \
    ACL user), special characters percent-encoded";

/// The sentinels accept their URLs' passwords: the primary they named refused.
const PRIMARY_REFUSES: &str = "the primary the sentinels named requires a password, or refused the user name \
    or password given: give the data nodes' with ClientBuilder::sentinel_primary_password (the sentinels' URLs \
    authenticate to the sentinels only)";

/// What to do when the sentinels, or the primary they named, did not answer the redis crate's own connections.
const SENTINELS_SILENT: &str = "no answer from the sentinels, or from the primary they named (the redis crate \
    gives each sentinel, and its check of the primary's role, 1 s to connect and 500 ms to answer, and asks the \
    next sentinel when one fails): check that they are up and reachable; ClientBuilder::connect_timeout bounds \
    it all";

/// No connection within the connect timeout: what a server that is stopped (SIGSTOP) or overloaded, or one
/// behind a firewall that drops packets, gives (it accepts or ignores the connection and never answers).
fn connect_timed_out(server: &str, timeouts: Timeouts) -> BackendError {
    let hint = format!(
        "no connection within the connect timeout ({:?}): check that the server is up, reachable, not stopped \
         and not overloaded, or raise ClientBuilder::connect_timeout",
        timeouts.connect
    );
    redis_error_with_hint(server, hint, timeout_error("timed out"))
}

/// What to do when a cluster's nodes did not answer.
fn cluster_timed_out(timeouts: Timeouts) -> String {
    format!(
        "no connection within the connect timeout ({:?}), which each node's connection is given (the seeds', \
         then those of the nodes in the slot map they give: twice it in all): check that the nodes are up, \
         reachable, not stopped and not overloaded, or raise ClientBuilder::connect_timeout",
        timeouts.connect
    )
}

pub(super) fn manager_config(timeouts: Timeouts) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeouts.connect))
        .set_response_timeout(Some(timeouts.response))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_millis(500))
}

/// The connection settings for `url` (`server` is its redacted form, for the error).
pub(super) fn connection_info(url: &str, server: &str) -> Result<redis::ConnectionInfo, LockError> {
    let info = url.into_connection_info().map_err(|e| url_error(server, &e))?;
    // Nagle's algorithm holds a small write back while an earlier one is unacknowledged: with several calls in
    // flight on one connection, a request would wait for an earlier reply (a round trip) or the server's delayed
    // ACK. Redis sends its replies with TCP_NODELAY; both of our connections send with it too.
    Ok(info.set_tcp_settings(TcpSettings::default().set_nodelay(true)))
}
