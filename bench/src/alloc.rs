//! A counting global allocator: the system allocator plus counters that only move while counting is switched
//! on, so timed windows pay one relaxed load per allocation and nothing else.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

/// The system allocator, counting allocations while [`start`] is in effect.
#[derive(Debug)]
pub struct Counting;

static ENABLED: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicU64 = AtomicU64::new(0);
static REALLOCS: AtomicU64 = AtomicU64::new(0);
static DEALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES_IN: AtomicU64 = AtomicU64::new(0);
static BYTES_OUT: AtomicU64 = AtomicU64::new(0);

// SAFETY: every method forwards its arguments unchanged to `System`, which upholds the `GlobalAlloc` contract;
// the counters are plain atomics and never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if ENABLED.load(Relaxed) {
            ALLOCS.fetch_add(1, Relaxed);
            BYTES_IN.fetch_add(layout.size() as u64, Relaxed);
        }
        // SAFETY: the caller's contract for `alloc` is passed on as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if ENABLED.load(Relaxed) {
            ALLOCS.fetch_add(1, Relaxed);
            BYTES_IN.fetch_add(layout.size() as u64, Relaxed);
        }
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if ENABLED.load(Relaxed) {
            DEALLOCS.fetch_add(1, Relaxed);
            BYTES_OUT.fetch_add(layout.size() as u64, Relaxed);
        }
        // SAFETY: `ptr` was allocated by `System` with `layout` (every allocation goes through this type).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if ENABLED.load(Relaxed) {
            REALLOCS.fetch_add(1, Relaxed);
            BYTES_IN.fetch_add(new_size as u64, Relaxed);
            BYTES_OUT.fetch_add(layout.size() as u64, Relaxed);
        }
        // SAFETY: as for `dealloc`, and `new_size` comes from the caller under `realloc`'s contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// What was allocated while counting was on.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counts {
    /// `alloc` and `alloc_zeroed` calls.
    pub allocs: u64,
    /// `realloc` calls (a grow or shrink; counted as allocations too in the report).
    pub reallocs: u64,
    /// `dealloc` calls.
    pub deallocs: u64,
    /// Bytes requested (a realloc counts its new size).
    pub bytes_in: u64,
    /// Bytes given back (a realloc counts its old size).
    pub bytes_out: u64,
}

impl Counts {
    /// Allocation calls of any kind.
    pub fn calls(&self) -> u64 {
        self.allocs + self.reallocs
    }

    /// Blocks allocated and not freed (net).
    pub fn live_blocks(&self) -> i64 {
        self.allocs as i64 - self.deallocs as i64
    }

    /// Net heap growth in bytes (negative when more was freed than allocated).
    pub fn net_bytes(&self) -> i64 {
        self.bytes_in as i64 - self.bytes_out as i64
    }
}

/// Zeroes the counters and starts counting.
pub fn start() {
    ALLOCS.store(0, Relaxed);
    REALLOCS.store(0, Relaxed);
    DEALLOCS.store(0, Relaxed);
    BYTES_IN.store(0, Relaxed);
    BYTES_OUT.store(0, Relaxed);
    ENABLED.store(true, Relaxed);
}

/// Stops counting and returns what was counted since [`start`].
pub fn stop() -> Counts {
    ENABLED.store(false, Relaxed);
    Counts {
        allocs: ALLOCS.load(Relaxed),
        reallocs: REALLOCS.load(Relaxed),
        deallocs: DEALLOCS.load(Relaxed),
        bytes_in: BYTES_IN.load(Relaxed),
        bytes_out: BYTES_OUT.load(Relaxed),
    }
}
