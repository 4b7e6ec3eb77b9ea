//! Reusable shared-memory segments for response bodies.
//!
//! A one-shot sealed memfd ([`ShmBody`]) costs the kernel a fresh page
//! per 4 KiB on both ends: allocated and zeroed when the producer writes,
//! mapped and unmapped by the consumer, freed when the last holder closes
//! it. For a 1 MiB response that was most of the group's CPU (decision 0011
//! has the profile).
//!
//! So a producer keeps a [`SegmentPool`]: memfds it created once and keeps
//! mapped, each with a one-page header holding a busy flag. A body is copied
//! into a free segment, which is marked busy and sent as a descriptor like a
//! sealed body. The consumer maps each segment once (a small cache keyed
//! by inode), copies the body out into memory of its own (a buffer it
//! keeps for reuse, so its pages are not faulted in again for every body)
//! and at once marks the segment free again — no message goes back. A segment whose body was lost on the way (a dropped frame, a
//! dead consumer) stays busy; past a lease the producer forgets it and makes
//! another, so a loss costs memory for a while, never a wrong byte.
//!
//! Only point-to-point bodies (requests and responses) use the pool: a body
//! delivered to several consumers would be freed by the first one. A body
//! is read once: [`ShmBody::map`] consumes its handle, and a second read of
//! a clone is refused rather than served from a reused segment.
//!
//! Trust (docs/decisions/0031-pool-segments-read-once.md): segments are not
//! sealed against writes (they are rewritten), so the producer can write a
//! body while it is being read. The consumer never forms a Rust reference
//! into a segment: it reads the body with relaxed atomic loads only, so
//! such a write can change only the bytes copied, never what the reader
//! does with them afterwards — they are private and stable once read. The
//! header is read once, atomically, before anything is decided on it.
//! Segments are sealed against shrinking and growing, so a mapping can
//! never fault.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};

use crate::Result;
use crate::budget::{Reservation, copy_to_shared};
use crate::segment::{BUSY, FREE, HEADER, MAGIC, MIN_ROOM, OFF_KIND, OFF_MAGIC, OFF_STATE, ONCE};
pub use crate::segment::{MAX_POOLED_BODY, mapped_segments, trim_mappings};
use crate::shm::ShmBody;

/// A producer's reusable segments.
pub struct SegmentPool {
    segments: Vec<PoolSegment>,
    /// Segments made for one body the pool could not take
    /// ([`SegmentPool::place_once`]), kept only until it is read.
    once: Vec<PoolSegment>,
    bytes: usize,
    max_bytes: usize,
    lease: Duration,
}

struct PoolSegment {
    fd: Arc<OwnedFd>,
    map: memmap2::MmapRaw,
    size: usize,
    /// When it was last handed out (a free segment unused for a while is
    /// released by [`SegmentPool::trim`]).
    sent: Instant,
    _reservation: Reservation,
}

impl PoolSegment {
    fn state(&self) -> &AtomicU32 {
        // SAFETY: the header page is inside the mapping, the offset is
        // 4-aligned in a page-aligned mapping, and every process accesses
        // the word only atomically.
        unsafe { &*(self.map.as_mut_ptr().add(OFF_STATE) as *const AtomicU32) }
    }

    fn kind(&self) -> &AtomicU32 {
        // SAFETY: as for `state`.
        unsafe { &*(self.map.as_mut_ptr().add(OFF_KIND) as *const AtomicU32) }
    }
}

impl SegmentPool {
    /// A pool holding at most `max_bytes` of segments; a segment busy for
    /// longer than `lease` is given up as lost.
    pub fn new(max_bytes: usize, lease: Duration) -> SegmentPool {
        SegmentPool {
            segments: Vec::new(),
            once: Vec::new(),
            bytes: 0,
            max_bytes,
            lease,
        }
    }

    /// Copies `body` into a free segment and returns it as a body to send;
    /// `None` when the body is too large for the pool or the pool is full
    /// of busy segments (the caller then makes a one-shot body).
    pub fn place(&mut self, body: &[u8]) -> Result<Option<ShmBody>> {
        if body.len() > MAX_POOLED_BODY {
            return Ok(None);
        }
        let size = HEADER + body.len().next_power_of_two().max(MIN_ROOM);
        let now = Instant::now();
        let lease = self.lease;
        // Lost segments (busy past the lease) leave the pool for good.
        self.retain(|s, free| free || now.duration_since(s.sent) < lease);
        self.release_read();
        let index = match self
            .segments
            .iter()
            .position(|s| s.size == size && s.state().load(Ordering::Acquire) == FREE)
        {
            Some(i) => i,
            None if self.bytes + size <= self.max_bytes => {
                self.segments.push(create(size)?);
                self.bytes += size;
                self.segments.len() - 1
            }
            None => return Ok(None),
        };
        let segment = &mut self.segments[index];
        segment.state().store(BUSY, Ordering::Relaxed);
        segment.sent = now;
        // SAFETY: the body range lies inside the mapping (size ≥ HEADER +
        // len). The segment is ours while FREE, but a consumer that broke
        // the protocol could be reading it: atomic stores keep even that a
        // race on values.
        unsafe { copy_to_shared(segment.map.as_mut_ptr().add(HEADER), body) };
        Ok(Some(ShmBody::pooled(segment.fd.clone(), body.len() as u64)))
    }

    /// Copies `body` into a segment of its own, for a body [`place`] could
    /// not take (too large for the pool, or the pool busy): a segment that
    /// is released as soon as its consumer has read it (seen at the next
    /// call on the pool), so a burst of large bodies costs one copy each
    /// while in flight and nothing after. Bounded by the process's
    /// shared-memory budget ([`Error::ShmBudget`]).
    ///
    /// [`place`]: SegmentPool::place
    pub fn place_once(&mut self, body: &[u8]) -> Result<ShmBody> {
        self.release_read();
        let size = (HEADER + body.len().max(1)).next_multiple_of(HEADER);
        let segment = create(size)?;
        segment.kind().store(ONCE, Ordering::Relaxed);
        segment.state().store(BUSY, Ordering::Relaxed);
        // SAFETY: as in `place`: the body range lies inside the fresh
        // mapping, which no consumer has seen yet.
        unsafe { copy_to_shared(segment.map.as_mut_ptr().add(HEADER), body) };
        let handle = ShmBody::pooled(segment.fd.clone(), body.len() as u64);
        self.once.push(segment);
        Ok(handle)
    }

    /// Drops the one-body segments that were read, or lost past the lease.
    fn release_read(&mut self) {
        let now = Instant::now();
        let lease = self.lease;
        self.once
            .retain(|s| s.state().load(Ordering::Acquire) == BUSY && now.duration_since(s.sent) < lease);
    }

    /// Releases free segments not handed out for `idle`, so that memory
    /// goes back down after a burst of large responses.
    pub fn trim(&mut self, idle: Duration) {
        let now = Instant::now();
        self.retain(|s, free| !free || now.duration_since(s.sent) < idle);
        self.release_read();
    }

    /// Keeps the segments `keep` says yes to (given each segment and
    /// whether it is free), and the byte count with them.
    fn retain(&mut self, mut keep: impl FnMut(&PoolSegment, bool) -> bool) {
        let before = self.segments.len();
        self.segments
            .retain(|s| keep(s, s.state().load(Ordering::Acquire) == FREE));
        if self.segments.len() != before {
            self.bytes = self.segments.iter().map(|s| s.size).sum();
        }
    }

    /// One-body segments not yet seen read (tests, status).
    pub fn once_count(&self) -> usize {
        self.once.len()
    }

    /// Segments in the pool and how many are free (tests, status).
    pub fn counts(&self) -> (usize, usize) {
        let free = self
            .segments
            .iter()
            .filter(|s| s.state().load(Ordering::Acquire) == FREE)
            .count();
        (self.segments.len(), free)
    }
}

fn create(size: usize) -> Result<PoolSegment> {
    let reservation = Reservation::take(size as u64)?;
    let fd = memfd_create(
        c"switchyard-segment",
        MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
    )
    .map_err(std::io::Error::from)?;
    let file = std::fs::File::from(fd);
    file.set_len(size as u64)?;
    let fd = OwnedFd::from(file);
    fcntl(
        &fd,
        FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL),
    )
    .map_err(std::io::Error::from)?;
    // Populated once, here: reuses never fault.
    let map = memmap2::MmapOptions::new().len(size).populate().map_raw(&fd)?;
    // SAFETY: the header lies inside the fresh mapping; the magic is
    // written before any consumer can see the segment.
    unsafe {
        (*(map.as_mut_ptr().add(OFF_MAGIC) as *const AtomicU64)).store(MAGIC, Ordering::Release);
    }
    Ok(PoolSegment {
        fd: Arc::new(fd),
        map,
        size,
        sent: Instant::now(),
        _reservation: reservation,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_reused_once_the_consumer_has_read_the_body() {
        let mut pool = SegmentPool::new(1 << 20, Duration::from_secs(60));
        let a = pool.place(&[1u8; 100_000]).unwrap().unwrap();
        // Busy until the consumer reads it: a second body takes a new segment.
        let b = pool.place(&[2u8; 100_000]).unwrap().unwrap();
        assert_eq!(pool.counts(), (2, 0));
        let bytes = a.map().unwrap();
        assert_eq!(&bytes[..], &[1u8; 100_000][..]);
        // Read out: free at once, however long the bytes are kept.
        assert_eq!(pool.counts(), (2, 1));
        assert_eq!(&b.map().unwrap()[..], &[2u8; 100_000][..]);
        assert_eq!(pool.counts(), (2, 2));
        // Reused: same segment, new bytes; the bytes read before stay.
        let c = pool.place(&[3u8; 70_000]).unwrap().unwrap();
        assert_eq!(pool.counts(), (2, 1));
        assert_eq!(&bytes[..], &[1u8; 100_000][..]);
        // Trimming releases free segments that sat idle, never busy ones.
        pool.trim(Duration::ZERO);
        assert_eq!(pool.counts(), (1, 0), "the busy one stays");
        assert_eq!(&c.map().unwrap()[..], &[3u8; 70_000][..]);
        pool.trim(Duration::ZERO);
        assert_eq!(pool.counts(), (0, 0));
    }

    /// Buffers are reused across bodies: each read gives exactly its body,
    /// whatever the buffer held or could hold before.
    #[test]
    fn reused_buffers_hold_exactly_the_body() {
        let mut pool = SegmentPool::new(1 << 22, Duration::from_secs(60));
        for (len, fill) in [(300_000usize, 1u8), (200_000, 2), (70_000, 3), (260_000, 4)] {
            let bytes = pool.place(&vec![fill; len]).unwrap().unwrap().map().unwrap();
            assert_eq!(bytes.len(), len);
            assert!(bytes.iter().all(|&b| b == fill), "body of {len}");
        }
    }

    /// Clones of a handle share one lease: the first read frees the
    /// segment, so a second read is refused, never served from a segment
    /// the producer may have rewritten since.
    #[test]
    fn a_pooled_body_is_read_once() {
        let mut pool = SegmentPool::new(1 << 20, Duration::from_secs(60));
        let body = pool.place(&[7u8; 100_000]).unwrap().unwrap();
        let twin = body.clone();
        assert_eq!(&body.map().unwrap()[..], &[7u8; 100_000][..]);
        // The producer reuses the freed segment for another body ...
        let _next = pool.place(&[8u8; 100_000]).unwrap().unwrap();
        assert_eq!(pool.counts(), (1, 0));
        // ... and the clone cannot read it, nor free it under that body.
        assert!(twin.map().is_err());
        assert_eq!(pool.counts(), (1, 0));
    }

    /// A producer writing into a segment after sending it changes only the
    /// bytes the consumer reads; what the consumer holds is its own, and
    /// stays as read however the segment changes afterwards.
    #[test]
    fn bytes_read_from_a_segment_do_not_change_under_the_reader() {
        let mut pool = SegmentPool::new(1 << 20, Duration::from_secs(60));
        let body = pool.place(&[1u8; 100_000]).unwrap().unwrap();
        let segment = &pool.segments[0];
        let bytes = body.map().unwrap();
        // SAFETY (test): the producer's own mapping, written as a hostile
        // producer would after the body was read.
        unsafe { std::ptr::write_bytes(segment.map.as_mut_ptr().add(HEADER), 9, 100_000) };
        assert!(bytes.iter().all(|&b| b == 1));
    }

    #[test]
    fn a_full_pool_says_none_and_lost_segments_expire() {
        let mut pool = SegmentPool::new(HEADER + MIN_ROOM, Duration::ZERO);
        let lost = pool.place(&[0u8; 1000]).unwrap().unwrap();
        // Sent, and never consumed nor dropped by its receiver: stays busy.
        let _sent = lost.fd_clone().unwrap();
        drop(lost);
        // The lease (zero here) is over: the lost segment is given up and a
        // new one made in its place.
        assert!(pool.place(&[0u8; 1000]).unwrap().is_some());
        let mut pool = SegmentPool::new(HEADER + MIN_ROOM, Duration::from_secs(60));
        let _busy = pool.place(&[0u8; 1000]).unwrap().unwrap();
        assert!(
            pool.place(&[0u8; 1000]).unwrap().is_none(),
            "full of busy segments"
        );
        assert!(pool.place(&vec![0u8; MAX_POOLED_BODY + 1]).unwrap().is_none());
    }

    #[test]
    fn once_segments_live_until_read() {
        let mut pool = SegmentPool::new(HEADER + MIN_ROOM, Duration::from_secs(60));
        let big = vec![5u8; MAX_POOLED_BODY + 1];
        assert!(pool.place(&big).unwrap().is_none());
        let a = pool.place_once(&big).unwrap();
        let b = pool.place_once(&[6u8; 1000]).unwrap();
        assert_eq!(pool.once_count(), 2);
        assert_eq!(a.map().unwrap(), big);
        // Read: released at the next call on the pool; the unread one stays.
        pool.trim(Duration::from_secs(60));
        assert_eq!(pool.once_count(), 1);
        assert_eq!(b.map().unwrap(), vec![6u8; 1000]);
        pool.trim(Duration::from_secs(60));
        assert_eq!(pool.once_count(), 0);
    }

    /// A body dropped unread (its request cancelled, its client gone) frees
    /// its segment at once; one handed on is the receiver's to free, and
    /// stays busy while the receiver holds it.
    #[test]
    fn a_body_dropped_unread_frees_its_segment() {
        let mut pool = SegmentPool::new(1 << 20, Duration::from_secs(60));
        let body = pool.place(&[1u8; 100_000]).unwrap().unwrap();
        let twin = body.clone();
        drop(body);
        assert_eq!(pool.counts(), (1, 0), "a clone still holds it");
        drop(twin);
        assert_eq!(pool.counts(), (1, 1));

        // Handed on: the sender's handle goes, the receiver's stays.
        let body = pool.place(&[2u8; 100_000]).unwrap().unwrap();
        let received = ShmBody::adopt_pooled(body.fd_clone().unwrap(), 100_000).unwrap();
        drop(body);
        assert_eq!(pool.counts(), (1, 0));
        // The receiver drops it unread (mapped in its cache or not).
        drop(received);
        assert_eq!(pool.counts(), (1, 1));

        // A one-body segment goes at the next call on the pool.
        let once = pool.place_once(&[3u8; 100_000]).unwrap();
        let received = ShmBody::adopt_pooled(once.fd_clone().unwrap(), 100_000).unwrap();
        drop(once);
        pool.trim(Duration::from_secs(60));
        assert_eq!(pool.once_count(), 1);
        drop(received);
        pool.trim(Duration::from_secs(60));
        assert_eq!(pool.once_count(), 0);
    }

    /// A consumer keeps pool segments mapped for the next body, but not a
    /// one-body segment, whatever its size.
    #[test]
    fn one_body_segments_are_not_kept_mapped() {
        let mut pool = SegmentPool::new(HEADER + MIN_ROOM, Duration::from_secs(60));
        let _busy = pool.place(&[0u8; 1000]).unwrap().unwrap();
        let once = pool.place_once(&[4u8; 1000]).unwrap();
        let received = ShmBody::adopt_pooled(once.fd_clone().unwrap(), 1000).unwrap();
        let before = mapped_segments();
        assert_eq!(received.map().unwrap(), vec![4u8; 1000]);
        assert_eq!(mapped_segments(), before);
    }
}
