//! The oracle: it knows the truth (the store's record and its expiry in simulated time) and checks the
//! safety model against it after every command the store applies and at every observation:
//! - a guard that says valid holds the store's record: its token, its fencing token, and an expiry no earlier
//!   than the guard's own deadline (S6: a guard's deadline never lies past the server's expiry of its grant);
//!   so no two guards of a key say valid at once;
//! - a guard reads lost only when the store no longer holds its grant or a fault kept its renewals away, and
//!   once it read lost it never reads valid again;
//! - fencing tokens rise per key: a record of a new owner carries a higher one than the last;
//! - a holder that is gone (request over, guard released or dropped) leaves nothing held, unless a fault kept
//!   its clean-up from the store; a crashed client's locks are free within their lease.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{short, World};
use crate::grant::Grant;

impl World {
    /// Checks every watched guard that says valid against the store.
    pub(super) fn check(&self, when: &str) {
        let grants: Vec<(Arc<Grant>, usize, Arc<str>)> = {
            let mut state = self.state();
            state.probes.retain(|(grant, ..)| grant.strong_count() > 0);
            state.probes.iter().filter_map(|(g, c, n)| Some((g.upgrade()?, *c, n.clone()))).collect()
        };
        let mut valid: Vec<(&str, &str)> = Vec::new();
        for (grant, client, name) in &grants {
            // Finality at every check, not only when the workload looks: a late reply that revives a lapsed
            // grant is seen even if no holder looked in between.
            self.check_lost_is_final(grant, grant.is_lost(), *client, name);
            if grant.is_lost() || self.beyond_assumptions(grant) || self.excused(grant.token.as_str()) {
                continue;
            }
            if !self.check_held(grant, *client, &format_args!("{name} ({when})")) {
                continue;
            }
            if let Some((other, _)) = valid.iter().find(|(record, _)| *record == grant.keys.record) {
                self.violation(format!("two guards of {other} say valid at once: {name} and another"));
            }
            valid.push((&grant.keys.record, name));
        }
    }

    /// One guard that says valid: the store must hold its grant until at least its deadline.
    pub(super) fn check_grant(&self, grant: &Grant, client: usize, name: &dyn std::fmt::Display) -> bool {
        // force_unlock breaks exclusion by design (README): a guard whose record it deleted says valid until its
        // next renewal finds out, so S1 and S6 are not checked for it from then on (see `outcomes.rs`).
        if self.excused(grant.token.as_str()) || self.beyond_assumptions(grant) {
            return false;
        }
        self.check_held(grant, client, name)
    }

    /// [`World::check_grant`] of a grant that is neither excused nor beyond the assumptions.
    fn check_held(&self, grant: &Grant, client: usize, name: &dyn std::fmt::Display) -> bool {
        let lease = grant.lease();
        let now = Instant::now();
        let ms = |at: Instant| at.saturating_duration_since(self.start).as_secs_f64() * 1000.0;
        if let super::Model::Redlock(_) = self.config.model {
            let (holding, quorum) = self.redlock_holders(grant);
            if holding < quorum {
                let seen: Vec<String> = self
                    .peek_each(&grant.keys.record)
                    .iter()
                    .map(|s| match s {
                        Some((token, _, expires)) => format!(
                            "{} until {:.3} ms",
                            token.as_deref().map_or_else(|| "nobody".to_owned(), short),
                            ms(*expires)
                        ),
                        None => "none".to_owned(),
                    })
                    .collect();
                self.violation(format!(
                    "c{client} {name}: guard of {} ({}) valid until {:.3} ms, but only {holding} servers (quorum {quorum}) hold its grant that long: {}",
                    grant.keys.name,
                    short(grant.token.as_str()),
                    ms(lease.valid_until),
                    seen.join(", ")
                ));
                return false;
            }
            return true;
        }
        match self.peek(&grant.keys.record) {
            Some((Some(token), fence, expires_at)) if token == grant.token.as_str() => {
                if lease.valid_until > expires_at {
                    self.violation(format!(
                        "c{client} {name}: guard valid until {:.3} ms, past the store's expiry of its grant at {:.3} ms{}",
                        ms(lease.valid_until),
                        ms(expires_at),
                        self.where_held()
                    ));
                    return false;
                }
                if fence != grant.fence {
                    self.violation(format!(
                        "c{client} {name}: guard has fencing token {}, the store's grant {fence}",
                        grant.fence
                    ));
                    return false;
                }
                true
            }
            Some((holder, fence, _)) => {
                self.violation(format!(
                    "c{client} {name}: guard (fence {}, valid until {:.3} ms) says valid while the store's record is {}'s (fence {fence})",
                    grant.fence,
                    ms(lease.valid_until),
                    holder.as_deref().map_or_else(|| "nobody".to_owned(), short)
                ));
                false
            }
            None => {
                self.violation(format!(
                    "c{client} {name}: guard (fence {}, valid until {:.3} ms) says valid at {:.3} ms while the store holds no record",
                    grant.fence,
                    ms(lease.valid_until),
                    ms(now)
                ));
                false
            }
        }
    }

    /// A guard reads lost: unless its grant is over, the store must no longer hold it, or something must have
    /// kept its client's renewals from the store since its last lease was granted.
    pub(super) fn check_needless_loss(&self, grant: &Grant, client: usize, name: &str) {
        let lease = grant.lease();
        if lease.gone || self.state().finished.contains(grant.token.as_str()) {
            return;
        }
        let since = lease.since.checked_sub(self.config.response_timeout).unwrap_or(lease.since);
        if let super::Model::Redlock(n) = self.config.model {
            // Redlock: its renewals count only with a quorum; a server that stopped answering is a fault.
            if self.redlock_count(&grant.keys.record, grant.token.as_str()) <= n / 2
                || self.disturbed(client, since, Instant::now())
            {
                return;
            }
        } else {
            let Some((Some(holder), ..)) = self.peek(&grant.keys.record) else { return };
            if holder != grant.token.as_str() || self.disturbed(client, since, Instant::now()) {
                return;
            }
        }
        self.violation(format!(
            "c{client} {name}: guard reads lost while the store holds its grant, with no fault since its lease was granted"
        ));
    }

    /// A guard looked at its grant and found it `lost` or not: once seen lost, a grant never reads valid again
    /// (a late reply to a renewal or extend must not revive it).
    pub(super) fn check_lost_is_final(&self, grant: &Grant, lost: bool, client: usize, name: &str) {
        let token = grant.token.as_str();
        let mut state = self.state();
        if lost {
            state.seen_lost.insert(token.to_owned());
        } else if state.seen_lost.contains(token) {
            drop(state);
            self.violation(format!("c{client} {name}: guard reads valid after it read lost"));
        }
    }

    /// After the store applied a command on `record`: a new owner's fencing token is above the last one's.
    pub(super) fn check_fence(&self, record: &str) {
        if matches!(self.config.model, super::Model::Redlock(_)) || record.is_empty() {
            return; // Redlock refuses fencing: its grants carry 0.
        }
        // A freed record (FREED or NOBODY over its token) keeps its last owner's fencing token: no new owner.
        let Some((token @ Some(_), fence, _)) = self.peek(record) else { return };
        let mut state = self.state();
        // Only a grant makes a new owner: a record that went back to an earlier grant's (a failover to a
        // replica that missed the later grants and the earlier release) issued no token. The same token may own
        // it again by a later grant, with a new fencing token (redis seed 6086 of the whole-API workload).
        let owner = (record.to_owned(), token.clone().unwrap_or_default(), fence);
        if !state.owners_seen.insert(owner) {
            return;
        }
        let last = state.last_fence.insert(record.to_owned(), (token.clone(), fence));
        // When the last grant was first seen: the clock assumption counts from it.
        let last_seen = state.fence_seen.insert(record.to_owned(), Instant::now());
        drop(state);
        if let Some((last_token, last_fence)) = last {
            let excused = || self.fence_excused(last_token.as_deref(), last_seen);
            if fence <= last_fence && !excused() {
                self.violation(format!("fencing token {fence} of a new owner of {record} is not above {last_fence}"));
            }
        }
    }

    /// `since` + a round trip or two after the holder of `tokens` was gone: the store holds none of them,
    /// unless a fault kept the clean-up from it.
    pub(super) fn check_gone(&self, client: usize, record: &str, tokens: &[String], since: Instant) {
        let Some(holder) = self.held_by(record) else { return };
        if !tokens.contains(&holder) || self.disturbed(client, since - self.config.normal_delay * 4, Instant::now()) {
            return;
        }
        let gone = since.saturating_duration_since(self.start).as_secs_f64() * 1000.0;
        self.violation(format!(
            "c{client}: {record} still held by {} after its holder was gone at {gone:.3} ms, with no fault in between",
            short(&holder)
        ));
    }

    /// `bound` after client `client` crashed: the store holds no lock for any token of it.
    pub(super) fn check_crashed(&self, client: usize, bound: Duration) {
        let records: Vec<String> = self.state().last_fence.keys().cloned().collect();
        for record in records {
            let Some(holder) = self.held_by(&record) else { continue };
            if self.state().owners.get(&holder) == Some(&client) {
                self.violation(format!(
                    "c{client} crashed, yet {record} is still held by its token {} {bound:?} later",
                    short(&holder)
                ));
            }
        }
    }

    /// A `run` returned `Lost` before its body watched its guard (the lock lost before the body's first
    /// poll): unless a fault touched its client since the request began, some key of it must have been lost, not
    /// held for the request's tokens by the store longer than a guard's deadline may fall short of the store's
    /// expiry: the README's drift allowance, the send's delay, Redis's whole-ms expiry, and any clock step back.
    pub(super) fn check_lost_before_body(&self, client: usize, name: &str, keys: &[String], tokens: &super::Tokens) {
        let seen = tokens.get();
        let now = Instant::now();
        let since = tokens.started.checked_sub(self.config.response_timeout).unwrap_or(tokens.started);
        if seen.is_empty() || seen.iter().any(|token| self.excused(token)) || self.disturbed(client, since, now) {
            return;
        }
        let back = self.stepped_back_since(tokens.started);
        let mut held = Vec::new();
        for key in keys {
            let record = crate::backend::LockKeys::new(super::PREFIX, key.clone()).record;
            let Some(until) = self.held_until(&record, &seen) else { return };
            let lease = until.saturating_duration_since(tokens.started);
            let slack = lease / 100 + Duration::from_millis(3) + 2 * self.config.normal_delay + back;
            if until.saturating_duration_since(now) <= slack {
                return;
            }
            held.push(format!("{key} for {:?} more", until - now));
        }
        self.violation(format!(
            "c{client} {name}: run returned Lost before its body started, with no fault since it began, while the store holds {}",
            held.join(", ")
        ));
    }

    /// Until when `record` is held for one of `tokens`: the primary's expiry; on a Redlock group, until when a
    /// majority holds it.
    fn held_until(&self, record: &str, tokens: &[String]) -> Option<Instant> {
        if let super::Model::Redlock(n) = self.config.model {
            let mut until: Vec<Instant> = self
                .peek_each(record)
                .into_iter()
                .filter_map(|s| s.filter(|(t, ..)| t.as_ref().is_some_and(|t| tokens.contains(t))))
                .map(|(.., expires)| expires)
                .collect();
            until.sort_unstable_by(|a, b| b.cmp(a));
            return until.get(n / 2).copied();
        }
        match self.peek(record) {
            Some((Some(holder), _, expires)) if tokens.contains(&holder) => Some(expires),
            _ => None,
        }
    }

    /// Whose grant `record` holds: the primary's record; on a Redlock group, a token a majority holds.
    fn held_by(&self, record: &str) -> Option<String> {
        if let super::Model::Redlock(n) = self.config.model {
            let seen = self.peek_each(record);
            let tokens = seen.iter().filter_map(|s| s.as_ref().and_then(|(t, ..)| t.clone()));
            return tokens.clone().find(|t| tokens.clone().filter(|u| u == t).count() > n / 2);
        }
        self.peek(record).and_then(|(holder, ..)| holder)
    }

    /// Where the store's truth was read, for messages: the primary and the servers' clocks.
    fn where_held(&self) -> String {
        if self.config.model.servers() <= 1 {
            return String::new();
        }
        let nodes = self.nodes();
        let primary = self.resolve(&nodes, super::wire::Target::Primary);
        let clocks: Vec<String> =
            nodes.iter().map(|n| format!("{} µs (follows {:?})", n.clock_offset_us, n.follows)).collect();
        format!(" (primary: server {primary}; clocks {})", clocks.join(", "))
    }
}
