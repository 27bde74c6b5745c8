//! [`SentinelGroup`]: a primary, its replicas and three Redis Sentinels watching them, all real processes
//! this test started, for the Sentinel backend's tests.

use std::time::Duration;

use crate::{eventually, RedisServer};

/// The service name the sentinels monitor.
pub const SERVICE: &str = "distlock-test";

/// The passwords of a [`SentinelGroup::start_with_passwords`] group.
#[derive(Debug, Clone, Copy)]
pub struct Passwords {
    /// The data nodes' (`requirepass` and `masterauth`), which the sentinels give them (`auth-pass`).
    pub data: &'static str,
    /// An ACL user on the data nodes, and its password, with every right.
    pub acl_user: (&'static str, &'static str),
    /// The sentinels' own (`requirepass`).
    pub sentinel: &'static str,
}

/// A primary with replicas and three sentinels (quorum 2), all owned by one test (or, through
/// [`shared`](SentinelGroup::shared), by a test binary).
#[derive(Debug)]
pub struct SentinelGroup {
    /// The servers, the first one the primary when started.
    pub servers: Vec<RedisServer>,
    /// The sentinels.
    pub sentinels: Vec<RedisServer>,
    // Kills the servers when this process exits, also when the group lives in a static that is never dropped.
    reaper: Option<std::process::Child>,
}

impl Drop for SentinelGroup {
    fn drop(&mut self) {
        if let Some(mut reaper) = self.reaper.take() {
            let _ = reaper.kill();
            let _ = reaper.wait();
        }
    }
}

impl SentinelGroup {
    /// Starts a primary with `replicas` replicas and three sentinels, and waits until every sentinel sees
    /// every replica and the other sentinels.
    pub async fn start(replicas: usize) -> Self {
        Self::start_with(replicas, None).await
    }

    /// Starts a group as [`start`](Self::start) does, every process behind a password as `passwords` say.
    pub async fn start_with_passwords(replicas: usize, passwords: &Passwords) -> Self {
        Self::start_with(replicas, Some(passwords)).await
    }

    async fn start_with(replicas: usize, passwords: Option<&Passwords>) -> Self {
        // Every data node both requires the password and gives it to its primary: any may be promoted, and the
        // old primary, back as a replica, must authenticate to the new one.
        let data_args: Vec<String> = match passwords {
            Some(p) => vec![
                "--requirepass".into(),
                p.data.into(),
                "--masterauth".into(),
                p.data.into(),
                // One config line, `user NAME on >PASSWORD ~* &* +@all`, given as its words.
                "--user".into(),
                p.acl_user.0.into(),
                "on".into(),
                format!(">{}", p.acl_user.1),
                "~*".into(),
                "&*".into(),
                "+@all".into(),
            ],
            None => vec![],
        };
        let primary = RedisServer::with_args(data_args.clone());
        let mut servers = vec![];
        for _ in 0..replicas {
            servers.push(RedisServer::replica_with_args(primary.port(), data_args.clone()).await);
        }
        servers.insert(0, primary);
        let port = servers[0].port();
        let sentinels: Vec<RedisServer> = (0..3)
            .map(|_| match passwords {
                Some(p) => RedisServer::sentinel_with_passwords(port, SERVICE, 2, p.sentinel, Some(p.data)),
                None => RedisServer::sentinel(port, SERVICE, 2),
            })
            .collect();
        let all: Vec<&RedisServer> = servers.iter().chain(&sentinels).collect();
        let reaper = Some(crate::server::reaper(&all));
        let group = Self { servers, sentinels, reaper };
        for sentinel in &group.sentinels {
            let conn = sentinel.connection().await;
            eventually(Duration::from_secs(30), "sentinels see the replicas and each other", || {
                let mut conn = conn.clone();
                async move {
                    let master: Vec<String> = redis::cmd("SENTINEL")
                        .arg("MASTER")
                        .arg(SERVICE)
                        .query_async(&mut conn)
                        .await
                        .unwrap_or_default();
                    let field = |name: &str| {
                        master
                            .iter()
                            .position(|f| f == name)
                            .and_then(|i| master.get(i + 1))
                            .cloned()
                            .unwrap_or_default()
                    };
                    field("num-slaves") == replicas.to_string() && field("num-other-sentinels") == "2"
                }
            })
            .await;
        }
        group
    }

    /// One group (a primary, one replica, three sentinels) for the whole test binary, started by the first
    /// caller. Tests that share it use keys of their own and never stop or reconfigure its servers.
    pub async fn shared() -> &'static SentinelGroup {
        static SHARED: tokio::sync::OnceCell<SentinelGroup> = tokio::sync::OnceCell::const_new();
        SHARED.get_or_init(|| SentinelGroup::start(1)).await
    }

    /// The sentinels' URLs, for `ClientBuilder::redis_sentinel`.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::url).collect()
    }

    /// The sentinels' URLs with `password` in them (`redis://:PASSWORD@127.0.0.1:PORT/`).
    pub fn sentinel_urls_with_password(&self, password: &str) -> Vec<String> {
        self.sentinels.iter().map(|s| format!("redis://:{password}@127.0.0.1:{}/", s.port())).collect()
    }

    /// The port of the server the sentinels name as primary now.
    pub async fn primary_port(&self) -> Option<u16> {
        let mut conn = self.sentinels[0].connection().await;
        let address: Vec<String> =
            redis::cmd("SENTINEL").arg("GET-MASTER-ADDR-BY-NAME").arg(SERVICE).query_async(&mut conn).await.ok()?;
        address.get(1)?.parse().ok()
    }
}
