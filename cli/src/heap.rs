//! Live heap bytes, counted by a global allocator that wraps the system's.
//!
//! The peak resident size a process reports (`VmHWM`) counts what the allocator keeps after it
//! was freed ([`typed_amp::device::keep_freed_memory`] keeps all of it), so it says little about
//! one stretch of a run. [`CountingAllocator`] counts the bytes the program holds: the
//! `typed-amp` binary installs it, and a run reports the peak of its training loop
//! ([`reset_peak`] before the first step, [`peak`] after the last).
//!
//! ```
//! use typed_amp_cli::heap::{self, CountingAllocator};
//!
//! // In a binary (the `typed-amp` binary does this):
//! #[global_allocator]
//! static ALLOCATOR: CountingAllocator = CountingAllocator;
//!
//! fn main() {
//!     heap::reset_peak();
//!     let before = heap::current().unwrap();
//!     let buffer = vec![1u8; 1 << 20];
//!     assert!(heap::peak().unwrap() >= before + (1 << 20));
//!     drop(buffer);
//! }
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// Bytes allocated and not yet freed.
static CURRENT: AtomicUsize = AtomicUsize::new(0);
/// The most [`CURRENT`] has been since the start or the last [`reset_peak`].
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting the bytes it holds for the program (current and peak).
///
/// Install it with `#[global_allocator]`; [`current`] and [`peak`] read the counts. The
/// counts are relaxed atomics: exact once the threads that allocate have joined or stopped,
/// and off by at most the allocations in flight while they run.
#[derive(Debug, Default, Clone, Copy)]
pub struct CountingAllocator;

fn grew(bytes: usize) {
    let now = CURRENT.fetch_add(bytes, Relaxed) + bytes;
    if now > PEAK.load(Relaxed) {
        PEAK.fetch_max(now, Relaxed);
    }
}

fn shrank(bytes: usize) {
    CURRENT.fetch_sub(bytes, Relaxed);
}

// SAFETY: every call is forwarded to `System` with the caller's arguments, and its result is
// returned unchanged; the counters are only read and written atomically.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is `System.alloc`'s.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is `System.alloc_zeroed`'s.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is `System.dealloc`'s.
        unsafe { System.dealloc(ptr, layout) };
        shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract is `System.realloc`'s.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            // On failure the old block stays allocated and the counts stay as they were.
            match new_size.cmp(&layout.size()) {
                std::cmp::Ordering::Greater => grew(new_size - layout.size()),
                std::cmp::Ordering::Less => shrank(layout.size() - new_size),
                std::cmp::Ordering::Equal => {}
            }
        }
        new
    }
}

/// Whether [`CountingAllocator`] is this process's global allocator: any Rust program has
/// allocated something before `main`, so a count of zero means nothing is counting.
fn counting() -> bool {
    PEAK.load(Relaxed) > 0 || CURRENT.load(Relaxed) > 0
}

/// Heap bytes the program holds now; `None` where [`CountingAllocator`] is not the global
/// allocator.
pub fn current() -> Option<u64> {
    counting().then(|| CURRENT.load(Relaxed) as u64)
}

/// The most heap bytes the program has held at once since it started or since the last
/// [`reset_peak`]; `None` where [`CountingAllocator`] is not the global allocator.
pub fn peak() -> Option<u64> {
    counting().then(|| PEAK.load(Relaxed) as u64)
}

/// Starts a new peak measurement: the peak becomes what the program holds now.
pub fn reset_peak() {
    PEAK.store(CURRENT.load(Relaxed), Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The counting logic on its own (unit tests run under the default allocator).
    #[test]
    fn the_peak_follows_growth_and_restarts_from_the_current_count() {
        let base = CURRENT.load(Relaxed);
        grew(1000);
        grew(500);
        shrank(1200);
        assert!(PEAK.load(Relaxed) >= base + 1500);
        reset_peak();
        assert_eq!(PEAK.load(Relaxed), base + 300);
        grew(100);
        assert_eq!(PEAK.load(Relaxed), base + 400);
        shrank(400);
        assert_eq!(CURRENT.load(Relaxed), base);
    }
}
