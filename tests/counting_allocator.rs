//! The one counting allocator of wick's memory measurements: `tests/memory.rs` and
//! `examples/memory_report.rs` both install it (the example includes this file by path).
//! It counts the bytes live now, the peak since the last [`reset_peak`], the bytes ever
//! allocated, and, while [`track_largest`] is on, the largest single allocation.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// `System`, counting.
pub struct CountingAllocator;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static ALLOCATED: AtomicUsize = AtomicUsize::new(0);
static TRACKING: AtomicBool = AtomicBool::new(false);
static LARGEST: AtomicUsize = AtomicUsize::new(0);

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn grew(bytes: usize) {
    ALLOCATED.fetch_add(bytes, Ordering::Relaxed);
    let now = CURRENT.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(now, Ordering::Relaxed);
    if TRACKING.load(Ordering::Relaxed) {
        LARGEST.fetch_max(bytes, Ordering::Relaxed);
    }
}

fn shrank(bytes: usize) {
    CURRENT.fetch_sub(bytes, Ordering::Relaxed);
}

unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        System.alloc_zeroed(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        shrank(layout.size());
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // Counted as a free and a new allocation: the peak sees the moment both may exist.
        shrank(layout.size());
        grew(new_size);
        System.realloc(ptr, layout, new_size)
    }
}

/// Bytes live now.
pub fn current() -> usize {
    CURRENT.load(Ordering::SeqCst)
}

/// The most bytes live at once since the last [`reset_peak`].
pub fn peak() -> usize {
    PEAK.load(Ordering::SeqCst)
}

/// Starts a new peak from what is live now; returns that.
pub fn reset_peak() -> usize {
    let now = current();
    PEAK.store(now, Ordering::SeqCst);
    now
}

/// Bytes ever allocated (never decreases): the allocation traffic between two readings.
#[allow(dead_code)] // the report does not read it
pub fn allocated() -> usize {
    ALLOCATED.load(Ordering::SeqCst)
}

/// Starts (from 0) or stops recording the largest single allocation.
#[allow(dead_code)] // the report does not read it
pub fn track_largest(on: bool) {
    if on {
        LARGEST.store(0, Ordering::SeqCst);
    }
    TRACKING.store(on, Ordering::SeqCst);
}

/// The largest single allocation recorded by [`track_largest`].
#[allow(dead_code)] // the report does not read it
pub fn largest() -> usize {
    LARGEST.load(Ordering::SeqCst)
}
