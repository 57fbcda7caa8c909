//! An allocator for tests: counts, per thread, the heap allocations made
//! outside the simulated device, so that a test can show that the code
//! above the fabric allocates nothing on a path (what the simulated device
//! allocates to carry a message stands for a device's own work), and the
//! bytes they keep, so that a test can measure what a structure costs.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static COUNT: Cell<u64> = const { Cell::new(0) };
    static BYTES: Cell<i64> = const { Cell::new(0) };
}

/// The system allocator, counting. Install it with `#[global_allocator]`
/// in a test binary and measure with [`CountingAlloc::count`].
#[derive(Debug, Clone, Copy, Default)]
pub struct CountingAlloc;

impl CountingAlloc {
    /// Runs `f` and returns its result with the allocations (and
    /// reallocations) this thread made meanwhile outside the simulated
    /// device.
    pub fn count<R>(f: impl FnOnce() -> R) -> (R, u64) {
        COUNT.with(|c| c.set(0));
        COUNTING.with(|c| c.set(true));
        let r = f();
        COUNTING.with(|c| c.set(false));
        (r, COUNT.with(|c| c.get()))
    }

    /// Runs `f` and returns its result with the heap bytes this thread
    /// allocated meanwhile outside the simulated device, less those it
    /// freed (of any age): what `f` left on the heap. Allocation sizes are
    /// those asked for, without the allocator's own overhead.
    pub fn bytes<R>(f: impl FnOnce() -> R) -> (R, i64) {
        BYTES.with(|c| c.set(0));
        let (r, _) = Self::count(f);
        (r, BYTES.with(|c| c.get()))
    }

    /// Counts an allocation (`alloc`: a new one or a reallocation) that
    /// changed the bytes held by `delta`, while counting is on.
    fn note(alloc: bool, delta: i64) {
        // `try_with`: the thread may be tearing its locals down.
        if COUNTING.try_with(|c| c.get()).unwrap_or(false) && !super::inside() {
            if alloc {
                let _ = COUNT.try_with(|c| c.set(c.get() + 1));
            }
            let _ = BYTES.try_with(|c| c.set(c.get() + delta));
        }
    }
}

// SAFETY: every call is passed on to the system allocator unchanged; the
// counting touches only thread-locals initialised without allocating.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        Self::note(true, layout.size() as i64);
        // SAFETY: the caller's contract is System's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        Self::note(true, layout.size() as i64);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        Self::note(true, new_size as i64 - layout.size() as i64);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        Self::note(false, -(layout.size() as i64));
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}
