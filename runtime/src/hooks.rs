//! Where the deterministic simulation (cargo feature `simulation`) takes over what would make a run
//! unrepeatable — OS randomness and the wall clock — and where it turns one of the fixes of issue 15 off to
//! show that it catches the bug the fix removed. Without the feature every function here is a constant.

/// A fix of issue 15 that a simulation can revert (test-only; never reverted outside a simulation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(not(feature = "simulation"), allow(unreachable_pub, reason = "public only through the simulation feature"))]
pub enum Fix {
    /// Leases come from the lease the server reported (its PTTL), not from the `ttl` the client asked for.
    LeaseFromServer,
    /// An announced hand-over is trusted only when its fencing token is above the last busy attempt's.
    FreshAnnouncement,
    /// `extend` waits for a renewal in flight, ignores a reply that came too late, and assumes the shorter
    /// lease when its outcome is unknown.
    SerializedExtend,
    /// A finished grant (released, or its lock body ended) reads as lost.
    FinishedIsLost,
    /// A guard lost by the clock alone still releases by token, and so does a grant the acquire gives back.
    ReleaseLostByClock,
}

/// Random bits from the simulation's seeded generator, when a simulation runs on this thread.
#[inline]
pub(crate) fn random_u64() -> Option<u64> {
    #[cfg(feature = "simulation")]
    return crate::simulation::hook_random_u64();
    #[cfg(not(feature = "simulation"))]
    None
}

/// Microseconds since the epoch on the simulated wall clock, when a simulation runs on this thread.
#[inline]
pub(crate) fn wall_clock_micros() -> Option<u128> {
    #[cfg(feature = "simulation")]
    return crate::simulation::hook_wall_clock_micros();
    #[cfg(not(feature = "simulation"))]
    None
}

/// Whether the simulation running on this thread reverted `fix`: always false outside a simulation.
#[inline]
pub(crate) fn reverted(fix: Fix) -> bool {
    #[cfg(feature = "simulation")]
    return crate::simulation::hook_reverted(fix);
    #[cfg(not(feature = "simulation"))]
    {
        let _ = fix;
        false
    }
}
