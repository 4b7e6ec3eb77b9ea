//! The request context: the request id and the W3C trace context, as
//! fixed binary fields of the envelope (decision 0146).
//!
//! The listener makes a [`RequestContext`] once per request (taken from
//! the client's `x-request-id` and `traceparent` when they are well formed,
//! made otherwise); every hop copies it as bytes. Nothing here formats a
//! string until something prints it: the `Display` impls write into the
//! formatter from a stack buffer, so a log line at a level that is off,
//! or a hop that only forwards, costs no text at all (decision 0147).

use std::cell::Cell;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Longest request id taken from a client, in bytes.
pub const MAX_REQUEST_ID: usize = 128;

/// What names a request in every hop's log lines and in its reply.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestContext {
    /// `None` when `[request_id]` is off, and outside a client's request.
    pub request_id: Option<RequestId>,
    /// `None` when `[tracing]` is off.
    pub trace: Option<TraceContext>,
}

impl RequestContext {
    /// Whether the context names nothing.
    pub fn is_empty(&self) -> bool {
        self.request_id.is_none() && self.trace.is_none()
    }

    /// The request id as a `tracing` field value, formatted only if the
    /// line is written.
    pub fn request_id_field(&self) -> Option<tracing::field::DisplayValue<&RequestId>> {
        self.request_id.as_ref().map(tracing::field::display)
    }

    /// The trace id as a `tracing` field value, formatted only if the line
    /// is written.
    pub fn trace_id_field(&self) -> Option<tracing::field::DisplayValue<TraceId>> {
        self.trace.map(|t| tracing::field::display(t.trace_id()))
    }

    /// The same request seen by the next participant: the same id and
    /// trace, with a new span id whose parent is this one's.
    pub fn child(&self) -> RequestContext {
        RequestContext {
            request_id: self.request_id.clone(),
            trace: self.trace.map(|t| t.child()),
        }
    }
}

/// A request id: one the listener made (128 bits, printed as 26
/// characters of Crockford base32) or the client's own (1 to
/// [`MAX_REQUEST_ID`] visible ASCII characters, kept as given).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestId {
    Made(u128),
    Given(Arc<str>),
}

impl RequestId {
    /// A new id: a per-thread counter mixed with a per-process random seed
    /// (no clock read, no system call): unique within the process by
    /// construction, and across processes but for a 64-bit random clash.
    pub fn make() -> RequestId {
        let (seed_hi, seed_lo) = seed();
        let n = next_counter();
        // `mix` is a bijection of u64, so distinct counters give distinct
        // low halves; the high half keeps processes apart.
        let lo = mix(n.wrapping_add(seed_lo));
        let hi = seed_hi ^ mix(n ^ seed_hi.rotate_left(17));
        RequestId::Made((u128::from(hi) << 64) | u128::from(lo))
    }

    /// The client's id when it is 1 to [`MAX_REQUEST_ID`] visible ASCII
    /// characters: nothing that could break a log line or a header.
    pub fn given(text: &[u8]) -> Option<RequestId> {
        if !valid_given(text) {
            return None;
        }
        // Visible ASCII is UTF-8.
        std::str::from_utf8(text)
            .ok()
            .map(|s| RequestId::Given(Arc::from(s)))
    }

    /// Writes the id's text into `out` and returns it (no allocation): a
    /// header value or a log field.
    pub fn write<'b>(&self, out: &'b mut [u8; MAX_REQUEST_ID]) -> &'b [u8] {
        match self {
            RequestId::Made(value) => {
                const ALPHABET: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
                // 26 digits of 5 bits hold 130: the top digit takes the
                // two highest bits.
                for (i, c) in out[..26].iter_mut().enumerate() {
                    let shift = 5 * (25 - i);
                    *c = ALPHABET[((value >> shift) & 31) as usize];
                }
                &out[..26]
            }
            RequestId::Given(text) => {
                out[..text.len()].copy_from_slice(text.as_bytes());
                &out[..text.len()]
            }
        }
    }
}

fn valid_given(text: &[u8]) -> bool {
    (1..=MAX_REQUEST_ID).contains(&text.len()) && text.iter().all(|b| (0x21..=0x7e).contains(b))
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestId::Given(text) => f.write_str(text),
            made => {
                let mut buf = [0u8; MAX_REQUEST_ID];
                let text = made.write(&mut buf);
                // Crockford base32 is ASCII.
                f.write_str(std::str::from_utf8(text).map_err(|_| fmt::Error)?)
            }
        }
    }
}

/// On the wire: the 16 bytes of a made id, or the client's text, checked
/// again when read (a frame is not trusted to carry a printable id).
#[derive(Serialize, Deserialize)]
enum RequestIdWire<'a> {
    Made(u128),
    Given(&'a [u8]),
}

impl Serialize for RequestId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            RequestId::Made(v) => RequestIdWire::Made(*v),
            RequestId::Given(text) => RequestIdWire::Given(text.as_bytes()),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for RequestId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<RequestId, D::Error> {
        #[derive(Deserialize)]
        #[serde(rename = "RequestIdWire")]
        enum Owned {
            Made(u128),
            Given(serde_bytes_vec::Bytes),
        }
        match Owned::deserialize(d)? {
            Owned::Made(v) => Ok(RequestId::Made(v)),
            Owned::Given(bytes) => RequestId::given(&bytes.0).ok_or_else(|| {
                serde::de::Error::custom("a request id that is not 1 to 128 visible ASCII characters")
            }),
        }
    }
}

/// A byte string read as one (a sequence of u8 would be read byte by byte).
mod serde_bytes_vec {
    use serde::de::{Deserialize, Deserializer, Error, Visitor};

    pub(super) struct Bytes(pub(super) Vec<u8>);

    impl<'de> Deserialize<'de> for Bytes {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Bytes;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("bytes")
                }
                fn visit_bytes<E: Error>(self, v: &[u8]) -> Result<Bytes, E> {
                    Ok(Bytes(v.to_vec()))
                }
                fn visit_byte_buf<E: Error>(self, v: Vec<u8>) -> Result<Bytes, E> {
                    Ok(Bytes(v))
                }
                fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Bytes, A::Error> {
                    let mut out = Vec::new();
                    while let Some(b) = seq.next_element::<u8>()? {
                        if out.len() >= super::MAX_REQUEST_ID {
                            return Err(A::Error::custom("request id too long"));
                        }
                        out.push(b);
                    }
                    Ok(Bytes(out))
                }
            }
            d.deserialize_bytes(V)
        }
    }
}

/// A W3C trace context (`traceparent`): the trace id, this participant's
/// span id, and the flags as the client sent them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "TraceWire", into = "TraceWire")]
pub struct TraceContext {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub flags: u8,
}

#[derive(Clone, Copy, Serialize, Deserialize)]
struct TraceWire(u128, u64, u8);

impl From<TraceContext> for TraceWire {
    fn from(t: TraceContext) -> TraceWire {
        TraceWire(
            u128::from_be_bytes(t.trace_id),
            u64::from_be_bytes(t.span_id),
            t.flags,
        )
    }
}

impl TryFrom<TraceWire> for TraceContext {
    type Error = &'static str;
    fn try_from(w: TraceWire) -> Result<TraceContext, &'static str> {
        if w.0 == 0 || w.1 == 0 {
            return Err("a trace context with an all-zero trace or span id");
        }
        Ok(TraceContext {
            trace_id: w.0.to_be_bytes(),
            span_id: w.1.to_be_bytes(),
            flags: w.2,
        })
    }
}

impl TraceContext {
    /// The length of a version-00 `traceparent`.
    pub const TEXT_LEN: usize = 55;

    /// A new trace, not sampled (flags `00`): the listener records no spans.
    pub fn make() -> TraceContext {
        let (seed_hi, seed_lo) = seed();
        let n = next_counter();
        let hi = mix(n ^ seed_lo.rotate_left(29));
        let lo = mix(n.wrapping_add(seed_hi)) | 1;
        TraceContext {
            trace_id: ((u128::from(hi) << 64) | u128::from(lo)).to_be_bytes(),
            span_id: new_span_id(),
            flags: 0,
        }
    }

    /// The client's trace, with a span id of our own whose parent is the
    /// client's: `None` unless `value` is a well-formed `traceparent`
    /// (`version-traceid-parentid-flags`, lowercase hex; a later version
    /// may append fields, which are ignored).
    pub fn continue_from(value: &[u8]) -> Option<TraceContext> {
        let value = value.trim_ascii();
        let version = value.get(..2)?;
        let version = hex_byte(version)?;
        if version == 0xff || value.len() < Self::TEXT_LEN || (version == 0 && value.len() != Self::TEXT_LEN)
        {
            return None;
        }
        if value.len() > Self::TEXT_LEN && value[Self::TEXT_LEN] != b'-' {
            return None;
        }
        if value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
            return None;
        }
        let mut trace_id = [0u8; 16];
        for (i, b) in trace_id.iter_mut().enumerate() {
            *b = hex_byte(&value[3 + 2 * i..5 + 2 * i])?;
        }
        let mut parent = [0u8; 8];
        for (i, b) in parent.iter_mut().enumerate() {
            *b = hex_byte(&value[36 + 2 * i..38 + 2 * i])?;
        }
        let flags = hex_byte(&value[53..55])?;
        if trace_id == [0; 16] || parent == [0; 8] {
            return None;
        }
        Some(TraceContext {
            trace_id,
            span_id: new_span_id(),
            flags,
        })
    }

    /// The same trace, a new span (a WebSocket or gRPC stream message: one
    /// request of the session that opened it).
    pub fn child(self) -> TraceContext {
        TraceContext {
            span_id: new_span_id(),
            ..self
        }
    }

    /// The trace id, printable (32 lowercase hex digits).
    pub fn trace_id(&self) -> TraceId {
        TraceId(self.trace_id)
    }

    /// The `traceparent` text, written into `out` (no allocation).
    pub fn write<'b>(&self, out: &'b mut [u8; Self::TEXT_LEN]) -> &'b str {
        *out = *b"00-00000000000000000000000000000000-0000000000000000-00";
        hex_into(&self.trace_id, &mut out[3..35]);
        hex_into(&self.span_id, &mut out[36..52]);
        hex_into(&[self.flags], &mut out[53..55]);
        // Lowercase hex and dashes: ASCII.
        std::str::from_utf8(out).unwrap_or_default()
    }
}

/// Prints as the `traceparent` header.
impl fmt::Display for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.write(&mut [0; Self::TEXT_LEN]))
    }
}

/// A trace id that prints as 32 lowercase hex digits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceId(pub [u8; 16]);

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = [0u8; 32];
        hex_into(&self.0, &mut out);
        f.write_str(std::str::from_utf8(&out).map_err(|_| fmt::Error)?)
    }
}

fn hex_into(bytes: &[u8], out: &mut [u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (i, b) in bytes.iter().enumerate() {
        out[2 * i] = HEX[usize::from(b >> 4)];
        out[2 * i + 1] = HEX[usize::from(b & 15)];
    }
}

/// Two lowercase hex digits.
fn hex_byte(two: &[u8]) -> Option<u8> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    Some((digit(*two.first()?)? << 4) | digit(*two.get(1)?)?)
}

fn new_span_id() -> [u8; 8] {
    let (_, seed_lo) = seed();
    (mix(next_counter() ^ seed_lo) | 1).to_be_bytes()
}

/// splitmix64's finaliser: a bijection of u64 that spreads every input bit.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The process's random seed, read once.
fn seed() -> (u64, u64) {
    static SEED: std::sync::OnceLock<(u64, u64)> = std::sync::OnceLock::new();
    *SEED.get_or_init(|| {
        use std::io::Read;
        let mut bytes = [0u8; 16];
        let random = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
        if random.is_err() {
            // Without /dev/urandom: std's per-process random hasher keys.
            use std::hash::{BuildHasher, Hasher};
            let state = std::collections::hash_map::RandomState::new();
            let mut h = state.build_hasher();
            h.write_u32(std::process::id());
            bytes[..8].copy_from_slice(&h.finish().to_le_bytes());
            h.write_u64(0x5eed);
            bytes[8..].copy_from_slice(&h.finish().to_le_bytes());
        }
        let hi = u64::from_le_bytes(bytes[..8].try_into().unwrap_or_default());
        let lo = u64::from_le_bytes(bytes[8..].try_into().unwrap_or_default());
        (hi, lo)
    })
}

/// A counter of this thread's, unique in the process: each thread takes
/// its own block of 2^40 values, so no two threads share a cache line or
/// a value.
fn next_counter() -> u64 {
    static THREADS: AtomicU64 = AtomicU64::new(0);
    thread_local! {
        static NEXT: Cell<u64> = const { Cell::new(u64::MAX) };
    }
    NEXT.with(|next| {
        let mut n = next.get();
        if n == u64::MAX || n & ((1 << 40) - 1) == (1 << 40) - 1 {
            n = THREADS.fetch_add(1, Ordering::Relaxed) << 40;
        }
        next.set(n + 1);
        n
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn traceparents_are_continued_when_well_formed() {
        let ours = TraceContext::continue_from(SAMPLE.as_bytes()).unwrap();
        assert_eq!(ours.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(ours.flags, 1);
        let text = ours.to_string();
        assert!(text.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"), "{text}");
        assert!(text.ends_with("-01"));
        assert_ne!(text, SAMPLE, "the listener's own span id");
        assert!(TraceContext::continue_from(text.as_bytes()).is_some());
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra";
        assert!(TraceContext::continue_from(later.as_bytes()).is_some());
        for bad in [
            "",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-011",
        ] {
            assert_eq!(TraceContext::continue_from(bad.as_bytes()), None, "{bad}");
        }
        let made = TraceContext::make();
        assert!(made.to_string().ends_with("-00"));
        assert!(TraceContext::continue_from(made.to_string().as_bytes()).is_some());
        let child = ours.child();
        assert_eq!(child.trace_id, ours.trace_id);
        assert_ne!(child.span_id, ours.span_id);
    }

    #[test]
    fn made_request_ids_are_distinct_and_printable() {
        let ids: std::collections::HashSet<String> =
            (0..10_000).map(|_| RequestId::make().to_string()).collect();
        assert_eq!(ids.len(), 10_000);
        for id in ids.iter().take(10) {
            assert_eq!(id.len(), 26, "{id}");
            assert!(RequestId::given(id.as_bytes()).is_some());
        }
        let other = std::thread::spawn(|| RequestId::make().to_string())
            .join()
            .unwrap();
        assert!(!ids.contains(&other));
        assert_eq!(RequestId::given(b"my-trace-1").unwrap().to_string(), "my-trace-1");
        for bad in [&b""[..], b"a b", b"\xc3\xa9", &[b'x'; 129]] {
            assert_eq!(RequestId::given(bad), None);
        }
    }

    #[test]
    fn contexts_that_could_not_be_made_are_refused_when_read() {
        for bad in [&b"a b"[..], b"", b"\n", &[b'x'; 129]] {
            let bytes = crate::codec::encode(&RequestIdWire::Given(bad)).unwrap();
            assert!(crate::codec::decode::<RequestId>(&bytes).is_err(), "{bad:?}");
        }
        let zero = crate::codec::encode(&TraceWire(0, 1, 0)).unwrap();
        assert!(crate::codec::decode::<TraceContext>(&zero).is_err());
        let zero_span = crate::codec::encode(&TraceWire(1, 0, 0)).unwrap();
        assert!(crate::codec::decode::<TraceContext>(&zero_span).is_err());
        let good = RequestContext {
            request_id: Some(RequestId::make()),
            trace: Some(TraceContext::make()),
        };
        let bytes = crate::codec::encode(&good).unwrap();
        assert_eq!(crate::codec::decode::<RequestContext>(&bytes).unwrap(), good);
    }
}
