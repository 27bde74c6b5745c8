//! A [`RedisServer`] whose wall clock the test steps ([`RedisServer::with_stepped_clock`]).
//!
//! The server runs with `LD_PRELOAD` set to a small shim (`clock_shim.c`, compiled with `cc` once per test
//! binary) that replaces `clock_gettime`, `gettimeofday` and `time`: `CLOCK_REALTIME` and
//! `CLOCK_REALTIME_COARSE` read the real clock plus an offset, every other clock passes through. The offset
//! lives in a 16-byte file in the server's directory, which the shim maps `MAP_SHARED` and reads on every call
//! and the test rewrites with one `pwrite` ([`RedisServer::step_clock`]): bytes 0..8 the offset in
//! nanoseconds (native endianness, positive = ahead), bytes 8..16 its bitwise complement, so the shim never
//! takes a half-written offset. libfaketime is not used: it hangs at start-up under redis-server's jemalloc
//! (its wrappers look the real functions up with `dlsym`, re-entering the allocator); the shim never calls
//! `dlsym` or allocates, it asks the kernel with `syscall(2)`.
//!
//! Redis reads the wall clock for `TIME`, key expiry (`PX`, `PEXPIREAT`, `PTTL`), `mstime()` and its log lines;
//! its monotonic clock (timeouts, latency) is unaffected. A step takes effect at the server's next clock read.
//! The kernel still times `pthread_cond_timedwait` deadlines by the real clock: a thread that computes one from
//! the shifted clock (jemalloc's background purging thread does) wakes early or late by the offset.

use std::ffi::OsString;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use crate::server::default_binary;
use crate::RedisServer;

/// The shim's C source.
const SHIM_SOURCE: &str = include_str!("clock_shim.c");
/// The variable that tells the shim where the offset file is (`OFFSET_FILE_VAR` in the shim).
const OFFSET_FILE_VAR: &str = "DISTLOCK_CLOCK_OFFSET_FILE";
/// The offset file's and the shim's names in the server's directory.
const OFFSET_FILE: &str = "clock-offset";
const SHIM_FILE: &str = "clockshim.so";
/// What a test that needs the stepped clock prints when there is no C compiler to build the shim with.
pub const NO_C_COMPILER: &str = "skipped: no C compiler (install build-essential)";

impl RedisServer {
    /// Starts a server (as [`new`](Self::new) does) whose wall clock the test steps with
    /// [`step_clock`](Self::step_clock); it starts at the real time (offset 0).
    ///
    /// Returns `None`, after printing why to stderr (uncaptured, so it shows in a passing run's output), when
    /// the shim cannot be built: no `cc` on `PATH` ([`NO_C_COMPILER`]), or not Linux. A test skips with
    /// `let Some(server) = RedisServer::with_stepped_clock() else { return };`. Panics if `cc` exists but
    /// fails to compile the shim, or if the server does not start.
    pub fn with_stepped_clock() -> Option<Self> {
        Self::with_stepped_clock_args(Vec::<String>::new())
    }

    /// [`with_stepped_clock`](Self::with_stepped_clock) with extra `redis-server` arguments (as
    /// [`with_args`](Self::with_args)).
    pub fn with_stepped_clock_args<I, S>(args: I) -> Option<Self>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let shim = match shim() {
            Ok(shim) => shim,
            Err(reason) => {
                // Straight to stderr: the test harness captures `eprintln!` of passing tests.
                let _ = writeln!(io::stderr(), "{reason}");
                return None;
            }
        };
        let args = args.into_iter().map(Into::into).collect();
        Some(Self::start_in(default_binary(), args, None, |dir| prepare(dir, shim)))
    }

    /// Steps the server's wall clock by `by_ms` milliseconds: forward when positive, back when negative.
    /// Panics unless the server was started with [`with_stepped_clock`](Self::with_stepped_clock).
    pub fn step_clock(&self, by_ms: i64) {
        self.set_clock_offset(self.clock_offset() + by_ms);
    }

    /// Sets the server's wall clock to the real time plus `offset_ms` milliseconds (negative: behind).
    /// Panics unless the server was started with [`with_stepped_clock`](Self::with_stepped_clock).
    pub fn set_clock_offset(&self, offset_ms: i64) {
        let ns = offset_ms.checked_mul(1_000_000).unwrap_or_else(|| panic!("clock offset {offset_ms} ms is too large"));
        let mut pair = [0; 16];
        pair[..8].copy_from_slice(&ns.to_ne_bytes());
        pair[8..].copy_from_slice(&(!ns).to_ne_bytes());
        let path = self.offset_file();
        // One write of both halves: the shim retries a read that finds them not matching.
        fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|file| file.write_all_at(&pair, 0))
            .unwrap_or_else(|e| panic!("cannot write the clock offset to {}: {e}", path.display()));
    }

    /// The server's wall-clock offset from the real time, in milliseconds (negative: behind).
    /// Panics unless the server was started with [`with_stepped_clock`](Self::with_stepped_clock).
    pub fn clock_offset(&self) -> i64 {
        let path = self.offset_file();
        let mut pair = [0; 16];
        fs::File::open(&path)
            .and_then(|file| file.read_exact_at(&mut pair, 0))
            .unwrap_or_else(|e| panic!("cannot read the clock offset from {}: {e}", path.display()));
        let ns = i64::from_ne_bytes(pair[..8].try_into().expect("8 bytes"));
        ns / 1_000_000
    }

    fn offset_file(&self) -> PathBuf {
        assert!(
            self.env.iter().any(|(name, _)| *name == OFFSET_FILE_VAR),
            "this redis-server has no stepped clock: start it with RedisServer::with_stepped_clock"
        );
        self.dir().join(OFFSET_FILE)
    }
}

/// Writes the shim and a zero offset into the server's directory `dir`; returns the server's environment.
/// The shim is copied into each server's directory so that it lives exactly as long as the server (restarts
/// included) and needs no cleanup of its own.
fn prepare(dir: &Path, shim: &[u8]) -> io::Result<Vec<(&'static str, OsString)>> {
    let shim_path = dir.join(SHIM_FILE);
    let offset_path = dir.join(OFFSET_FILE);
    // LD_PRELOAD splits its list on spaces and colons.
    let text = shim_path.to_string_lossy();
    if text.contains([' ', ':']) {
        return Err(io::Error::other(format!("{text}: LD_PRELOAD cannot name a path with a space or colon")));
    }
    fs::write(&shim_path, shim)?;
    let mut zero = [0; 16];
    zero[8..].copy_from_slice(&(!0i64).to_ne_bytes());
    fs::write(&offset_path, zero)?;
    Ok(vec![("LD_PRELOAD", shim_path.into_os_string()), (OFFSET_FILE_VAR, offset_path.into_os_string())])
}

/// The compiled shim, built once per process; `Err` is why it cannot be (the test skips).
fn shim() -> Result<&'static [u8], &'static str> {
    static SHIM: OnceLock<Result<Vec<u8>, &'static str>> = OnceLock::new();
    SHIM.get_or_init(compile).as_deref().map_err(|reason| *reason)
}

fn compile() -> Result<Vec<u8>, &'static str> {
    if !cfg!(target_os = "linux") {
        return Err("skipped: the stepped clock is an LD_PRELOAD shim for Linux");
    }
    let dir = tempfile::Builder::new()
        .prefix("distlock-clockshim-")
        .tempdir()
        .unwrap_or_else(|e| panic!("cannot create a temporary directory for the clock shim: {e}"));
    let source = dir.path().join("clock_shim.c");
    let output = dir.path().join(SHIM_FILE);
    fs::write(&source, SHIM_SOURCE).unwrap_or_else(|e| panic!("cannot write {}: {e}", source.display()));
    let result = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-o"])
        .arg(&output)
        .arg(&source)
        .stdin(Stdio::null())
        .output();
    match result {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(NO_C_COMPILER),
        Err(e) => panic!("cannot run cc to build the clock shim: {e}"),
        Ok(out) if !out.status.success() => panic!(
            "cc failed to build the clock shim ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        Ok(_) => Ok(fs::read(&output).unwrap_or_else(|e| panic!("cannot read {}: {e}", output.display()))),
    }
}
