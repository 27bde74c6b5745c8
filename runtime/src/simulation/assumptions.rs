//! What the oracle holds the servers' faults to, model by model, as the README states the guarantees:
//! - a restart without persistence (or a failover, for the old primary's state) loses the locks it held: a
//!   grant whose lease was sent before it is no longer held to exclusion on that server ("holders find out at
//!   their next renewal"); Redlock keeps exclusion across a minority's restarts (its lock-state marks), so
//!   there a restarted server counts as still holding the grants it lost until they would have expired;
//! - a server's clock stepping forward ends its records early by the step: a lease is excused only when the
//!   steps since it was sent exceed its drift allowance (S1 holds "while clocks drift less than the drift
//!   allowance"); within the allowance it is checked as always, so the boundary is checked from both sides;
//! - fencing tokens rise while the server remembers a key's last token, which it must for at least the ttl of
//!   the key's last grant unless it lost its state (a restart, a failover): a token not above the last is
//!   excused only when neither holds (Correctness II's schedule 2); then it went back because a clock stands
//!   behind the last token (README, Fencing: a step back by more than the ttl).

use std::time::Duration;

use tokio::time::Instant;

use super::{Model, World};
use crate::grant::Grant;

/// One server's view of a record: owner token, fencing token, expiry.
type Seen = Option<(Option<String>, u64, Instant)>;

impl World {
    /// Whether server `node` restarted (lost its state) after `since`.
    pub(super) fn restarted_since(&self, node: usize, since: Instant) -> bool {
        self.nodes()[node].restarts.iter().any(|&at| at >= since)
    }

    /// Whether server `node`'s clock stepped forward by more than `grant`'s drift allowance since its lease was
    /// sent, while its records expired by that clock (it was a primary): past the README's assumption for that
    /// lease.
    pub(super) fn stepped_past_allowance(&self, node: usize, grant: &Grant) -> bool {
        let lease = grant.lease();
        // The README's rule, written out here rather than borrowed from the engine's `drift` (a check that
        // shares the formula it checks cannot fail when the formula is wrong): a guard counts L − (L·1% + 2 ms)
        // from its send, for the lease L the server reported, so L = (valid + 2 ms) / 0.99 and the allowance is
        // L·1% + 2 ms. Were the engine to count less (or no) allowance, this still gives the README's, and a step
        // within it ends the record before the guard's deadline: `check_grant` reports it.
        let forward: i64 = self.nodes()[node]
            .steps_as_primary
            .iter()
            .filter(|(at, _)| *at >= lease.since)
            .map(|(_, d)| (*d).max(0))
            .sum();
        if forward == 0 {
            return false; // the allowance is at least 2 ms, more than the 1 ms below (the oracle's common case)
        }
        let valid = lease.valid_until.saturating_duration_since(lease.since);
        let reported = (valid + Duration::from_millis(2)).mul_f64(1.0 / 0.99);
        // A renewal or extend sent since the lease's request may have lowered its deadline to its own lease's
        // (an extend to a shorter ttl), whose allowance is smaller; the lease keeps its `since` (redis+replicas
        // seed 130661: an extend to 522 ms after a lease of 2,051 ms, then a failover 10.1 ms ahead, within
        // the longer lease's allowance and past the shorter one's).
        let shortest_sent = self
            .state()
            .ttl_sent
            .get(grant.token.as_str())
            .and_then(|sent| sent.iter().filter(|(at, _)| *at >= lease.since).map(|&(_, ttl)| ttl).min());
        let reported = shortest_sent.map_or(reported, |ttl| reported.min(ttl));
        let allowance = (reported / 100 + Duration::from_millis(2)).as_micros() as i64;
        // Redis keeps an expiry in whole ms (the server's clock truncated, plus the ttl): a record may end up to
        // 1 ms before its µs-exact time, which the allowance's 2 ms must also cover (README, S1; redis+replicas
        // seed 14930: a failover to a replica 4.46 ms ahead, against an allowance of 4.61 ms).
        forward + 1000 > allowance
    }

    /// How much the clocks records expire by stepped back since `since` (on any server while it was a primary,
    /// or by a failover to a server whose clock is behind): a record's life on the server grows by that much
    /// (Redis expires keys by its own clock), so what must free "within its lease" frees that much later.
    pub(super) fn stepped_back_since(&self, since: Instant) -> Duration {
        let nodes = self.nodes();
        let back: i64 = nodes
            .iter()
            .map(|n| {
                n.steps_as_primary.iter().filter(|(at, step)| *at >= since && *step < 0).map(|(_, s)| s).sum::<i64>()
            })
            .sum();
        Duration::from_micros(back.unsigned_abs())
    }

    /// Whether the oracle holds `grant` to the rules on the single-primary models: not when its server lost
    /// its state since the lease was sent, or stepped its clock past the lease's allowance.
    pub(super) fn beyond_assumptions(&self, grant: &Grant) -> bool {
        let lease_since = grant.lease().since;
        match self.config.model {
            Model::Memory => false,
            // A clock jump on a server of the majority can free the lock early (README, Redlock): a lease is
            // no longer held to exclusion once any server's clock jumped past its allowance. Restarts are not
            // excused: the servers' lock-state marks keep exclusion across them.
            Model::Redlock(n) => {
                (0..n).any(|node| self.stepped_past_allowance(node, grant)) || self.shorter_ttl_after_restart(grant)
            }
            // A failover is a restart of the old primary: any restart of any server counts. So does a step on
            // any server while it was the primary: its records, ours among them, pass to the next one by
            // failover with the early expiry (`redis+replicas` seed 225 of the whole-API workload).
            Model::Redis | Model::RedisReplicas => (0..self.config.model.servers())
                .any(|n| self.restarted_since(n, lease_since) || self.stepped_past_allowance(n, grant)),
        }
    }

    /// Redlock: whether a server that lost `grant`'s record in a restart now holds the record of another guard
    /// (a grant that counted, not a young one given back) whose ttl is shorter than `grant`'s lease. A
    /// restarted server waits one ttl of the acquirer before its grant counts, which covers the records it lost only when "every holder of a lock uses a lease no longer
    /// than the ttl of whoever acquires it next" (README, Restarts without persistence); the workload mixes
    /// ttls on purpose, so past that assumption the lease is not held to exclusion.
    /// Once past it, a lease stays past it: the other guard's extend to a longer ttl later does not mend the
    /// assumption its acquire broke (`redlock` seed 140 of the whole-API workload).
    fn shorter_ttl_after_restart(&self, grant: &Grant) -> bool {
        if self.state().beyond_restart.contains(grant.token.as_str()) {
            return true;
        }
        let lease = grant.lease();
        // Nothing to look at unless a server restarted since (most checks: the oracle runs after every command).
        let servers = self.nodes().len();
        if !(0..servers).any(|node| self.restarted_since(node, lease.since)) {
            return false;
        }
        let held_for = lease.valid_until.saturating_duration_since(lease.since);
        let seen = self.peek_each(&grant.keys.record);
        // The grants first, then their leases: no grant's lock is taken under the world's.
        let grants: Vec<_> = self.state().probes.iter().filter_map(|(g, ..)| g.upgrade()).collect();
        let others: Vec<Duration> = grants
            .iter()
            .filter(|other| other.token != grant.token)
            .filter(|other| {
                seen.iter().enumerate().any(|(node, s)| {
                    self.restarted_since(node, lease.since)
                        && matches!(s, Some((Some(t), ..)) if t == other.token.as_str())
                })
            })
            .map(|other| other.lease().ttl)
            .collect();
        let beyond = others.into_iter().any(|ttl| ttl < held_for);
        if beyond {
            self.state().beyond_restart.insert(grant.token.as_str().to_owned());
        }
        beyond
    }

    /// Every server's view of `record` (Redlock).
    pub(super) fn peek_each(&self, record: &str) -> Vec<Seen> {
        let nodes = self.nodes();
        (0..nodes.len()).map(|n| self.peek_node(&nodes, n, record)).collect()
    }

    /// Redlock: how many servers hold `grant` until at least its deadline, counting a server that restarted
    /// or stepped its clock past the allowance since the lease was sent as holding it (its lock-state mark
    /// keeps it from voting for anyone else until the lost records would have expired; a clock step is past
    /// the assumption), and the quorum.
    pub(super) fn redlock_holders(&self, grant: &Grant) -> (usize, usize) {
        let lease = grant.lease();
        let (now, record, token) = (Instant::now(), &grant.keys.record, grant.token.as_str());
        let servers = self.nodes().len();
        let holding = (0..servers)
            .filter(|&node| {
                let held = {
                    let nodes = self.nodes();
                    self.held_on_node(&nodes, node, record, token, now).is_some_and(|e| e >= lease.valid_until)
                };
                held || self.restarted_since(node, lease.since) || self.stepped_past_allowance(node, grant)
            })
            .count();
        (holding, servers / 2 + 1)
    }

    /// Redlock: how many servers hold a record of `token`.
    pub(super) fn redlock_count(&self, record: &str, token: &str) -> usize {
        let (nodes, now) = (self.nodes(), Instant::now());
        (0..nodes.len()).filter(|&node| self.held_on_node(&nodes, node, record, token, now).is_some()).count()
    }

    /// A client sends a renewal or extend of `token`'s grant for `ttl` (ms): from now on its guard's deadline
    /// may be lowered to where that lease would end (grant.rs, `lower_for`).
    pub(super) fn sent_ttl(&self, token: &str, ttl: &str) {
        if let Ok(ms) = ttl.parse::<u64>() {
            let sent = (Instant::now(), Duration::from_millis(ms));
            self.state().ttl_sent.entry(token.to_owned()).or_default().push(sent);
        }
    }

    /// A script call about to run asks for `ttl` (ms, as sent) for `token`'s grant or renewal: the shortest
    /// one asked is what the oracle holds the server's memory of the token to (an extend to a shorter ttl
    /// shortens it, README; an extend that fails still counts, as its outcome may be unknown).
    pub(super) fn asked(&self, token: &str, ttl: &str) {
        if let Ok(ms) = ttl.parse::<u64>() {
            let ttl = Duration::from_millis(ms);
            self.state().ttl_asked.entry(token.to_owned()).and_modify(|t| *t = (*t).min(ttl)).or_insert(ttl);
        }
    }

    /// Whether a new owner's fencing token not above that of the last owner (`last_token`, whose grant was
    /// first seen at `last_seen`) is within the README's assumption. A grant takes the server's clock as its
    /// token unless the server remembers a higher last token (then last + 1), and the server must remember it
    /// for at least the ttl of the last grant (the shortest it asked for: an extend to less shortens it). So a token may
    /// go back only once that ttl has passed since the last grant on the server's clock (a step forward counts),
    /// or after a server lost its state (a restart
    /// without persistence, a failover) since — and then only because a clock stands behind the last token (a
    /// step back, or a promoted replica's clock behind). Before the ttl has passed, whatever the clock did, it
    /// must rise (Correctness II's schedule 2).
    pub(super) fn fence_excused(&self, last_token: Option<&str>, last_seen: Option<Instant>) -> bool {
        if self.config.model == Model::Memory {
            return false;
        }
        let Some(granted) = last_seen else { return false };
        let since = Instant::now().saturating_duration_since(granted);
        let nodes = self.nodes();
        let lost = nodes.iter().flat_map(|n| n.restarts.iter().copied().chain(n.reset_at)).any(|at| at >= granted);
        // A server clock stepped forward ends a ttl that much earlier.
        let forward: i64 =
            nodes.iter().flat_map(|n| &n.steps).filter(|(at, step)| *at >= granted && *step > 0).map(|(_, s)| s).sum();
        drop(nodes);
        let elapsed = since + Duration::from_micros(forward.unsigned_abs());
        let ttl = last_token.and_then(|token| self.state().ttl_asked.get(token).copied());
        lost || ttl.is_none_or(|ttl| elapsed >= ttl)
    }
}
