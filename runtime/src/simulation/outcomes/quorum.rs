//! The oracle's release outcomes on a Redlock group. Each server keeps its own record and a release is a round
//! over them, so an outcome is true when the servers' records make it so for a quorum (as the round decides:
//! `redlock/mod.rs`, `release_verdict`), judged per server by the rules `could_be` applies to one store.

use tokio::time::Instant;

use super::{resent_after_ours, Applied, Found};
use crate::simulation::World;
use crate::ReleaseOutcome;

impl World {
    /// Whether `outcome` can be true of the release of `token` at `record` that ran `during` (from, to) on a
    /// group of `n` servers; `sent_nothing`: its grant was one a round had said was gone.
    pub(super) fn could_be_on_a_quorum(
        &self,
        n: usize,
        record: &str,
        token: &str,
        during: (Instant, Instant),
        outcome: ReleaseOutcome,
        sent_nothing: bool,
    ) -> bool {
        let ((from, to), quorum) = (during, n / 2 + 1);
        let state = self.state();
        let all = state.truth.releases.get(token).map_or(&[][..], Vec::as_slice);
        let on = |node: usize, since: Instant| -> Vec<Applied> {
            all.iter().filter(|a| a.node == node && a.at >= since && a.at <= to).copied().collect()
        };
        match outcome {
            // A quorum's records freed by a release of this grant: this one's, an earlier send of it, or the
            // engine's give-back since the token's last acquire attempt on that server (a renewal takes a
            // lapsed record again, server by server; as on one store).
            ReleaseOutcome::Released => {
                let since = |node: usize| {
                    let attempted = state.truth.attempted.get(&(token.to_owned(), node));
                    attempted.map_or(from, |&(at, _)| at.min(from))
                };
                (0..n).filter(|&node| on(node, since(node)).iter().any(|a| a.found == Found::Ours)).count() >= quorum
            }
            // A server that found another token's record (not after a send of ours had freed it there).
            ReleaseOutcome::TakenByOther => (0..n).any(|node| {
                let found = on(node, from);
                !resent_after_ours(&found) && found.iter().any(|a| a.found == Found::Other)
            }),
            ReleaseOutcome::Unconfirmed => all.iter().any(|a| a.at >= from && a.at <= to && a.resent),
            ReleaseOutcome::Nested => false,
            // More than `n - quorum` servers without the grant, each one whose release found no record (not
            // after a send of ours had freed it there), or, unreached, holds none now: then no quorum held it.
            // A server that failed while holding it, or whose record a send of ours freed before a resend
            // found nothing, may be part of a quorum that still held it: the round must say so, not Expired.
            // No send of it found nothing anywhere: then it must have sent nothing, a round having said the grant
            // gone (a renewal that found no quorum holding it, or a shutdown's release; grant.rs), and what the
            // store applied meanwhile is the engine's give-back, in the background, of what that renewal took
            // again, or the shutdown's release.
            ReleaseOutcome::Expired => {
                let reached: Vec<Vec<Applied>> = (0..n).map(|node| on(node, from)).collect();
                drop(state);
                if !reached.iter().flatten().any(|a| a.found == Found::Nobody) {
                    return sent_nothing;
                }
                let gone = reached
                    .iter()
                    .enumerate()
                    .filter(|(node, found)| match found.is_empty() {
                        false => !resent_after_ours(found) && found.iter().any(|a| a.found == Found::Nobody),
                        true => self.found_on(*node, record, token) != Found::Ours,
                    })
                    .count();
                gone > n - quorum
            }
        }
    }
}
