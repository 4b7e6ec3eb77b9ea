//! Streaming shared-memory pipes: a byte stream of any length (a 1 GiB
//! download, an upload of unknown size) from one process to another through
//! a fixed ring of shared memory, with backpressure both ways.
//!
//! A pipe is two descriptors that travel with a frame like a shared-memory
//! body does ([`Payload::Stream`](crate::Payload::Stream)): a memfd holding
//! the ring, and one end of a Unix socket pair whose other end the producer
//! keeps. The ring carries the bytes; the socket carries only wake-ups and
//! death:
//!
//! - **Wake-ups are event-driven.** A side that finds the ring empty (the
//!   consumer) or full (the producer) raises its `waiting` flag, re-checks,
//!   and sleeps in `poll(2)` (or tokio's reactor) on its socket end. The
//!   other side, after moving its position, sends one byte only if that flag
//!   was up. A stream that never fills or drains costs no system call per
//!   chunk beyond the copy.
//! - **Death is end-of-file.** When either process exits, for any reason,
//!   the kernel closes its socket end and the other side's `poll` returns:
//!   a consumer whose producer vanished before finishing gets
//!   [`Error::PipeAborted`], never a hang; a producer whose consumer went
//!   away (the HTTP client disconnected) gets it on its next write.
//!
//! The ring's header is shared with a process we do not trust further than
//! the frames it sends: positions read from it are checked (never more
//! than the capacity ahead, never backwards), and the memfd is sealed
//! against shrinking so a mapping cannot fault. docs/decisions/0010.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

use bytes::{Bytes, BytesMut};
use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};
use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};

use crate::budget::{Reservation, copy_from_shared, copy_to_shared};
use crate::{Error, Result};

/// Ring capacity of a pipe unless its creator asks otherwise: big enough
/// that a consumer copies out a few hundred KiB per wake-up, small enough
/// that a thousand concurrent streams fit in a quarter GiB.
pub const DEFAULT_CAPACITY: usize = 256 * 1024;

/// Bytes before the ring's data: the header, padded to a page.
const HEADER: usize = 4096;
const MAGIC: u64 = u64::from_le_bytes(*b"SWYPIPE1");

// Header layout (byte offsets). The producer's and consumer's words sit on
// separate cache lines so the two sides do not false-share.
const OFF_MAGIC: usize = 0;
const OFF_CAPACITY: usize = 8;
const OFF_WRITTEN: usize = 64;
const OFF_PRODUCER_STATE: usize = 72;
const OFF_PRODUCER_WAITING: usize = 76;
const OFF_READ: usize = 128;
const OFF_CONSUMER_STATE: usize = 136;
const OFF_CONSUMER_WAITING: usize = 140;

const OPEN: u32 = 0;
/// Producer: every byte is in the ring, the stream ended normally.
const FINISHED: u32 = 1;
/// Either side: gave up; the stream is incomplete.
const ABORTED: u32 = 2;

/// The sending side's view of a pipe: the two descriptors a consumer needs
/// and the stream's length when known. It rides in an envelope; cloning
/// shares the descriptors.
#[derive(Clone, Debug)]
pub struct StreamHandle {
    fds: Arc<(OwnedFd, OwnedFd)>,
    length: Option<u64>,
}

impl PartialEq for StreamHandle {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.fds, &other.fds)
    }
}

impl Eq for StreamHandle {}

impl StreamHandle {
    /// Rebuilds a handle from the descriptors received with a frame (ring
    /// first, then the wake socket). They are checked when opened.
    pub fn from_parts(ring: OwnedFd, wake: OwnedFd, length: Option<u64>) -> StreamHandle {
        StreamHandle {
            fds: Arc::new((ring, wake)),
            length,
        }
    }

    /// The stream's total length, when the producer announced it.
    pub fn length(&self) -> Option<u64> {
        self.length
    }

    /// The two descriptors to send, in order.
    pub fn fds(&self) -> [BorrowedFd<'_>; 2] {
        [self.fds.0.as_fd(), self.fds.1.as_fd()]
    }

    /// Takes the descriptors out (duplicating them if the handle is shared),
    /// e.g. to hand them across the plugin boundary.
    pub fn into_parts(self) -> Result<(OwnedFd, OwnedFd, Option<u64>)> {
        match Arc::try_unwrap(self.fds) {
            Ok((ring, wake)) => Ok((ring, wake, self.length)),
            Err(shared) => Ok((shared.0.try_clone()?, shared.1.try_clone()?, self.length)),
        }
    }

    /// Opens the consuming end: maps the ring (checking it is one) and takes
    /// the wake socket. Call once per stream: a pipe has one reader.
    pub fn open(self) -> Result<PipeEnd> {
        self.open_within(Budget::Counted)
    }

    /// Opens the consuming end of a link's ring ([`crate::link`]), which
    /// does not count against the bodies' budget.
    #[cfg(feature = "runtime")]
    pub(crate) fn open_link(self) -> Result<PipeEnd> {
        self.open_within(Budget::Infrastructure)
    }

    fn open_within(self, budget: Budget) -> Result<PipeEnd> {
        let (ring, wake, _) = self.into_parts()?;
        let seals =
            fcntl(&ring, FcntlArg::F_GET_SEALS).map_err(|_| Error::Malformed("pipe ring is not a memfd"))?;
        if !SealFlag::from_bits_truncate(seals).contains(SealFlag::F_SEAL_SHRINK) {
            return Err(Error::Malformed("pipe ring can shrink"));
        }
        let size = nix::sys::stat::fstat(&ring).map_err(io::Error::from)?.st_size as usize;
        if size <= HEADER {
            return Err(Error::Malformed("pipe ring shorter than its header"));
        }
        let reservation = match budget {
            Budget::Counted => Some(Reservation::take(size as u64)?),
            Budget::Infrastructure => None,
        };
        let ring = Ring::map(&ring, size, reservation)?;
        if ring.word64(OFF_MAGIC).load(Ordering::Relaxed) != MAGIC
            || ring.word64(OFF_CAPACITY).load(Ordering::Relaxed) != ring.capacity as u64
        {
            return Err(Error::Malformed("pipe ring header is not a pipe's"));
        }
        PipeEnd::new(ring, wake, Side::Consumer)
    }
}

/// Creates a pipe with a ring of `capacity` bytes (counted against this
/// process's shared-memory budget while the producer lives). Returns the
/// producing end, to keep, and the handle to send to the consumer.
pub fn pipe(capacity: usize, length: Option<u64>) -> Result<(PipeEnd, StreamHandle)> {
    make(capacity, length, Budget::Counted)
}

/// A pipe for one direction of a link ([`crate::link`]): its ring is part
/// of the group's fixed plumbing (a few per process), not a body a request
/// brought, so it does not count against `shm_budget_bytes`.
#[cfg(feature = "runtime")]
pub(crate) fn link_pipe(capacity: usize) -> Result<(PipeEnd, StreamHandle)> {
    make(capacity, None, Budget::Infrastructure)
}

/// Whether a ring counts against this process's shared-memory budget.
#[derive(Clone, Copy)]
#[cfg_attr(not(feature = "runtime"), allow(dead_code))]
enum Budget {
    Counted,
    Infrastructure,
}

fn make(capacity: usize, length: Option<u64>, budget: Budget) -> Result<(PipeEnd, StreamHandle)> {
    let capacity = capacity.max(4096);
    let reservation = match budget {
        Budget::Counted => Some(Reservation::take((HEADER + capacity) as u64)?),
        Budget::Infrastructure => None,
    };
    let fd = memfd_create(
        c"switchyard-pipe",
        MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
    )
    .map_err(io::Error::from)?;
    let file = std::fs::File::from(fd);
    file.set_len((HEADER + capacity) as u64)?;
    let fd = OwnedFd::from(file);
    fcntl(
        &fd,
        FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL),
    )
    .map_err(io::Error::from)?;
    let ring = Ring::map(&fd, HEADER + capacity, reservation)?;
    ring.word64(OFF_CAPACITY)
        .store(capacity as u64, Ordering::Relaxed);
    ring.word64(OFF_MAGIC).store(MAGIC, Ordering::Release);
    let (mine, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
    )
    .map_err(io::Error::from)?;
    let producer = PipeEnd::new(ring, mine, Side::Producer)?;
    Ok((producer, StreamHandle::from_parts(fd, theirs, length)))
}

/// See [`PipeEnd::probe`].
#[cfg(feature = "runtime")]
pub(crate) struct RingProbe(std::sync::Weak<Ring>);

#[cfg(feature = "runtime")]
impl RingProbe {
    /// Unread bytes in the ring, as [`PipeEnd::has_bytes`] (false once
    /// its end is gone).
    pub(crate) fn has_bytes(&self) -> bool {
        self.0.upgrade().is_some_and(|ring| ring.has_unread())
    }

    /// Whether the end it looks at still lives.
    pub(crate) fn is_open(&self) -> bool {
        self.0.strong_count() > 0
    }

    pub(crate) fn same(&self, other: &RingProbe) -> bool {
        std::sync::Weak::ptr_eq(&self.0, &other.0)
    }
}

/// The mapped ring: its end's, and looked at by that end's probes.
struct Ring {
    map: memmap2::MmapRaw,
    capacity: usize,
    _reservation: Option<Reservation>,
}

impl Ring {
    fn map(fd: &OwnedFd, size: usize, reservation: Option<Reservation>) -> Result<Ring> {
        let map = memmap2::MmapOptions::new().len(size).map_raw(fd)?;
        Ok(Ring {
            map,
            capacity: size - HEADER,
            _reservation: reservation,
        })
    }

    /// The positions, checked: the peer's word may be anything.
    fn positions(&self) -> Result<(u64, u64)> {
        let written = self.word64(OFF_WRITTEN).load(Ordering::Acquire);
        let read = self.word64(OFF_READ).load(Ordering::Acquire);
        if written < read || written - read > self.capacity as u64 {
            return Err(Error::Malformed("pipe positions out of range"));
        }
        Ok((written, read))
    }

    /// Bytes published and not read yet (false when the positions make
    /// no sense).
    fn has_unread(&self) -> bool {
        self.positions().is_ok_and(|(written, read)| written > read)
    }

    fn word64(&self, offset: usize) -> &AtomicU64 {
        debug_assert!(offset + 8 <= HEADER && offset.is_multiple_of(8));
        // SAFETY: the header lies inside the mapping (size > HEADER, checked
        // by both constructors), the offset is 8-aligned in a page-aligned
        // mapping, and the word is only ever accessed atomically, by every
        // process that maps it.
        unsafe { &*(self.map.as_mut_ptr().add(offset) as *const AtomicU64) }
    }

    fn word32(&self, offset: usize) -> &AtomicU32 {
        debug_assert!(offset + 4 <= HEADER && offset.is_multiple_of(4));
        // SAFETY: as for `word64`.
        unsafe { &*(self.map.as_mut_ptr().add(offset) as *const AtomicU32) }
    }

    /// Copies `src` into the ring at stream position `at` (wrapping).
    fn copy_in(&self, at: u64, src: &[u8]) {
        let start = (at % self.capacity as u64) as usize;
        let first = src.len().min(self.capacity - start);
        // SAFETY: both ranges lie inside the data area, and the positions
        // protocol gives this side [written, read + capacity) until it
        // publishes `written`; the peer is not trusted to keep to it, so
        // the stores are atomic (a race on values, never UB).
        unsafe {
            let data = self.map.as_mut_ptr().add(HEADER);
            copy_to_shared(data.add(start), &src[..first]);
            copy_to_shared(data, &src[first..]);
        }
    }

    /// Copies `len` ring bytes from stream position `at` (wrapping) to
    /// `dst`, which must be valid for `len` bytes of writes.
    ///
    /// # Safety
    /// `dst` is valid for `len` writes and `len` ≤ capacity.
    unsafe fn copy_out_to(&self, at: u64, dst: *mut u8, len: usize) {
        let start = (at % self.capacity as u64) as usize;
        let first = len.min(self.capacity - start);
        // SAFETY: both source ranges lie inside the data area; [read,
        // written) is the consumer's until it publishes `read`, and a
        // producer writing there anyway changes only the bytes copied (the
        // loads are atomic). `dst` is the caller's promise.
        unsafe {
            let data = self.map.as_mut_ptr().add(HEADER);
            copy_from_shared(data.add(start), dst, first);
            copy_from_shared(data, dst.add(first), len - first);
        }
    }

    /// `len` ring bytes from stream position `at` (wrapping), in a new
    /// buffer: one copy, no zeroing first.
    fn copy_out(&self, at: u64, len: usize) -> BytesMut {
        let mut out = BytesMut::with_capacity(len);
        // SAFETY: `out` has capacity for `len` bytes, all written before
        // `set_len`; `len` never exceeds the bytes available (≤ capacity).
        unsafe {
            self.copy_out_to(at, out.as_mut_ptr(), len);
            out.set_len(len);
        }
        out
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Producer,
    Consumer,
}

/// One end of a pipe. Its methods never block: they say
/// [`Progress::Wait`] and the caller waits with [`PipeEnd::wait_blocking`]
/// or, in async code, [`AsyncPipe`].
pub struct PipeEnd {
    /// Shared with the [`RingProbe`]s handed out, which only look.
    ring: Arc<Ring>,
    wake: OwnedFd,
    side: Side,
    /// The other side's socket end is closed (it finished or died).
    peer_gone: bool,
    /// This side finished or aborted; Drop has nothing left to say.
    done: bool,
}

/// What a non-blocking step managed.
#[derive(Debug, PartialEq, Eq)]
pub enum Progress {
    /// Moved this many bytes (reads: 0 means the stream ended normally).
    Moved(usize),
    /// Nothing to move now; wait for a wake-up and try again.
    Wait,
}

impl PipeEnd {
    fn new(ring: Ring, wake: OwnedFd, side: Side) -> Result<PipeEnd> {
        let ring = Arc::new(ring);
        nix::fcntl::fcntl(&wake, FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK))
            .map_err(io::Error::from)?;
        Ok(PipeEnd {
            ring,
            wake,
            side,
            peer_gone: false,
            done: false,
        })
    }

    /// The ring's capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.ring.capacity
    }

    pub(crate) fn written(&self) -> &AtomicU64 {
        self.ring.word64(OFF_WRITTEN)
    }
    fn read(&self) -> &AtomicU64 {
        self.ring.word64(OFF_READ)
    }
    fn my_state(&self) -> &AtomicU32 {
        self.ring.word32(match self.side {
            Side::Producer => OFF_PRODUCER_STATE,
            Side::Consumer => OFF_CONSUMER_STATE,
        })
    }
    fn peer_state(&self) -> &AtomicU32 {
        self.ring.word32(match self.side {
            Side::Producer => OFF_CONSUMER_STATE,
            Side::Consumer => OFF_PRODUCER_STATE,
        })
    }
    fn my_waiting(&self) -> &AtomicU32 {
        self.ring.word32(match self.side {
            Side::Producer => OFF_PRODUCER_WAITING,
            Side::Consumer => OFF_CONSUMER_WAITING,
        })
    }
    fn peer_waiting(&self) -> &AtomicU32 {
        self.ring.word32(match self.side {
            Side::Producer => OFF_CONSUMER_WAITING,
            Side::Consumer => OFF_PRODUCER_WAITING,
        })
    }

    /// Wakes the peer if it said it sleeps. SeqCst pairs with the fence in
    /// `prepare_wait`: either the peer sees our new position, or we see its
    /// flag.
    fn wake_peer(&self) {
        fence(Ordering::SeqCst);
        if self.peer_waiting().swap(0, Ordering::SeqCst) != 0 {
            // A full socket buffer already holds a wake-up; a closed one
            // means the peer is gone and has nothing to wake.
            // MSG_NOSIGNAL: a closed peer is an error to ignore, not SIGPIPE.
            let _ = nix::sys::socket::send(
                self.wake.as_raw_fd(),
                &[1u8],
                nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
            );
        }
    }

    /// Raises this side's waiting flag; the caller must re-check the ring
    /// before sleeping (the peer may have moved just before).
    fn prepare_wait(&self) {
        self.my_waiting().store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    fn cancel_wait(&self) {
        self.my_waiting().store(0, Ordering::Relaxed);
    }

    /// Reads and discards pending wake-up bytes; notes the peer's end closing.
    fn drain_wakeups(&mut self) -> io::Result<()> {
        let mut sink = [0u8; 64];
        loop {
            match nix::unistd::read(&self.wake, &mut sink) {
                Ok(0) => {
                    self.peer_gone = true;
                    return Ok(());
                }
                Ok(_) => continue,
                Err(nix::errno::Errno::EAGAIN) => return Ok(()),
                Err(nix::errno::Errno::EINTR) => continue,
                Err(nix::errno::Errno::ECONNRESET) => {
                    self.peer_gone = true;
                    return Ok(());
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Producer: copies as much of `data` as fits. `Wait` when the ring is
    /// full; an error when the consumer is gone.
    pub fn try_write(&mut self, data: &[u8]) -> Result<Progress> {
        self.try_write_slices(&[data])
    }

    /// Producer: copies as much of `slices` (in order) as fits, and
    /// publishes it with one position update and at most one wake-up.
    /// `Wait` when the ring is full; an error when the consumer is gone.
    pub fn try_write_slices(&mut self, slices: &[&[u8]]) -> Result<Progress> {
        debug_assert_eq!(self.side, Side::Producer);
        let total: usize = slices.iter().map(|s| s.len()).sum();
        if total == 0 {
            return Ok(Progress::Moved(0));
        }
        for attempt in 0..2 {
            if self.peer_gone || self.peer_state().load(Ordering::Acquire) != OPEN {
                return Err(Error::PipeAborted("the reader went away"));
            }
            let (written, read) = self.ring.positions()?;
            let free = self.ring.capacity - (written - read) as usize;
            if free > 0 {
                if attempt == 1 {
                    self.cancel_wait();
                }
                let mut at = written;
                let mut room = free;
                for slice in slices {
                    if room == 0 {
                        break;
                    }
                    let n = slice.len().min(room);
                    self.ring.copy_in(at, &slice[..n]);
                    at += n as u64;
                    room -= n;
                }
                self.written().store(at, Ordering::Release);
                self.wake_peer();
                return Ok(Progress::Moved((at - written) as usize));
            }
            if attempt == 0 {
                self.prepare_wait();
            }
        }
        Ok(Progress::Wait)
    }

    /// Consumer: whether the producer has published bytes not read yet (a
    /// peek at the positions; false when they make no sense).
    pub fn has_bytes(&self) -> bool {
        self.ring.has_unread()
    }

    /// A look at this consumer's ring from elsewhere in this process
    /// (a runtime's park hook, [`crate::park`]): whether it holds unread
    /// bytes, while this end lives.
    #[cfg(feature = "runtime")]
    pub(crate) fn probe(&self) -> RingProbe {
        RingProbe(Arc::downgrade(&self.ring))
    }

    /// Consumer: appends up to `max` bytes of the stream to `buf` (one copy,
    /// straight into its spare capacity). `Moved(0)` means the stream ended
    /// normally; `Wait` means nothing yet; an error means the producer
    /// aborted or died before finishing.
    pub fn try_read_into(&mut self, buf: &mut BytesMut, max: usize) -> Result<Progress> {
        debug_assert_eq!(self.side, Side::Consumer);
        for attempt in 0..2 {
            let state = self.peer_state().load(Ordering::Acquire);
            let (written, read) = self.ring.positions()?;
            if written > read {
                if attempt == 1 {
                    self.cancel_wait();
                }
                let n = ((written - read) as usize).min(max.max(1));
                buf.reserve(n);
                // SAFETY: `buf` has spare capacity for `n` bytes (reserved
                // above), all written by the copy before `set_len`; `n` is
                // within the bytes available, so within the ring.
                unsafe {
                    let len = buf.len();
                    self.ring.copy_out_to(read, buf.as_mut_ptr().add(len), n);
                    buf.set_len(len + n);
                }
                self.read().store(read + n as u64, Ordering::Release);
                self.wake_peer();
                return Ok(Progress::Moved(n));
            }
            match state {
                FINISHED => {
                    self.cancel_wait();
                    self.done = true;
                    return Ok(Progress::Moved(0));
                }
                OPEN if !self.peer_gone => {}
                _ => {
                    self.cancel_wait();
                    return Err(Error::PipeAborted("the writer went away before the end"));
                }
            }
            if attempt == 0 {
                self.prepare_wait();
            }
        }
        Ok(Progress::Wait)
    }

    /// Consumer: up to `max` bytes of the stream. `Moved(0)` with an empty
    /// buffer means the stream ended normally; `Wait` means none yet; an
    /// error means the producer aborted or died before finishing.
    pub fn try_read(&mut self, max: usize) -> Result<(Progress, Bytes)> {
        debug_assert_eq!(self.side, Side::Consumer);
        for attempt in 0..2 {
            // The producer's state first: it publishes `written` before
            // FINISHED, so a finished state read here means every byte is
            // already visible below.
            let state = self.peer_state().load(Ordering::Acquire);
            let (written, read) = self.ring.positions()?;
            if written > read {
                if attempt == 1 {
                    self.cancel_wait();
                }
                let n = ((written - read) as usize).min(max.max(1));
                let out = self.ring.copy_out(read, n);
                self.read().store(read + n as u64, Ordering::Release);
                self.wake_peer();
                return Ok((Progress::Moved(n), out.freeze()));
            }
            match state {
                FINISHED => {
                    self.cancel_wait();
                    self.done = true;
                    return Ok((Progress::Moved(0), Bytes::new()));
                }
                OPEN if !self.peer_gone => {}
                _ => {
                    self.cancel_wait();
                    return Err(Error::PipeAborted("the writer went away before the end"));
                }
            }
            if attempt == 0 {
                self.prepare_wait();
            }
        }
        Ok((Progress::Wait, Bytes::new()))
    }

    /// Producer: marks the stream complete (the consumer reads what is left,
    /// then end-of-stream).
    pub fn finish(&mut self) {
        self.end(FINISHED);
    }

    /// Either side: gives up; the peer sees an error (or, for the
    /// producer, its next write fails).
    pub fn abort(&mut self) {
        self.end(ABORTED);
    }

    fn end(&mut self, state: u32) {
        if self.done {
            return;
        }
        self.done = true;
        self.my_state().store(state, Ordering::Release);
        self.wake_peer();
        // Closing our socket end (on drop) wakes a peer that is not waiting
        // on the flag yet but about to poll.
    }

    /// Sleeps until the peer wakes us or goes away (`poll(2)`, no timeout:
    /// every way out of the wait is an event).
    pub fn wait_blocking(&mut self) -> Result<()> {
        self.wait_blocking_for(None).map(drop)
    }

    /// [`wait_blocking`](Self::wait_blocking), for at most `limit`; false
    /// when the time ran out with nothing from the peer.
    fn wait_blocking_for(&mut self, limit: Option<std::time::Duration>) -> Result<bool> {
        let mut fds = [nix::poll::PollFd::new(
            self.wake.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        let timeout = match limit {
            None => nix::poll::PollTimeout::NONE,
            Some(limit) => nix::poll::PollTimeout::try_from(limit).unwrap_or(nix::poll::PollTimeout::MAX),
        };
        loop {
            match nix::poll::poll(&mut fds, timeout) {
                Ok(0) => return Ok(false),
                Ok(_) => break,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(io::Error::from(e).into()),
            }
        }
        self.drain_wakeups()?;
        Ok(true)
    }

    /// Producer: writes all of `data`, blocking while the ring is full.
    pub fn write_all_blocking(&mut self, data: &[u8]) -> Result<()> {
        self.write_all_within(data, None)
    }

    /// [`write_all_blocking`](Self::write_all_blocking), giving up (and
    /// aborting the stream) when the reader takes nothing for `idle`: a
    /// reader that stalls must not hold a producer forever.
    pub fn write_all_within(&mut self, mut data: &[u8], idle: Option<std::time::Duration>) -> Result<()> {
        while !data.is_empty() {
            match self.try_write(data)? {
                Progress::Moved(n) => data = &data[n..],
                Progress::Wait => {
                    if !self.wait_blocking_for(idle)? {
                        self.abort();
                        return Err(Error::PipeAborted("the reader took nothing for too long"));
                    }
                }
            }
        }
        Ok(())
    }

    /// Consumer: the next chunk (at most `max` bytes), blocking while the
    /// ring is empty; empty at the end of the stream.
    pub fn read_blocking(&mut self, max: usize) -> Result<Bytes> {
        loop {
            match self.try_read(max)? {
                (Progress::Moved(_), bytes) => return Ok(bytes),
                (Progress::Wait, _) => self.wait_blocking()?,
            }
        }
    }

    /// Turns this end into one that waits on tokio's reactor.
    #[cfg(feature = "runtime")]
    pub fn into_async(self) -> Result<AsyncPipe> {
        AsyncPipe::new(self)
    }
}

impl Drop for PipeEnd {
    fn drop(&mut self) {
        // Dropped without finishing: an incomplete stream, never a silent
        // short one.
        self.abort();
    }
}

impl AsRawFd for PipeEnd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.wake.as_raw_fd()
    }
}

/// A [`PipeEnd`] whose waits go through tokio's reactor (the listener's
/// side of every stream).
#[cfg(feature = "runtime")]
pub struct AsyncPipe {
    end: tokio::io::unix::AsyncFd<PipeEnd>,
}

#[cfg(feature = "runtime")]
impl AsyncPipe {
    fn new(end: PipeEnd) -> Result<AsyncPipe> {
        // SAFETY: the descriptor is the end's own `wake` socket, which it
        // owns and never replaces or closes before being dropped itself.
        let end =
            unsafe { tokio::io::unix::AsyncFd::register_with_interest(end, tokio::io::Interest::READABLE) }
                .map_err(io::Error::from)?;
        Ok(AsyncPipe { end })
    }

    /// The stream's next chunk (at most `max` bytes); empty at its end.
    pub async fn read(&mut self, max: usize) -> Result<Bytes> {
        std::future::poll_fn(|cx| self.poll_read(cx, max)).await
    }

    /// Polls for the stream's next chunk (for `Body` and `Stream` impls).
    pub fn poll_read(
        &mut self,
        cx: &mut std::task::Context<'_>,
        max: usize,
    ) -> std::task::Poll<Result<Bytes>> {
        use std::task::Poll;
        loop {
            if let (Progress::Moved(_), bytes) = self.end.get_mut().try_read(max)? {
                return Poll::Ready(Ok(bytes));
            }
            let mut guard = match self.end.poll_read_ready_mut(cx) {
                Poll::Ready(guard) => guard?,
                Poll::Pending => return Poll::Pending,
            };
            let end = guard.get_inner_mut();
            end.drain_wakeups()?;
            if !end.peer_gone {
                guard.clear_ready();
            }
        }
    }

    /// Polls for stream bytes appended to `buf` (at most `max`): the count,
    /// 0 at the stream's normal end.
    pub fn poll_read_into(
        &mut self,
        cx: &mut std::task::Context<'_>,
        buf: &mut BytesMut,
        max: usize,
    ) -> std::task::Poll<Result<usize>> {
        use std::task::Poll;
        loop {
            if let Progress::Moved(n) = self.end.get_mut().try_read_into(buf, max)? {
                return Poll::Ready(Ok(n));
            }
            match self.poll_wake(cx) {
                Poll::Ready(result) => result?,
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// The end itself, for its non-blocking steps (`try_write_slices` …).
    pub fn end_mut(&mut self) -> &mut PipeEnd {
        self.end.get_mut()
    }

    /// Polls for the peer's next wake-up (or its going away): after a step
    /// said `Wait`, `Ready` means try again.
    pub fn poll_wake(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<()>> {
        use std::task::Poll;
        let mut guard = match self.end.poll_read_ready_mut(cx) {
            Poll::Ready(guard) => guard?,
            Poll::Pending => return Poll::Pending,
        };
        let end = guard.get_inner_mut();
        end.drain_wakeups()?;
        // Drained to EAGAIN (or EOF, which stays readable): re-arm.
        if !end.peer_gone {
            guard.clear_ready();
        }
        Poll::Ready(Ok(()))
    }

    /// Writes all of `data`, waiting while the ring is full.
    pub async fn write_all(&mut self, mut data: &[u8]) -> Result<()> {
        while !data.is_empty() {
            match self.end.get_mut().try_write(data)? {
                Progress::Moved(n) => data = &data[n..],
                Progress::Wait => self.wait().await?,
            }
        }
        Ok(())
    }

    async fn wait(&mut self) -> Result<()> {
        let mut guard = self.end.readable_mut().await?;
        let end = guard.get_inner_mut();
        end.drain_wakeups()?;
        // Drained to EAGAIN (or EOF, which stays readable): re-arm.
        if !end.peer_gone {
            guard.clear_ready();
        }
        Ok(())
    }

    /// Producer: the stream is complete.
    pub fn finish(&mut self) {
        self.end.get_mut().finish();
    }

    /// Gives up on the stream.
    pub fn abort(&mut self) {
        self.end.get_mut().abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn bytes_cross_in_order_through_a_small_ring() {
        let (mut producer, handle) = pipe(4096, Some(100_000)).unwrap();
        assert_eq!(handle.length(), Some(100_000));
        let data = pattern(100_000, 7);
        let expected = data.clone();
        let writer = std::thread::spawn(move || {
            for chunk in data.chunks(1000) {
                producer.write_all_blocking(chunk).unwrap();
            }
            producer.finish();
        });
        let mut consumer = handle.open().unwrap();
        let mut got = Vec::new();
        loop {
            let chunk = consumer.read_blocking(3000).unwrap();
            if chunk.is_empty() {
                break;
            }
            got.extend_from_slice(&chunk);
        }
        writer.join().unwrap();
        assert_eq!(got, expected);
    }

    #[test]
    fn a_producer_dropped_mid_stream_is_an_error_not_an_end() {
        let (mut producer, handle) = pipe(4096, None).unwrap();
        producer.write_all_blocking(b"partial").unwrap();
        drop(producer);
        let mut consumer = handle.open().unwrap();
        assert_eq!(&consumer.read_blocking(100).unwrap()[..], b"partial");
        assert!(matches!(consumer.read_blocking(100), Err(Error::PipeAborted(_))));
    }

    #[test]
    fn a_full_ring_blocks_the_producer_until_the_reader_leaves() {
        let (mut producer, handle) = pipe(4096, None).unwrap();
        let consumer = handle.open().unwrap();
        let writer = std::thread::spawn(move || producer.write_all_blocking(&[0u8; 1 << 20]));
        // The writer fills the ring and sleeps; the reader never reads, then
        // goes away: the writer wakes with an error instead of hanging.
        drop(consumer);
        assert!(matches!(writer.join().unwrap(), Err(Error::PipeAborted(_))));
    }

    #[test]
    fn a_reader_that_stalls_times_the_producer_out() {
        let (mut producer, handle) = pipe(4096, None).unwrap();
        let consumer = handle.open().unwrap();
        let idle = Some(std::time::Duration::from_millis(50));
        // Fills the ring, then waits for room that never comes.
        let result = producer.write_all_within(&[0u8; 10_000], idle);
        assert!(matches!(result, Err(Error::PipeAborted(_))), "{result:?}");
        drop(consumer);
    }

    #[test]
    fn the_wake_socket_alone_is_not_a_ring() {
        let (_producer, handle) = pipe(4096, None).unwrap();
        let (ring, wake, _) = handle.into_parts().unwrap();
        let forged = StreamHandle::from_parts(wake.try_clone().unwrap(), wake, None);
        assert!(forged.open().is_err());
        drop(ring);
    }

    #[test]
    fn positions_from_a_lying_peer_are_refused() {
        let (producer, handle) = pipe(4096, None).unwrap();
        producer.written().store(1 << 40, Ordering::Release);
        let mut consumer = handle.open().unwrap();
        assert!(matches!(consumer.try_read(10), Err(Error::Malformed(_))));
    }

    #[cfg(feature = "runtime")]
    #[tokio::test]
    async fn async_ends_stream_both_ways() {
        let (producer, handle) = pipe(8192, None).unwrap();
        let mut producer = producer.into_async().unwrap();
        let data = pattern(1 << 20, 3);
        let expected = data.clone();
        let writer = tokio::spawn(async move {
            for chunk in data.chunks(10_000) {
                producer.write_all(chunk).await.unwrap();
            }
            producer.finish();
        });
        let mut consumer = handle.open().unwrap().into_async().unwrap();
        let mut got = Vec::new();
        loop {
            let chunk = consumer.read(64 * 1024).await.unwrap();
            if chunk.is_empty() {
                break;
            }
            got.extend_from_slice(&chunk);
        }
        writer.await.unwrap();
        assert_eq!(got, expected);
    }
}
