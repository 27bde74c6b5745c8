//! [`PgBouncer`]: a private PgBouncer in front of a test's [`PostgresServer`], on a free loopback port (never
//! the machine's 6432), in a temporary directory, killed on drop (its log printed if the test panics).
//! PgBouncer refuses to run as root: as root, it runs as the `postgres` user.

use std::fmt;
use std::fs;
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::postgres::postgres_user;
use crate::server::free_port;
use crate::PostgresServer;

/// What to do when PgBouncer is missing.
pub const PGBOUNCER_INSTALL_HINT: &str =
    "install it with `apt-get install -y pgbouncer` (prefix `sudo` when not root), or point PGBOUNCER_BIN at it";

/// A PgBouncer for one test.
pub struct PgBouncer {
    port: u16,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl PgBouncer {
    /// Starts PgBouncer in `pool_mode` (`transaction`, `session`) in front of `server`'s `postgres` database,
    /// trusting every user, at most 4 server sessions, and waits until it accepts connections.
    pub fn start(server: &PostgresServer, pool_mode: &str) -> Self {
        let dir = tempfile::Builder::new().prefix("distlock-pgbouncer-").tempdir().expect("a temporary directory");
        let run_as = rustix::process::geteuid().is_root().then(postgres_user);
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).expect("give the directory to postgres");
        }
        let port = free_port();
        let d = dir.path().display();
        fs::write(dir.path().join("users.txt"), "\"postgres\" \"\"\n").expect("users file");
        let ini = format!(
            "[databases]\npostgres = host=127.0.0.1 port={} dbname=postgres user=postgres\n\
             [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir = {d}\n\
             auth_type = trust\nauth_file = {d}/users.txt\npool_mode = {pool_mode}\ndefault_pool_size = 4\n\
             max_client_conn = 500\nlogfile = {d}/pgbouncer.log\npidfile = {d}/pgbouncer.pid\n\
             ignore_startup_parameters = extra_float_digits\n",
            server.port()
        );
        fs::write(dir.path().join("pgbouncer.ini"), ini).expect("pgbouncer.ini");
        let bin = std::env::var("PGBOUNCER_BIN").unwrap_or_else(|_| "/usr/sbin/pgbouncer".into());
        let mut cmd = Command::new(&bin);
        cmd.arg(dir.path().join("pgbouncer.ini")).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
        if let Some((uid, gid)) = run_as {
            std::os::unix::process::CommandExt::uid(&mut cmd, uid);
            std::os::unix::process::CommandExt::gid(&mut cmd, gid);
        }
        let child = cmd.spawn().unwrap_or_else(|e| panic!("cannot run `{bin}`: {e}; {PGBOUNCER_INSTALL_HINT}"));
        let mut bouncer = Self { port, child: Some(child), dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            let exited = bouncer.child.as_mut().and_then(|c| c.try_wait().ok().flatten());
            assert!(exited.is_none() && Instant::now() < deadline, "pgbouncer did not start:\n{}", bouncer.log());
            thread::sleep(Duration::from_millis(20));
        }
        bouncer
    }

    /// A URL for the server's superuser and its `postgres` database, through the pool.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("pgbouncer.log")).unwrap_or_else(|e| format!("(no log: {e})"))
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        if thread::panicking() {
            eprintln!("--- pgbouncer log ---\n{}\n--- end of pgbouncer log ---", self.log());
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl fmt::Debug for PgBouncer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgBouncer").field("port", &self.port).finish_non_exhaustive()
    }
}
