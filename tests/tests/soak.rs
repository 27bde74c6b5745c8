//! The randomized fault soak, Jepsen style (README "Testing", issue 15).
//!
//! Five worker processes (`soak_worker`), each with its own client behind its own [`FaultProxy`], lock three
//! keys in a loop with short ttls and waits, write their fencing tokens to a fenced register on a second
//! redis-server that no fault touches, and log every grant, `is_lost()` observation, register answer and
//! release as JSON lines on CLOCK_MONOTONIC. Meanwhile a seeded nemesis pauses workers (mostly right after
//! they said they are about to wait, were just granted, or are about to release, so pauses straddle
//! hand-overs and releases) and the lock server (SIGSTOP/SIGCONT), adds latency, resets, blackholes,
//! refuses and drops replies on connections, and kills and restarts workers and the lock server (which runs
//! with `--appendonly yes --appendfsync always`, so a restart keeps the lock records). Then the faults heal,
//! every worker must make progress, the workers are told to stop, and [`soak::check`] judges the history.
//!
//! `DISTLOCK_SOAK_SECS` sets the seconds of faults (default 30); `DISTLOCK_SOAK_SEED` the nemesis seed
//! (default: random; printed at the start, and with every failure).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use distlock_tests::agent::Agent;
use distlock_tests::proxy::{Fault, FaultProxy};
use distlock_tests::soak::{self, now_ns, rel, History, Incarnation, Rng};
use distlock_tests::sys::Stopped;
use distlock_tests::time::{ms, secs};
use distlock_tests::RedisServer;
use tokio::task::JoinSet;

const BIN: &str = env!("CARGO_BIN_EXE_soak_worker");
const WORKERS: usize = 5;
const KEYS: [&str; 3] = ["k0", "k1", "k2"];
/// Seconds of faults by default (CI): the whole test takes well under 90 s.
const DEFAULT_SECS: u64 = 30;
/// How long the healed system may take until every worker made progress.
const HEAL_LIMIT: Duration = Duration::from_secs(30);
/// How long a worker may take to exit once told to stop (a cycle is at most ~4 s).
const STOP_LIMIT: Duration = Duration::from_secs(20);

struct Worker {
    proxy: Arc<FaultProxy>,
    agent: Agent,
    inc: u32,
    /// Processes that ended: (incarnation, killed on purpose, exit code).
    ended: Vec<(u32, bool, Option<i32>)>,
}

struct Soak {
    seed: u64,
    rng: Rng,
    origin: u64,
    /// Logs and the stop file; kept when the test fails.
    dir: Option<tempfile::TempDir>,
    lock_server: RedisServer,
    register: RedisServer,
    workers: Vec<Worker>,
    /// What the nemesis did, with times relative to `origin`.
    nemesis: Vec<String>,
    /// Proxy faults waiting to heal.
    faults: JoinSet<()>,
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim();
    let parsed = match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => v.parse(),
    };
    Some(parsed.unwrap_or_else(|_| panic!("{name}={v:?} is not a number")))
}

impl Soak {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.as_ref().expect("the soak's directory").path().join(name)
    }

    fn log_path(&self, worker: usize, inc: u32) -> PathBuf {
        self.path(&format!("w{worker}.{inc}.jsonl"))
    }

    fn note(&mut self, t0: u64, what: String) {
        let line = format!("{} .. {} {what}", rel(t0, self.origin), rel(now_ns(), self.origin));
        self.nemesis.push(line);
    }

    fn spawn(&self, worker: usize, inc: u32, proxy: &FaultProxy) -> Agent {
        let args = vec![
            worker.to_string(),
            inc.to_string(),
            proxy.url(),
            self.register.url(),
            self.log_path(worker, inc).display().to_string(),
            self.path("stop").display().to_string(),
            (self.seed ^ ((worker as u64) << 40) ^ (u64::from(inc) << 20)).to_string(),
            KEYS.join(","),
        ];
        Agent::spawn(&format!("w{worker}#{inc}"), BIN, &args)
    }

    async fn start(seed: u64) -> Self {
        let origin = now_ns();
        let dir = tempfile::Builder::new().prefix("distlock-soak-").tempdir().expect("a temporary directory");
        let lock_server = RedisServer::with_args(["--appendonly", "yes", "--appendfsync", "always"]);
        let register = RedisServer::new();
        let mut soak = Soak {
            seed,
            rng: Rng::new(seed),
            origin,
            dir: Some(dir),
            lock_server,
            register,
            workers: Vec::new(),
            nemesis: Vec::new(),
            faults: JoinSet::new(),
        };
        for i in 0..WORKERS {
            let proxy = Arc::new(FaultProxy::to_port(soak.lock_server.port()).await);
            let agent = soak.spawn(i, 0, &proxy);
            soak.workers.push(Worker { proxy, agent, inc: 0, ended: Vec::new() });
        }
        for i in 0..WORKERS {
            if soak.workers[i].agent.wait_for("READY", secs(30)).await.is_none() {
                soak.note(now_ns(), format!("w{i} was not ready within 30 s"));
            }
        }
        soak
    }

    /// Starts the next process of worker `i` (after it was killed or crashed).
    fn respawn(&mut self, i: usize) {
        let inc = self.workers[i].inc + 1;
        let agent = self.spawn(i, inc, &self.workers[i].proxy);
        let w = &mut self.workers[i];
        w.agent = agent;
        w.inc = inc;
    }

    /// Restarts any worker that ended without being killed (a crash: the checker flags it).
    fn reap(&mut self) {
        for i in 0..WORKERS {
            if let Some(code) = self.workers[i].agent.try_exit() {
                let inc = self.workers[i].inc;
                self.workers[i].ended.push((inc, false, code));
                self.note(now_ns(), format!("w{i}#{inc} ended by itself with {code:?}; started again"));
                self.respawn(i);
            }
        }
    }

    /// A pause length: mostly 100-600 ms, often longer than the ttl (300-1000 ms).
    fn pause_length(&mut self) -> Duration {
        if self.rng.chance(35) {
            ms(self.rng.range(600, 1500))
        } else {
            ms(self.rng.range(100, 600))
        }
    }

    /// Runs one random fault; proxy faults heal in the background.
    async fn fault(&mut self) {
        self.reap();
        let t0 = now_ns();
        let roll = self.rng.range(0, 99);
        let i = self.rng.below(WORKERS);
        match roll {
            // Pause a worker at a cue: queued (a hand-over may come while it sleeps), just granted, about
            // to release.
            0..=41 => {
                let cue = match self.rng.range(0, 99) {
                    0..=44 => "WAITING",
                    45..=74 => "RELEASING",
                    _ => "HOLDING",
                };
                let delay = ms(self.rng.range(0, 40));
                let pause = self.pause_length();
                let agent = &mut self.workers[i].agent;
                agent.skip_printed().await;
                if agent.wait_for(cue, secs(3)).await.is_none() {
                    self.note(t0, format!("w{i}: no {cue} cue within 3 s"));
                    return;
                }
                tokio::time::sleep(delay).await;
                let stopped = self.workers[i].agent.stop();
                tokio::time::sleep(pause).await;
                stopped.resume();
                self.note(t0, format!("SIGSTOP w{i} {delay:?} after its {cue} cue, for {pause:?}"));
            }
            42..=47 => {
                let pause = self.pause_length();
                let stopped = self.workers[i].agent.stop();
                tokio::time::sleep(pause).await;
                stopped.resume();
                self.note(t0, format!("SIGSTOP w{i} at a random moment for {pause:?}"));
            }
            48..=55 => {
                let pause = self.pause_length();
                let pid = self.lock_server.pid().expect("the lock server runs");
                let stopped = Stopped::stop(pid);
                tokio::time::sleep(pause).await;
                stopped.resume();
                self.note(t0, format!("SIGSTOP redis-server for {pause:?}"));
            }
            56..=81 => {
                let all = self.rng.chance(25);
                let (fault, length) = match roll {
                    56..=62 => (Fault::Delay(ms(self.rng.range(20, 250))), ms(self.rng.range(300, 2000))),
                    63..=68 => (Fault::Reset, Duration::ZERO),
                    69..=74 => (Fault::Blackhole, ms(self.rng.range(200, 1500))),
                    75..=79 => (Fault::DropReplies, ms(self.rng.range(100, 800))),
                    _ => (Fault::Refuse, ms(self.rng.range(200, 1000))),
                };
                let targets: Vec<usize> = if all { (0..WORKERS).collect() } else { vec![i] };
                for &t in &targets {
                    let proxy = Arc::clone(&self.workers[t].proxy);
                    match fault {
                        Fault::Reset => proxy.reset_all(),
                        _ => {
                            if fault == Fault::Refuse {
                                proxy.reset_all();
                            }
                            proxy.set_fault(fault);
                            self.faults.spawn(async move {
                                tokio::time::sleep(length).await;
                                proxy.set_fault(Fault::Pass);
                            });
                        }
                    }
                }
                let whom = if all { String::from("every worker") } else { format!("w{i}") };
                self.note(t0, format!("proxy of {whom}: {fault:?} for {length:?}"));
            }
            82..=93 => {
                let down = ms(self.rng.range(0, 500));
                let inc = self.workers[i].inc;
                self.workers[i].agent.kill9().await;
                self.workers[i].ended.push((inc, true, None));
                tokio::time::sleep(down).await;
                self.respawn(i);
                self.note(t0, format!("SIGKILL w{i}#{inc}, started again {down:?} later"));
            }
            _ => {
                tokio::task::block_in_place(|| self.lock_server.restart());
                self.note(t0, String::from("SIGKILL redis-server, restarted (AOF)"));
            }
        }
    }

    /// Ends every fault; returns when that was.
    async fn heal(&mut self) -> u64 {
        self.faults.abort_all();
        while self.faults.join_next().await.is_some() {}
        for w in &self.workers {
            w.proxy.set_fault(Fault::Pass);
        }
        self.reap();
        let healed_at = now_ns();
        self.note(healed_at, String::from("HEAL: no more faults"));
        healed_at
    }

    fn read_log(&self, worker: usize, inc: u32) -> String {
        std::fs::read_to_string(self.log_path(worker, inc)).unwrap_or_default()
    }

    fn progressed(&self, worker: usize, since: u64) -> bool {
        (0..=self.workers[worker].inc).any(|inc| soak::progressed(&self.read_log(worker, inc), since))
    }

    /// Waits until every worker made progress since `since` (or the limit passes).
    async fn wait_for_progress(&mut self, since: u64) {
        let deadline = tokio::time::Instant::now() + HEAL_LIMIT;
        loop {
            self.reap();
            let pending: Vec<usize> = (0..WORKERS).filter(|&w| !self.progressed(w, since)).collect();
            if pending.is_empty() {
                return;
            }
            if tokio::time::Instant::now() >= deadline {
                self.note(since, format!("after the heal, no progress within {HEAL_LIMIT:?} by workers {pending:?}"));
                return;
            }
            tokio::time::sleep(ms(100)).await;
        }
    }

    /// Tells every worker to stop and waits for them; a worker that does not exit is killed (a hang).
    async fn stop(&mut self) {
        std::fs::write(self.path("stop"), b"stop").expect("write the stop file");
        for i in 0..WORKERS {
            let inc = self.workers[i].inc;
            let code = match self.workers[i].agent.exit_within(STOP_LIMIT).await {
                Some(code) => code,
                None => {
                    self.workers[i].agent.kill9().await;
                    self.note(now_ns(), format!("w{i}#{inc} did not exit within {STOP_LIMIT:?}; killed"));
                    None
                }
            };
            self.workers[i].ended.push((inc, false, code));
        }
    }

    async fn register_lists(&self) -> BTreeMap<String, Vec<u64>> {
        let mut conn = self.register.connection().await;
        let mut lists = BTreeMap::new();
        for key in KEYS {
            let (_, list) = soak::register_keys(key);
            let tokens: Vec<u64> =
                redis::cmd("LRANGE").arg(&list).arg(0).arg(-1).query_async(&mut conn).await.expect("LRANGE");
            lists.insert(key.to_owned(), tokens);
        }
        lists
    }

    fn history(&self, healed_at: u64, register: BTreeMap<String, Vec<u64>>) -> History {
        let mut incarnations = Vec::new();
        for (i, w) in self.workers.iter().enumerate() {
            for &(inc, killed, exit_code) in &w.ended {
                incarnations.push(Incarnation { worker: i, inc, log: self.read_log(i, inc), killed, exit_code });
            }
        }
        History { workers: WORKERS, incarnations, register, healed_at, origin: self.origin }
    }

    /// What to print when the soak fails: the seed, what the nemesis did, and the tail of every worker's log.
    fn failure_report(&mut self, verdict: &soak::Verdict) -> String {
        let mut out = format!(
            "soak FAILED with DISTLOCK_SOAK_SEED={} (times relative to the start of the run)\n{verdict}\n",
            self.seed
        );
        for v in &verdict.violations {
            for (worker, inc, tok) in &v.grants {
                out += &format!("--- w{worker}#{inc}'s log lines of grant {tok} ---\n");
                out += &soak::grant_lines(&self.read_log(*worker, *inc), tok);
            }
        }
        out += &format!("--- nemesis ({} actions) ---\n", self.nemesis.len());
        for line in &self.nemesis {
            out += &format!("    {line}\n");
        }
        for i in 0..WORKERS {
            let inc = self.workers[i].inc;
            out += &format!("--- tail of w{i}#{inc}'s log ---\n{}", soak::tail(&self.read_log(i, inc), 12));
        }
        let kept = self.dir.take().map(tempfile::TempDir::keep);
        if let Some(path) = kept {
            out += &format!("--- every worker's whole log is kept in {} ---\n", path.display());
        }
        out
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn randomized_faults_keep_mutual_exclusion_fencing_and_progress() {
    let fault_secs = env_u64("DISTLOCK_SOAK_SECS").unwrap_or(DEFAULT_SECS);
    let seed = env_u64("DISTLOCK_SOAK_SEED").unwrap_or_else(|| getrandom::u64().expect("OS randomness"));
    eprintln!(
        "soak: DISTLOCK_SOAK_SEED={seed} (set it to repeat this nemesis schedule), {fault_secs} s of faults, \
         {WORKERS} workers, keys {KEYS:?}"
    );
    // Everything the soak starts is killed when `soak` is dropped: on return, on panic, and on this timeout.
    let limit = secs(fault_secs) + HEAL_LIMIT + STOP_LIMIT + secs(60);
    let outcome = tokio::time::timeout(limit, async {
        let mut soak = Soak::start(seed).await;
        let started = tokio::time::Instant::now();
        let mut actions = 0;
        while started.elapsed() < secs(fault_secs) {
            soak.fault().await;
            actions += 1;
            let gap = ms(soak.rng.range(0, 250));
            tokio::time::sleep(gap).await;
        }
        let healed_at = soak.heal().await;
        soak.wait_for_progress(healed_at).await;
        soak.stop().await;
        let register = soak.register_lists().await;
        let history = soak.history(healed_at, register);
        let verdict = soak::check(&history);
        if !verdict.passed() {
            panic!("{}", soak.failure_report(&verdict));
        }
        eprintln!("soak: nemesis actions (times relative to the start):");
        for line in &soak.nemesis {
            eprintln!("    {line}");
        }
        eprintln!("soak: seed {seed}, {actions} nemesis actions, passed: {verdict}");
    })
    .await;
    assert!(outcome.is_ok(), "soak with DISTLOCK_SOAK_SEED={seed} did not finish within {limit:?}");
}
