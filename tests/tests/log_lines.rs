//! Issue 34: what a lock prints through `tracing-subscriber`'s `fmt` with distlock at DEBUG (what
//! `RUST_LOG=distlock=debug` with its `EnvFilter` selects; here a `Targets` filter, the same selection) and the
//! span's close events turned on: the lines the README shows. The call window's probe is at TRACE, not among
//! them. This binary installs the one global subscriber it needs; its output is printed with `--nocapture`.

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use distlock::Client;
use distlock_tests::time::secs;
use distlock_tests::RedisServer;
use tracing::Level;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::Layer;

/// Where the formatted lines go.
#[derive(Clone, Default)]
struct Output(Arc<Mutex<Vec<u8>>>);

impl Write for Output {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Output {
    fn lines(&self) -> Vec<String> {
        let bytes = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&bytes).lines().map(str::to_owned).collect()
    }
}

/// Installs, once, `fmt` without colours and with span close events, distlock at DEBUG and the call window's
/// module at TRACE (to see where its probe went).
fn output() -> Output {
    static OUTPUT: OnceLock<Output> = OnceLock::new();
    OUTPUT
        .get_or_init(|| {
            let output = Output::default();
            let writer = output.clone();
            let filter = Targets::new()
                .with_target("distlock", Level::DEBUG)
                .with_target("distlock::backend::redis::window", Level::TRACE);
            let layer = tracing_subscriber::fmt::layer()
                .with_writer(move || writer.clone())
                .with_ansi(false)
                .with_span_events(FmtSpan::CLOSE)
                .with_filter(filter);
            tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
                .expect("the only global subscriber of this binary");
            output
        })
        .clone()
}

/// One lock taken and released on a real redis-server: a grant line and a release line inside the lock's span,
/// then the span's close line with its outcome and time; later calls bring the call window's probe, which
/// prints at TRACE only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_prints_its_grant_release_and_close_lines() {
    let output = output();
    let server = RedisServer::new();
    let client = Client::builder().redis(server.url()).owner("web-1").build().await.expect("client");
    let fence = client
        .lock("report:42")
        .ttl(secs(10))
        .run(async { distlock::current_lock().expect("held").fencing_token() })
        .await
        .expect("the body ran");
    // The window probes its base round trip every 200 shortest round trips, at the next call back: calls some
    // time apart until one brings it. The first calls' round trips (the scripts loaded on a fresh server) can
    // put the first probe half a second or more away.
    let probed = || output.lines().iter().any(|l| l.contains("probes its base"));
    for _ in 0..100 {
        if probed() {
            break;
        }
        tokio::time::sleep(distlock_tests::time::ms(100)).await;
        client.lock("busy:loop").run(async {}).await.expect("a cycle");
    }

    let lines = output.lines();
    let of_lock: Vec<&String> = lines.iter().filter(|l| l.contains("report:42")).collect();
    println!("{}", of_lock.iter().map(|l| l.as_str()).collect::<Vec<_>>().join("\n"));
    let one = |what: &str, needles: &[&str]| {
        let found: Vec<&&String> = of_lock.iter().filter(|l| needles.iter().all(|n| l.contains(n))).collect();
        assert_eq!(found.len(), 1, "one {what} line: {of_lock:#?}");
        found[0].to_string()
    };
    let span = "lock{key=\"report:42\"";
    let granted = one("grant", &["DEBUG", span, "}: distlock: lock granted "]);
    for field in ["key=report:42", "owner=web-1", &format!("fencing_token={fence}"), "waited_ms="] {
        assert!(granted.contains(field), "{field} in {granted}");
    }
    let released = one("release", &["DEBUG", span, "}: distlock: lock released "]);
    for field in ["owner=web-1", &format!("fencing_token={fence}"), "held_ms=", "outcome=Released"] {
        assert!(released.contains(field), "{field} in {released}");
    }
    let closed = one("close", &["DEBUG", span, "}: distlock: close "]);
    for field in ["outcome=\"held\"", "time.busy=", "time.idle="] {
        assert!(closed.contains(field), "{field} in {closed}");
    }

    let probes: Vec<&String> = lines.iter().filter(|l| l.contains("probes its base")).collect();
    assert!(!probes.is_empty(), "no probe in {} lines", lines.len());
    assert!(probes.iter().all(|l| l.contains("TRACE")), "a probe above TRACE: {probes:#?}");
}
