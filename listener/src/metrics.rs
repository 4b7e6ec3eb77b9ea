//! This process's request figures for the admin endpoint's `/metrics`:
//! requests by route, method and status, and their latency histogram.
//!
//! The hot path is a handful of relaxed atomic additions on counters
//! found when the route table is built, never per request: no lock, no
//! allocation, no map lookup, and each thread adds to a shard of its own. Labels are bounded: a route's template
//! (`/hello/{name}`), never its path, and a few fixed labels for what no
//! route serves ([`Fixed`]). The figures are cumulative; the child's
//! control loop sends those that changed to the supervisor once a second
//! ([`changed`]), which adds up every process's (decision 0055).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use http::Method;
use switchyard_proto::supervision::{Extra, GAUGES, LATENCY_BUCKETS, RouteFigures};

/// Status codes counted one by one (100 to 599); anything else counts as
/// 599, which no server sends.
const STATUSES: usize = 500;
/// [`LATENCY_BUCKETS`] in microseconds, so that the hot path compares
/// integers.
const BOUNDS_US: [u64; LATENCY_BUCKETS.len()] = {
    let mut out = [0u64; LATENCY_BUCKETS.len()];
    let mut i = 0;
    while i < out.len() {
        out[i] = (LATENCY_BUCKETS[i] * 1_000_000.0) as u64;
        i += 1;
    }
    out
};

/// Shards of each route's counters: a thread adds to its own, so the
/// listener's runtime threads do not bounce one cache line between cores
/// on every request (decision 0147). Summed when reported, once a second.
const SHARDS: usize = 4;

/// One thread's share of a route's counters, on cache lines of its own.
#[repr(align(128))]
struct Shard {
    statuses: [AtomicU64; STATUSES],
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    sum_us: AtomicU64,
}

/// The counters of one (route, method): about 16 KiB ([`SHARDS`] of 4),
/// made once per route ever declared and kept for the life of the
/// process (counters must not go back when a route disappears and comes
/// back).
pub(crate) struct RouteStats {
    shards: [Shard; SHARDS],
    /// Requests counted at the last report: unchanged routes are not sent.
    reported: AtomicU64,
}

/// This thread's shard: threads take them in turn when they first count.
fn shard_index() -> usize {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    thread_local! {
        static MINE: usize = (NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS as u64) as usize;
    }
    MINE.with(|i| *i)
}

impl RouteStats {
    fn leak() -> &'static RouteStats {
        Box::leak(Box::new(RouteStats {
            shards: [const {
                Shard {
                    statuses: [const { AtomicU64::new(0) }; STATUSES],
                    buckets: [const { AtomicU64::new(0) }; LATENCY_BUCKETS.len() + 1],
                    sum_us: AtomicU64::new(0),
                }
            }; SHARDS],
            reported: AtomicU64::new(0),
        }))
    }

    /// Counts one answered request.
    pub(crate) fn record(&self, status: u16, elapsed: Duration) {
        let shard = &self.shards[shard_index()];
        let slot = usize::from(status.clamp(100, 599) - 100);
        shard.statuses[slot].fetch_add(1, Ordering::Relaxed);
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        let bucket = BOUNDS_US.iter().position(|&b| us <= b).unwrap_or(BOUNDS_US.len());
        shard.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        shard.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    /// The sum over the shards of one counter.
    fn total(&self, counter: impl Fn(&Shard) -> &AtomicU64) -> u64 {
        self.shards
            .iter()
            .map(|s| counter(s).load(Ordering::Relaxed))
            .sum()
    }

    fn count(&self) -> u64 {
        (0..=LATENCY_BUCKETS.len())
            .map(|b| self.total(|s| &s.buckets[b]))
            .sum()
    }
}

/// Every (route label, method) counted in this process, for [`changed`].
struct Registry {
    by_key: HashMap<(String, String), &'static RouteStats>,
}

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    static REGISTRY: OnceLock<Mutex<Registry>> = OnceLock::new();
    REGISTRY
        .get_or_init(|| {
            Mutex::new(Registry {
                by_key: HashMap::new(),
            })
        })
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// The counters of a declared route: called when the route table is
/// built, so a request finds them in its matched entry.
pub(crate) fn route(method: &str, template: &str) -> &'static RouteStats {
    registry()
        .by_key
        .entry((template.to_owned(), method.to_owned()))
        .or_insert_with(RouteStats::leak)
}

/// What the listener answers without a declared route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fixed {
    Health = 0,
    Ready = 1,
    Ws = 2,
    WsEcho = 3,
    Grpc = 4,
    /// No route matches (404, 405), or the request was refused before
    /// routing (bad framing): one label for any number of paths.
    Unmatched = 5,
    OpenApi = 6,
    Docs = 7,
    /// Any file of a `[[static]]` mount: one label, however many files.
    Static = 8,
}

impl Fixed {
    fn label(self) -> &'static str {
        match self {
            Fixed::Health => "/health",
            Fixed::Ready => "/ready",
            Fixed::Ws => "/ws",
            Fixed::WsEcho => "/ws/echo",
            Fixed::Grpc => "grpc",
            Fixed::Unmatched => "unmatched",
            Fixed::OpenApi => "/openapi.json",
            Fixed::Docs => "/docs",
            Fixed::Static => "static",
        }
    }
}

/// Methods counted by name; any other is `OTHER`.
const METHODS: [Method; 9] = [
    Method::GET,
    Method::HEAD,
    Method::POST,
    Method::PUT,
    Method::DELETE,
    Method::PATCH,
    Method::OPTIONS,
    Method::CONNECT,
    Method::TRACE,
];

/// The counters of a fixed label for `method`: after the first request of
/// its kind, one atomic load.
pub(crate) fn fixed(label: Fixed, method: &Method) -> &'static RouteStats {
    static FIXED: [[OnceLock<&'static RouteStats>; METHODS.len() + 1]; 9] =
        [const { [const { OnceLock::new() }; METHODS.len() + 1] }; 9];
    let m = METHODS.iter().position(|m| m == method).unwrap_or(METHODS.len());
    FIXED[label as usize][m].get_or_init(|| {
        let name = METHODS.get(m).map_or("OTHER", Method::as_str);
        route(name, label.label())
    })
}

/// Requests this process is answering (their headers not sent yet).
static IN_FLIGHT: AtomicU64 = AtomicU64::new(0);
/// Open WebSocket sessions.
static WS_SESSIONS: AtomicU64 = AtomicU64::new(0);

/// Counts a request in flight until dropped.
pub(crate) struct InFlight(());

impl InFlight {
    pub(crate) fn start() -> InFlight {
        IN_FLIGHT.fetch_add(1, Ordering::Relaxed);
        InFlight(())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        IN_FLIGHT.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Counts an open WebSocket session until dropped.
pub(crate) struct WsSession(());

impl WsSession {
    pub(crate) fn open() -> WsSession {
        WS_SESSIONS.fetch_add(1, Ordering::Relaxed);
        WsSession(())
    }
}

impl Drop for WsSession {
    fn drop(&mut self) {
        WS_SESSIONS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The routes whose figures changed since the last call, cumulative;
/// also sets this process's load and WebSocket gauges. Called by the
/// child's control loop once a second.
pub fn changed() -> Vec<RouteFigures> {
    GAUGES.set(IN_FLIGHT.load(Ordering::Relaxed) as usize, 0);
    GAUGES.set_extra(Extra::WsConnections, WS_SESSIONS.load(Ordering::Relaxed));
    let registry = registry();
    let mut out = Vec::new();
    for ((route, method), stats) in &registry.by_key {
        let count = stats.count();
        if stats.reported.swap(count, Ordering::Relaxed) == count {
            continue;
        }
        let statuses = (0..STATUSES)
            .filter_map(|i| {
                let c = stats.total(|s| &s.statuses[i]);
                (c > 0).then_some((i as u16 + 100, c))
            })
            .collect();
        out.push(RouteFigures {
            route: route.clone(),
            method: method.clone(),
            statuses,
            buckets: (0..=LATENCY_BUCKETS.len())
                .map(|b| stats.total(|s| &s.buckets[b]))
                .collect(),
            sum_us: stats.total(|s| &s.sum_us),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_are_cumulative_and_sent_when_changed() {
        let stats = route("GET", "/metrics-test/{id}");
        assert!(std::ptr::eq(stats, route("GET", "/metrics-test/{id}")));
        stats.record(200, Duration::from_micros(80));
        stats.record(200, Duration::from_millis(3));
        stats.record(404, Duration::from_secs(60));
        let mine = |all: Vec<RouteFigures>| all.into_iter().find(|r| r.route == "/metrics-test/{id}");
        let first = mine(changed()).expect("changed");
        assert_eq!(first.statuses, vec![(200, 2), (404, 1)]);
        assert_eq!(first.buckets[0], 1, "80 µs is in the first bucket");
        assert_eq!(first.buckets[5], 1, "3 ms is at most 5 ms");
        assert_eq!(
            first.buckets[LATENCY_BUCKETS.len()],
            1,
            "a minute is past the last bound"
        );
        assert_eq!(first.sum_us, 80 + 3_000 + 60_000_000);
        assert!(mine(changed()).is_none(), "unchanged routes are not sent again");
        stats.record(200, Duration::ZERO);
        assert_eq!(mine(changed()).unwrap().statuses, vec![(200, 3), (404, 1)]);
        let unknown = Method::from_bytes(b"BREW").unwrap();
        assert!(std::ptr::eq(
            fixed(Fixed::Unmatched, &unknown),
            route("OTHER", "unmatched")
        ));
    }

    #[test]
    fn counts_from_many_threads_add_up() {
        let stats = route("GET", "/metrics-test/threads");
        std::thread::scope(|s| {
            for _ in 0..6 {
                s.spawn(|| {
                    for _ in 0..100 {
                        stats.record(201, Duration::from_micros(10));
                    }
                });
            }
        });
        let mine = changed()
            .into_iter()
            .find(|r| r.route == "/metrics-test/threads")
            .expect("changed");
        assert_eq!(mine.statuses, vec![(201, 600)]);
        assert_eq!(mine.sum_us, 6_000);
    }
}
