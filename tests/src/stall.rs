//! [`StallableRuntime`]: a current-thread tokio runtime on a thread of its own, which a test can freeze on
//! demand, as a GC pause, a swapped-out process or a long blocking call freezes a real client: its tasks,
//! timers, connections and watchdog all stop together, while the test, the server and other clients go on.

use std::future::Future;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// A stall request: block the runtime's thread until this instant; `started` hears when it begins.
struct Stall {
    until: Instant,
    started: oneshot::Sender<()>,
}

/// A current-thread runtime driven by a thread of its own. Futures [`spawn`](Self::spawn)ed on it run
/// there; [`stall`](Self::stall) blocks that thread with `std::thread::sleep`. Dropping it ends the thread
/// (after any stall under way) and drops the tasks still running on it.
#[derive(Debug)]
pub struct StallableRuntime {
    handle: tokio::runtime::Handle,
    stalls: Option<mpsc::UnboundedSender<Stall>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StallableRuntime {
    /// Starts the thread (named `name`) and its runtime.
    pub fn start(name: &str) -> Self {
        let (stalls, mut requests) = mpsc::unbounded_channel::<Stall>();
        let (handle_tx, handle_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
                handle_tx.send(runtime.handle().clone()).expect("handle");
                runtime.block_on(async move {
                    while let Some(Stall { until, started }) = requests.recv().await {
                        let _ = started.send(());
                        // Nothing else runs on this thread until it is over: no task, no timer, no I/O.
                        std::thread::sleep(until.saturating_duration_since(Instant::now()));
                    }
                });
            })
            .unwrap_or_else(|e| panic!("cannot start thread {name}: {e}"));
        let handle = handle_rx.recv().expect("the runtime thread started");
        Self { handle, stalls: Some(stalls), thread: Some(thread) }
    }

    /// The runtime's handle.
    pub fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }

    /// Runs `future` on this runtime; await the handle from any runtime.
    pub fn spawn<F>(&self, future: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.handle.spawn(future)
    }

    /// Blocks the runtime's thread until `until`; returns once the block has begun (the runtime is between
    /// two task polls: no task of it runs again before `until`).
    pub async fn stall_until(&self, until: Instant) {
        let (started, begun) = oneshot::channel();
        self.stalls.as_ref().expect("running").send(Stall { until, started }).expect("the runtime thread is alive");
        begun.await.expect("the stall began");
    }

    /// Blocks the runtime's thread for `duration` from now (see [`stall_until`](Self::stall_until)); returns
    /// when the stall will end.
    pub async fn stall(&self, duration: Duration) -> Instant {
        let until = Instant::now() + duration;
        self.stall_until(until).await;
        until
    }
}

impl Drop for StallableRuntime {
    fn drop(&mut self) {
        self.stalls = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
