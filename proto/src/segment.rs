//! A pool segment as its consumer sees it: the header's layout, which the
//! producer (`pool`) writes by too, the mapping cache, and the reading out
//! of a body, which marks the segment free again. [`crate::shm`] reads a
//! received segment body through here; the trust rules are in `pool`'s
//! documentation (decision 0031).

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use nix::fcntl::{FcntlArg, SealFlag, fcntl};

use crate::budget::{Reservation, copy_from_shared};
use crate::{Error, Result};

/// Bytes before a segment's body: the header, padded to a page.
pub(crate) const HEADER: usize = 4096;
pub(crate) const MAGIC: u64 = u64::from_le_bytes(*b"SWYSEG01");
pub(crate) const OFF_MAGIC: usize = 0;
pub(crate) const OFF_STATE: usize = 8;
pub(crate) const OFF_KIND: usize = 12;
pub(crate) const FREE: u32 = 0;
pub(crate) const BUSY: u32 = 1;
/// Kinds of segment (the header word at `OFF_KIND`): a reusable one of a
/// pool, or one made for a single body (which a consumer does not cache).
pub(crate) const REUSABLE: u32 = 0;
pub(crate) const ONCE: u32 = 1;

/// Smallest body room of a segment; rooms are powers of two above it, and
/// a segment is its header page plus its room.
pub(crate) const MIN_ROOM: usize = 64 * 1024;
/// Bodies larger than this go as one-shot sealed segments.
pub const MAX_POOLED_BODY: usize = 8 * 1024 * 1024;

/// A consumer's mapping of a pool segment, shared by every body the segment
/// carries. Only ever accessed through atomics: the producer may write it
/// at any time.
struct Mapped {
    map: memmap2::MmapRaw,
    size: usize,
    _reservation: Reservation,
}

impl Mapped {
    fn state(&self) -> &AtomicU32 {
        // SAFETY: as in `PoolSegment::state`: the header page is mapped,
        // and every process accesses the word only atomically.
        unsafe { &*(self.map.as_mut_ptr().add(OFF_STATE) as *const AtomicU32) }
    }

    fn kind(&self) -> u32 {
        // SAFETY: as for `state`.
        unsafe { (*(self.map.as_mut_ptr().add(OFF_KIND) as *const AtomicU32)).load(Ordering::Acquire) }
    }

    /// Copies `len` body bytes into `out` with relaxed atomic loads, 8
    /// bytes at a time: sound whatever the producer does meanwhile (a
    /// concurrent write can only tear the bytes copied), and as fast as a
    /// plain copy (decision 0031 has the measurement).
    fn copy_body(&self, len: usize, out: &mut Vec<u8>) {
        debug_assert!(HEADER + len <= self.size && out.capacity() >= len);
        out.clear();
        // SAFETY: HEADER + len ≤ size (checked by the caller): the source
        // lies in the mapping, which every process accesses atomically;
        // `out` has capacity for `len` bytes, all written before `set_len`.
        unsafe {
            copy_from_shared(self.map.as_ptr().add(HEADER), out.as_mut_ptr(), len);
            out.set_len(len);
        }
    }
}

/// Segments this process has mapped, by (device, inode): a segment is
/// mapped once and reused for every body it carries. Holding the mapping
/// keeps the inode alive, so a key cannot be reused by another memfd while
/// it is cached.
static MAPPED: Mutex<Option<MappingCache>> = Mutex::new(None);
/// Mappings kept, in number and bytes; the least recently used beyond
/// either are dropped.
const MAX_MAPPED: usize = 64;
const MAX_MAPPED_BYTES: usize = 128 * 1024 * 1024;

/// (device, inode) → the mapping and when it was last used.
type MappingCache = HashMap<(u64, u64), (Arc<Mapped>, Instant)>;

/// Drops this process's cached mappings of pool segments and of sealed
/// bodies, and the spare buffers bodies were read into, not used for
/// `idle` (producers trim idle segments too). Every process calls it periodically.
pub fn trim_mappings(idle: Duration) {
    let now = Instant::now();
    if let Some(cache) = MAPPED.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
        cache.retain(|_, (_, last)| now.duration_since(*last) < idle);
    }
    SPARE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|(_, back)| now.duration_since(*back) < idle);
    crate::sealed::trim(idle);
}

/// Pool segments this process keeps mapped (tests, status).
pub fn mapped_segments() -> usize {
    MAPPED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .map_or(0, HashMap::len)
}

/// Checks a received pool segment's descriptor for a body of `len` bytes.
pub(crate) fn check(fd: &OwnedFd, len: u64) -> Result<()> {
    let seals =
        fcntl(fd, FcntlArg::F_GET_SEALS).map_err(|_| Error::Malformed("pool segment is not a memfd"))?;
    if !SealFlag::from_bits_truncate(seals).contains(SealFlag::F_SEAL_SHRINK) {
        return Err(Error::Malformed("pool segment can shrink"));
    }
    let size = nix::sys::stat::fstat(fd).map_err(std::io::Error::from)?.st_size as u64;
    if size < HEADER as u64 + len {
        return Err(Error::Malformed("pool segment shorter than its handle"));
    }
    Ok(())
}

/// The mapping of the segment `fd`, from the cache or made now (its magic
/// checked: read once, atomically, then compared).
fn mapping(fd: &OwnedFd) -> Result<Arc<Mapped>> {
    let stat = nix::sys::stat::fstat(fd).map_err(std::io::Error::from)?;
    let size = stat.st_size as usize;
    if size < HEADER {
        return Err(Error::Malformed("pool segment shorter than its header"));
    }
    let key = (stat.st_dev, stat.st_ino);
    let now = Instant::now();
    let mut cache = MAPPED.lock().unwrap_or_else(|p| p.into_inner());
    let cache = cache.get_or_insert_with(HashMap::new);
    if let Some((mapped, last)) = cache.get_mut(&key) {
        *last = now;
        return Ok(mapped.clone());
    }
    let reservation = Reservation::take(size as u64)?;
    let map = memmap2::MmapOptions::new().len(size).map_raw(fd)?;
    // SAFETY: the magic lies inside the mapped header page, 8-aligned in a
    // page-aligned mapping; read atomically, once.
    let magic = unsafe { (*(map.as_mut_ptr().add(OFF_MAGIC) as *const AtomicU64)).load(Ordering::Acquire) };
    if magic != MAGIC {
        return Err(Error::Malformed("pool segment header is not a segment's"));
    }
    let mapped = Arc::new(Mapped {
        map,
        size,
        _reservation: reservation,
    });
    // One made for a single body (`place_once`), never to be seen again:
    // caching it would only keep its memory alive. (A segment larger than
    // any pooled one is such a body whatever its header says.)
    if size > HEADER + MAX_POOLED_BODY || mapped.kind() != REUSABLE {
        return Ok(mapped);
    }
    make_room(cache, |m| m.size, size, MAX_MAPPED, MAX_MAPPED_BYTES);
    cache.insert(key, (mapped.clone(), now));
    Ok(mapped)
}

/// Drops the least recently used entries of a cache of mappings by
/// (device, inode) until one more of `size` bytes fits in `max_len`
/// entries and `max_bytes` (`bytes` gives an entry's size). Shared by the
/// pool segments' cache here and the sealed bodies' one (`sealed`).
pub(crate) fn make_room<T>(
    cache: &mut HashMap<(u64, u64), (Arc<T>, Instant)>,
    bytes: impl Fn(&T) -> usize,
    size: usize,
    max_len: usize,
    max_bytes: usize,
) {
    let mut held: usize = cache.values().map(|(m, _)| bytes(m)).sum();
    while cache.len() >= max_len || (!cache.is_empty() && held + size > max_bytes) {
        let Some(oldest) = cache.iter().min_by_key(|(_, (_, last))| *last).map(|(k, _)| *k) else {
            break;
        };
        if let Some((evicted, _)) = cache.remove(&oldest) {
            held -= bytes(&evicted);
        }
    }
}

/// Reads the `len` body bytes of a received pool segment into memory of
/// this process, then marks the segment free for its producer to reuse.
/// The bytes count against the budget while they live.
///
/// A body that cannot be read (this process's budget cannot take its
/// mapping or its copy) frees its segment all the same, as one dropped
/// unread does: left busy, it would hold its producer's budget for the
/// whole lease (two minutes), and a burst of such bodies refused every
/// large answer that long (tests/slow_readers.rs saw it).
pub(crate) fn read(fd: &OwnedFd, len: u64) -> Result<Bytes> {
    let read = read_out(fd, len);
    if read.is_err() {
        release_unread(fd);
    }
    read
}

fn read_out(fd: &OwnedFd, len: u64) -> Result<Bytes> {
    let mapped = mapping(fd)?;
    let len = usize::try_from(len).map_err(|_| Error::Malformed("pool body longer than memory"))?;
    if HEADER.saturating_add(len) > mapped.size {
        return Err(Error::Malformed("pool segment shorter than its handle"));
    }
    let reservation = Reservation::take(len as u64)?;
    let mut body = spare_buffer(len);
    mapped.copy_body(len, &mut body);
    // The bytes are ours now: the producer may rewrite the segment.
    mapped.state().store(FREE, Ordering::Release);
    Ok(Bytes::from_owner(Copied {
        body,
        _reservation: reservation,
    }))
}

/// Marks a pool segment free without reading its body, which was dropped
/// unread (see `shm::Segment`'s drop): its producer may reuse or release it
/// now rather than when its lease runs out. Best effort: a segment this
/// process cannot map is left to that lease.
pub(crate) fn release_unread(fd: &OwnedFd) {
    let Ok(stat) = nix::sys::stat::fstat(fd) else {
        return;
    };
    if (stat.st_size as usize) < HEADER {
        return;
    }
    let key = (stat.st_dev, stat.st_ino);
    let cached = MAPPED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .and_then(|cache| cache.get(&key).map(|(mapped, _)| mapped.clone()));
    if let Some(mapped) = cached {
        return mapped.state().store(FREE, Ordering::Release);
    }
    // Only the header page: the body's pages are not touched.
    let Ok(header) = memmap2::MmapOptions::new().len(HEADER).map_raw(fd) else {
        return;
    };
    // SAFETY: the magic and state words lie inside the mapped header page
    // (the file is at least a page long, checked above), aligned in a
    // page-aligned mapping, and every process accesses them atomically.
    unsafe {
        if (*(header.as_mut_ptr().add(OFF_MAGIC) as *const AtomicU64)).load(Ordering::Acquire) == MAGIC {
            (*(header.as_mut_ptr().add(OFF_STATE) as *const AtomicU32)).store(FREE, Ordering::Release);
        }
    }
}

/// A pooled body read out of its segment, counted against the budget; its
/// buffer goes back to [`SPARE`] when dropped.
struct Copied {
    body: Vec<u8>,
    _reservation: Reservation,
}

impl AsRef<[u8]> for Copied {
    fn as_ref(&self) -> &[u8] {
        &self.body
    }
}

impl Drop for Copied {
    fn drop(&mut self) {
        let body = std::mem::take(&mut self.body);
        let mut spare = SPARE.lock().unwrap_or_else(|p| p.into_inner());
        let held: usize = spare.iter().map(|(b, _)| b.capacity()).sum();
        if spare.len() < MAX_SPARE && held + body.capacity() <= MAX_SPARE_BYTES {
            spare.push((body, Instant::now()));
        }
    }
}

/// Buffers bodies were read into, kept for the next ones: a fresh buffer
/// costs a page fault per 4 KiB when the body is copied in, which is what
/// pool segments exist to avoid (decision 0011), with when each came back.
static SPARE: Mutex<Vec<(Vec<u8>, Instant)>> = Mutex::new(Vec::new());
/// Spare buffers kept, in number and bytes.
const MAX_SPARE: usize = 16;
const MAX_SPARE_BYTES: usize = 32 * 1024 * 1024;

/// An empty buffer with room for `len` bytes: a spare one of the right size
/// class if there is one (at most twice the room needed), else a new one.
fn spare_buffer(len: usize) -> Vec<u8> {
    let room = len.next_power_of_two().max(MIN_ROOM);
    let mut spare = SPARE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(i) = spare
        .iter()
        .position(|(b, _)| b.capacity() >= len && b.capacity() <= 2 * room)
    {
        let (mut body, _) = spare.swap_remove(i);
        body.clear();
        return body;
    }
    Vec::with_capacity(room)
}
