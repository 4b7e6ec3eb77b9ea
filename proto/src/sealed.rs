//! Sealed bodies answered more than once, on both ends.
//!
//! A producer that answers many requests with the same large body (a cached
//! file, a rendered page) keeps it sealed in shared memory once
//! ([`share`]): every answer made of those bytes, whole or a prefix,
//! crosses as a duplicate of the memfd's descriptor
//! ([`ShmBody::of_shared`](crate::ShmBody::of_shared)) instead of being
//! copied into a pool segment. A consumer that receives the same sealed
//! memfd a second time keeps it mapped ([`map`]): the answers after that
//! cost it neither a copy nor a mapping; hyper writes them straight from
//! the one mapping.
//!
//! Sealing is what makes both safe (docs/decisions/0160): a sealed memfd
//! can be neither written nor resized by anyone, so its bytes cannot change
//! under a reader, a mapping of it can be read as a plain `&[u8]` by any
//! number of answers at once, and a cached mapping keeps its inode alive,
//! so the (device, inode) key cannot be reused by another memfd while it is
//! cached. Pool segments, which their producer rewrites, never come here.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::Result;
use crate::budget::Reservation;

/// A producer's sealed body, mapped read-only, registered by its address
/// while it lives.
struct Shared {
    fd: Arc<OwnedFd>,
    map: memmap2::Mmap,
    _reservation: Reservation,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Before the unmapping (the fields drop after this): no other
        // mapping can have this address yet.
        lock(&SHARED).remove(&(self.map.as_ptr() as usize));
    }
}

struct SharedView(Arc<Shared>);

impl AsRef<[u8]> for SharedView {
    fn as_ref(&self) -> &[u8] {
        &self.0.map
    }
}

/// This process's shared bodies by the address of their mapping, with
/// their length.
static SHARED: Mutex<BTreeMap<usize, (usize, Weak<Shared>)>> = Mutex::new(BTreeMap::new());

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Seals a copy of `bytes` in shared memory, counted against the budget
/// while any view of it lives, and returns a view of it.
pub(crate) fn share(bytes: &[u8]) -> Result<Bytes> {
    if bytes.is_empty() {
        return Ok(Bytes::new());
    }
    let reservation = Reservation::take(bytes.len() as u64)?;
    let fd = crate::shm::sealed_memfd(bytes)?;
    // SAFETY: the memfd is sealed against writes and resizing: the mapped
    // bytes cannot change or vanish.
    let map = unsafe { memmap2::MmapOptions::new().len(bytes.len()).populate().map(&fd)? };
    let shared = Arc::new(Shared {
        fd: Arc::new(fd),
        map,
        _reservation: reservation,
    });
    lock(&SHARED).insert(
        shared.map.as_ptr() as usize,
        (bytes.len(), Arc::downgrade(&shared)),
    );
    Ok(Bytes::from_owner(SharedView(shared)))
}

/// The descriptor of the shared body `bytes` is a prefix of, if it is one.
/// The test is on addresses: bytes that start where a live shared body's
/// mapping starts are that mapping's bytes, whoever holds them.
pub(crate) fn descriptor_of(bytes: &Bytes) -> Option<Arc<OwnedFd>> {
    if bytes.is_empty() {
        return None;
    }
    let start = bytes.as_ptr() as usize;
    let registry = lock(&SHARED);
    let (&at, (len, shared)) = registry.range(..=start).next_back()?;
    if at != start || bytes.len() > *len {
        return None;
    }
    Some(shared.upgrade()?.fd.clone())
}

/// A consumer's mapping of a sealed memfd: a cached one, of the whole
/// file, shared by every body that arrives in it ([`MappedPrefix`]), or
/// one made for a single body.
struct Mapping {
    map: memmap2::Mmap,
    _reservation: Reservation,
}

impl AsRef<[u8]> for Mapping {
    fn as_ref(&self) -> &[u8] {
        &self.map
    }
}

struct MappedPrefix {
    mapping: Arc<Mapping>,
    len: usize,
}

impl AsRef<[u8]> for MappedPrefix {
    fn as_ref(&self) -> &[u8] {
        &self.mapping.map[..self.len]
    }
}

#[derive(Default)]
struct Cache {
    /// Mapped sealed memfds by (device, inode), with when each was last used.
    mapped: HashMap<(u64, u64), (Arc<Mapping>, Instant)>,
    /// Sealed memfds seen once, not mapped: the second sight maps one for
    /// good. (Without the file held, a key may come back as another memfd;
    /// that caches a body needlessly, never a wrong one: what is cached is
    /// mapped from the descriptor that arrived.)
    seen: VecDeque<(u64, u64)>,
}

static CACHE: Mutex<Option<Cache>> = Mutex::new(None);

/// Mappings kept, in number and bytes; the least recently used beyond either
/// are dropped.
const MAX_MAPPED: usize = 32;
const MAX_MAPPED_BYTES: usize = 64 * 1024 * 1024;
/// Keys remembered as seen once.
const MAX_SEEN: usize = 64;

/// The first `len` bytes of the sealed memfd `fd` (its seals checked by
/// the caller), mapped read-only: a mapping of this process's cache when
/// the memfd was seen before, else one of their own.
pub(crate) fn map(fd: &OwnedFd, len: u64) -> Result<Bytes> {
    let stat = nix::sys::stat::fstat(fd).map_err(std::io::Error::from)?;
    let (key, size) = ((stat.st_dev, stat.st_ino), stat.st_size as usize);
    let len = len as usize;
    let mut cache = lock(&CACHE);
    let cache = cache.get_or_insert_with(Cache::default);
    let now = Instant::now();
    if let Some((mapping, last)) = cache.mapped.get_mut(&key)
        && len <= mapping.map.len()
    {
        *last = now;
        return Ok(view(mapping.clone(), len));
    }
    let again = cache.seen.contains(&key);
    if !again || size > MAX_MAPPED_BYTES {
        if !again {
            if cache.seen.len() == MAX_SEEN {
                cache.seen.pop_front();
            }
            cache.seen.push_back(key);
        }
        let reservation = Reservation::take(len as u64)?;
        // SAFETY: sealed against writes and shrinking (checked by the
        // caller): the bytes cannot change or vanish under the mapping.
        // Populated up front: one call maps every page instead of a fault each.
        let map = unsafe { memmap2::MmapOptions::new().len(len).populate().map(fd)? };
        return Ok(Bytes::from_owner(Mapping {
            map,
            _reservation: reservation,
        }));
    }
    cache.seen.retain(|k| *k != key);
    let reservation = Reservation::take(size as u64)?;
    // SAFETY: as above; the whole file, so that any prefix is served.
    let map = unsafe { memmap2::MmapOptions::new().len(size).populate().map(fd)? };
    let mapping = Arc::new(Mapping {
        map,
        _reservation: reservation,
    });
    crate::segment::make_room(
        &mut cache.mapped,
        |m| m.map.len(),
        size,
        MAX_MAPPED,
        MAX_MAPPED_BYTES,
    );
    cache.mapped.insert(key, (mapping.clone(), now));
    Ok(view(mapping, len))
}

fn view(mapping: Arc<Mapping>, len: usize) -> Bytes {
    if len == 0 {
        return Bytes::new();
    }
    Bytes::from_owner(MappedPrefix { mapping, len })
}

/// Drops the cached mappings not used for `idle` (their memory goes back
/// once the bodies still using them are sent).
pub(crate) fn trim(idle: Duration) {
    let now = Instant::now();
    if let Some(cache) = lock(&CACHE).as_mut() {
        cache
            .mapped
            .retain(|_, (_, last)| now.duration_since(*last) < idle);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ShmBody;

    #[test]
    fn prefixes_of_a_shared_body_name_its_memfd_and_nothing_else_does() {
        let shared = share(&[9u8; 100_000]).unwrap();
        let at = shared.as_ptr() as usize;
        assert!(descriptor_of(&shared).is_some());
        assert!(descriptor_of(&shared.slice(..1000)).is_some());
        assert!(descriptor_of(&shared.slice(1..1000)).is_none(), "not a prefix");
        assert!(descriptor_of(&Bytes::from(vec![9u8; 100_000])).is_none());
        let body = ShmBody::of_shared(&shared.slice(..5000)).unwrap();
        assert_eq!(body.len(), 5000);
        assert_eq!(body.map().unwrap(), vec![9u8; 5000]);
        drop(shared);
        assert!(
            !lock(&SHARED).contains_key(&at),
            "unregistered with its last view"
        );
    }

    #[test]
    fn a_consumer_keeps_a_sealed_memfd_mapped_from_its_second_sight() {
        let shared = share(&[3u8; 200_000]).unwrap();
        let received = || {
            let sent = ShmBody::of_shared(&shared).unwrap();
            ShmBody::adopt(sent.fd_clone().unwrap(), sent.len()).unwrap()
        };
        let stat = nix::sys::stat::fstat(&*descriptor_of(&shared).unwrap()).unwrap();
        let key = (stat.st_dev, stat.st_ino);
        let cached = || {
            lock(&CACHE)
                .as_ref()
                .and_then(|c| c.mapped.get(&key).map(|(m, _)| m.map.as_ptr()))
        };
        let first = received().map().unwrap();
        assert_eq!(first, shared);
        assert_eq!(cached(), None, "a body seen once may never come again");
        let second = received().map().unwrap();
        let third = received().map().unwrap();
        assert_eq!(cached(), Some(second.as_ptr()));
        assert_eq!(third.as_ptr(), second.as_ptr(), "one mapping for both");
        assert_eq!(third, shared);
        trim(Duration::ZERO);
        assert_eq!(cached(), None, "idle mappings are let go");
        assert_eq!(second, shared, "views outlive the cache");
    }
}
