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

use super::{short, World};
use crate::grant::Grant;
use crate::ReleaseOutcome;

mod checks;
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

/// A guard's grants as its release began: see [`Sim::releasing`](super::Sim::releasing).
#[derive(Debug)]
pub struct Releasing {
    /// Per key: record, token, and whether the key was held by the running lock body (nested: not released).
    parts: Vec<(String, String, bool)>,
    /// When the release began: releases the store applied from then on are this one's (or a concurrent one's).
    started: Instant,
    /// Each part's grant, to read once the release returned whether it sent anything: a grant the store had
    /// said was gone (a renewal refused, a shutdown's release) sends nothing.
    grants: Vec<Arc<Grant>>,
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

    /// Whether `outcome` can be true of the release of `token` on `record` that ran from `from` to `to`;
    /// `sent_nothing`: its grant was one the store had said was gone, so the release sent nothing.
    fn could_be(
        &self,
        record: &str,
        token: &str,
        during: (Instant, Instant),
        outcome: ReleaseOutcome,
        sent_nothing: bool,
    ) -> bool {
        let (from, to) = during;
        if let super::Model::Redlock(n) = self.config.model {
            return self.could_be_on_a_quorum(n, record, token, (from, to), outcome, sent_nothing);
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
            // Nothing applied: nothing sent (the store had said the grant was gone; a release sent and lost is an
            // error, not an outcome), and the grant gone, unless a failover since the grant promoted a replica
            // that had missed what removed it (redis+replicas seed 90623: a force_unlock's delete, not yet
            // replicated, and the old record back on the new primary).
            ReleaseOutcome::Expired => {
                let rolled_back = state.truth.failovers.iter().any(|&at| at >= since);
                drop(state);
                sent_nothing && (rolled_back || self.found(record, token) != Found::Ours)
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
