//! The workload of issue 19, kept as it was: the regression seeds in `tests/tests/simulation.rs` replay the
//! schedules it was found in, which any change to it would draw differently.
//!
//! One schedule: three simulated clients (processes) with one to three tasks each lock one or two keys,
//! doing what users do — `acquire` and `try_acquire` with varied ttls, waits and retry strategies, holding
//! and looking at `is_lost()`, `extend` to longer and shorter leases, `release` or drop, `run` with bodies of
//! varied length under either `OnLost`, a body that lets its `current_lock()` guard escape, and cancellation
//! of any of these at a random moment — while a nemesis stalls clients, pauses the store and crashes a
//! client, and the store's fault layer slows, loses and reorders what it carries as the seed says.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use distlock::simulation::Sim;
use distlock::{Client, LockGuard, LockRequest, OnLost, RetryStrategy};
use tokio::task::AbortHandle;
use tokio::time::{sleep, Instant};

/// The longest lease a workload may set (ttls up to 1 s, extends up to 3 s): a crashed client's locks are
/// free by then.
const MAX_LEASE: Duration = Duration::from_secs(3);

/// One schedule's workload: the clients' tasks and the nemesis; every task must end, none may panic.
pub(super) async fn workload(sim: Sim) {
    let clients = sim.config().clients;
    let keys = if sim.chance(0.7) { 1 } else { 2 };
    let aborts: Arc<Mutex<Vec<Vec<AbortHandle>>>> = Arc::new(Mutex::new(vec![Vec::new(); clients]));
    let mut tasks = Vec::new();
    for c in 0..clients {
        let client = sim.client(c);
        for t in 0..1 + sim.below(3) {
            let task = sim.spawn(c, user(sim.clone(), client.clone(), c, format!("c{c}t{t}"), keys));
            aborts.lock().unwrap_or_else(PoisonError::into_inner)[c].push(task.abort_handle());
            tasks.push(task);
        }
    }
    let nemesis = tokio::spawn(nemesis(sim.clone(), Arc::clone(&aborts)));
    super::join_users(&sim, tasks).await;
    nemesis.abort();
}

/// Stalls clients, pauses the store, and now and then crashes a client.
async fn nemesis(sim: Sim, aborts: Arc<Mutex<Vec<Vec<AbortHandle>>>>) {
    let clients = sim.config().clients as u64;
    for _ in 0..sim.below(7) {
        sleep(sim.millis(0, 800)).await;
        let c = sim.below(clients) as usize;
        let servers = sim.model().servers() as u64;
        if servers > 0 && sim.chance(0.4) {
            super::workload::server_fault(&sim, servers);
            continue;
        }
        match sim.below(20) {
            0..=11 => sim.stall(c, sim.millis(20, 700)),
            12..=18 => sim.pause_store(sim.millis(20, 600)),
            _ => {
                sim.crash(c, MAX_LEASE);
                aborts.lock().unwrap_or_else(PoisonError::into_inner)[c].iter().for_each(AbortHandle::abort);
            }
        }
    }
}

/// One user task: a few lock operations with pauses in between.
async fn user(sim: Sim, client: Client, c: usize, name: String, keys: u64) {
    for i in 0..2 + sim.below(4) {
        sleep(sim.millis(0, 100)).await;
        let key = format!("k{}", sim.below(keys));
        let name = format!("{name}.{i}");
        match sim.below(10) {
            0..=4 => hold(&sim, &client, c, &key, &name, false).await,
            5 => hold(&sim, &client, c, &key, &name, true).await,
            6..=8 => run(&sim, &client, c, &key, &name).await,
            _ => escape(&sim, &client, c, &key, &name).await,
        }
    }
}

/// A request with a random ttl, wait and retry strategy; its ttl and wait.
fn request(sim: &Sim, client: &Client, key: &str, try_only: bool) -> (LockRequest, Duration, Duration) {
    let ttl = sim.millis(100, 1000);
    let wait = match sim.below(4) {
        _ if try_only => Duration::ZERO,
        0 => Duration::ZERO,
        1 => sim.millis(10, 300),
        _ => sim.millis(300, 3000),
    };
    let retry = match sim.below(3) {
        0 => RetryStrategy::default(),
        1 => RetryStrategy::Linear { step: sim.millis(5, 100) },
        _ => RetryStrategy::Exponential { base: sim.millis(5, 50), max: sim.millis(100, 1000) },
    };
    (client.lock(key).ttl(ttl).wait(wait).retry(retry), ttl, wait)
}

/// Runs `op`, cancelled at a random moment in a fifth of the cases; `None` when cancelled.
async fn maybe_cancelled<F: std::future::Future>(sim: &Sim, within: Duration, op: F) -> Option<F::Output> {
    if !sim.chance(0.2) {
        return Some(op.await);
    }
    let at = sim.millis(0, within.as_millis() as u64);
    tokio::select! {
        biased;
        out = op => Some(out),
        () = sleep(at) => None,
    }
}

/// `acquire` (or `try_acquire`), then hold the lock for a while looking at it and extending it, then release
/// or drop it.
async fn hold(sim: &Sim, client: &Client, c: usize, key: &str, name: &str, try_only: bool) {
    let (request, ttl, wait) = request(sim, client, key, try_only);
    let started = Instant::now();
    let (tokens, acquiring) = sim.track(async move {
        if try_only {
            request.try_acquire().await
        } else {
            request.acquire().await.map(Some)
        }
    });
    let Some(outcome) = maybe_cancelled(sim, wait + Duration::from_millis(100), acquiring).await else {
        sim.trace(|| format!("c{c} {name}: acquire cancelled"));
        return sim.gone(c, key, tokens.get());
    };
    sim.check_wait(c, started, wait, name);
    let guard = match outcome {
        Ok(Some(guard)) => guard,
        other => {
            sim.trace(|| format!("c{c} {name}: acquire ended with {other:?}"));
            return sim.gone(c, key, tokens.get());
        }
    };
    sim.watch(c, &guard, name);
    let until = Instant::now() + sim.millis(0, 2 * ttl.as_millis() as u64);
    while Instant::now() < until {
        sleep(sim.millis(1, 50)).await;
        if !sim.observe(c, &guard, name) {
            break;
        }
        if sim.chance(0.15) {
            extend(sim, c, &guard, ttl, name).await;
        }
    }
    match sim.below(3) {
        0 => drop(guard),
        1 => {
            // Issue 32's oracle checks the outcome here too (issue 19's workload only traced it): the models with
            // simulated servers run this workload, and their resends are where a wrong outcome comes from.
            let releasing = sim.releasing(&guard);
            let outcome = guard.release().await;
            sim.released(c, releasing, &outcome, name);
        }
        _ => {
            let outcome = maybe_cancelled(sim, Duration::from_millis(5), guard.release()).await;
            sim.trace(|| format!("c{c} {name}: release (maybe cancelled): {outcome:?}"));
        }
    }
    sim.gone(c, key, tokens.get());
}

/// `extend` to a longer or a shorter lease, maybe cancelled.
async fn extend(sim: &Sim, c: usize, guard: &LockGuard, ttl: Duration, name: &str) {
    let to = if sim.chance(0.5) {
        sim.millis(ttl.as_millis() as u64, 3000)
    } else {
        sim.millis(100, ttl.as_millis() as u64)
    };
    sim.trace(|| format!("c{c} {name}: extend to {to:?}"));
    let outcome = maybe_cancelled(sim, Duration::from_millis(20), guard.extend(to)).await;
    sim.trace(|| format!("c{c} {name}: extend to {to:?}: {outcome:?}"));
}

/// `run` with a body of random length that looks at its lock and sometimes extends it.
async fn run(sim: &Sim, client: &Client, c: usize, key: &str, name: &str) {
    let (request, ttl, wait) = request(sim, client, key, false);
    let on_lost = if sim.chance(0.5) { OnLost::Abort } else { OnLost::Continue };
    let body = body(sim.clone(), c, name.to_owned(), ttl, false);
    let (tokens, running) = sim.track(request.on_lost(on_lost).run(body));
    let within = wait + 2 * ttl + Duration::from_millis(100);
    let outcome = maybe_cancelled(sim, within, running).await;
    sim.trace(|| format!("c{c} {name}: run ended with {:?}", outcome.as_ref().map(|o| o.as_ref().map(|_| ()))));
    let lost = matches!(outcome, Some(Err(distlock::LockError::Lost { .. })));
    sim.run_ended(c, name, &[key.to_owned()], &tokens, lost);
    sim.gone(c, key, tokens.get());
}

/// `run` with a body that returns its `current_lock()` guard, which the task then keeps looking at.
async fn escape(sim: &Sim, client: &Client, c: usize, key: &str, name: &str) {
    let (request, ttl, _) = request(sim, client, key, false);
    let body = body(sim.clone(), c, name.to_owned(), ttl, true);
    let (tokens, running) = sim.track(request.run(body));
    let outcome = running.await;
    sim.gone(c, key, tokens.get());
    if let Ok(Some(escaped)) = outcome {
        let name = format!("{name} (escaped)");
        sim.watch(c, &escaped, &name);
        for _ in 0..sim.below(5) {
            sleep(sim.millis(1, 100)).await;
            sim.observe(c, &escaped, &name);
        }
    }
}

/// A lock body: looks at its lock every few milliseconds for a random time (up to two ttls), sometimes
/// extends it; with `escape`, returns its guard.
async fn body(sim: Sim, c: usize, name: String, ttl: Duration, escape: bool) -> Option<LockGuard> {
    let Some(lock) = distlock::current_lock() else {
        sim.violation(format!("c{c} {name}: a lock body ran without current_lock()"));
        return None;
    };
    sim.watch(c, &lock, &name);
    let until = Instant::now() + sim.millis(0, 2 * ttl.as_millis() as u64);
    while Instant::now() < until {
        sleep(sim.millis(1, 50)).await;
        if !sim.observe(c, &lock, &name) {
            break;
        }
        if sim.chance(0.05) {
            extend(&sim, c, &lock, ttl, &name).await;
        }
    }
    escape.then_some(lock)
}
