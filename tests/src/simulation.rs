//! The deterministic simulation's workload and runner (issues 19 and 32; the simulated store, fault layer and
//! oracle are `distlock::simulation`, behind the runtime's `simulation` feature).
//!
//! [`run_one`] runs the workload of issue 32 ([`workload`]): the whole public API, from three to five clients
//! on one to four keys, on every store model. [`run_classic`] and [`run_classic_on`] run issue 19's (module
//! `classic`), unchanged, for the regression seeds found in it and for the Lua mutation report. Both use only the public API and [`Sim`], so they run on any store
//! model behind it.

mod bodies;
mod classic;
mod workload;

use std::ops::Range;

use distlock::simulation::{self, Config, Model, Report, Sim};
pub use workload::workload;

/// What a run of many schedules found.
#[derive(Debug, Default)]
pub struct Summary {
    pub schedules: u64,
    pub faults: u64,
    pub violations: u64,
    /// The failing seeds, each with its first violation, in seed order.
    pub failing: Vec<(u64, String)>,
}

/// Runs schedule `seed`, tracing every step if `trace`.
pub fn run_one(seed: u64, trace: bool) -> Report {
    run_one_on(Model::Memory, seed, trace)
}

/// Runs schedule `seed` on the store `model`: the whole-API workload, or issue 19's with `SIM_WORKLOAD=classic`.
pub fn run_one_on(model: Model, seed: u64, trace: bool) -> Report {
    if std::env::var("SIM_WORKLOAD").is_ok_and(|w| w == "classic") {
        return run_classic_on(model, seed, trace);
    }
    let mut config = config(model, seed, trace);
    config.clients = clients(seed);
    simulation::run(config, workload)
}

/// Runs schedule `seed` of issue 19's workload on the store `model`, as the regression seeds found in it on
/// the models with simulated servers were found (it was their default until the whole-API workload ran
/// clean there).
pub fn run_classic_on(model: Model, seed: u64, trace: bool) -> Report {
    simulation::run(config(model, seed, trace), classic::workload)
}

fn config(model: Model, seed: u64, trace: bool) -> Config {
    let mut config = Config::new(seed);
    // Redlock's schedules alternate between groups of 3 and 5 servers.
    config.model = match model {
        Model::Redlock(_) => Model::Redlock(if seed.is_multiple_of(2) { 3 } else { 5 }),
        other => other,
    };
    config.trace = trace;
    config
}

/// The first schedule of `seeds` of the whole-API workload on `model` that the oracle faults, with its first
/// violation, with the simulated servers running the scripts as `mutant` has them (two threads).
pub fn first_failing(
    model: Model,
    seeds: Range<u64>,
    mutant: Option<distlock::simulation::LuaMutant>,
) -> Option<(u64, String)> {
    let run = |seed: u64| {
        let mut config = config(model, seed, false);
        config.clients = clients(seed);
        config.lua_mutant = mutant.clone();
        simulation::run(config, workload).violations.first().map(|v| (seed, v.clone()))
    };
    let found = on_threads(seeds, 2, run, |found| found.is_some());
    found.into_iter().find_map(|(_, found)| found)
}

/// Waits for every user task of a workload: a task cancelled is one whose client crashed; a panic is a
/// violation.
async fn join_users(sim: &Sim, tasks: Vec<tokio::task::JoinHandle<()>>) {
    for task in tasks {
        match task.await {
            Ok(()) => {}
            Err(e) if e.is_cancelled() => {}
            Err(e) => sim.violation(format!("a task panicked: {e}")),
        }
    }
}

/// Runs schedule `seed` of issue 19's workload on the memory store, as [`run_one`] ran it when its regression
/// seeds were found.
pub fn run_classic(seed: u64, trace: bool) -> Report {
    run_classic_on(Model::Memory, seed, trace)
}

/// How many clients schedule `seed` has: three, or in a fifth of the schedules four or five. Drawn from the
/// seed by a mix of its own, not from the schedule's generator, which the world is built before.
fn clients(seed: u64) -> usize {
    // splitmix64's finalizer: neighbouring seeds get unrelated draws.
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    if z.is_multiple_of(5) {
        4 + (z / 5 % 2) as usize
    } else {
        3
    }
}

/// Runs the schedules of `seeds` on `threads` threads; with `stop_early`, the threads stop at the first
/// failing seed.
pub fn run_many(seeds: Range<u64>, threads: u64, stop_early: bool) -> Summary {
    run_many_on(Model::Memory, seeds, threads, stop_early)
}

/// [`run_many`] on the store `model`.
pub fn run_many_on(model: Model, seeds: Range<u64>, threads: u64, stop_early: bool) -> Summary {
    let run = |seed| {
        let report = run_one_on(model, seed, false);
        (report.faults, report.violations.len() as u64, report.violations.into_iter().next())
    };
    let results = on_threads(seeds, threads, run, |(_, _, first)| stop_early && first.is_some());
    let mut total = Summary::default();
    for (seed, (faults, violations, first)) in results {
        total.schedules += 1;
        total.faults += faults;
        total.violations += violations;
        total.failing.extend(first.map(|first| (seed, first)));
    }
    total
}

/// Runs `run` on each seed of `seeds` on `threads` threads, each thread claiming the next seed not yet
/// claimed: schedules differ in cost (Redlock's odd seeds run on 5 servers, its even ones on 3), so a fixed
/// split would leave one thread the longer share. Once `stop` holds for a result no seed is claimed any more.
/// The results, in seed order.
fn on_threads<T: Send>(
    seeds: Range<u64>,
    threads: u64,
    run: impl Fn(u64) -> T + Sync,
    stop: impl Fn(&T) -> bool + Sync,
) -> Vec<(u64, T)> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let (next, stopped) = (AtomicU64::new(seeds.start), AtomicBool::new(false));
    let mut results: Vec<(u64, T)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads.max(1))
            .map(|_| {
                scope.spawn(|| {
                    let mut results = Vec::new();
                    while !stopped.load(Ordering::Relaxed) {
                        let seed = next.fetch_add(1, Ordering::Relaxed);
                        if seed >= seeds.end {
                            break;
                        }
                        let result = run(seed);
                        if stop(&result) {
                            stopped.store(true, Ordering::Relaxed);
                        }
                        results.push((seed, result));
                    }
                    results
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().expect("a simulation thread panicked")).collect()
    });
    results.sort_by_key(|(seed, _)| *seed);
    results
}
