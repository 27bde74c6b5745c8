//! Stalls that stop a client's own code: every task of a simulated client — the workload's tasks, and the
//! engine's tasks they spawn (renewer, background releases, coalescer drains) — carries its client's number,
//! and is not polled while that client is stalled (or ever again once it crashed), as a process stopped by
//! SIGSTOP or a long GC pause runs nothing. Its timers fire late, when it runs again.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::time::{Instant, Sleep};

use super::current;

tokio::task_local! {
    /// The client whose task is being polled.
    static CLIENT: usize;
}

/// `task`, owned by the client of the task that spawns it (if any): see the module.
pub(crate) fn owned<F: Future>(task: F) -> impl Future<Output = F::Output> {
    let client = CLIENT.try_with(|c| *c).ok();
    Owned { client, task: Box::pin(task), sleep: None }
}

/// `task` as a task of client `client`.
pub(super) fn of_client<F: Future>(client: usize, task: F) -> impl Future<Output = F::Output> {
    Owned { client: Some(client), task: Box::pin(task), sleep: None }
}

struct Owned<F: Future> {
    client: Option<usize>,
    task: Pin<Box<F>>,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl<F: Future> Future for Owned<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let Some(client) = self.client else { return self.task.as_mut().poll(cx) };
        if let Some(world) = current() {
            let frozen = world.state().frozen_until[client];
            match frozen {
                Some(until) if until <= Instant::now() => self.sleep = None,
                Some(until) => {
                    let sleep = self.sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(until)));
                    sleep.as_mut().reset(until);
                    if sleep.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    self.sleep = None;
                }
                None => return Poll::Pending,
            }
        }
        let task = self.task.as_mut();
        CLIENT.sync_scope(client, || task.poll(cx))
    }
}
