//! Measuring helpers: CPU time, resident memory, percentiles and medians, and the server's INFO counters.

use std::collections::HashMap;
use std::time::Duration;

/// This process's CPU time (user + system, all threads), with nanosecond resolution.
pub fn cpu_now() -> Duration {
    cpu_time::ProcessTime::now().as_duration()
}

/// Linux's USER_HZ: the unit of utime/stime in `/proc/<pid>/stat` (100 on every mainstream kernel).
const TICKS_PER_SECOND: f64 = 100.0;

/// Another process's CPU time (user + system) from `/proc/<pid>/stat`, at 10 ms resolution.
pub fn process_cpu(pid: u32) -> Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Duration::ZERO;
    };
    // The command name (field 2) may hold spaces; the fields after its closing parenthesis are plain.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return Duration::ZERO;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Field 3 (state) is fields[0]; utime is field 14, stime field 15.
    let ticks: u64 = [11, 12].iter().filter_map(|&i| fields.get(i)?.parse::<u64>().ok()).sum();
    Duration::from_secs_f64(ticks as f64 / TICKS_PER_SECOND)
}

/// Resident memory of this process in bytes (/proc/self/statm, 4 KiB pages).
pub fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// The `p`-th percentile (0–100) of `sorted` (nearest rank), as microseconds.
pub fn percentile_us(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    f64::from(sorted[rank.clamp(1, sorted.len()) - 1]) / 1000.0
}

/// Median of the finite values (NaN when there are none).
pub fn median(values: impl IntoIterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

/// A duration as nanoseconds in a `u32` (saturating at ~4.3 s), for latency samples.
pub fn ns32(d: Duration) -> u32 {
    u32::try_from(d.as_nanos()).unwrap_or(u32::MAX)
}

/// The server's command counters at one moment.
#[derive(Debug, Clone, Default)]
pub struct ServerCounters {
    /// `total_commands_processed` (counts the commands run inside scripts too).
    pub total: u64,
    /// `cmdstat_<name>` → calls.
    pub calls: HashMap<String, u64>,
    /// `cmdstat_<name>` → microseconds spent in the command (a script's time includes its inner calls).
    pub usec: HashMap<String, u64>,
    /// `expired_keys`: keys deleted because their expiry passed.
    pub expired_keys: u64,
}

impl ServerCounters {
    /// Reads INFO stats and INFO commandstats (two commands, both counted by the server).
    pub async fn read(conn: &mut redis::aio::MultiplexedConnection) -> redis::RedisResult<Self> {
        let stats: String = redis::cmd("INFO").arg("stats").query_async(conn).await?;
        let commandstats: String = redis::cmd("INFO").arg("commandstats").query_async(conn).await?;
        let stat = |name: &str| {
            stats.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.trim().parse().ok()).unwrap_or(0)
        };
        let (total, expired_keys) = (stat("total_commands_processed"), stat("expired_keys"));
        let field = |key: &str| -> HashMap<String, u64> {
            commandstats
                .lines()
                .filter_map(|l| {
                    let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
                    let value = rest.split(',').find_map(|kv| kv.strip_prefix(key))?.parse().ok()?;
                    Some((name.to_owned(), value))
                })
                .collect()
        };
        Ok(Self { total, calls: field("calls="), usec: field("usec="), expired_keys })
    }

    /// Microseconds spent in the commands the contenders send (SET, EVALSHA, EVAL) since `earlier`. A
    /// script's time includes the commands it calls, which are also counted under their own names: those are
    /// left out.
    pub fn usec_delta(&self, earlier: &Self) -> u64 {
        ["set", "evalsha", "eval"]
            .iter()
            .map(|&name| {
                let now = self.usec.get(name).copied().unwrap_or(0);
                now.saturating_sub(earlier.usec.get(name).copied().unwrap_or(0))
            })
            .sum()
    }

    /// Prints (to stderr) each command's calls and server time per cycle since `earlier`, for profiling.
    pub fn print_per_cycle(&self, earlier: &Self, what: &str, cycles: u64) {
        let cycles = cycles.max(1) as f64;
        let mut names: Vec<&String> = self.calls.keys().filter(|n| self.delta(earlier, n) > 0).collect();
        names.sort();
        eprintln!("    server commands per cycle, {what}:");
        for name in names {
            let usec =
                self.usec.get(name).copied().unwrap_or(0).saturating_sub(earlier.usec.get(name).copied().unwrap_or(0));
            eprintln!(
                "      {name:<12} {:>6.2} calls {:>7.2} µs",
                self.delta(earlier, name) as f64 / cycles,
                usec as f64 / cycles
            );
        }
    }

    /// Calls of `name` since `earlier`.
    pub fn delta(&self, earlier: &Self, name: &str) -> u64 {
        self.calls.get(name).copied().unwrap_or(0).saturating_sub(earlier.calls.get(name).copied().unwrap_or(0))
    }
}
