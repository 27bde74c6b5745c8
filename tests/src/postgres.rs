//! [`PostgresServer`]: a private PostgreSQL server for one test, in its own temporary directory, on a free
//! loopback port (never the machine's 5432).
//!
//! PostgreSQL refuses to run as root: when the tests run as root (as CI does), `initdb` and `postgres` run as
//! the `postgres` user (the process's uid and gid are set before it starts; no `su` in between, so the child
//! is the postmaster itself and a test can signal it).

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use crate::server::{free_port, reaper_of};

/// How long a server may take to accept connections once started (crash recovery included).
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How many times a start is retried when another process took the chosen port first.
const PORT_ATTEMPTS: usize = 5;
/// The port of the machine's own PostgreSQL, if it has one: the tests never touch it.
const FORBIDDEN_PORT: u16 = 5432;
/// What to do when PostgreSQL is missing.
pub const POSTGRES_INSTALL_HINT: &str = "install it with `apt-get install -y postgresql` (prefix `sudo` when \
     not root), or point PG_BIN_DIR at the directory holding initdb and postgres";

/// A PostgreSQL server owned by one test.
///
/// `initdb` makes a fresh cluster (trust authentication, UTF8, the C locale) in a temporary directory, and
/// the server listens on 127.0.0.1 and a unix socket there, logging to `<dir>/postgres.log`. Durability stays
/// as in production (`fsync` on), so a test may kill it with SIGKILL and [`restart`](Self::restart) it on the
/// same data. On drop the server is shut down at once (SIGQUIT, then SIGKILL) and the directory removed; if
/// the thread is panicking, the server log is printed first.
pub struct PostgresServer {
    bin: PathBuf,
    port: u16,
    /// Whether to run the binaries as the `postgres` user (we are root), and its uid and gid.
    run_as: Option<(u32, u32)>,
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

impl PostgresServer {
    /// Makes a cluster and starts its server. Panics (with the server log, or with how to install
    /// PostgreSQL) if it cannot.
    pub fn new() -> Self {
        Self::with_bin_dir(bin_dir())
    }

    /// As [`new`](Self::new), with the PostgreSQL binaries (initdb, postgres, psql, pg_isready) from `bin`.
    pub fn with_bin_dir(bin: impl Into<PathBuf>) -> Self {
        let bin = bin.into();
        let run_as = if rustix::process::geteuid().is_root() { Some(postgres_user()) } else { None };
        let dir = tempfile::Builder::new()
            .prefix("distlock-pg-")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot make a temporary directory: {e}"));
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
                .unwrap_or_else(|e| panic!("cannot give {} to the postgres user: {e}", dir.path().display()));
        }
        let mut server = Self { bin, port: 0, run_as, child: None, dir };
        server.initdb();
        for _ in 0..PORT_ATTEMPTS {
            server.port = free_port_but(FORBIDDEN_PORT);
            match server.spawn_and_wait() {
                Ok(()) => return server,
                Err(StartError::PortTaken) => continue,
                Err(StartError::Failed(msg)) => server.fail(&msg),
            }
        }
        server.fail(&format!("every port tried was taken ({PORT_ATTEMPTS} attempts)"))
    }

    /// One server for the whole test binary, started by the first caller. Tests that share it use keys of
    /// their own and never stop it; it is killed, and its directory removed, when the process exits.
    pub fn shared() -> &'static PostgresServer {
        static SHARED: OnceLock<(PostgresServer, Child)> = OnceLock::new();
        &SHARED
            .get_or_init(|| {
                let server = PostgresServer::new();
                let reaper = reaper_of(&server.pid().into_iter().collect::<Vec<_>>(), &[server.dir()]);
                (server, reaper)
            })
            .0
    }

    /// A URL for the server's superuser and its `postgres` database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The directory holding the cluster (`data/`), the socket and the log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The postmaster's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The postmaster and every process it started (each session's backend, the checkpointer, the WAL
    /// writer...): freezing the server means freezing all of them.
    pub fn pids(&self) -> Vec<u32> {
        let Some(postmaster) = self.pid() else { return Vec::new() };
        let mut pids = vec![postmaster];
        for entry in fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else { continue };
            let stat = fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            // `pid (comm) state ppid ...`: comm may hold spaces, so read after its closing parenthesis.
            let parent =
                stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
            if parent == Some(postmaster) {
                pids.push(pid);
            }
        }
        pids
    }

    /// The server log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_else(|e| format!("(no log: {e})"))
    }

    /// Runs `sql` with `psql` as the superuser (one session, autocommit) and returns what it printed
    /// (unaligned, tuples only). Panics with psql's error and the server log if it fails.
    pub fn psql(&self, sql: &str) -> String {
        self.try_psql(sql).unwrap_or_else(|error| panic!("psql `{sql}` failed: {error}\n{}", self.log_block()))
    }

    /// As [`psql`](Self::psql), with psql's error text when it fails.
    pub fn try_psql(&self, sql: &str) -> Result<String, String> {
        let out = Command::new(self.bin.join("psql"))
            .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-U", "postgres", "-d", "postgres"])
            .args(["-p", &self.port.to_string(), "-c", sql])
            .output()
            .unwrap_or_else(|e| panic!("cannot run psql: {e}; {POSTGRES_INSTALL_HINT}"));
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
        }
    }

    /// Kills every process of the server with SIGKILL, as a crash of its machine would, and waits until all
    /// are gone (a backend left behind would keep the shared memory a restart needs).
    pub fn kill(&mut self) {
        let others: Vec<u32> = self.pids().into_iter().skip(1).collect();
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        for pid in others {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            let deadline = Instant::now() + READY_TIMEOUT;
            while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(5));
            }
        }
    }

    /// Starts the server again on the same port and data, after [`kill`](Self::kill) (crash recovery runs).
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            match self.spawn_and_wait() {
                Ok(()) => return,
                // The old backends may still hold the port a moment, until they notice the postmaster died.
                Err(StartError::PortTaken) if Instant::now() < deadline => thread::sleep(Duration::from_millis(50)),
                Err(StartError::PortTaken) => self.fail(&format!("port {} is taken; cannot restart", self.port)),
                Err(StartError::Failed(msg)) => self.fail(&msg),
            }
        }
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("postgres.log")
    }

    fn log_block(&self) -> String {
        format!("--- postgres log ({}) ---\n{}\n--- end of postgres log ---", self.log_path().display(), self.log())
    }

    fn fail(&mut self, msg: &str) -> ! {
        self.shut_down();
        panic!("postgres ({}) on 127.0.0.1:{}: {msg}\n{}", self.bin.display(), self.port, self.log_block())
    }

    /// A command running `program` from the server's binaries, as the postgres user when we are root.
    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bin.join(program));
        if let Some((uid, gid)) = self.run_as {
            std::os::unix::process::CommandExt::uid(&mut cmd, uid);
            std::os::unix::process::CommandExt::gid(&mut cmd, gid);
            // Its HOME and USER would otherwise still be root's.
            cmd.env("HOME", self.dir.path()).env("USER", "postgres");
        }
        cmd.current_dir(self.dir.path());
        cmd
    }

    fn initdb(&mut self) {
        let data = self.data_dir();
        let out = self
            .command("initdb")
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"])
            .output();
        let out = match out {
            Ok(out) => out,
            Err(e) if e.kind() == io::ErrorKind::NotFound => panic!(
                "`{}` not found: the distlock tests need a real PostgreSQL server; {POSTGRES_INSTALL_HINT}",
                self.bin.join("initdb").display()
            ),
            Err(e) => panic!("cannot run initdb: {e}"),
        };
        assert!(
            out.status.success(),
            "initdb failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn spawn_and_wait(&mut self) -> Result<(), StartError> {
        assert_ne!(self.port, FORBIDDEN_PORT, "tests never use port {FORBIDDEN_PORT}");
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .map_err(|e| StartError::Failed(format!("cannot open its log: {e}")))?;
        if let Some((uid, gid)) = self.run_as {
            let _ = std::os::unix::fs::chown(self.log_path(), Some(uid), Some(gid));
        }
        let err = log.try_clone().map_err(|e| StartError::Failed(format!("cannot open its log: {e}")))?;
        let logged_before = self.log().len();
        let child = self
            .command("postgres")
            .arg("-D")
            .arg(self.data_dir())
            .args(["-p", &self.port.to_string()])
            .arg("-k")
            .arg(self.dir.path())
            .args(["-c", "listen_addresses=127.0.0.1", "-c", "logging_collector=off", "-c", "fsync=on"])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|e| StartError::Failed(format!("cannot spawn postgres: {e}")))?;
        self.child = Some(child);
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                self.child = None;
                let new_lines = self.log().get(logged_before..).unwrap_or_default().to_owned();
                if new_lines.contains("Address already in use") {
                    return Err(StartError::PortTaken);
                }
                return Err(StartError::Failed(format!("exited early with {status}")));
            }
            // Ours: the postmaster writes the ready line once it listens; the process is still our child.
            let ready = self.log().get(logged_before..).is_some_and(|s| s.contains("ready to accept connections"));
            if ready && self.pg_isready() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.shut_down();
                return Err(StartError::Failed(format!("did not accept connections within {READY_TIMEOUT:?}")));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn pg_isready(&self) -> bool {
        Command::new(self.bin.join("pg_isready"))
            .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string()])
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Immediate shutdown (SIGQUIT: the postmaster stops its backends and exits), then SIGKILL if it lingers.
    fn shut_down(&mut self) {
        let Some(child) = self.child.as_mut() else { return };
        crate::sys::signal(child.id(), "QUIT");
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if child.try_wait().ok().flatten().is_some() {
                self.child = None;
                return;
            }
            thread::sleep(Duration::from_millis(10));
        }
        self.kill();
    }
}

impl Default for PostgresServer {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for PostgresServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresServer")
            .field("port", &self.port)
            .field("pid", &self.pid())
            .field("dir", &self.dir.path())
            .finish()
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        if thread::panicking() {
            eprintln!("postgres on 127.0.0.1:{} (test failed):\n{}", self.port, self.log_block());
        }
        self.shut_down();
    }
}

/// `$PG_BIN_DIR`, else `pg_config --bindir`, else the newest `/usr/lib/postgresql/<version>/bin` (Debian's).
fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PG_BIN_DIR") {
        return PathBuf::from(dir);
    }
    let from_pg_config = Command::new("pg_config").arg("--bindir").output().ok().filter(|o| o.status.success());
    if let Some(dir) = from_pg_config.map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim())) {
        if dir.join("initdb").exists() {
            return dir;
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, bin)| bin.join("initdb").exists())
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).unwrap_or_else(|| {
        panic!("PostgreSQL's initdb was not found: the distlock tests need a real PostgreSQL server; {POSTGRES_INSTALL_HINT}")
    })
}

/// The `postgres` user's uid and gid, from /etc/passwd (the Debian package makes it).
pub(crate) fn postgres_user() -> (u32, u32) {
    let passwd = fs::read_to_string("/etc/passwd").unwrap_or_default();
    passwd
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            (fields.first() == Some(&"postgres")).then(|| Some((fields.get(2)?.parse().ok()?, fields.get(3)?.parse().ok()?)))?
        })
        .unwrap_or_else(|| {
            panic!("running as root, and there is no `postgres` user to run PostgreSQL as (it refuses root); {POSTGRES_INSTALL_HINT}")
        })
}

/// A free loopback port other than `forbidden`.
fn free_port_but(forbidden: u16) -> u16 {
    loop {
        let port = free_port();
        if port != forbidden {
            return port;
        }
    }
}
