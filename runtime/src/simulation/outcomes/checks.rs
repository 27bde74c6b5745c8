//! What the workload tells the oracle as it learns things (a guard taken, a body step, a release's outcome,
//! a cancellation, a shutdown), and the rule of outcomes.rs each of them checks there.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::super::{short, Model, Sim, Tokens, World, PREFIX};
use super::{Capped, Found, Releasing};
use crate::backend::LockKeys;
use crate::grant::Grant;
use crate::{LockError, LockGuard, OnLost, ReleaseOutcome};

impl Sim {
    /// Watches every key of `guard` at every step from now on, as [`Sim::watch`] watches one (a grant
    /// watched already, through another guard of it, is not added twice: two guards sharing a grant are one
    /// holder). With `max_hold`, [`Sim::look`] also checks that it reads lost once that is over.
    pub fn watch_guard(&self, client: usize, guard: &LockGuard, name: &str, max_hold: Option<Duration>, ttl: Duration) {
        let world = &self.0;
        world.trace(|| {
            format!("c{client} {name}: holds {:?} fences {:?}", guard.keys().collect::<Vec<_>>(), fences(guard))
        });
        let grants = guard.grants();
        world.check_accessors(client, guard, &grants, name);
        // The cap is on the keys this guard took itself, not on those it shares with the body around it.
        let owned: Vec<Weak<Grant>> =
            grants.iter().filter(|grant| !guard.is_nested() && !held(grant)).map(Arc::downgrade).collect();
        let mut state = world.state();
        state.bodies.insert(name.to_owned(), grants.iter().map(Arc::downgrade).collect());
        for grant in &grants {
            if !state.probes.iter().any(|(probe, ..)| probe.as_ptr() == Arc::as_ptr(grant)) {
                state.probes.push((Arc::downgrade(grant), client, name.into()));
            }
        }
        if let (Some(max_hold), false) = (max_hold, owned.is_empty()) {
            let capped = Capped { grants: owned, from: Instant::now(), max_hold, longest: ttl, extended: None };
            state.truth.capped.push(capped);
        }
        drop(state);
        world.check("watch");
    }

    /// An extend of `guard` to `ttl` ended (done, failed or cancelled): for `max_hold`, the lease it may
    /// have set.
    pub fn extended(&self, guard: &LockGuard, ttl: Duration) {
        let grants = guard.grants();
        let now = Instant::now();
        let mut state = self.0.state();
        for capped in state.truth.capped.iter_mut().filter(|c| shares(&c.grants, &grants)) {
            capped.longest = capped.longest.max(ttl);
            capped.extended = Some(now);
        }
    }

    /// The workload looked at `guard` (`is_lost()`), as a holder does before acting under the lock; every key
    /// is checked, as [`Sim::observe`] checks one, and a guard past its `max_hold` must read lost.
    pub fn look(&self, client: usize, guard: &LockGuard, name: &str) -> bool {
        let world = &self.0;
        let lost = guard.is_lost();
        world.trace(|| format!("c{client} {name}: observed {}", if lost { "lost" } else { "valid" }));
        let now = Instant::now();
        let grace_end = world.state().truth.shutting_down.get(&client).copied();
        let shutting_down = grace_end.is_some();
        for grant in guard.grants() {
            world.check_lost_is_final(&grant, grant.is_lost(), client, name);
            if !grant.is_lost() {
                world.check_grant(&grant, client, &name);
            } else if !shutting_down && grant.max_hold_until.is_none_or(|cap| cap > now) {
                // Lost by design past max_hold (renewals stopped) and at the end of a shutdown's grace.
                world.check_needless_loss(&grant, client, name);
            }
        }
        // Once a shutdown's grace is over, every lock of the client is lost (the same tick may see it first).
        // A client stalled since the grace began ran none of its shutdown: its guards learn of it when it runs.
        let stalled =
            |end: Instant| world.stalled_between(client, end.checked_sub(Duration::from_secs(60)).unwrap_or(end), now);
        if let Some(end) = grace_end.filter(|&end| !lost && now > end + Duration::from_millis(1) && !stalled(end)) {
            let over = now - end;
            world.violation(format!(
                "c{client} {name}: guard reads valid {over:?} after its client's shutdown grace ended"
            ));
        }
        // Each capped grant of this guard's (its own, or one it shares with the body around it).
        let grants = guard.grants();
        let state = world.state();
        let over: Vec<(String, Duration)> = state
            .truth
            .capped
            .iter()
            .filter(|c| shares(&c.grants, &grants))
            .flat_map(|c| {
                let bound = (c.from + c.max_hold).max(c.extended.unwrap_or(c.from)) + c.longest;
                c.grants.iter().filter_map(Weak::upgrade).filter_map(move |grant| {
                    (now >= bound && !grant.is_lost()).then(|| (grant.keys.name.clone(), now - bound))
                })
            })
            .collect();
        drop(state);
        for (key, over) in over {
            world.violation(format!(
                "c{client} {name}: grant of {key} reads valid {over:?} after its max_hold and longest lease were over"
            ));
        }
        world.check("observation");
        !lost
    }

    /// A `run` of `keys` (tracked as `tokens`, its lock body named `name`) returned, with `Err(Lost)` when
    /// `lost`: its lock must have been lost, the store no longer holding the grant or a fault having kept its
    /// renewals away, as when a guard reads lost ([`Sim::look`]). A body that watched its guard
    /// ([`Sim::watch_guard`]) is judged by its grants (checked as `run` returns: the guard's release has only
    /// been spawned, so they are not finished yet); one that never started, by what the store holds for the
    /// request's tokens.
    pub fn run_ended(&self, client: usize, name: &str, keys: &[String], tokens: &Tokens, lost: bool) {
        let world = &self.0;
        let watched = world.state().bodies.remove(name);
        if !lost || world.state().truth.shutting_down.contains_key(&client) {
            return;
        }
        // Names repeat (nested requests at one depth): grants of a request over before this one are not its.
        let finished = |grant: &Arc<Grant>| world.state().finished.contains(grant.token.as_str());
        let watched = watched.unwrap_or_default();
        let alive: Vec<Arc<Grant>> = watched.iter().filter_map(Weak::upgrade).collect();
        if alive.len() < watched.len() {
            // The guard's drop let go of a grant without spawning its release: the store said it was gone.
            return;
        }
        let grants: Vec<Arc<Grant>> = alive.into_iter().filter(|grant| !finished(grant)).collect();
        if !grants.is_empty() {
            if grants.iter().all(|grant| !grant.is_lost()) {
                world.violation(format!(
                    "c{client} {name}: run returned Lost while every grant of its guard reads valid"
                ));
                return;
            }
            let now = Instant::now();
            for grant in grants.iter().filter(|grant| grant.is_lost()) {
                if grant.max_hold_until.is_none_or(|cap| cap > now) {
                    world.check_needless_loss(grant, client, name);
                }
            }
            return;
        }
        world.check_lost_before_body(client, name, keys, tokens);
    }

    /// Whether a `force_unlock` deleted one of `guard`'s grants. For the liveness hold: a `force_unlock` sent
    /// before calm by a client that then crashed can still land after it (redis seed 675, a leg of 81 ms).
    pub fn force_unlocked(&self, guard: &LockGuard) -> bool {
        guard.grants().iter().any(|grant| self.0.excused(grant.token.as_str()))
    }

    /// A lock body runs (a step, or its start): S5, the store holds its grant. `chain` is each body around this
    /// one and this one, innermost last: its `current_lock()` guard, the keys its request named (a reentrant
    /// request's body sees the grants of the body around it, and is watched for the loss of its own keys only)
    /// and its `on_lost`. A body is dropped when a grant it runs under `Abort` is lost, so every such grant
    /// must be held at every step; under `Continue` a body runs on after a loss by design, and only its start
    /// needs its own grants (the body never starts without them).
    pub fn in_body(&self, client: usize, chain: &[(&LockGuard, &[String], OnLost)], name: &str, starting: bool) {
        let world = &self.0;
        for (level, (guard, keys, on_lost)) in chain.iter().enumerate() {
            let innermost = level + 1 == chain.len();
            if *on_lost != OnLost::Abort && !(starting && innermost) {
                continue;
            }
            for grant in guard.grants().into_iter().filter(|grant| keys.contains(&grant.keys.name)) {
                let token = grant.token.as_str();
                // Fail closed: a body never starts on a grant that reads lost, even one the store still holds (a
                // nested request on a lost outer grant must fail, not share it).
                if starting && innermost && grant.is_lost() && !world.excused(token) {
                    world.violation(format!(
                        "c{client} {name}: a lock body (level {level}) starts on a grant of {} that reads lost (fence {})",
                        grant.keys.name, grant.fence
                    ));
                }
                // A restart or a clock jump past the README's assumptions voids the grant on the server.
                let held = match world.config.model {
                    // Redlock: held as check_grant counts it (a quorum, restarted servers vouching by their marks).
                    Model::Redlock(_) => {
                        let (holding, quorum) = world.redlock_holders(&grant);
                        holding >= quorum
                    }
                    _ => world.found(&grant.keys.record, token) == Found::Ours,
                };
                if world.excused(token) || world.beyond_assumptions(&grant) || held {
                    continue;
                }
                let (what, lost) = (if starting { "starts" } else { "runs a step" }, grant.is_lost());
                world.violation(format!(
                    "c{client} {name}: a lock body (level {level}, {on_lost:?}) {what} while the store does not hold its grant of {} (fence {}; the guard reads {})",
                    grant.keys.name,
                    grant.fence,
                    if lost { "lost" } else { "valid" }
                ));
            }
        }
        world.check("body");
    }

    /// A request for `keys` that waited at most `wait` ended (`what`), having started at `started`: as
    /// [`Sim::check_wait`], with a round trip more per key for several keys (the one-step attempt at all of
    /// them, then each key's own attempt: without a wait every key gets one).
    pub fn check_wait_keys(&self, client: usize, started: Instant, wait: Duration, keys: &[String], what: &str) {
        let mut distinct: Vec<&String> = keys.iter().collect();
        distinct.sort_unstable();
        distinct.dedup();
        let extra = match distinct.len() {
            1 => Duration::ZERO,
            n => n as u32 * 2 * self.0.config.normal_delay,
        };
        self.check_wait(client, started, wait + extra, &format!("{what} ({} keys: wait + {extra:?})", distinct.len()));
    }

    /// `guard`'s release is about to start: what to check its outcome against ([`Sim::released`]).
    pub fn releasing(&self, guard: &LockGuard) -> Releasing {
        let all_nested = guard.is_nested();
        let grants = guard.grants();
        let parts = grants
            .iter()
            // A key the running lock body holds is left to it.
            .map(|grant| (grant.keys.record.clone(), grant.token.as_str().to_owned(), all_nested || held(grant)))
            .collect();
        Releasing { parts, started: Instant::now(), grants }
    }

    /// A release returned `outcome`: it must be the true one. `Released` only if the store held this grant
    /// until a release of it freed it (left it to `min_hold`, handed it over); `Expired` only if the store no
    /// longer held it; `TakenByOther` only if another token held it; `Unconfirmed` only after a resend (the
    /// oracle cannot tell which: accepted then); `Nested` only for a guard that took no key itself. A guard of
    /// several keys reports `Released` only if every key was, else one key's outcome. An error says nothing.
    pub fn released(
        &self,
        client: usize,
        releasing: Releasing,
        outcome: &Result<ReleaseOutcome, LockError>,
        name: &str,
    ) {
        let world = &self.0;
        world.trace(|| format!("c{client} {name}: released: {outcome:?}"));
        let Ok(outcome) = *outcome else { return };
        let (from, to) = (releasing.started, Instant::now());
        // With each part, whether its release sent nothing (read now: a renewal in flight when the release began
        // may have said the grant gone before it).
        let owned: Vec<(&(String, String, bool), bool)> = (releasing.parts.iter().zip(&releasing.grants))
            .filter(|(p, _)| !p.2)
            .map(|(p, grant)| (p, grant.lease().gone))
            .collect();
        let true_of = |((record, token, _), sent_nothing): &(&(String, String, bool), bool)| {
            world.could_be(record, token, (from, to), outcome, *sent_nothing)
        };
        let right = match outcome {
            ReleaseOutcome::Nested => owned.is_empty(),
            _ if owned.is_empty() => false,
            ReleaseOutcome::Released => owned.iter().all(true_of),
            _ => owned.iter().any(true_of),
        };
        if !right {
            let found: Vec<String> = owned
                .iter()
                .map(|((record, token, _), _)| {
                    let now = match world.peek(record) {
                        Some((Some(holder), ..)) if holder == *token => "still its".to_owned(),
                        Some((Some(holder), ..)) => format!("{}'s", short(&holder)),
                        _ => "nobody's".to_owned(),
                    };
                    format!("{record}: releases {}; now {now}", world.releases_of(token, from))
                })
                .collect();
            world.violation(format!(
                "c{client} {name}: release reported {outcome:?}, not what the store found ({}; {} of {} keys nested)",
                found.join("; "),
                releasing.parts.len() - owned.len(),
                releasing.parts.len()
            ));
        }
    }

    /// A request for `keys` that used `tokens` was cancelled: whatever it left in the store frees within its
    /// lease, `max_lease` at the longest (the prompt clean-up is [`Sim::gone`]'s).
    pub fn cancelled(&self, client: usize, keys: &[String], tokens: Vec<String>, max_lease: Duration) {
        if tokens.is_empty() {
            return;
        }
        let bound = self.0.lease_bound(max_lease);
        let records: Vec<String> = keys.iter().map(|key| LockKeys::new(PREFIX, key.clone()).record).collect();
        self.0.after_quiet(client, bound, move |world| {
            for record in &records {
                if let Some((Some(holder), ..)) = world.peek(record) {
                    if tokens.contains(&holder) {
                        world.violation(format!(
                            "c{client}: {record} still held by {} of a request cancelled {bound:?} (and every pause since) ago",
                            short(&holder)
                        ));
                    }
                }
            }
        });
    }

    /// Client `client` starts its shutdown with `grace`: its locks are lost at the end of it, by design.
    pub fn shutting_down(&self, client: usize, grace: Duration) {
        self.0.trace(|| format!("c{client} SHUTTING DOWN (grace {grace:?})"));
        self.0.state().truth.shutting_down.insert(client, Instant::now() + grace);
    }

    /// Client `client`'s shutdown with `grace`, started at `started`, resolved: unless a fault hindered the
    /// client meanwhile, promptly after the grace (its bodies stop on the loss, and its releases take a round
    /// trip each), and with the store holding none of its locks; and none `max_lease` (its longest lease)
    /// later in any case.
    pub fn shut_down(&self, client: usize, started: Instant, grace: Duration, max_lease: Duration) {
        let world = &self.0;
        world.trace(|| format!("c{client} SHUT DOWN"));
        let now = Instant::now();
        if !world.disturbed(client, started, now) {
            // A lock whose release the client sent before the shutdown is not the shutdown's to release: if a
            // fault lost that release, its record expires with its lease (redis+replicas seed 28278: a dropped
            // guard's release timed out on a paused server a second before), which the check a lease later holds.
            world.check_left(client, "shut down and still holds", Some(started));
            // A body notices the loss at its next step, and a nested one's ends before its outer one's.
            let slack = 2 * world.config.response_timeout + Duration::from_millis(300);
            if now - started > grace + slack {
                let took = now - started;
                world.violation(format!("c{client}: shutdown with grace {grace:?} took {took:?}, with no fault"));
            }
        }
        world.after_quiet(client, world.lease_bound(max_lease), move |world| {
            world.check_left(client, "shut down, and a lease later still holds", None);
        });
    }
}

impl World {
    /// The store holds no lock for a token of `client`, except, with `released_before`, tokens whose release
    /// the client sent before then.
    fn check_left(&self, client: usize, what: &str, released_before: Option<Instant>) {
        let records: Vec<String> = self.state().last_fence.keys().cloned().collect();
        for record in records {
            let Some((Some(holder), ..)) = self.peek(&record) else { continue };
            let state = self.state();
            // ... and no attempt of the token applied since (an attempt retried with the same token).
            let sent = state.truth.release_sent.get(&holder).copied();
            let excused = released_before.zip(sent).is_some_and(|(before, sent)| {
                sent < before && state.truth.last_attempt(&holder).is_none_or(|at| at <= sent)
            });
            let ours = state.owners.get(&holder) == Some(&client);
            drop(state);
            if ours && !excused {
                self.violation(format!("c{client} {what} {record} (its token {})", short(&holder)));
            }
        }
    }
}

/// Whether `grant` is held by the lock body running now (so a guard of it took it nested).
fn held(grant: &Arc<Grant>) -> bool {
    crate::held::find(&grant.client, &grant.keys.name).is_some_and(|g| Arc::ptr_eq(&g, grant))
}

impl World {
    /// What a holder reads off its guard is its grants' truth (which [`World::check_grant`] holds to the
    /// store's record): each key's fencing token, the first key's for the whole guard (or, on a store without
    /// fencing, 0 and an error from `try_fencing_token`), and the keys in order.
    fn check_accessors(&self, client: usize, guard: &LockGuard, grants: &[Arc<Grant>], name: &str) {
        let keys: Vec<&str> = grants.iter().map(|grant| grant.keys.name.as_str()).collect();
        let mut wrong = Vec::new();
        if guard.keys().collect::<Vec<_>>() != keys || guard.key() != keys[0] {
            wrong.push(format!("keys {:?}, key {}", guard.keys().collect::<Vec<_>>(), guard.key()));
        }
        for grant in grants {
            if guard.fencing_token_of(&grant.keys.name) != Some(grant.fence) {
                wrong.push(format!(
                    "fencing_token_of({}) {:?}",
                    grant.keys.name,
                    guard.fencing_token_of(&grant.keys.name)
                ));
            }
        }
        if guard.fencing_token_of("not a key of this guard").is_some() {
            wrong.push("a fencing token for a key it does not hold".to_owned());
        }
        let first = grants[0].fence;
        if guard.fencing_token() != first {
            wrong.push(format!("fencing_token {}", guard.fencing_token()));
        }
        let fenced = !matches!(self.config.model, Model::Redlock(_));
        match guard.try_fencing_token() {
            Ok(fence) if fenced && fence == first => {}
            Err(_) if !fenced => {}
            other => wrong.push(format!("try_fencing_token {other:?}")),
        }
        if !wrong.is_empty() {
            self.violation(format!(
                "c{client} {name}: the guard says {}, its grants {keys:?} with fences {:?}",
                wrong.join(", "),
                grants.iter().map(|grant| grant.fence).collect::<Vec<_>>()
            ));
        }
    }
}

/// Whether any of `grants` is one of `watched`.
fn shares(watched: &[Weak<Grant>], grants: &[Arc<Grant>]) -> bool {
    watched.iter().any(|w| grants.iter().any(|g| w.as_ptr() == Arc::as_ptr(g)))
}

/// A guard's fencing tokens, for the trace.
fn fences(guard: &LockGuard) -> Vec<u64> {
    guard.keys().filter_map(|key| guard.fencing_token_of(key)).collect()
}
