//! The event envelope: what travels between processes.
//!
//! An [`Envelope`] is the unit of routing. Its payload is opaque to every hop
//! but the two ends: the broker and router route on `event_type`, `kind`,
//! `correlation` and `origin` alone, and never decode or copy the payload.

use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

pub use crate::context::RequestContext;
pub use crate::pipe::StreamHandle;
pub use crate::shm::ShmBody;

/// A routable event type: a name such as `shop.Checkout`, interned to a
/// stable 64-bit id (FNV-1a of the UTF-8 name) so that routing compares
/// integers. The id is the same in every process and on every machine.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default)]
pub struct EventType(pub u64);

impl EventType {
    /// The id reserved for control frames; no name hashes to it in practice
    /// and [`EventType::of`] never returns it.
    pub const CONTROL: EventType = EventType(0);

    /// Interns `name`. `const` so that SDK types carry their id at compile time.
    pub const fn of(name: &str) -> EventType {
        let bytes = name.as_bytes();
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let mut i = 0;
        while i < bytes.len() {
            hash ^= bytes[i] as u64;
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
            i += 1;
        }
        EventType(if hash == 0 { 1 } else { hash })
    }
}

impl std::fmt::Debug for EventType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EventType({:#018x})", self.0)
    }
}

/// What an envelope is for; decides how the router treats it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    /// Wants exactly one [`Kind::Response`] with the same correlation.
    Request,
    /// Fire-and-forget; delivered to every subscriber.
    Notification,
    /// The answer to a request; routed back by `origin`.
    Response,
    /// One piece of a streamed body (reserved for streaming responses).
    StreamItem,
    /// Process-to-process control (hello, route table, ...).
    Control,
}

/// Where a response must go back to. Stamped by the hop that owns the return
/// address: the broker for listener pipes, the router for managers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Origin {
    /// Not stamped yet (a listener's request before the broker sees it).
    Unset,
    /// A listener return pipe, by the id the broker gave it.
    Pipe(u64),
    /// A manager instance, by the id the router gave it.
    Manager(u64),
}

/// An absolute deadline in microseconds of `CLOCK_MONOTONIC` ([`now_micros`]);
/// 0 means none.
///
/// Monotonic, not wall-clock: every process of a group runs on one host,
/// where `CLOCK_MONOTONIC` is one clock for all of them, and it never steps,
/// so an NTP correction or a hand-set clock can neither expire nor extend a
/// request in flight (docs/decisions/0030-monotonic-deadlines.md). It means
/// nothing on another host: a hop that leaves the machine must send the
/// time left ([`Deadline::remaining`]), never the deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, Default)]
pub struct Deadline(pub u64);

impl Deadline {
    /// No deadline.
    pub const NONE: Deadline = Deadline(0);

    /// The deadline `after` from now.
    pub fn after(after: Duration) -> Deadline {
        Deadline(now_micros().saturating_add(after.as_micros() as u64))
    }

    /// Whether the deadline is set and has passed at `now` ([`now_micros`]).
    pub fn expired_at(self, now: u64) -> bool {
        self.0 != 0 && now >= self.0
    }

    /// Time left, `None` when there is no deadline.
    pub fn remaining(self) -> Option<Duration> {
        (self.0 != 0).then(|| Duration::from_micros(self.0.saturating_sub(now_micros())))
    }
}

/// Microseconds of `CLOCK_MONOTONIC`: the clock every [`Deadline`] is on,
/// the same in every process of the host, never stepped.
pub fn now_micros() -> u64 {
    use nix::time::{ClockId, clock_gettime};
    // CLOCK_MONOTONIC cannot fail on Linux with a valid clock id and
    // pointer; 0 would read as "no deadline yet passed", never as expired.
    clock_gettime(ClockId::CLOCK_MONOTONIC)
        .map(|ts| {
            let micros = ts.tv_sec() as i128 * 1_000_000 + ts.tv_nsec() as i128 / 1_000;
            u64::try_from(micros).unwrap_or(0)
        })
        .unwrap_or(0)
}

/// Meta keys of the request context: what the listener copies from the
/// request into the event when its type declares it
/// (`control::RequestNeeds`). They all begin with
/// `:`, which no HTTP header name can, so a response's meta never turns
/// one into a header and no client can send one. The request id and trace
/// context are not among them: they are typed fields of the envelope
/// ([`Envelope::context`], decision 0146).
/// Asks the manager that answers to time its handler: the listener sets it
/// when `[tracing] server_timing` is on.
pub const META_TIMING: &str = ":timing";
/// On a response: the microseconds the manager spent on the request
/// (when [`META_TIMING`] asked).
pub const META_MANAGER_MICROS: &str = ":t-manager";
/// The request method.
pub const META_METHOD: &str = ":method";
/// The request path, as received.
pub const META_PATH: &str = ":path";
/// The client's IP address (through trusted proxies).
pub const META_CLIENT: &str = ":client";
/// The authenticated identity, JSON `{"sub","method","claims"}`.
pub const META_IDENTITY: &str = ":identity";
/// `:h:NAME`: a request header (lowercase name).
pub const META_HEADER_PREFIX: &str = ":h:";
/// `:c:NAME`: a cookie.
pub const META_COOKIE_PREFIX: &str = ":c:";
/// `:s:NAME`: a claim of the identity's scope, as JSON.
pub const META_SCOPE_PREFIX: &str = ":s:";

/// Whether a meta key is request context (never a response header).
pub fn is_context_key(key: &str) -> bool {
    key.starts_with(':')
}

/// A small ordered header map carried with an event (`content-type`, path
/// parameters, the query string). Few entries, so a vector beats a map.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta(pub Vec<(String, String)>);

impl Meta {
    /// The first value for `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// Appends an entry.
    pub fn push(&mut self, key: impl Into<String>, value: impl Into<String>) {
        self.0.push((key.into(), value.into()));
    }

    /// Iterates over the entries.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

/// An event's body: inline bytes (a zero-copy slice of the received frame),
/// a sealed shared-memory body whose descriptor travels with the frame, or a
/// streaming pipe whose bytes arrive over time ([`crate::pipe`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Payload {
    Inline(Bytes),
    Shm(ShmBody),
    Stream(StreamHandle),
}

impl Default for Payload {
    fn default() -> Self {
        Payload::Inline(Bytes::new())
    }
}

impl Payload {
    /// The inline bytes, or `None` for a shared-memory body.
    pub fn inline(&self) -> Option<&Bytes> {
        match self {
            Payload::Inline(b) => Some(b),
            Payload::Shm(_) | Payload::Stream(_) => None,
        }
    }

    /// The body's bytes: the inline slice, or the shared-memory body read
    /// ([`ShmBody::map`]: consumes the handle). A stream has no bytes yet:
    /// it must be opened ([`StreamHandle::open`]).
    pub fn into_bytes(self) -> crate::Result<Bytes> {
        match self {
            Payload::Inline(b) => Ok(b),
            Payload::Shm(body) => body.map(),
            Payload::Stream(_) => Err(crate::Error::Malformed("a streamed body read as bytes")),
        }
    }

    /// The body's length in bytes (a stream's announced length, or 0).
    pub fn len(&self) -> usize {
        match self {
            Payload::Inline(b) => b.len(),
            Payload::Shm(body) => body.len() as usize,
            Payload::Stream(handle) => handle.length().unwrap_or(0) as usize,
        }
    }

    /// How many descriptors travel with this payload.
    pub fn fd_count(&self) -> usize {
        match self {
            Payload::Inline(_) => 0,
            Payload::Shm(_) => 1,
            Payload::Stream(_) => 2,
        }
    }

    /// Whether the body is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `bytes` inline when below `threshold`, else in shared memory (falling
    /// back to inline when shared memory cannot be had is the caller's call:
    /// the error says why).
    pub fn for_body(bytes: Bytes, threshold: usize) -> crate::Result<Payload> {
        if bytes.len() < threshold {
            Ok(Payload::Inline(bytes))
        } else {
            ShmBody::create(&bytes).map(Payload::Shm)
        }
    }
}

/// One event on the wire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envelope {
    /// The interned event type; [`EventType::CONTROL`] for control frames.
    pub event_type: EventType,
    pub kind: Kind,
    /// Chosen by the requester, unique among its outstanding requests;
    /// echoed by the response.
    pub correlation: u64,
    /// The return address (see [`Origin`]).
    pub origin: Origin,
    pub deadline: Deadline,
    /// HTTP-like status of a response (200, 404, 503, ...); 0 on other kinds.
    pub status: u16,
    /// The return token (decision 0143): on a listener's request, 64 bits
    /// the listener keys from the correlation with a secret of its own; an
    /// answer written straight into the listener's return link must echo
    /// them, so an instance can answer only the requests it was sent. 0:
    /// none (every other frame).
    pub token: u64,
    /// The request id and trace context (decision 0146): made by the
    /// listener, copied by every hop, printed only where a line shows it.
    pub context: RequestContext,
    pub meta: Meta,
    pub payload: Payload,
}

impl Envelope {
    /// A request of `event_type` carrying `payload`.
    pub fn request(event_type: EventType, correlation: u64, payload: Bytes) -> Envelope {
        Envelope {
            event_type,
            kind: Kind::Request,
            correlation,
            origin: Origin::Unset,
            deadline: Deadline::NONE,
            status: 0,
            token: 0,
            context: RequestContext::default(),
            meta: Meta::default(),
            payload: Payload::Inline(payload),
        }
    }

    /// A notification of `event_type`.
    pub fn notification(event_type: EventType, payload: Bytes) -> Envelope {
        Envelope {
            kind: Kind::Notification,
            ..Envelope::request(event_type, 0, payload)
        }
    }

    /// The response to `request` (same type, correlation, origin) with a status,
    /// meta and body.
    pub fn response_to(request: &Envelope, status: u16, meta: Meta, body: Bytes) -> Envelope {
        Envelope {
            event_type: request.event_type,
            kind: Kind::Response,
            correlation: request.correlation,
            origin: request.origin,
            deadline: Deadline::NONE,
            status,
            token: request.token,
            context: request.context.clone(),
            meta,
            payload: Payload::Inline(body),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interning_is_stable_and_distinct() {
        const A: EventType = EventType::of("demo.Noop");
        assert_eq!(A, EventType::of("demo.Noop"));
        assert_ne!(A, EventType::of("demo.Echo"));
        assert_ne!(EventType::of(""), EventType::CONTROL);
        // FNV-1a 64 of "a", a published test vector.
        assert_eq!(EventType::of("a").0, 0xaf63dc4c8601ec8c);
    }

    #[test]
    fn deadlines() {
        assert!(!Deadline::NONE.expired_at(u64::MAX));
        let d = Deadline::after(Duration::from_secs(60));
        assert!(!d.expired_at(now_micros()));
        assert!(d.expired_at(d.0));
        assert!(d.remaining().unwrap() <= Duration::from_secs(60));
    }

    fn monotonic_micros() -> u64 {
        let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).unwrap();
        ts.tv_sec() as u64 * 1_000_000 + ts.tv_nsec() as u64 / 1_000
    }

    /// A deadline is a point on CLOCK_MONOTONIC, so stepping the wall clock
    /// (NTP, `date -s`) moves neither it nor the "now" it is compared with.
    #[test]
    fn deadlines_are_on_the_monotonic_clock() {
        let before = monotonic_micros();
        let now = now_micros();
        let d = Deadline::after(Duration::from_secs(30));
        let after = monotonic_micros();
        assert!((before..=after).contains(&now), "{before} <= {now} <= {after}");
        assert!(
            (before + 30_000_000..=after + 30_000_000).contains(&d.0),
            "deadline {} is 30 s past monotonic now {before}..{after}",
            d.0
        );
    }
}
