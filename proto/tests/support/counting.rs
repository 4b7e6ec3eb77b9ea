//! A counting global allocator for the property tests of decoders (shared
//! by the fuzz tests of several crates through `#[path]`): [`bounded`]
//! asserts that one decode's allocation peak stays in proportion to its
//! input.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts the bytes allocated right now and the peak since the last reset.
struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    let now = CURRENT.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to the system allocator unchanged; the
// counters are only statistics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as received.
        unsafe { System.dealloc(ptr, layout) };
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded as received.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
            grew(new_size);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// What a decode of `input` bytes may allocate at its peak: a fixed
/// allowance (decoders pre-size containers, cautiously) plus a multiple of
/// the input. A length field claiming gigabytes must fail, not allocate.
pub(crate) fn allowance(input: usize) -> usize {
    4 * 1024 * 1024 + 64 * input
}

/// Runs `decode` on `input`, asserting its allocation peak stays within
/// [`allowance`].
pub(crate) fn bounded<T>(input: &[u8], decode: impl FnOnce(&[u8]) -> T) -> T {
    let base = CURRENT.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let out = decode(input);
    let peak = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    assert!(
        peak <= allowance(input.len()),
        "decoding {} bytes allocated {peak} bytes at its peak",
        input.len()
    );
    out
}
