//! Where the deterministic simulation (cargo feature `simulation`) takes over what would make a run
//! unrepeatable — OS randomness, the wall clock, the tasks a stalled client owns. Without the feature every
//! function here is a constant or the plain tokio call.

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
