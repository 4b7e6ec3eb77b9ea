//! W3C trace context (`traceparent`): taken from the client when it is
//! well formed, made otherwise, and carried in the event's typed context
//! through every hop, so that every log line the request causes names its trace
//! id (docs/operations.md#tracing, decision 0058).
//!
//! The listener is a participant of the trace: what travels on is the
//! client's trace id with a span id of the listener's own, whose parent is
//! the client's. Switchyard records no spans itself; the flags are kept as
//! the client sent them (a trace the listener starts is not sampled:
//! `00`).

use http::HeaderMap;
use switchyard_proto::TraceContext;

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

/// The request's trace context: the client's trace id and flags with a
/// new span id, or a new trace. Bytes only; the text is written where it
/// is shown ([`TraceContext`]'s `Display`).
pub(crate) fn take_or_make(headers: &HeaderMap) -> TraceContext {
    headers
        .get("traceparent")
        .and_then(|v| TraceContext::continue_from(v.as_bytes()))
        .unwrap_or_else(TraceContext::make)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_clients_trace_is_continued_and_a_bad_one_replaced() {
        let mut headers = HeaderMap::new();
        headers.insert("traceparent", SAMPLE.parse().unwrap());
        let ours = take_or_make(&headers).to_string();
        assert!(ours.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"), "{ours}");
        assert!(ours.ends_with("-01"));
        assert_ne!(ours, SAMPLE, "the listener's own span id");
        headers.insert("traceparent", "00-zz".parse().unwrap());
        let made = take_or_make(&headers).to_string();
        assert!(TraceContext::continue_from(made.as_bytes()).is_some(), "{made}");
        assert!(made.ends_with("-00"));
        assert!(!made.contains("4bf92f3577b34da6a3ce929d0e0e4736"));
    }
}
