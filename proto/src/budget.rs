//! What every shared-memory user of a process shares: the budget of bytes
//! it may hold mapped or created ([`set_budget`], [`Reservation`]), and the
//! only two ways bytes cross into or out of memory another process may
//! touch at any moment ([`copy_from_shared`], [`copy_to_shared`]). Sealed
//! bodies ([`crate::shm`]), pool segments (`pool`, `segment`) and streaming
//! pipes ([`crate::pipe`]) build on it; it builds on nothing of theirs.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::{Error, Result};

/// Bytes of shared memory this process has mapped or created and not yet
/// released; bounded by [`set_budget`].
static IN_USE: AtomicU64 = AtomicU64::new(0);
static BUDGET: AtomicU64 = AtomicU64::new(u64::MAX);

/// Sets this process's shared-memory budget in bytes. Creating a body over
/// budget fails with [`Error::ShmBudget`] (answered with 503).
pub fn set_budget(bytes: u64) {
    BUDGET.store(bytes, Ordering::Relaxed);
}

/// Bytes this process holds in shared-memory bodies right now.
pub fn in_use() -> u64 {
    IN_USE.load(Ordering::Relaxed)
}

/// Accounts `len` bytes against the budget until dropped.
#[derive(Debug)]
pub(crate) struct Reservation(u64);

impl Reservation {
    pub(crate) fn take(len: u64) -> Result<Reservation> {
        let budget = BUDGET.load(Ordering::Relaxed);
        let mut current = IN_USE.load(Ordering::Relaxed);
        loop {
            if current.saturating_add(len) > budget {
                return Err(Error::ShmBudget { len, budget });
            }
            match IN_USE.compare_exchange_weak(current, current + len, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Ok(Reservation(len)),
                Err(now) => current = now,
            }
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        IN_USE.fetch_sub(self.0, Ordering::Relaxed);
    }
}

/// Copies `len` bytes out of memory another process may write at any
/// moment (a pool segment, a ring) into `dst`, with relaxed atomic loads:
/// a concurrent write can only change which bytes are copied, never make
/// the copy undefined behaviour. Eight bytes at a time where the source is
/// aligned, as fast as a plain copy (decision 0031 has the measurement).
///
/// # Safety
/// `src..src + len` lies in a live mapping that every process accesses only
/// atomically or through these functions; `dst` is valid for `len` bytes of
/// writes and does not overlap the source.
pub(crate) unsafe fn copy_from_shared(src: *const u8, dst: *mut u8, len: usize) {
    use std::sync::atomic::AtomicU8;
    // SAFETY: per this function's contract; every load is within the
    // source range and aligned for its atomic type.
    unsafe {
        let head = src.align_offset(8).min(len);
        for i in 0..head {
            dst.add(i)
                .write((*(src.add(i) as *const AtomicU8)).load(Ordering::Relaxed));
        }
        let words = (len - head) / 8;
        let words_src = src.add(head) as *const AtomicU64;
        for i in 0..words {
            let word = (*words_src.add(i)).load(Ordering::Relaxed);
            dst.add(head + i * 8).cast::<u64>().write_unaligned(word);
        }
        for i in head + words * 8..len {
            dst.add(i)
                .write((*(src.add(i) as *const AtomicU8)).load(Ordering::Relaxed));
        }
    }
}

/// Copies `src` into memory another process may read at any moment, with
/// relaxed atomic stores (the counterpart of [`copy_from_shared`]).
///
/// # Safety
/// `dst..dst + src.len()` lies in a live mapping that every process
/// accesses only atomically or through these functions.
pub(crate) unsafe fn copy_to_shared(dst: *mut u8, src: &[u8]) {
    use std::sync::atomic::AtomicU8;
    let len = src.len();
    let from = src.as_ptr();
    // SAFETY: per this function's contract; every store is within the
    // destination range and aligned for its atomic type.
    unsafe {
        let head = dst.align_offset(8).min(len);
        for i in 0..head {
            (*(dst.add(i) as *const AtomicU8)).store(*from.add(i), Ordering::Relaxed);
        }
        let words = (len - head) / 8;
        let words_dst = dst.add(head) as *const AtomicU64;
        for i in 0..words {
            let word = from.add(head + i * 8).cast::<u64>().read_unaligned();
            (*words_dst.add(i)).store(word, Ordering::Relaxed);
        }
        for i in head + words * 8..len {
            (*(dst.add(i) as *const AtomicU8)).store(*from.add(i), Ordering::Relaxed);
        }
    }
}
