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

/// Spawns a task of the engine's on the current runtime. In a simulation, the task belongs to the simulated
/// client whose task spawned it, and makes no progress while that client is stalled (a stall stops the
/// client's own code — its renewer, its timers — not only its I/O).
#[inline]
pub(crate) fn spawn<F>(task: F) -> tokio::task::JoinHandle<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    #[cfg(feature = "simulation")]
    return tokio::spawn(crate::simulation::owned(task));
    #[cfg(not(feature = "simulation"))]
    tokio::spawn(task)
}

/// [`spawn`] on `runtime`.
#[inline]
pub(crate) fn spawn_on<F>(runtime: &tokio::runtime::Handle, task: F) -> tokio::task::JoinHandle<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    #[cfg(feature = "simulation")]
    return runtime.spawn(crate::simulation::owned(task));
    #[cfg(not(feature = "simulation"))]
    runtime.spawn(task)
}
