//! Under zero3 no rank ever allocates a full parameter while the model is created: the
//! largest single allocation stays below half the parameter's size at W = 4. A counting
//! allocator sees every allocation of this test binary (it holds this one test only).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use wick::accelerator::ThreadWorld;
use wick::core::Wrapped;

struct LargestAllocation;

static TRACKING: AtomicBool = AtomicBool::new(false);
static LARGEST: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for LargestAllocation {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if TRACKING.load(Ordering::Relaxed) {
            LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        }
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if TRACKING.load(Ordering::Relaxed) {
            LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        }
        System.alloc_zeroed(layout)
    }
}

#[global_allocator]
static ALLOCATOR: LargestAllocation = LargestAllocation;

/// One 1024 x 4096 weight: 16 MiB in full, 4 MiB per rank at W = 4.
const FULL_BYTES: usize = 1024 * 4096 * 4;

/// Creates the model under `strategy` on 4 ranks; returns the largest allocation seen.
fn largest_allocation_while_creating(strategy: &str) -> usize {
    let world_size = if strategy == "single" { 1 } else { 4 };
    LARGEST.store(0, Ordering::SeqCst);
    TRACKING.store(true, Ordering::SeqCst);
    let outcomes = ThreadWorld::new(world_size).run(|comm| {
        let mut s = wick::strategies::strategy_by_name(strategy)?;
        s.connect(Arc::new(comm), candle_core::Device::Cpu)?;
        let ctx = s.sharded_context(0)?;
        let _unit: Wrapped<candle_nn::Linear> = {
            let _open = ctx.enter();
            ctx.wrap("big", |vb| candle_nn::linear_no_bias(1024, 4096, vb))?
        };
        s.finish_sharding()?;
        Ok::<_, wick::core::Error>(s.num_parameters())
    });
    TRACKING.store(false, Ordering::SeqCst);
    for o in outcomes {
        assert_eq!(o.unwrap(), 1024 * 4096);
    }
    LARGEST.load(Ordering::SeqCst)
}

#[test]
fn zero3_never_allocates_a_full_parameter_at_init() {
    // The probe works: creating the full parameter is seen.
    assert!(largest_allocation_while_creating("single") >= FULL_BYTES);
    let largest = largest_allocation_while_creating("zero3");
    assert!(
        largest < FULL_BYTES / 2,
        "largest allocation {largest} bytes; the full parameter is {FULL_BYTES}"
    );
}
