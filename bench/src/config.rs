//! What a run of the benchmark measures, from its command line: scenarios, contenders, rounds, windows, added
//! round trips.

use std::time::Duration;

use crate::systems::Variant;

/// What to run, and for how long.
#[derive(Debug, Clone)]
pub struct Config {
    pub quick: bool,
    pub rounds: usize,
    pub one_task_window: Duration,
    pub many_tasks: usize,
    pub many_tasks_window: Duration,
    pub contention_window: Duration,
    pub held_sizes: Vec<usize>,
    pub held_ttl: Duration,
    pub wake_trials: usize,
    /// Scenario 6: how many waiters on one key, and how long each row is measured.
    pub waiter_counts: Vec<usize>,
    pub waiters_window: Duration,
    pub rslock_wake_trials: usize,
    pub variants: Vec<Variant>,
    pub scenarios: Vec<u8>,
    /// Scenario 2u (64 tasks, unpinned, 2 workers).
    pub unpinned_many: bool,
    /// Pin redis-server and the benchmark to different CPUs.
    pub pin: bool,
    /// Added round trips, one pass each.
    pub rtts: Vec<Hop>,
    /// Only measure round trips through the proxy at each `rtts`, and exit.
    pub proxy_check: bool,
    /// Only run the scale-out rows (Redlock, Redis Cluster), and exit.
    pub scale_out: bool,
    /// Only run the PostgreSQL rows, and exit.
    pub postgres: bool,
}

/// One pass's network: loopback, or through the benchmark's delay proxy adding `rtt_ms` (which may be 0: the
/// proxy's own hop, which costs CPU on this machine's two cores).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hop {
    pub rtt_ms: f64,
    pub proxied: bool,
}

impl Hop {
    const LOOPBACK: Hop = Hop { rtt_ms: 0.0, proxied: false };

    /// `0`: loopback; `+0`: the proxy with no delay; `0.25`, `+0.25`: the proxy adding that round trip.
    fn parse(s: &str) -> Option<Self> {
        let s = s.trim();
        let rtt_ms = s.trim_start_matches('+').parse::<f64>().ok().filter(|ms| (0.0..=100.0).contains(ms))?;
        Some(Hop { rtt_ms, proxied: rtt_ms > 0.0 || s.starts_with('+') })
    }
}

impl Config {
    fn new(quick: bool) -> Self {
        let all = vec![Variant::Raw, Variant::Api, Variant::Run, Variant::Macro, Variant::Rslock, Variant::Fenced];
        if quick {
            Self {
                quick,
                rounds: 2,
                one_task_window: Duration::from_millis(300),
                many_tasks: 64,
                many_tasks_window: Duration::from_millis(400),
                contention_window: Duration::from_millis(800),
                held_sizes: vec![1_000, 10_000],
                held_ttl: Duration::from_secs(3),
                wake_trials: 5,
                waiter_counts: vec![10, 1_000],
                waiters_window: Duration::from_millis(300),
                rslock_wake_trials: 5,
                variants: all,
                scenarios: vec![1, 2, 3, 4, 5, 6],
                unpinned_many: true,
                pin: true,
                rtts: vec![Hop::LOOPBACK],
                proxy_check: false,
                scale_out: false,
                postgres: false,
            }
        } else {
            Self {
                quick,
                rounds: 5,
                one_task_window: Duration::from_millis(2000),
                many_tasks: 64,
                many_tasks_window: Duration::from_millis(1200),
                contention_window: Duration::from_millis(1500),
                held_sizes: vec![1_000, 10_000, 100_000],
                held_ttl: Duration::from_secs(30),
                wake_trials: 20,
                waiter_counts: vec![10, 1_000, 10_000],
                waiters_window: Duration::from_secs(2),
                rslock_wake_trials: 10,
                variants: all,
                scenarios: vec![1, 2, 3, 4, 5, 6],
                unpinned_many: true,
                pin: true,
                rtts: vec![Hop::LOOPBACK],
                proxy_check: false,
                scale_out: false,
                postgres: false,
            }
        }
    }

    pub fn command_line(&self) -> String {
        let args: Vec<String> = std::env::args().skip(1).collect();
        if args.is_empty() {
            "cargo run --release -p distlock-bench".to_owned()
        } else {
            format!("cargo run --release -p distlock-bench -- {}", args.join(" "))
        }
    }
}

pub const USAGE: &str =
    "usage: distlock-bench [--quick] [--rounds N] [--only 1,2,2u,3,4,5,6] [--variants raw,api,run,macro,rslock,fenced]
                      [--no-pin] [--rtt MS[,MS...]] [--proxy-check] [--scale-out] [--postgres]
  --quick        short smoke run (under 30 s): 2 rounds, short windows, 1k/10k held locks with ttl 3 s
  --rounds N     rounds for scenarios 1-3 (default 5; 2 with --quick)
  --only LIST    run only these scenarios (2u: scenario 2 unpinned, client on a 2-worker runtime)
  --variants L   contenders for scenarios 1-2 (raw, api, run, macro, rslock, fenced: the least fenced cycle by
                 script, a bound); scenario 3 runs raw, distlock
                 (if api/run/macro is listed) and rslock (if listed)
  --no-pin       do not pin redis-server and the benchmark to different CPUs
  --rtt LIST     added round trips in ms (e.g. 0,+0,0.25,0.5,1; 0 = loopback, +0 = through the proxy with no
                 delay): one pass each, every contender through the benchmark's delay proxy (half the round
                 trip each way); scenarios 4 and 5 run in the first pass only; a summary table compares the
                 passes
  --proxy-check  measure PING round trips through the proxy at each --rtt (and the hop alone), then exit
  --scale-out    only the scale-out rows: distlock on Redlock (3 and 5 servers) against rslock's Redlock, and
                 on a 3-primary Redis Cluster against raw SET NX PX + EVALSHA on the crate's cluster client;
                 1 and 64 tasks; --rounds and --quick apply
  --postgres     only the PostgreSQL rows, on a private server: distlock against INSERT … ON CONFLICT + DELETE
                 and against advisory locks, 1 and 64 tasks, then the hand-off on one key";

pub fn parse_args() -> Result<Config, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut config = Config::new(args.iter().any(|a| a == "--quick"));
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().cloned().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--quick" => {}
            "--no-pin" => config.pin = false,
            "--rounds" => {
                config.rounds = value("--rounds")?.parse().map_err(|e| format!("--rounds: {e}"))?;
                if config.rounds == 0 || config.rounds > 50 {
                    return Err("--rounds must be 1..=50".into());
                }
            }
            "--only" => {
                let list = value("--only")?;
                config.unpinned_many = list.split(',').any(|s| s.trim() == "2u");
                config.scenarios = list
                    .split(',')
                    .filter(|s| s.trim() != "2u")
                    .map(|s| s.trim().parse::<u8>().ok().filter(|n| (1..=6).contains(n)))
                    .collect::<Option<_>>()
                    .ok_or("--only takes scenario numbers 1-6 and 2u")?;
            }
            "--rtt" => {
                config.rtts =
                    value("--rtt")?.split(',').map(Hop::parse).collect::<Option<_>>().ok_or(
                        "--rtt takes round trips in ms, 0 to 100, e.g. 0,+0,0.25,0.5,1 (+0: the proxy, no delay)",
                    )?;
                if config.rtts.is_empty() {
                    return Err("--rtt needs at least one round trip".into());
                }
            }
            "--proxy-check" => config.proxy_check = true,
            "--scale-out" => config.scale_out = true,
            "--postgres" => config.postgres = true,
            "--variants" => {
                config.variants = value("--variants")?
                    .split(',')
                    .map(|s| Variant::parse(s.trim()).ok_or(format!("unknown variant {s:?}")))
                    .collect::<Result<_, _>>()?;
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(config)
}
