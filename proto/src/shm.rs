//! Shared-memory bodies: a payload written once into a sealed memfd, whose
//! file descriptor travels with the frame (`SCM_RIGHTS`) hop by hop, so the
//! broker and router forward a 16 MiB body as a descriptor, never as bytes.
//!
//! Why memfd and not named segments (docs/decisions/0007-shared-memory.md):
//! an unnamed memfd exists only while some process holds its descriptor or a
//! mapping of it, so a `kill -9` anywhere leaks nothing and there is nothing
//! in `/dev/shm` to sweep. Sealing (no write, no resize) lets a receiver map
//! the bytes without trusting the sender to leave them alone.

use std::os::fd::OwnedFd;
#[cfg(feature = "runtime")]
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};

use crate::budget::Reservation;
pub use crate::budget::{in_use, set_budget};
use crate::{Error, Result};

/// Bodies at least this large go through shared memory by default.
pub const DEFAULT_THRESHOLD: usize = 64 * 1024;

#[derive(Debug)]
struct Segment {
    fd: Arc<OwnedFd>,
    _reservation: Option<Reservation>,
    /// A pool segment's body has been read (and the segment freed): its
    /// bytes may be another body's now.
    read: AtomicBool,
    /// The descriptor went on to another owner (sent on a link, handed
    /// across the plugin boundary): reading the body, and freeing its
    /// segment, is theirs now.
    handed_on: AtomicBool,
    /// In a reusable pool segment (`pool`) rather than a one-shot
    /// sealed memfd.
    pooled: bool,
}

impl Drop for Segment {
    /// A pooled body whose last handle goes without being read or handed
    /// on (its request was cancelled, its client left, its consumer gave
    /// up) frees its segment here, for its producer to reuse or release at
    /// once: otherwise the segment would stay busy, and mapped, until the
    /// producer's lease ran out (two minutes; a burst of abandoned 1 MiB
    /// answers held hundreds of MiB that long).
    fn drop(&mut self) {
        if self.pooled && !*self.read.get_mut() && !*self.handed_on.get_mut() {
            crate::segment::release_unread(&self.fd);
        }
    }
}

/// A shared-memory body. Cloning shares the descriptor (a hop keeps one
/// while its writer sends another); reading it ([`ShmBody::map`]) consumes
/// the handle, and a pooled body is read once across all its clones.
#[derive(Clone, Debug)]
pub struct ShmBody {
    segment: Arc<Segment>,
    len: u64,
}

impl PartialEq for ShmBody {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.segment, &other.segment) && self.len == other.len
    }
}

impl Eq for ShmBody {}

const SEALS: SealFlag = SealFlag::F_SEAL_SHRINK
    .union(SealFlag::F_SEAL_GROW)
    .union(SealFlag::F_SEAL_WRITE)
    .union(SealFlag::F_SEAL_SEAL);

impl ShmBody {
    /// Copies `bytes` into a new sealed memfd (the only copy of the body on
    /// its way through the group).
    pub fn create(bytes: &[u8]) -> Result<ShmBody> {
        let len = bytes.len() as u64;
        let reservation = Reservation::take(len)?;
        let fd = sealed_memfd(bytes)?;
        Ok(ShmBody::new(Arc::new(fd), Some(reservation), false, len))
    }

    fn new(fd: Arc<OwnedFd>, reservation: Option<Reservation>, pooled: bool, len: u64) -> ShmBody {
        ShmBody {
            segment: Arc::new(Segment {
                fd,
                _reservation: reservation,
                read: AtomicBool::new(false),
                handed_on: AtomicBool::new(false),
                pooled,
            }),
            len,
        }
    }

    /// Seals a copy of `bytes` in shared memory for a producer that answers
    /// with them many times (a cached file, a rendered page): the returned
    /// bytes, and any prefix of them (`slice(..n)`), go out as the sealed
    /// memfd's descriptor ([`ShmBody::of_shared`]) with no copy on either
    /// side, and a consumer that sees the memfd again keeps it mapped
    /// (`sealed`). Counted against the budget while any view lives.
    pub fn share(bytes: &[u8]) -> Result<Bytes> {
        crate::sealed::share(bytes)
    }

    /// The body to send for `bytes` when they are (a prefix of) bytes made
    /// by [`ShmBody::share`] in this process: the sealed memfd itself.
    pub fn of_shared(bytes: &Bytes) -> Option<ShmBody> {
        let fd = crate::sealed::descriptor_of(bytes)?;
        Some(ShmBody::new(fd, None, false, bytes.len() as u64))
    }

    /// Adopts a received descriptor that must hold a sealed body of `len`
    /// bytes; anything else is refused.
    pub fn adopt(fd: OwnedFd, len: u64) -> Result<ShmBody> {
        let seals = fcntl(&fd, FcntlArg::F_GET_SEALS)
            .map_err(|_| Error::Malformed("shm descriptor is not a memfd"))?;
        let seals = SealFlag::from_bits_truncate(seals);
        if !seals.contains(SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_WRITE) {
            return Err(Error::Malformed("shm body is not sealed"));
        }
        let size = nix::sys::stat::fstat(&fd).map_err(std::io::Error::from)?.st_size as u64;
        if size < len {
            return Err(Error::Malformed("shm body shorter than its handle"));
        }
        Ok(ShmBody::new(Arc::new(fd), None, false, len))
    }

    /// A body in a pool segment (made by a producer's `SegmentPool`).
    pub(crate) fn pooled(fd: Arc<OwnedFd>, len: u64) -> ShmBody {
        ShmBody::new(fd, None, true, len)
    }

    /// Adopts a received pool segment holding a body of `len` bytes.
    pub fn adopt_pooled(fd: OwnedFd, len: u64) -> Result<ShmBody> {
        crate::segment::check(&fd, len)?;
        Ok(ShmBody::pooled(Arc::new(fd), len))
    }

    /// Whether the body is in a reusable pool segment.
    pub fn is_pooled(&self) -> bool {
        self.segment.pooled
    }

    /// The body's length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the body is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The body's bytes, for as long as the returned `Bytes` (and its
    /// clones) live, counted against the budget meanwhile. A sealed body is
    /// mapped read-only (it cannot change: no copy). A pooled body is read
    /// out of its segment into this process's memory, and the segment is
    /// freed for its producer at once; that happens once for the handle
    /// and all its clones, so reading a clone afterwards is an error.
    pub fn map(self) -> Result<Bytes> {
        if self.segment.pooled {
            if self.segment.read.swap(true, Ordering::AcqRel) {
                return Err(Error::Malformed("a pooled body is read once, and this one was"));
            }
            return crate::segment::read(&self.segment.fd, self.len);
        }
        if self.len == 0 {
            return Ok(Bytes::new());
        }
        // Sealed against writes and shrinking (checked on adopt, set on
        // create): mapped, not copied, and kept mapped when it comes again.
        crate::sealed::map(&self.segment.fd, self.len)
    }

    /// A duplicate of the body's descriptor, to hand to another owner in
    /// this process: reading the body is theirs from now on.
    pub fn fd_clone(&self) -> Result<OwnedFd> {
        self.segment.handed_on.store(true, Ordering::Release);
        Ok(self.segment.fd.try_clone()?)
    }

    /// The body's descriptor, to send to another process: reading the body
    /// is the receiver's from now on.
    #[cfg(feature = "runtime")]
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.segment.handed_on.store(true, Ordering::Release);
        self.segment.fd.as_fd()
    }
}

/// A new memfd holding `bytes`, sealed against writes and resizing.
pub(crate) fn sealed_memfd(bytes: &[u8]) -> Result<OwnedFd> {
    let fd = memfd_create(
        c"switchyard-body",
        MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
    )
    .map_err(std::io::Error::from)?;
    // write(2), not mmap + copy: the kernel fills the pages directly,
    // instead of taking a page fault per 4 KiB of a fresh mapping
    // (measured: ~1 ms of system time per MiB in a VM).
    let mut file = std::fs::File::from(fd);
    std::io::Write::write_all(&mut file, bytes)?;
    let fd = OwnedFd::from(file);
    fcntl(&fd, FcntlArg::F_ADD_SEALS(SEALS)).map_err(std::io::Error::from)?;
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_map_adopt() {
        let data: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        let body = ShmBody::create(&data).unwrap();
        assert_eq!(body.clone().map().unwrap().as_ref(), &data[..]);
        // A receiver adopting a duplicate of the descriptor sees the same bytes.
        let dup = body.fd().try_clone_to_owned().unwrap();
        let adopted = ShmBody::adopt(dup, data.len() as u64).unwrap();
        assert_eq!(adopted.map().unwrap().as_ref(), &data[..]);
        // Lengths past the end are refused.
        let dup = body.fd().try_clone_to_owned().unwrap();
        assert!(ShmBody::adopt(dup, data.len() as u64 + 1).is_err());
        assert!(ShmBody::create(b"").unwrap().map().unwrap().is_empty());
    }

    #[test]
    fn unsealed_descriptors_are_refused() {
        let fd = memfd_create(c"x", MFdFlags::MFD_CLOEXEC).unwrap();
        assert!(ShmBody::adopt(fd, 0).is_err());
    }
}
