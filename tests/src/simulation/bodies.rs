//! Lock bodies of issue 32's workload: `run` with bodies that check S5 at every step, look at and extend their
//! lock, nest requests (reentrant, for another key, or for several of which some are held), race an extend
//! against the release at their end, or let their guard escape.

use std::time::Duration;

use distlock::{LockError, LockGuard, OnLost};
use tokio::time::{sleep, Instant};

use super::workload::{Body, Chain, Opts, User, MAX_DEPTH, MAX_LEASE};

impl User {
    /// `run` on `keys` with a body of random length that looks at its lock, extends it and nests requests.
    pub(super) async fn run(&self, keys: Vec<String>, name: &str) {
        let (sim, c) = (&self.sim, self.c);
        let (request, opts) = self.request(&keys, false);
        let body = self.body(name.to_owned(), &keys, opts, &[], 0, false);
        let (tokens, running) = sim.track(request.run(body));
        let within = opts.wait + 2 * opts.ttl + Duration::from_millis(100);
        let outcome = self.maybe_cancelled(0.2, within, running).await;
        sim.trace(|| format!("c{c} {name}: run ended with {:?}", outcome.as_ref().map(|o| o.as_ref().map(|_| ()))));
        sim.run_ended(c, name, &keys, &tokens, matches!(outcome, Some(Err(LockError::Lost { .. }))));
        // A body may have extended its lease up to MAX_LEASE.
        self.left(&keys, tokens.get(), outcome.is_none().then_some(MAX_LEASE));
    }

    /// `run` with a body that returns its `current_lock()` guard, which the task then keeps: it must read lost,
    /// fail to extend (sending nothing) and release as `Nested`.
    pub(super) async fn escape(&self, keys: Vec<String>, name: &str) {
        let (sim, c) = (&self.sim, self.c);
        let (request, opts) = self.request(&keys, false);
        let body = self.body(name.to_owned(), &keys, opts, &[], 0, true);
        let (tokens, running) = sim.track(request.run(body));
        let outcome = running.await;
        sim.run_ended(c, name, &keys, &tokens, matches!(outcome, Err(LockError::Lost { .. })));
        self.left(&keys, tokens.get(), None);
        let Ok(Some(escaped)) = outcome else { return };
        let name = format!("{name} (escaped)");
        for _ in 0..sim.below(4) {
            sleep(sim.millis(1, 100)).await;
            if sim.look(c, &escaped, &name) {
                sim.violation(format!("c{c} {name}: a guard kept after its lock body ended reads valid"));
            }
        }
        if sim.chance(0.5) {
            let extended = escaped.extend(opts.ttl).await;
            if !matches!(extended, Err(LockError::Lost { .. })) {
                sim.violation(format!("c{c} {name}: extend of a guard kept after its body ended: {extended:?}"));
            }
        }
        self.release(escaped, &name).await;
    }

    /// A lock body for the request of `keys`, inside the bodies of `outer`: checks at its start and at every
    /// step that it runs with its grants (S5), looks at its lock every few milliseconds for up to two ttls (past
    /// its `max_hold` now and then), sometimes extends it or makes a nested request, may spawn an extend racing
    /// the release at its end; with `escape`, returns its guard.
    pub(super) fn body<'a>(
        &'a self,
        name: String,
        keys: &'a [String],
        opts: Opts,
        outer: &'a Chain<'a>,
        depth: u32,
        escape: bool,
    ) -> Body<'a> {
        Box::pin(async move {
            let (sim, c) = (&self.sim, self.c);
            let Some(lock) = distlock::current_lock() else {
                sim.violation(format!("c{c} {name}: a lock body ran without current_lock()"));
                return None;
            };
            let mut chain: Vec<(&LockGuard, &[String], OnLost)> = outer.to_vec();
            chain.push((&lock, keys, opts.on_lost));
            sim.in_body(c, &chain, &name, true);
            sim.watch_guard(c, &lock, &name, opts.max_hold, opts.ttl);
            let until = self.until(opts);
            while Instant::now() < until {
                sleep(sim.millis(1, 50)).await;
                sim.in_body(c, &chain, &name, false);
                if !sim.look(c, &lock, &name) {
                    // OnLost::Continue lets a body go on past its loss; a request it makes then for a key it
                    // holds must fail with Lost, never run a body on the lost grant (Correctness II, schedule 1).
                    if opts.on_lost == OnLost::Continue && depth < MAX_DEPTH && sim.chance(0.5) {
                        self.nested(&chain, &name, depth + 1).await;
                    }
                    break;
                }
                if sim.chance(0.05) {
                    self.extend(&lock, opts.ttl, &name).await;
                }
                if depth < MAX_DEPTH && sim.chance(0.05) {
                    self.nested(&chain, &name, depth + 1).await;
                }
            }
            drop(chain);
            if sim.chance(0.1) {
                self.race_extend(&name);
            }
            escape.then_some(lock)
        })
    }

    /// At a body's end: an extend through another `current_lock()` guard, spawned so that it races the
    /// release that follows.
    pub(super) fn race_extend(&self, name: &str) {
        let Some(lock) = distlock::current_lock() else { return };
        let (sim, c, name) = (self.sim.clone(), self.c, format!("{name} (racing extend)"));
        let (delay, to) = (sim.millis(0, 3), sim.millis(100, 3000));
        self.sim.clone().spawn(c, async move {
            sleep(delay).await;
            let outcome = lock.extend(to).await;
            sim.extended(&lock, to);
            sim.trace(|| format!("c{c} {name}: extend to {to:?}: {outcome:?}"));
        });
    }

    /// A request made inside a lock body holding `held`, whose chain is `chain`: the same key again (reentrant
    /// `acquire`, `try_acquire` or `run`), another key (`run` or `acquire`), or several keys of which one is
    /// held.
    pub(super) async fn nested(&self, chain: &Chain<'_>, name: &str, depth: u32) {
        let (sim, c) = (&self.sim, self.c);
        let Some((innermost, ..)) = chain.last() else { return };
        let own: Vec<&str> = innermost.keys().collect();
        let key = own[sim.below(own.len() as u64) as usize].to_owned();
        // A key no body around holds.
        let held = |k: &String| chain.iter().any(|(guard, ..)| guard.keys().any(|h| h == k));
        let other = (0..self.keys).map(|k| format!("k{k}")).find(|k| !held(k) && sim.chance(0.7));
        let name = format!("{name}/{depth}");
        match (sim.below(6), other) {
            (1..=2, _) => {
                // A reentrant run, watched under its own on_lost.
                let (request, mut opts) = self.request(std::slice::from_ref(&key), false);
                opts.max_hold = None;
                let keys = [key];
                let (tokens, running) =
                    sim.track(request.run(self.body(name.clone(), &keys, opts, chain, depth, false)));
                let outcome = running.await;
                sim.run_ended(c, &name, &keys, &tokens, matches!(outcome, Err(LockError::Lost { .. })));
                sim.trace(|| format!("c{c} {name}: reentrant run ended with {:?}", outcome.map(|_| ())));
            }
            (0, _) | (_, None) => {
                // Reentrant: shares the outer grant, asks the store nothing, releases as Nested.
                let request = self.client.lock(key.clone());
                let outcome =
                    if sim.chance(0.5) { request.acquire().await.map(Some) } else { request.try_acquire().await };
                sim.trace(|| format!("c{c} {name}: reentrant request for {key}: {:?}", outcome.as_ref().map(|_| ())));
                if let Ok(Some(guard)) = outcome {
                    // A guard handed out holds its grant, as a body starting does (no guard on a lost grant).
                    sim.in_body(c, &[(&guard, std::slice::from_ref(&key), OnLost::Abort)], &name, true);
                    sim.look(c, &guard, &name);
                    self.release(guard, &name).await;
                }
            }
            (3, Some(other)) => {
                let (request, opts) = self.request(std::slice::from_ref(&other), false);
                let wait = opts.wait.min(Duration::from_millis(300));
                let keys = [other.clone()];
                let body = self.body(name.clone(), &keys, opts, chain, depth, false);
                let started = Instant::now();
                let (tokens, running) = sim.track(request.wait(wait).run(body));
                let outcome = running.await;
                if let Err(e) = &outcome {
                    sim.check_gave_up(c, started, (wait, opts.retry), e, &name);
                }
                sim.run_ended(c, &name, &keys, &tokens, matches!(outcome, Err(LockError::Lost { .. })));
                sim.trace(|| format!("c{c} {name}: run of {other} ended with {:?}", outcome.map(|_| ())));
                self.left(&[other], tokens.get(), None);
            }
            (_, Some(other)) => {
                // Another key alone, or with a held one: a guard that owns one key and shares the other.
                let keys = if sim.chance(0.5) { vec![other] } else { vec![key, other] };
                let (request, opts) = self.request(&keys, false);
                let wait = opts.wait.min(Duration::from_millis(300));
                let started = Instant::now();
                let (tokens, acquiring) = sim.track(request.wait(wait).acquire());
                let outcome = acquiring.await;
                sim.check_wait_keys(c, started, wait, &keys, &name);
                if let Err(e) = &outcome {
                    sim.check_gave_up(c, started, (wait, opts.retry), e, &name);
                }
                match outcome {
                    Ok(guard) => {
                        sim.in_body(c, &[(&guard, &keys[..], OnLost::Abort)], &name, true);
                        sim.watch_guard(c, &guard, &name, opts.max_hold, opts.ttl);
                        for _ in 0..sim.below(4) {
                            sleep(sim.millis(1, 50)).await;
                            if !sim.look(c, &guard, &name) {
                                break;
                            }
                        }
                        self.release(guard, &name).await;
                    }
                    Err(e) => sim.trace(|| format!("c{c} {name}: nested acquire of {keys:?} failed: {e:?}")),
                }
                self.left(&keys, tokens.get(), None);
            }
        }
    }
}
