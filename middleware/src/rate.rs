//! Token buckets per client on `governor` (GCRA), in bounded memory.
//!
//! governor's keyed limiters keep one 8-byte state per key in a `DashMap`
//! and can forget keys whose bucket is full again (`retain_recent`), but
//! nothing stops a client that makes up a new key per request (a new
//! source address, a new API key name) from growing the map without end.
//! [`Bounded`] is governor's own `DashMap` store with a ceiling: known keys
//! keep their bucket; at the ceiling, keys it has not seen share one
//! overflow bucket until a sweep forgets idle ones. A flood of new keys
//! thus gets one bucket's worth of requests between them, and memory
//! stays at the ceiling.

use std::hash::Hash;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use governor::clock::{Clock, DefaultClock};
use governor::nanos::Nanos;
use governor::state::keyed::ShrinkableKeyedStateStore;
use governor::state::{InMemoryState, NotKeyed, StateStore};
use governor::{Quota, RateLimiter};

/// Whose bucket a request takes from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Key {
    Address(IpAddr),
    Subject(String),
}

/// A keyed store of at most `cap` keys plus one overflow bucket.
pub(crate) struct Bounded {
    map: DashMap<Key, InMemoryState>,
    cap: usize,
    overflow: InMemoryState,
    /// Set when a new key met a full map: a sweep is due. Shared with the
    /// [`Limiter`], since governor keeps its store to itself.
    full: Arc<AtomicBool>,
}

impl StateStore for Bounded {
    type Key = Key;

    fn measure_and_replace<T, F, E>(&self, key: &Key, f: F) -> Result<T, E>
    where
        F: Fn(Option<Nanos>) -> Result<(T, Nanos), E>,
    {
        if let Some(state) = self.map.get(key) {
            return state.measure_and_replace(&NotKeyed::NonKey, f);
        }
        if self.map.len() >= self.cap {
            self.full.store(true, Ordering::Relaxed);
            return self.overflow.measure_and_replace(&NotKeyed::NonKey, f);
        }
        let state = self.map.entry(key.clone()).or_default();
        state.measure_and_replace(&NotKeyed::NonKey, f)
    }
}

impl ShrinkableKeyedStateStore<Key> for Bounded {
    fn retain_recent(&self, drop_below: Nanos) {
        self.map.retain_recent(drop_below);
    }

    fn shrink_to_fit(&self) {
        self.map.shrink_to_fit();
    }

    fn len(&self) -> usize {
        self.map.len()
    }

    fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// One limit's buckets.
pub(crate) struct Limiter {
    limiter: RateLimiter<Key, Bounded, DefaultClock>,
    clock: DefaultClock,
    full: Arc<AtomicBool>,
    /// When the last sweep ran: a full map is swept at most this often.
    swept: Mutex<Instant>,
    /// IPv6 addresses count by this many leading bits: one client holds a
    /// whole /64 as a rule, and would otherwise have 2^64 buckets.
    ipv6_prefix: u8,
}

/// A full map is swept at most once per this long (a sweep walks it all).
const SWEEP_EVERY: Duration = Duration::from_secs(1);

impl Limiter {
    /// Buckets for `quota`, at most `cap` of them, IPv6 clients counted by
    /// their first `ipv6_prefix` bits (`rate_limit.ipv6_prefix`).
    pub(crate) fn new(quota: Quota, cap: usize, ipv6_prefix: u8) -> Limiter {
        let clock = DefaultClock::default();
        let full = Arc::new(AtomicBool::new(false));
        let store = Bounded {
            map: DashMap::new(),
            cap: cap.max(1),
            overflow: InMemoryState::default(),
            full: full.clone(),
        };
        Limiter {
            limiter: RateLimiter::new(quota, store, clock.clone()),
            clock,
            full,
            swept: Mutex::new(Instant::now()),
            ipv6_prefix: ipv6_prefix.min(128),
        }
    }

    /// Takes one request from `key`'s bucket; `Err` with how long until it
    /// has room again.
    pub(crate) fn check(&self, key: &Key) -> Result<(), Duration> {
        let checked = match key {
            Key::Address(IpAddr::V6(ip)) if self.ipv6_prefix < 128 => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.ipv6_prefix))
                    .unwrap_or(0);
                let network = Ipv6Addr::from(u128::from(*ip) & mask);
                self.limiter.check_key(&Key::Address(IpAddr::V6(network)))
            }
            key => self.limiter.check_key(key),
        };
        if self.full.swap(false, Ordering::Relaxed) {
            self.sweep();
        }
        checked.map_err(|not_until| not_until.wait_time_from(self.clock.now()))
    }

    /// Forgets the keys whose bucket is full again (no different from a
    /// new key's), at most once per [`SWEEP_EVERY`].
    pub(crate) fn sweep(&self) {
        let mut swept = self.swept.lock().unwrap_or_else(|p| p.into_inner());
        if swept.elapsed() < SWEEP_EVERY {
            return;
        }
        *swept = Instant::now();
        drop(swept);
        self.limiter.retain_recent();
        self.limiter.shrink_to_fit();
    }

    /// Keys tracked now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.limiter.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::NonZeroU32;

    #[test]
    fn a_bucket_per_key_and_retry_after() {
        let limiter = Limiter::new(Quota::per_minute(NonZeroU32::new(2).unwrap()), 100, 64);
        let a = Key::Address(IpAddr::from([10, 0, 0, 1]));
        let b = Key::Subject("b".into());
        assert!(limiter.check(&a).is_ok());
        assert!(limiter.check(&a).is_ok());
        let wait = limiter.check(&a).unwrap_err();
        assert!(
            wait > Duration::from_secs(20) && wait <= Duration::from_secs(30),
            "{wait:?}"
        );
        assert!(limiter.check(&b).is_ok());
    }

    #[test]
    fn memory_is_bounded_however_many_keys() {
        let limiter = Limiter::new(Quota::per_hour(NonZeroU32::new(1).unwrap()), 1000, 64);
        let mut refused = 0;
        for i in 0..100_000u32 {
            let key = Key::Address(IpAddr::from(i.to_be_bytes()));
            if limiter.check(&key).is_err() {
                refused += 1;
            }
        }
        assert!(limiter.len() <= 1000, "{} keys kept", limiter.len());
        // Past the ceiling, the new keys shared one bucket of one request.
        assert_eq!(refused, 100_000 - 1000 - 1);
    }

    /// An IPv6 client counts by its /64 (the default): the addresses of its
    /// network share one bucket, so it cannot mint 2^64 fresh ones; other
    /// networks, and IPv4 addresses, keep their own.
    #[test]
    fn ipv6_clients_count_by_their_network() {
        let limiter = Limiter::new(Quota::per_minute(NonZeroU32::new(2).unwrap()), 100, 64);
        let host = |i: u16| Key::Address(format!("2001:db8:1:2::{i:x}").parse().unwrap());
        assert!(limiter.check(&host(1)).is_ok());
        assert!(limiter.check(&host(2)).is_ok());
        assert!(limiter.check(&host(3)).is_err(), "same /64, same bucket");
        let other = Key::Address("2001:db8:1:3::1".parse().unwrap());
        assert!(limiter.check(&other).is_ok());
        assert_eq!(limiter.len(), 2);
        // Every address its own, when configured so.
        let exact = Limiter::new(Quota::per_minute(NonZeroU32::new(1).unwrap()), 100, 128);
        assert!(exact.check(&host(1)).is_ok());
        assert!(exact.check(&host(2)).is_ok());
    }
}
