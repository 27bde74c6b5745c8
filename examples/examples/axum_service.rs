//! An HTTP service whose handler is `#[distributed_lock]`ed, and how to test it with a client of its own.
//!
//! ```text
//! cargo run -p examples --example axum_service                                   # a demo: two requests, then exit
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run -p examples --example axum_service  # the same on a real Redis
//! cargo run -p examples --example axum_service -- --serve                         # serve on 127.0.0.1:3000
//! curl -i -X POST http://127.0.0.1:3000/reports/7 & curl -i -X POST http://127.0.0.1:3000/reports/7
//! ```
//!
//! With `--serve`, Ctrl-C or SIGTERM shuts it down gracefully: axum stops accepting connections, and
//! `Client::shutdown` makes new lock requests fail at once (`503`), gives the reports being built
//! `GRACE` to finish, then releases what is still held (those requests get `500`), so no lock of this
//! process is left behind for the other replicas to wait out.
//!
//! `POST /reports/{id}` builds report `id` under the lock `report:<id>`: while one request builds it, another
//! for the same id gets `409 Conflict` with a `Retry-After` estimated from the holder's record (`1` for this
//! 300 ms build, whatever the lease); a backend that is down gives `503`, a lock lost mid-build `500`. The
//! handler returns `LockError` as it is: distlock's feature `axum` makes it the response
//! (`LockError::http_status`, `LockError::retry_after`). The client reaches the handler through
//! `distlock::tower::ClientLayer`: `axum::serve` runs each connection in a task of its own, where a
//! `with_client` scope would not reach, so the test below can give the service its own client.
//!
//! `GET /metrics` shows distlock's metrics (feature `metrics`) in the Prometheus text format, through
//! `metrics-exporter-prometheus`'s recorder: `curl http://127.0.0.1:3000/metrics`.

use std::sync::OnceLock;
use std::time::Duration;

use axum::extract::Path;
use axum::routing::{get, post};
use axum::Router;
use distlock::tower::ClientLayer;
use distlock::{distributed_lock, Client, LockError};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// Builds one report; at most one request at a time per id, across every replica of the service.
#[distributed_lock(key = "report:<id>", ttl = "10s")]
async fn build_report(id: u64) -> Result<String, LockError> {
    tokio::time::sleep(Duration::from_millis(300)).await; // the work
    Ok(format!("report {id}\n"))
}

/// A busy lock answers 409 with a Retry-After, a store that is down or a stopping service 503, anything else
/// 500 (an application with errors of its own converts a `LockError` with `into_response()` in its own).
async fn post_report(Path(id): Path<u64>) -> Result<String, LockError> {
    build_report(id).await
}

/// The process's metrics recorder (the first call installs it), which `/metrics` renders.
fn metrics() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| PrometheusBuilder::new().install_recorder().expect("no other metrics recorder")).clone()
}

/// The service, with `client` in scope for every request.
fn app(client: Client) -> Router {
    let metrics = metrics();
    Router::new()
        .route("/reports/{id}", post(post_report))
        .route("/metrics", get(move || std::future::ready(metrics.render())))
        .layer(ClientLayer::new(client))
}

/// Sends `POST path` over a plain HTTP/1.1 connection; the status code and the `Retry-After` header, if any.
async fn send_post(address: std::net::SocketAddr, path: &str) -> std::io::Result<(u16, Option<String>)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    let request = format!("POST {path} HTTP/1.1\r\nHost: demo\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let status = response.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let retry_after =
        response.lines().find_map(|l| l.to_ascii_lowercase().strip_prefix("retry-after:").map(|v| v.trim().to_owned()));
    Ok((status, retry_after))
}

/// How long reports being built may take to finish once the service is stopping.
const GRACE: Duration = Duration::from_secs(10);

/// Serves `app` on `listener` until `stop` resolves, then shuts down gracefully: no new connections, no new
/// locks, bodies under way get `GRACE`; returns once every request is answered and every lock released.
async fn serve(
    listener: tokio::net::TcpListener,
    client: Client,
    stop: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let (stopping, stopping_seen) = tokio::sync::watch::channel(false);
    let server = axum::serve(listener, app(client.clone())).with_graceful_shutdown(async move {
        let _ = stopping_seen.clone().wait_for(|stopping| *stopping).await;
    });
    let server = tokio::spawn(std::future::IntoFuture::into_future(server));
    stop.await;
    stopping.send_replace(true);
    client.shutdown(GRACE).await;
    server.await.map_err(std::io::Error::other)?
}

/// Resolves on Ctrl-C or, on Unix, SIGTERM (what a container orchestrator sends before it kills).
async fn stop_signal() {
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut sigterm) => drop(sigterm.recv().await),
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
}

/// Serves on a free port and sends two requests for one report, the second while the first builds it.
async fn two_requests(client: Client) -> Result<[(u16, Option<String>); 2], Box<dyn std::error::Error>> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    tokio::spawn(std::future::IntoFuture::into_future(axum::serve(listener, app(client.clone()))));
    let first = tokio::spawn(async move { send_post(address, "/reports/7").await });
    // The second one once the first holds the lock (its body takes 300 ms).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while client.lock_info("report:7").await?.is_none() {
        if tokio::time::Instant::now() > deadline {
            return Err("the first request never took the lock".into());
        }
        tokio::task::yield_now().await;
    }
    let second = send_post(address, "/reports/7").await?;
    Ok([first.await??, second])
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = match std::env::var("REDIS_URL") {
        Ok(url) => Client::builder().redis(url).build().await?,
        Err(_) => Client::builder().memory().build().await?,
    };
    if std::env::args().any(|a| a == "--serve") {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
        println!("POST http://{}/reports/{{id}} (Ctrl-C or SIGTERM stops)", listener.local_addr()?);
        serve(listener, client, stop_signal()).await?;
        println!("stopped: every request answered, every lock released");
        return Ok(());
    }
    let [first, second] = two_requests(client).await?;
    println!("first request:  {} ", first.0);
    println!("second request: {} (Retry-After: {})", second.0, second.1.as_deref().unwrap_or("none"));
    if first.0 != 200 || second.0 != 409 {
        return Err("expected 200 for the first request and 409 for the second".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The body of `GET path`.
    async fn get_body(address: std::net::SocketAddr, path: &str) -> std::io::Result<String> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(address).await?;
        stream.write_all(format!("GET {path} HTTP/1.1\r\nHost: demo\r\nConnection: close\r\n\r\n").as_bytes()).await?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await?;
        Ok(response.split_once("\r\n\r\n").map_or(String::new(), |(_, body)| body.to_owned()))
    }

    /// Two requests for one report at once through `axum::serve`: one builds it, the other gets 409 with a
    /// Retry-After of one second (the build takes 300 ms; its 10 s lease is not the estimate); afterwards the
    /// report can be built again. No client is installed: the layer's is used.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_second_request_for_a_report_being_built_gets_409() {
        let client = Client::builder().memory().build().await.expect("client");
        let [first, second] = two_requests(client.clone()).await.expect("two requests");
        assert_eq!(first, (200, None));
        assert_eq!(second, (409, Some("1".to_owned())));
        // The report can be built again once the first request is done, and another is never blocked.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        tokio::spawn(std::future::IntoFuture::into_future(axum::serve(listener, app(client))));
        assert_eq!(send_post(address, "/reports/7").await.expect("third").0, 200);
        assert_eq!(send_post(address, "/reports/8").await.expect("another").0, 200);
        // The lock's metrics, in the Prometheus text format: at least this test's three grants and its refused
        // request (the recorder is the process's, and the other test of this binary takes locks too).
        let metrics = get_body(address, "/metrics").await.expect("GET /metrics");
        let count = |outcome: &str| -> u64 {
            let prefix = format!("distlock_acquire_total{{outcome=\"{outcome}\"}} ");
            metrics.lines().find_map(|l| l.strip_prefix(&prefix)).and_then(|n| n.trim().parse().ok()).unwrap_or(0)
        };
        assert!(count("acquired") >= 3, "{metrics}");
        assert!(count("not_obtained") >= 1, "{metrics}");
        assert!(metrics.contains("distlock_hold_seconds"), "{metrics}");
    }

    /// Stopping `serve` (as Ctrl-C or SIGTERM would) while a report is being built: that request still gets
    /// its 200 within the grace period, `serve` returns, the lock is free and the client takes no new locks.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stop_lets_the_request_in_flight_finish_and_releases_everything() {
        const HELD: Duration = Duration::from_millis(100);
        let client = Client::builder().memory().build().await.expect("client");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, client.clone(), async move { drop(stopped.await) }));
        let in_flight = tokio::spawn(async move { send_post(address, "/reports/7").await });
        // The store shows the lock as soon as it granted it, a moment before the request's acquisition returns
        // and its body starts; a shutdown in that moment gives the grant back (503), as for a waiter. So wait
        // until the lock has been held a third of the body's 300 ms: the body is running by then.
        while client.lock_info("report:7").await.expect("lock_info").is_none_or(|info| info.held_for < HELD) {
            tokio::task::yield_now().await;
        }
        stop.send(()).expect("serve is waiting");
        assert_eq!(in_flight.await.expect("task").expect("response").0, 200);
        tokio::time::timeout(GRACE, server).await.expect("serve returns").expect("task").expect("serve");
        assert!(client.lock_info("report:7").await.expect("lock_info").is_none());
        assert!(matches!(client.lock("report:7").acquire().await, Err(LockError::ShuttingDown)));
    }
}
