//! W3C trace context (`traceparent`): taken from the client when it is
//! well formed, made otherwise, and carried in the event's meta through
//! every hop, so that every log line the request causes names its trace
//! id (docs/operations.md#tracing, decision 0058).
//!
//! The listener is a participant of the trace: what travels on is the
//! client's trace id with a span id of the listener's own, whose parent is
//! the client's. Switchyard records no spans itself; the flags are kept as
//! the client sent them (a trace the listener starts is not sampled:
//! `00`).

use std::sync::Arc;

use http::HeaderMap;

/// `[tracing]`.
#[derive(Clone, Debug)]
pub struct TracingConfig {
    /// Whether requests carry a trace context at all. Default true.
    pub enabled: bool,
    /// Whether replies say where the time went (`Server-Timing`: total,
    /// manager, and the hops between) and carry the request's
    /// `traceparent`. Default false: it tells clients about the inside.
    pub server_timing: bool,
}

impl Default for TracingConfig {
    fn default() -> Self {
        TracingConfig {
            enabled: true,
            server_timing: false,
        }
    }
}

/// The request's `traceparent`: the client's trace id and flags with a
/// new span id, or a new trace. One allocation: the text is made in place.
pub(crate) fn take_or_make(headers: &HeaderMap) -> Arc<str> {
    let span = fastrand::u64(1..).to_be_bytes();
    if let Some((trace_id, flags)) = headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .and_then(parse)
    {
        return compose(trace_id.as_bytes(), span, flags.as_bytes());
    }
    let trace = (u128::from(fastrand::u64(..)) << 64 | u128::from(fastrand::u64(..))).max(1);
    let mut trace_hex = [0u8; 32];
    hex_into(&trace.to_be_bytes(), &mut trace_hex);
    compose(&trace_hex, span, b"00")
}

/// The same trace, a new span (a WebSocket or gRPC stream message: one
/// request of the session that opened it).
pub(crate) fn next_span(traceparent: &str) -> Arc<str> {
    let span = fastrand::u64(1..).to_be_bytes();
    match parse(traceparent) {
        Some((trace_id, flags)) => compose(trace_id.as_bytes(), span, flags.as_bytes()),
        None => take_or_make(&HeaderMap::new()),
    }
}

/// `00-{trace_id}-{span}-{flags}`.
fn compose(trace_id: &[u8], span: [u8; 8], flags: &[u8]) -> Arc<str> {
    let mut text = *b"00-00000000000000000000000000000000-0000000000000000-00";
    text[3..35].copy_from_slice(trace_id);
    hex_into(&span, &mut text[36..52]);
    text[53..55].copy_from_slice(flags);
    // Lowercase hex and dashes: ASCII.
    Arc::from(std::str::from_utf8(&text).unwrap_or_default())
}

fn hex_into(bytes: &[u8], out: &mut [u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (i, b) in bytes.iter().enumerate() {
        out[2 * i] = HEX[usize::from(b >> 4)];
        out[2 * i + 1] = HEX[usize::from(b & 15)];
    }
}

/// The trace id and flags of a well-formed `traceparent`
/// (`version-traceid-parentid-flags`, lowercase hex; a later version may
/// append fields, which are ignored), or `None`.
pub(crate) fn parse(value: &str) -> Option<(&str, &str)> {
    let value = value.trim();
    let version = value.get(..2)?;
    if !is_hex(version) || version == "ff" {
        return None;
    }
    // Version 00 is exactly 55 characters; a later one at least that.
    if value.len() < 55 || (version == "00" && value.len() != 55) {
        return None;
    }
    if value.len() > 55 && value.as_bytes()[55] != b'-' {
        return None;
    }
    let bytes = value.as_bytes();
    if bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
        return None;
    }
    let (trace, parent, flags) = (&value[3..35], &value[36..52], &value[53..55]);
    let nonzero = |s: &str| s.bytes().any(|b| b != b'0');
    (is_hex(trace) && is_hex(parent) && is_hex(flags) && nonzero(trace) && nonzero(parent))
        .then_some((trace, flags))
}

fn is_hex(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn well_formed_contexts_are_kept_and_others_replaced() {
        assert_eq!(parse(SAMPLE), Some(("4bf92f3577b34da6a3ce929d0e0e4736", "01")));
        // A later version may carry more fields.
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra";
        assert!(parse(later).is_some());
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
            assert_eq!(parse(bad), None, "{bad}");
        }
        let mut headers = HeaderMap::new();
        headers.insert("traceparent", SAMPLE.parse().unwrap());
        let ours = take_or_make(&headers);
        assert!(ours.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"), "{ours}");
        assert!(ours.ends_with("-01"));
        assert_ne!(&*ours, SAMPLE, "the listener's own span id");
        let made = take_or_make(&HeaderMap::new());
        assert!(parse(&made).is_some(), "{made}");
        assert!(made.ends_with("-00"));
        let next = next_span(&ours);
        assert_eq!(next[..36], ours[..36]);
        assert_ne!(next, ours);
        assert!(parse(&next).is_some());
    }
}
