//! The oracle's rules of issue 32, beside `oracle.rs`'s. Each is checked where the workload learns something,
//! against the store's truth (read with `self.peek`, as `oracle.rs` reads it):
//! - every [`ReleaseOutcome`] a release returns is the true one, or says it cannot know (`Unconfirmed`, only
//!   for a release sent again after an ambiguous failure);
//! - no lock body runs while its grant is lost (S5): at its start and at every step it checks that the store
//!   holds its grant, and the grants of the bodies around it that drop it when they lose theirs;
//! - a guard past its `max_hold` reads lost: `max_hold` ends a lease by design;
//! - a lock left by a cancelled request, or by a client that shut down, frees within its lease (crashes are
//!   `oracle.rs`'s), and a shut-down client leaves nothing held unless a fault kept its releases away;
//! - no renewal or extend reaches the store after a release of the same token (S8);
//! - `force_unlock` breaks exclusion by design (README): a guard whose record it deleted keeps saying valid
//!   until its next renewal finds out, so from the moment the store applied it that guard is excused from the
//!   S1/S6 checks (and from S5's).
//!
//! A store model tells the oracle what it applies, at the moment it applies it and before it changes
//! anything: [`World::applying_release`], [`World::applying_renew`], [`World::applying_force_unlock`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::{short, Sim, Tokens, World, PREFIX};
use crate::backend::LockKeys;
use crate::grant::Grant;
use crate::{LockError, LockGuard, OnLost, ReleaseOutcome};

mod quorum;

/// What an applied release found in the store, for its token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Found {
    /// The record was this token's grant: the release freed it (or left it to `min_hold`, or handed it over).
    Ours,
    /// Another token's grant.
    Other,
    /// No record, or one kept by nobody (after a `min_hold` release).
    Nobody,
}

impl Found {
    /// What a record seen as `seen` (`peek`'s) is for `token`.
    fn of(seen: Option<(Option<String>, u64, Instant)>, token: &str) -> Self {
        match seen {
            Some((Some(holder), ..)) if holder == token => Found::Ours,
            Some((Some(_), ..)) => Found::Other,
            _ => Found::Nobody,
        }
    }
}

/// Whether a resend came after a send that found the grant, among the releases applied in one release's time.
fn resent_after_ours(applied: &[Applied]) -> bool {
    applied.iter().position(|a| a.found == Found::Ours).is_some_and(|i| applied[i + 1..].iter().any(|a| a.resent))
}

/// One release the store applied.
#[derive(Debug, Clone, Copy)]
struct Applied {
    /// When the store applied it.
    at: Instant,
    /// Its place among the releases and acquire attempts the store applied (several apply at one instant).
    seq: u64,
    /// What it found for its token, just before it changed anything.
    found: Found,
    /// The model's client path sent it again after an ambiguous failure (the Redis backend's resend after a
    /// reconnect); the reply the client got may be this one's.
    resent: bool,
    /// The server that applied it (a Redlock group's; 0 on the single-primary models).
    node: usize,
}

/// A guard under `max_hold`: it must read lost once its renewals have stopped and its longest lease ran out.
#[derive(Debug)]
struct Capped {
    /// The grants the guard took itself (not those it shares with the body around it).
    grants: Vec<Weak<Grant>>,
    /// When the workload got the guard: no earlier than the grant, so the cap counts from no later.
    from: Instant,
    /// The request's `max_hold`.
    max_hold: Duration,
    /// The longest lease it may have set: its ttl, or an extend's.
    longest: Duration,
    /// When its last extend ended: an extend sets a lease whatever the cap.
    extended: Option<Instant>,
}

/// What the rules of this file remember.
#[derive(Debug, Default)]
pub(super) struct Truth {
    /// Per token: every release of it the store applied, in order.
    releases: BTreeMap<String, Vec<Applied>>,
    /// Tokens whose record an applied `force_unlock` deleted.
    forced: BTreeSet<String>,
    /// Per token and server (a Redlock group's; 0 on the single-primary models): when that server last applied
    /// an acquire attempt of it (the models that report them; on Redlock a round's, or a renewal's taking a
    /// lapsed record again), and its place in the order of application.
    attempted: BTreeMap<(String, usize), (Instant, u64)>,
    /// Releases and acquire attempts applied so far.
    applied: u64,
    /// Guards under `max_hold`, watched until the end of the schedule.
    capped: Vec<Capped>,
    /// Clients whose shutdown started, each with the end of its grace, when its locks are lost by design.
    shutting_down: BTreeMap<usize, Instant>,
    /// Per token: when its client last sent a release of it (applied or not).
    release_sent: BTreeMap<String, Instant>,
    /// When a replica was promoted (it may lack the old primary's last writes).
    failovers: Vec<Instant>,
}

impl Truth {
    /// When the last acquire attempt of `token` was applied, on any server.
    fn last_attempt(&self, token: &str) -> Option<Instant> {
        let (first, last) = ((token.to_owned(), 0), (token.to_owned(), usize::MAX));
        self.attempted.range(first..=last).map(|(_, &(at, _))| at).max()
    }
}

/// A guard's grants as its release began: see [`Sim::releasing`].
#[derive(Debug)]
pub struct Releasing {
    /// Per key: record, token, and whether the key was held by the running lock body (nested: not released).
    parts: Vec<(String, String, bool)>,
    /// When the release began: releases the store applied from then on are this one's (or a concurrent one's).
    started: Instant,
}

impl World {
    /// A client sent a release of `token` (it may never apply: a fault may lose it, and then the record
    /// expires with its lease, as the README says of a release that fails).
    pub(super) fn release_sent(&self, token: &str) {
        self.state().truth.release_sent.insert(token.to_owned(), Instant::now());
    }

    /// A replica replaces the primary now.
    pub(super) fn failing_over(&self) {
        self.state().truth.failovers.push(Instant::now());
    }

    /// What `token` finds in `record` now.
    fn found(&self, record: &str, token: &str) -> Found {
        Found::of(self.peek(record), token)
    }

    /// What server `node` of a Redlock group holds at `record`, for `token`.
    fn found_on(&self, node: usize, record: &str, token: &str) -> Found {
        let nodes = self.nodes();
        Found::of(self.peek_node(&nodes, node, record), token)
    }

    /// The store is about to apply a release of `record` by `token` (`resent`: sent again by the client path).
    /// `after_acquire`: an acquire earlier in the same call may take a free record first (found in
    /// simulation, redis seed 1691 of the whole workload: a BATCH "ar" on one key after a force_unlock), so a
    /// free record may be found taken by another; `after_release`: a release earlier in the same call may free
    /// the record, another token's (redis seed 4966 of the whole workload: a BATCH "rr" of one key by the grant
    /// that took it after a restart, then by the grant the restart lost) or this token's own (Redlock seed 1408:
    /// the engine's give-back beside the guard's release), so it may be found free.
    /// `node`: the server applying it, on a Redlock group (each keeps its own record); 0 elsewhere.
    pub(super) fn applying_release(&self, record: &str, token: &str, resent: bool, after: (bool, bool), node: usize) {
        let (after_acquire, after_release) = after;
        let found = match self.config.model {
            super::Model::Redlock(_) => self.found_on(node, record, token),
            _ => self.found(record, token),
        };
        let at = Instant::now();
        let mut state = self.state();
        state.truth.applied += 1;
        let seq = state.truth.applied;
        let releases = state.truth.releases.entry(token.to_owned()).or_default();
        releases.push(Applied { at, seq, found, resent, node });
        if after_acquire && found == Found::Nobody {
            releases.push(Applied { at, seq, found: Found::Other, resent, node });
        }
        // The earlier release may be this token's own (a BATCH "rr" of one record: a give-back beside the
        // guard's release): then this one finds nothing either.
        if after_release && found != Found::Nobody {
            releases.push(Applied { at, seq, found: Found::Nobody, resent, node });
        }
    }

    /// The store is about to apply an acquire attempt by `token`: a request that gave back a grant it could not
    /// use (too late, or not acknowledged by the replicas) keeps its token and place, and may be granted again.
    /// `node`: the server applying it, as for [`applying_release`](Self::applying_release).
    pub(super) fn applying_acquire(&self, token: &str, node: usize) {
        let mut state = self.state();
        state.truth.applied += 1;
        let seq = state.truth.applied;
        state.truth.attempted.insert((token.to_owned(), node), (Instant::now(), seq));
    }

    /// The store is about to apply a renewal or extend of `record` by `token`: S8, none after its release
    /// (since the token's last acquire attempt).
    pub(super) fn applying_renew(&self, record: &str, token: &str) {
        let state = self.state();
        // Only a release applied after the token's last acquire attempt: one applied before it, at the same
        // instant, was of an earlier grant (redis+replicas seed 26410: a give-back delivered late, then the
        // request's next attempt granted).
        let attempted = state.truth.attempted.get(&(token.to_owned(), 0)).map(|&(_, seq)| seq);
        let released = state
            .truth
            .releases
            .get(token)
            .is_some_and(|r| r.iter().any(|applied| attempted.is_none_or(|seq| applied.seq > seq)));
        drop(state);
        if released {
            self.violation(format!(
                "a renewal or extend by {} reached {record} after the store applied a release by the same token (S8)",
                short(token)
            ));
        }
    }

    /// The store is about to apply a `force_unlock` of `record`: the grant it deletes is excused from now on.
    /// On Redlock, the record on the server it runs on (`node`), whoever holds the majority: a grant it
    /// deletes on one server may have been counted by a round still under way (redlock seed 7086 of the
    /// whole-API workload: an acquire's grant on a server, then the force_unlock there, then its grant on a
    /// second server).
    pub(super) fn applying_force_unlock(&self, record: &str, node: usize) {
        let seen = match self.config.model {
            super::Model::Redlock(_) => {
                let nodes = self.nodes();
                self.peek_node(&nodes, node, record)
            }
            _ => self.peek(record),
        };
        if let Some((Some(holder), ..)) = seen {
            self.trace(|| format!("force_unlock deletes {record} of {}: excused from S1/S6/S5", short(&holder)));
            self.state().truth.forced.insert(holder);
        }
    }

    /// Whether the grant of `token` was deleted by a `force_unlock`, which breaks exclusion by design.
    pub(super) fn excused(&self, token: &str) -> bool {
        self.state().truth.forced.contains(token)
    }

    /// Whether `outcome` can be true of the release of `token` on `record` that ran from `from` to `to`.
    fn could_be(&self, record: &str, token: &str, from: Instant, to: Instant, outcome: ReleaseOutcome) -> bool {
        if let super::Model::Redlock(n) = self.config.model {
            return self.could_be_on_a_quorum(n, record, token, (from, to), outcome);
        }
        let state = self.state();
        let all = state.truth.releases.get(token).map_or(&[][..], Vec::as_slice);
        let mut within = all.iter().filter(|a| a.at >= from && a.at <= to).peekable();
        // The token's last acquire attempt, or the release's start if that is earlier.
        let since = state.truth.last_attempt(token).map_or(from, |at| at.min(from));
        match outcome {
            // The release that freed the grant may be an earlier send of this one (its reply lost): also in it.
            // Or the engine's own give-back of the same grant, sent when it found the grant lost, just before
            // the guard's release began (found in simulation, redis seed 388 of the whole workload): any
            // release by this token since its last acquire attempt that found its grant.
            ReleaseOutcome::Released => {
                all.iter().filter(|a| a.at >= since && a.at <= to).any(|a| a.found == Found::Ours)
            }
            // A resend of a release (its first send's reply lost) after a send that found the grant: that send
            // freed it, so "lost" is false (a concurrent release of the same grant, by a shutdown or a
            // give-back, is not this one's and may leave it free).
            ReleaseOutcome::TakenByOther => {
                let found: Vec<Applied> = within.copied().collect();
                !resent_after_ours(&found) && found.iter().any(|a| a.found == Found::Other)
            }
            ReleaseOutcome::Unconfirmed => within.any(|a| a.resent),
            ReleaseOutcome::Nested => false,
            ReleaseOutcome::Expired if within.peek().is_some() => {
                let found: Vec<Applied> = within.copied().collect();
                !resent_after_ours(&found) && found.iter().any(|a| a.found == Found::Nobody)
            }
            // Nothing sent (the store said the grant was gone): it must be, unless a failover since the grant
            // promoted a replica that had missed what removed it (redis+replicas seed 90623: a force_unlock's
            // delete, not yet replicated, and the old record back on the new primary).
            ReleaseOutcome::Expired => {
                let rolled_back = state.truth.failovers.iter().any(|&at| at >= since);
                drop(state);
                rolled_back || self.found(record, token) != Found::Ours
            }
        }
    }

    /// What the store applied of `token`'s releases from `from` on, for a message.
    fn releases_of(&self, token: &str, from: Instant) -> String {
        let redlock = matches!(self.config.model, super::Model::Redlock(_));
        let state = self.state();
        let all = state.truth.releases.get(token).map_or(&[][..], Vec::as_slice);
        let shown: Vec<String> = all
            .iter()
            .map(|a| {
                let at = a.at.saturating_duration_since(self.start).as_secs_f64() * 1000.0;
                let before = if a.at < from { " (before this release)" } else { "" };
                let on = if redlock { format!(" on s{}", a.node) } else { String::new() };
                format!("{:?}{}{on} at {at:.3} ms{before}", a.found, if a.resent { " resent" } else { "" })
            })
            .collect();
        if shown.is_empty() {
            "none applied".to_owned()
        } else {
            shown.join(", ")
        }
    }

    /// Runs `check` once `bound` has passed since now with no pause of the store and no stall of `client`
    /// ending later (a command sent before may be applied when they end); not at all if `client` crashes,
    /// whose own check covers its locks.
    fn after_quiet(self: &Arc<Self>, client: usize, bound: Duration, check: impl FnOnce(&World) + Send + 'static) {
        let world = Arc::clone(self);
        tokio::spawn(async move {
            let since = Instant::now();
            let mut until = since + bound;
            loop {
                tokio::time::sleep_until(until).await;
                let (paused, frozen) = {
                    let state = world.state();
                    (state.paused_until, state.frozen_until[client])
                };
                let Some(frozen) = frozen else { return };
                // A server clock stepped back keeps what it holds that much longer (redis+replicas seed 16266),
                // also a step taken before `since` while the record already lived (seed 13306): any within a
                // bound before it.
                let back = world.stepped_back_since(since.checked_sub(bound).unwrap_or(world.start));
                let due = paused.max(frozen).max(since) + bound + back;
                if due <= until {
                    break;
                }
                until = due;
            }
            check(&world);
        });
    }

    /// How long a lock whose longest lease is `max_lease` may outlive its holder: as for a crash, a queue
    /// place handed over to it, and the store's delays.
    fn lease_bound(&self, max_lease: Duration) -> Duration {
        2 * max_lease + 2 * self.config.slow_delay + Duration::from_millis(300)
    }
}

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
                    super::Model::Redlock(_) => {
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
        let parts = guard
            .grants()
            .iter()
            // A key the running lock body holds is left to it.
            .map(|grant| (grant.keys.record.clone(), grant.token.as_str().to_owned(), all_nested || held(grant)))
            .collect();
        Releasing { parts, started: Instant::now() }
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
        let owned: Vec<&(String, String, bool)> = releasing.parts.iter().filter(|p| !p.2).collect();
        let true_of = |(record, token, _): &&(String, String, bool)| world.could_be(record, token, from, to, outcome);
        let right = match outcome {
            ReleaseOutcome::Nested => owned.is_empty(),
            _ if owned.is_empty() => false,
            ReleaseOutcome::Released => owned.iter().all(true_of),
            _ => owned.iter().any(true_of),
        };
        if !right {
            let found: Vec<String> = owned
                .iter()
                .map(|(record, token, _)| {
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
        let fenced = !matches!(self.config.model, super::Model::Redlock(_));
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
