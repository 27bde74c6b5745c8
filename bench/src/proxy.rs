//! `--rtt`: a userspace TCP delay proxy, so that every contender reaches redis-server across the same
//! network hop (netem is not available here).
//!
//! Every chunk read from either side is written to the other side `one_way` after it arrived, in the order
//! it arrived (per direction, and across connections: the delay is the same for all). Reader threads block in
//! `read`; one release thread writes every chunk: it sleeps, with a timer slack of 1 ns, until shortly before
//! the next chunk is due, then spins the rest, and learns how late its sleeps wake so the spin stays short.
//! The proxy's threads may run on every CPU (the network belongs to neither client nor server), and its own
//! sockets have Nagle off, so it adds no delay of its own beyond a loopback hop. `--proxy-check` measures
//! what a round trip through it costs, and how late chunks left.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

/// Lateness samples kept (ns each): enough for the percentiles of a run.
const LATENESS_SAMPLES: usize = 1 << 20;
/// The spin before a chunk is due starts at this, and adapts to how late sleeps wake.
const FIRST_MARGIN: Duration = Duration::from_micros(50);
const MAX_MARGIN: Duration = Duration::from_micros(400);

/// A delay proxy on a free loopback port in front of `upstream`. Dropping it stops it and closes its
/// connections.
pub struct DelayProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for DelayProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DelayProxy").field("addr", &self.addr).field("one_way", &self.shared.one_way).finish()
    }
}

/// What the proxy did so far.
#[derive(Debug, Clone, Default)]
pub struct ProxyStats {
    pub connections: u64,
    /// Chunks forwarded client → server and server → client.
    pub chunks_up: u64,
    pub chunks_down: u64,
    /// How late each chunk was written after it was due (ns, sorted).
    pub lateness: Vec<u32>,
}

struct Chunk {
    due: Instant,
    to: Arc<TcpStream>,
    /// `None`: the other side closed; shut this side's writing down (after the delay, like the FIN).
    data: Option<Vec<u8>>,
}

struct Shared {
    one_way: Duration,
    queue: Mutex<VecDeque<Chunk>>,
    ready: Condvar,
    stop: AtomicBool,
    connections: AtomicU64,
    chunks_up: AtomicU64,
    chunks_down: AtomicU64,
    lateness: Mutex<Vec<u32>>,
    streams: Mutex<Vec<Weak<TcpStream>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Lets the calling thread run on every CPU of the machine, whatever the process is pinned to.
pub fn run_anywhere(cores: usize) {
    let mut all = rustix::thread::CpuSet::new();
    for cpu in 0..cores {
        all.set(cpu);
    }
    let _ = rustix::thread::sched_setaffinity(None, &all);
}

impl DelayProxy {
    /// Starts forwarding to `upstream` with `one_way` added each way (a round trip gains twice that).
    /// `cores`: the machine's CPUs, all of which its threads may use.
    pub fn start(upstream: SocketAddr, one_way: Duration, cores: usize) -> std::io::Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            one_way,
            queue: Mutex::default(),
            ready: Condvar::new(),
            stop: AtomicBool::new(false),
            connections: AtomicU64::new(0),
            chunks_up: AtomicU64::new(0),
            chunks_down: AtomicU64::new(0),
            lateness: Mutex::new(Vec::with_capacity(LATENESS_SAMPLES)),
            streams: Mutex::default(),
        });
        let s = Arc::clone(&shared);
        std::thread::Builder::new().name("proxy-release".into()).spawn(move || {
            run_anywhere(cores);
            release(&s);
        })?;
        let s = Arc::clone(&shared);
        std::thread::Builder::new().name("proxy-accept".into()).spawn(move || {
            run_anywhere(cores);
            accept(&listener, upstream, &s, cores);
        })?;
        Ok(Self { addr, shared })
    }

    /// The URL to give clients instead of the server's.
    pub fn url(&self) -> String {
        format!("redis://{}/", self.addr)
    }

    pub fn stats(&self) -> ProxyStats {
        let mut lateness = lock(&self.shared.lateness).clone();
        lateness.sort_unstable();
        ProxyStats {
            connections: self.shared.connections.load(Ordering::Relaxed),
            chunks_up: self.shared.chunks_up.load(Ordering::Relaxed),
            chunks_down: self.shared.chunks_down.load(Ordering::Relaxed),
            lateness,
        }
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.ready.notify_all();
        // Wakes the acceptor, which then sees `stop`.
        let _ = TcpStream::connect(self.addr);
        for stream in lock(&self.shared.streams).drain(..).filter_map(|w| w.upgrade()) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

fn accept(listener: &TcpListener, upstream: SocketAddr, shared: &Arc<Shared>, cores: usize) {
    for client in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = client else { continue };
        // Dropping the client on failure closes it: the client sees the server as unreachable.
        let Ok(server) = TcpStream::connect(upstream) else { continue };
        if client.set_nodelay(true).and(server.set_nodelay(true)).is_err() {
            continue;
        }
        shared.connections.fetch_add(1, Ordering::Relaxed);
        let (client, server) = (Arc::new(client), Arc::new(server));
        {
            let mut streams = lock(&shared.streams);
            streams.retain(|w| w.strong_count() > 0);
            streams.extend([Arc::downgrade(&client), Arc::downgrade(&server)]);
        }
        for (from, to, up) in [(Arc::clone(&client), Arc::clone(&server), true), (server, client, false)] {
            let shared = Arc::clone(shared);
            let spawned = std::thread::Builder::new().name("proxy-read".into()).spawn(move || {
                run_anywhere(cores);
                forward(&from, to, up, &shared);
            });
            if spawned.is_err() {
                return;
            }
        }
    }
}

/// Reads `from` until it closes, queueing each chunk for `to`.
fn forward(from: &TcpStream, to: Arc<TcpStream>, up: bool, shared: &Shared) {
    let mut buf = vec![0u8; 64 * 1024];
    let counter = if up { &shared.chunks_up } else { &shared.chunks_down };
    loop {
        let data = match (&*from).read(&mut buf) {
            Ok(0) | Err(_) => None,
            Ok(n) => Some(buf[..n].to_vec()),
        };
        let closed = data.is_none();
        if !closed {
            counter.fetch_add(1, Ordering::Relaxed);
        }
        {
            // Stamped under the queue's lock, so the queue stays in order of due time.
            let mut queue = lock(&shared.queue);
            queue.push_back(Chunk { due: Instant::now() + shared.one_way, to: Arc::clone(&to), data });
        }
        shared.ready.notify_one();
        if closed || shared.stop.load(Ordering::SeqCst) {
            return;
        }
    }
}

/// Writes each chunk when it is due: a precise sleep to `margin` before, then a spin.
fn release(shared: &Shared) {
    // Linux delays a sleeping thread's wake-up by up to its timer slack (50 µs by default).
    let _ = rustix::thread::set_current_timer_slack(NonZeroU64::new(1));
    let mut margin = FIRST_MARGIN;
    let mut due_now: Vec<Chunk> = Vec::new();
    let mut queue = lock(&shared.queue);
    loop {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let Some(due) = queue.front().map(|c| c.due) else {
            queue = shared.ready.wait(queue).unwrap_or_else(PoisonError::into_inner);
            continue;
        };
        let now = Instant::now();
        if due > now + margin {
            let wake = due - margin;
            queue = shared.ready.wait_timeout(queue, wake - now).unwrap_or_else(PoisonError::into_inner).0;
            let woke = Instant::now();
            // A wake-up by the timer (not by a new chunk): keep the margin just above how late these come.
            if woke >= wake {
                let late = woke - wake;
                margin = (margin.mul_f64(0.995)).max(late + late / 4).clamp(Duration::from_micros(5), MAX_MARGIN);
            }
            continue;
        }
        // Only this thread takes chunks off the queue, and new ones are due later: spin without the lock.
        drop(queue);
        while Instant::now() < due {
            std::hint::spin_loop();
        }
        queue = lock(&shared.queue);
        let now = Instant::now();
        while queue.front().is_some_and(|c| c.due <= now) {
            due_now.extend(queue.pop_front());
        }
        drop(queue);
        let mut lateness = Vec::with_capacity(due_now.len());
        for chunk in due_now.drain(..) {
            lateness.push(u32::try_from(Instant::now().duration_since(chunk.due).as_nanos()).unwrap_or(u32::MAX));
            match chunk.data {
                // A peer that is gone makes the write fail; its reader closes the other side.
                Some(data) => {
                    let _ = (&*chunk.to).write_all(&data);
                }
                None => {
                    let _ = chunk.to.shutdown(Shutdown::Write);
                }
            }
        }
        {
            let mut kept = lock(&shared.lateness);
            let room = LATENESS_SAMPLES.saturating_sub(kept.len());
            kept.extend(lateness.into_iter().take(room));
        }
        queue = lock(&shared.queue);
    }
}
