//! Process signals for fault tests, through the `kill` command (no unsafe code): freeze a process with
//! SIGSTOP, thaw it with SIGCONT, kill it with SIGKILL.

use std::process::Command;
use std::time::{Duration, Instant};

/// Sends `signal` (a name such as `STOP`, `CONT`, `KILL`) to process `pid`, panicking if `kill` fails.
pub fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .unwrap_or_else(|e| panic!("cannot run `kill -{signal} {pid}`: {e}"));
    assert!(status.success(), "`kill -{signal} {pid}` failed: {status}");
}

/// The one-letter state of process `pid` from `/proc/<pid>/stat` (`R`, `S`, `T` stopped, `Z` zombie...), or
/// `None` when there is no such process.
pub fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces: the state follows the last ')'.
    stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next())
}

/// A process frozen with SIGSTOP; [`resume`](Stopped::resume) or dropping it sends SIGCONT (also when the
/// test panics, so a frozen server never outlives a failed test).
#[derive(Debug)]
pub struct Stopped {
    pid: u32,
    resumed: bool,
}

impl Stopped {
    /// Sends SIGSTOP to `pid` and waits (up to 5 s) until the kernel reports it stopped.
    pub fn stop(pid: u32) -> Self {
        signal(pid, "STOP");
        let stopped = Self { pid, resumed: false };
        let deadline = Instant::now() + Duration::from_secs(5);
        while process_state(pid) != Some('T') {
            assert!(Instant::now() < deadline, "process {pid} did not stop: state {:?}", process_state(pid));
            std::thread::sleep(Duration::from_millis(1));
        }
        stopped
    }

    /// The stopped process.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Sends SIGCONT.
    pub fn resume(mut self) {
        self.cont();
    }

    fn cont(&mut self) {
        if !self.resumed {
            self.resumed = true;
            // The process may be gone already (killed while stopped): nothing to resume then.
            let _ = Command::new("kill").arg("-CONT").arg(self.pid.to_string()).status();
        }
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        self.cont();
    }
}
