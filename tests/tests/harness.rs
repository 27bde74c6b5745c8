//! Tests of the test harness itself: the `RedisServer` and `PostgresServer` guards.

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::time::Duration;

use distlock_tests::{free_port, PostgresServer, RedisServer};
use redis::AsyncCommands;

fn tcp_open(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok()
}

fn panic_text(payload: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else {
        String::from("<non-string panic>")
    }
}

#[tokio::test]
async fn server_answers_on_tcp_and_unix_socket() {
    let server = RedisServer::new();
    assert_ne!(server.port(), 6379, "must never use the machine's own Redis port");
    assert_eq!(server.url(), format!("redis://127.0.0.1:{}/", server.port()));
    assert!(server.unix_socket().exists(), "no socket at {:?}", server.unix_socket());
    assert!(server.unix_socket().starts_with(server.dir()));

    let mut tcp = server.connection().await;
    let pong: String = redis::cmd("PING").query_async(&mut tcp).await.unwrap();
    assert_eq!(pong, "PONG");
    let _: () = tcp.set("harness:k", "v").await.unwrap();

    let unix = redis::Client::open(server.unix_url()).unwrap();
    let mut unix = unix.get_multiplexed_async_connection().await.unwrap();
    let v: String = unix.get("harness:k").await.unwrap();
    assert_eq!(v, "v", "TCP and unix socket reach the same server");

    // Nothing is persisted, and DEBUG is available for tests that simulate stalls.
    let save: Vec<String> = redis::cmd("CONFIG").arg("GET").arg("save").query_async(&mut tcp).await.unwrap();
    assert_eq!(save, vec!["save".to_string(), String::new()]);
    let ok: String = redis::cmd("DEBUG").arg("SLEEP").arg(0).query_async(&mut tcp).await.unwrap();
    assert_eq!(ok, "OK");

    assert!(server.log().contains("Ready to accept connections"), "log: {}", server.log());
}

#[tokio::test]
async fn servers_are_isolated_from_each_other() {
    let a = RedisServer::new();
    let b = RedisServer::new();
    assert_ne!(a.port(), b.port());
    assert_ne!(a.unix_socket(), b.unix_socket());
    let mut ca = a.connection().await;
    let mut cb = b.connection().await;
    let _: () = ca.set("harness:only-in-a", 1).await.unwrap();
    let in_b: Option<i64> = cb.get("harness:only-in-a").await.unwrap();
    assert_eq!(in_b, None);
}

#[test]
fn drop_kills_reaps_and_cleans_up() {
    let mut server = RedisServer::new();
    assert!(server.is_running());
    let pid = server.pid().expect("running server has a pid");
    let port = server.port();
    let dir = server.dir().to_path_buf();
    assert!(Path::new(&format!("/proc/{pid}")).exists());
    assert!(tcp_open(port));
    drop(server);
    // Reaped: not even a zombie is left (a zombie still has a /proc entry).
    assert!(!Path::new(&format!("/proc/{pid}")).exists(), "process {pid} still exists after drop");
    assert!(!tcp_open(port), "port {port} still answers after drop");
    assert!(!dir.exists(), "temporary directory {dir:?} left behind");
}

#[tokio::test]
async fn kill_and_restart() {
    let mut server = RedisServer::new();
    let port = server.port();
    let mut conn = server.connection().await;
    let _: () = conn.set("harness:k", "v").await.unwrap();

    server.kill();
    assert!(!server.is_running());
    assert_eq!(server.pid(), None);
    assert!(!tcp_open(port));
    server.kill(); // idempotent

    server.restart();
    assert!(server.is_running());
    assert_eq!(server.port(), port, "restart keeps the port");
    let mut conn = server.connection().await;
    let v: Option<String> = conn.get("harness:k").await.unwrap();
    assert_eq!(v, None, "nothing survives a restart");
}

#[test]
fn free_port_is_never_the_default_redis_port() {
    for _ in 0..20 {
        let p = free_port();
        assert_ne!(p, 6379);
        assert_ne!(p, 0);
    }
}

#[test]
#[should_panic(expected = "apt-get install -y redis-server redis-tools")]
fn missing_binary_says_how_to_install_redis() {
    let _ = RedisServer::with_binary("redis-server-that-does-not-exist-distlock");
}

#[test]
fn failed_start_reports_the_log() {
    // `false` exits at once with status 1, like a redis-server that rejects its config.
    let err = catch_unwind(AssertUnwindSafe(|| RedisServer::with_binary("false")))
        .expect_err("a binary that exits at once cannot be a server");
    let msg = panic_text(err);
    assert!(msg.contains("exited early"), "message: {msg}");
    assert!(msg.contains("redis-server log"), "message: {msg}");
}

/// Run in a child process by `panicking_test_prints_server_log`: fails while owning a server.
#[test]
fn child_panics_while_owning_a_server() {
    if std::env::var_os("DISTLOCK_HARNESS_CHILD").is_none() {
        return; // only meaningful when run as the child below
    }
    let server = RedisServer::new();
    let port = server.port();
    panic!("deliberate failure with a server on port {port}");
}

#[test]
fn panicking_test_prints_server_log() {
    let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "child_panics_while_owning_a_server", "--nocapture", "--test-threads=1"])
        .env("DISTLOCK_HARNESS_CHILD", "1")
        .output()
        .expect("run the test binary as a child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the child test was meant to fail\n{stdout}\n{stderr}");
    assert!(stderr.contains("deliberate failure"), "stderr: {stderr}");
    assert!(stderr.contains("--- redis-server log"), "no server log in the failure output: {stderr}");
    assert!(stderr.contains("Ready to accept connections"), "stderr: {stderr}");
}

/// A private PostgreSQL server: its own port (never 5432), durable as in production, answering as the
/// superuser; dropped, its processes are gone, its port closed and its directory removed.
#[test]
fn a_private_postgres_server_is_its_own_and_leaves_nothing_behind() {
    let server = PostgresServer::new();
    let (pid, port, dir) =
        (server.pid().expect("a running server has a pid"), server.port(), server.dir().to_path_buf());
    assert_ne!(port, 5432, "the machine's own PostgreSQL port");
    assert!(server.url().contains(&format!("127.0.0.1:{port}/")), "{}", server.url());
    assert_eq!(server.psql("SHOW fsync"), "on");
    assert_eq!(server.psql("SELECT current_user"), "postgres");
    assert_eq!(server.psql("SHOW port"), port.to_string(), "another server answered on our port");
    drop(server);
    assert!(!Path::new(&format!("/proc/{pid}")).exists(), "postmaster {pid} still exists after drop");
    assert!(!tcp_open(port), "port {port} still answers after drop");
    assert!(!dir.exists(), "temporary directory {dir:?} left behind");
}

/// Killed with SIGKILL, as a crash would, and restarted on the same data: what was committed is still there.
#[test]
fn a_killed_postgres_server_restarts_with_what_it_committed() {
    let mut server = PostgresServer::new();
    server.psql("CREATE TABLE kept (n int); INSERT INTO kept VALUES (42)");
    let pid = server.pid().expect("running");
    server.kill();
    assert!(!Path::new(&format!("/proc/{pid}")).exists(), "postmaster {pid} survived SIGKILL");
    server.restart();
    assert_ne!(server.pid(), Some(pid));
    assert_eq!(server.psql("SELECT n FROM kept"), "42", "a committed row was lost in the crash");
}

#[test]
#[should_panic(expected = "apt-get install -y postgresql")]
fn missing_postgres_says_how_to_install_it() {
    PostgresServer::with_bin_dir("/nonexistent/postgresql/bin");
}
