//! [`RedisServer`]: a private `redis-server` process for one test.

use std::ffi::OsString;
use std::fmt;
use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// How long a server may take to answer `PING` after it was spawned.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How many times a start is retried when another process took the chosen port first.
const PORT_ATTEMPTS: usize = 5;
/// The port of the machine's own Redis, if it has one: the tests never touch it.
const FORBIDDEN_PORT: u16 = 6379;
/// What to do when `redis-server` is missing.
pub const INSTALL_HINT: &str = "install it with `apt-get install -y redis-server redis-tools` \
     (prefix `sudo` when not root), or point REDIS_SERVER_BIN at a redis-server binary";

/// A `redis-server` process owned by one test.
///
/// It listens on a free loopback port (never 6379) and on a unix socket in its own temporary
/// directory, persists nothing (`--save "" --appendonly no`) and logs to `<tempdir>/redis.log`.
/// On drop the process is killed and reaped and the directory removed; if the thread is
/// panicking (a failed assertion), the server log is printed to stderr first, so it shows up
/// in the test's failure output.
///
/// Tests never talk to any server they did not start, and never run `FLUSHALL`.
pub struct RedisServer {
    binary: PathBuf,
    /// Extra `redis-server` arguments, appended after the harness's own (so they can override them).
    extra_args: Vec<String>,
    /// A config file's text, written to `<tempdir>/redis.conf` (once: Sentinel rewrites its own) and given
    /// first on the command line.
    config: Option<String>,
    /// The `--requirepass` password, if any: the harness's own checks authenticate with it.
    password: Option<String>,
    /// Environment variables the process starts with (kept across restarts): the stepped clock's `LD_PRELOAD`
    /// and offset file (clock.rs).
    pub(crate) env: Vec<(&'static str, OsString)>,
    port: u16,
    child: Option<Child>,
    // Declared last: removed after the process is gone.
    dir: tempfile::TempDir,
}

#[derive(Debug)]
enum StartError {
    /// The port was taken between choosing it and the server binding it.
    PortTaken,
    /// Anything else: the message says what.
    Failed(String),
}

impl RedisServer {
    /// Starts a server with `$REDIS_SERVER_BIN`, or `redis-server` from `PATH`.
    ///
    /// Panics (with the server log, or with how to install Redis) if it cannot be started.
    pub fn new() -> Self {
        Self::with_args(Vec::<String>::new())
    }

    /// Starts a server with the given `redis-server` binary (a path, or a name looked up on `PATH`).
    pub fn with_binary(binary: impl Into<PathBuf>) -> Self {
        Self::start(binary.into(), Vec::new())
    }

    /// Starts a server (as [`new`](Self::new) does) with extra `redis-server` arguments, e.g.
    /// `["--cluster-enabled", "yes"]`. They are kept across [`restart`](Self::restart).
    pub fn with_args<I, S>(args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let binary = default_binary();
        Self::start(binary, args.into_iter().map(Into::into).collect())
    }

    /// Starts a replica of the server on `primary_port` (`--replicaof`) and waits until its replication link
    /// is up, so writes acknowledged by `WAIT` from then on are on it.
    pub async fn replica_of(primary_port: u16) -> Self {
        Self::replica_with_args(primary_port, Vec::<String>::new()).await
    }

    /// Starts a replica as [`replica_of`](Self::replica_of) does, with extra `redis-server` arguments (as
    /// [`with_args`](Self::with_args) takes them), e.g. the `--masterauth` of a primary that needs a password.
    pub async fn replica_with_args<I, S>(primary_port: u16, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut all: Vec<String> = vec!["--replicaof".into(), "127.0.0.1".into(), primary_port.to_string()];
        all.extend(args.into_iter().map(Into::into));
        let replica = Self::with_args(all);
        let conn = replica.connection().await;
        crate::eventually(Duration::from_secs(10), "replication link up", || {
            let mut conn = conn.clone();
            async move {
                let info: String = redis::cmd("INFO").arg("replication").query_async(&mut conn).await.expect("INFO");
                info.contains("master_link_status:up")
            }
        })
        .await;
        replica
    }

    /// Starts a Sentinel monitoring the primary on `primary_port` as `service` (quorum `quorum`), tuned for
    /// tests: the primary counts as down after 1 s without answers.
    pub fn sentinel(primary_port: u16, service: &str, quorum: u32) -> Self {
        Self::start_with(
            default_binary(),
            vec!["--sentinel".into()],
            Some(sentinel_config(primary_port, service, quorum)),
        )
    }

    /// Starts a Sentinel as [`sentinel`](Self::sentinel) does, behind `password` of its own (`requirepass`,
    /// which the sentinels also give each other), reaching the data nodes with `auth_pass` (`sentinel
    /// auth-pass`) when they need one.
    pub fn sentinel_with_passwords(
        primary_port: u16,
        service: &str,
        quorum: u32,
        password: &str,
        auth_pass: Option<&str>,
    ) -> Self {
        let binary = default_binary();
        let mut config = sentinel_config(primary_port, service, quorum);
        if let Some(auth_pass) = auth_pass {
            config.push_str(&format!("sentinel auth-pass {service} {auth_pass}\n"));
        }
        let args = vec!["--sentinel".into(), "--requirepass".into(), password.into()];
        Self::start_with(binary, args, Some(config))
    }

    /// Starts a server that requires `password` (`--requirepass`). [`url`](Self::url) has no password in
    /// it; [`connection`](Self::connection) authenticates.
    pub fn with_password(password: &str) -> Self {
        let binary = default_binary();
        Self::start_with(binary, vec!["--requirepass".into(), password.into()], None)
    }

    fn start(binary: PathBuf, extra_args: Vec<String>) -> Self {
        Self::start_with(binary, extra_args, None)
    }

    fn start_with(binary: PathBuf, extra_args: Vec<String>, config: Option<String>) -> Self {
        Self::start_in(binary, extra_args, config, |_| Ok(Vec::new()))
    }

    /// Starts a server whose process gets the environment `env` returns for its (fresh) private directory.
    pub(crate) fn start_in(
        binary: PathBuf,
        extra_args: Vec<String>,
        config: Option<String>,
        env: impl FnOnce(&Path) -> io::Result<Vec<(&'static str, OsString)>>,
    ) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("distlock-redis-")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot create a temporary directory for redis-server: {e}"));
        let password =
            extra_args.iter().position(|a| a == "--requirepass").and_then(|i| extra_args.get(i + 1)).cloned();
        let env = env(dir.path()).unwrap_or_else(|e| panic!("cannot prepare redis-server's environment: {e}"));
        let mut server = RedisServer { binary, extra_args, config, password, env, port: 0, child: None, dir };
        let mut last = String::new();
        for _ in 0..PORT_ATTEMPTS {
            server.port = free_port();
            match server.spawn_and_wait() {
                Ok(()) => return server,
                Err(StartError::PortTaken) => {
                    last = format!("port {} was taken before redis-server bound it", server.port);
                }
                Err(StartError::Failed(msg)) => server.fail(&msg),
            }
        }
        server.fail(&format!("gave up after {PORT_ATTEMPTS} attempts to find a free port: {last}"))
    }

    /// `redis://127.0.0.1:PORT/`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The URL of the unix socket, for the `redis` crate: `redis+unix:///…/redis.sock`.
    pub fn unix_url(&self) -> String {
        format!("redis+unix://{}", self.unix_socket().display())
    }

    /// The loopback TCP port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The path of the server's unix socket.
    pub fn unix_socket(&self) -> PathBuf {
        self.dir.path().join("redis.sock")
    }

    /// The server's private directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The process id, while the server runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Freezes the server (SIGSTOP: its sockets stay open, nothing is answered) until the returned
    /// [`Stopped`](crate::sys::Stopped) is resumed or dropped.
    pub fn freeze(&self) -> crate::sys::Stopped {
        crate::sys::Stopped::stop(self.pid().expect("the server is not running"))
    }

    /// Whether the process is still alive (reaps it if it exited).
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            None => false,
            Some(child) => matches!(child.try_wait(), Ok(None)),
        }
    }

    /// The server log so far (its `--logfile`, plus anything it wrote to stdout/stderr).
    pub fn log(&self) -> String {
        let mut text = fs::read_to_string(self.log_path()).unwrap_or_default();
        let out = fs::read_to_string(self.output_path()).unwrap_or_default();
        if !out.trim().is_empty() {
            text.push_str("\n--- redis-server stdout/stderr ---\n");
            text.push_str(&out);
        }
        text
    }

    /// An async connection over TCP, for assertions.
    pub async fn connection(&self) -> redis::aio::MultiplexedConnection {
        let url = match &self.password {
            Some(password) => format!("redis://:{password}@127.0.0.1:{}/", self.port),
            None => self.url(),
        };
        let client = redis::Client::open(url).unwrap_or_else(|e| panic!("bad url {}: {e}", self.url()));
        client
            .get_multiplexed_async_connection()
            .await
            .unwrap_or_else(|e| panic!("cannot connect to {}: {e}\n{}", self.url(), self.log_block()))
    }

    /// Whether the server was killed ([`kill`](Self::kill)) and not restarted since.
    pub fn is_killed(&self) -> bool {
        self.child.is_none()
    }

    /// Kills the server (SIGKILL) and reaps it. Idempotent.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server and starts a fresh one on the same port and socket. The data is gone
    /// (nothing is persisted).
    pub fn restart(&mut self) {
        self.kill();
        // The port was ours until a moment ago; retry briefly in case it lingers.
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            match self.spawn_and_wait() {
                Ok(()) => return,
                Err(StartError::PortTaken) if Instant::now() < deadline => thread::sleep(Duration::from_millis(50)),
                Err(StartError::PortTaken) => self.fail(&format!("port {} is taken; cannot restart", self.port)),
                Err(StartError::Failed(msg)) => self.fail(&msg),
            }
        }
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    fn output_path(&self) -> PathBuf {
        self.dir.path().join("redis.out")
    }

    fn log_block(&self) -> String {
        format!(
            "--- redis-server log ({}) ---\n{}\n--- end of redis-server log ---",
            self.log_path().display(),
            self.log()
        )
    }

    fn fail(&mut self, msg: &str) -> ! {
        self.kill();
        panic!("redis-server ({}) on 127.0.0.1:{}: {msg}\n{}", self.binary.display(), self.port, self.log_block())
    }

    fn spawn_and_wait(&mut self) -> Result<(), StartError> {
        assert_ne!(self.port, FORBIDDEN_PORT, "tests never use port {FORBIDDEN_PORT}");
        let _ = fs::remove_file(self.unix_socket());
        let out = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.output_path())
            .map_err(|e| StartError::Failed(format!("cannot open output file: {e}")))?;
        let err = out.try_clone().map_err(|e| StartError::Failed(format!("cannot open output file: {e}")))?;
        let mut cmd = Command::new(&self.binary);
        if let Some(text) = &self.config {
            let path = self.dir.path().join("redis.conf");
            if !path.exists() {
                fs::write(&path, text).map_err(|e| StartError::Failed(format!("cannot write its config: {e}")))?;
            }
            cmd.arg(path);
        }
        cmd.arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1"])
            .arg("--unixsocket")
            .arg(self.unix_socket())
            .args(["--unixsocketperm", "700"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(self.log_path())
            .args(["--daemonize", "no"])
            .args(["--enable-debug-command", "local"])
            .args(&self.extra_args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let child = match cmd.spawn() {
            Ok(child) => child,
            Err(e) if e.kind() == io::ErrorKind::NotFound => panic!(
                "`{}` not found: the distlock tests need a real Redis server; {INSTALL_HINT}",
                self.binary.display()
            ),
            Err(e) => return Err(StartError::Failed(format!("cannot spawn: {e}"))),
        };
        let pid = child.id();
        self.child = Some(child);

        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                self.child = None;
                let log = self.log();
                let port_needle = format!(":{}", self.port);
                if log.contains("Address already in use") && log.contains(&port_needle) {
                    return Err(StartError::PortTaken);
                }
                return Err(StartError::Failed(format!("exited early with {status}")));
            }
            // The unix socket is certainly ours; once it answers, redis has bound every
            // listener (it exits if one fails), and the TCP check proves the port is ours too.
            if ping_unix(&self.unix_socket(), self.password.as_deref()).is_ok() {
                return match tcp_process_id(self.port, self.password.as_deref()) {
                    Ok(p) if p == pid => Ok(()),
                    Ok(other) => {
                        self.kill();
                        Err(StartError::Failed(format!(
                            "port {} is answered by process {other}, not by ours ({pid})",
                            self.port
                        )))
                    }
                    Err(e) => {
                        self.kill();
                        Err(StartError::Failed(format!("unix socket answers but TCP port does not: {e}")))
                    }
                };
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(StartError::Failed(format!("did not answer PING within {READY_TIMEOUT:?}")));
            }
            thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Default for RedisServer {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisServer")
            .field("port", &self.port)
            .field("pid", &self.pid())
            .field("dir", &self.dir.path())
            .finish()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if thread::panicking() {
            eprintln!("redis-server on 127.0.0.1:{} (test failed):\n{}", self.port, self.log_block());
        }
        self.kill();
    }
}

/// `$REDIS_SERVER_BIN`, or `redis-server` (looked up on `PATH`).
pub(crate) fn default_binary() -> PathBuf {
    std::env::var_os("REDIS_SERVER_BIN").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("redis-server"))
}

/// A Sentinel's configuration, tuned for tests: the primary counts as down after 1 s without answers.
fn sentinel_config(primary_port: u16, service: &str, quorum: u32) -> String {
    format!(
        "sentinel monitor {service} 127.0.0.1 {primary_port} {quorum}\n\
         sentinel down-after-milliseconds {service} 1000\n\
         sentinel failover-timeout {service} 5000\n\
         sentinel parallel-syncs {service} 1\n"
    )
}

/// A loopback port that was free a moment ago (another process may still take it: callers retry).
pub fn free_port() -> u16 {
    loop {
        let listener =
            TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap_or_else(|e| panic!("cannot bind 127.0.0.1:0: {e}"));
        let port = listener.local_addr().expect("local address of a bound listener").port();
        if port != FORBIDDEN_PORT {
            return port;
        }
    }
}

/// Sends one command in RESP and returns the reply's payload (simple string, or bulk string
/// body); an error reply becomes an `Err`.
fn raw_command<S: Read + Write>(stream: S, args: &[&str]) -> io::Result<String> {
    let mut stream = BufReader::new(stream);
    let mut req = format!("*{}\r\n", args.len());
    for a in args {
        req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    stream.get_mut().write_all(req.as_bytes())?;
    let mut line = String::new();
    stream.read_line(&mut line)?;
    let line = line.trim_end();
    match line.as_bytes().first() {
        Some(b'+') | Some(b':') => Ok(line[1..].to_string()),
        Some(b'$') => {
            let len: usize = line[1..].parse().map_err(|_| io::Error::other(format!("bad bulk length {line:?}")))?;
            let mut body = vec![0; len + 2];
            stream.read_exact(&mut body)?;
            body.truncate(len);
            String::from_utf8(body).map_err(io::Error::other)
        }
        _ => Err(io::Error::other(format!("unexpected reply {line:?}"))),
    }
}

fn ping_unix(path: &Path, password: Option<&str>) -> io::Result<()> {
    let stream = UnixStream::connect(path)?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(Duration::from_secs(2)))?;
    if let Some(password) = password {
        raw_command(&stream, &["AUTH", password])?;
    }
    match raw_command(&stream, &["PING"])?.as_str() {
        "PONG" => Ok(()),
        other => Err(io::Error::other(format!("PING answered {other:?}"))),
    }
}

/// The `process_id` that the server on `127.0.0.1:port` reports in `INFO server`.
fn tcp_process_id(port: u16, password: Option<&str>) -> io::Result<u32> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(Duration::from_secs(2)))?;
    if let Some(password) = password {
        raw_command(&stream, &["AUTH", password])?;
    }
    let info = raw_command(&stream, &["INFO", "server"])?;
    info.lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|p| p.trim().parse().ok())
        .ok_or_else(|| io::Error::other("INFO server has no process_id"))
}

/// A shell that waits for this process to exit, then kills `nodes` and removes their directories (a server kept
/// in a static is never dropped).
pub(crate) fn reaper(nodes: &[&RedisServer]) -> Child {
    let pids: Vec<u32> = nodes.iter().filter_map(|n| n.pid()).collect();
    let dirs: Vec<&Path> = nodes.iter().map(|n| n.dir()).collect();
    reaper_of(&pids, &dirs)
}

/// A shell that waits for this process to exit, then kills the processes `pids` and removes `dirs`.
pub(crate) fn reaper_of(pids: &[u32], dirs: &[&Path]) -> Child {
    let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
    let dirs: Vec<String> = dirs.iter().map(|d| format!("'{}'", d.display())).collect();
    let script = format!(
        "while kill -0 {} 2>/dev/null; do sleep 0.5; done; kill -9 {} 2>/dev/null; sleep 0.2; rm -rf {}",
        std::process::id(),
        pids.join(" "),
        dirs.join(" ")
    );
    Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start the servers' reaper: {e}"))
}
