//! An envelope as a NATS message: the body is the payload's bytes as they
//! are, everything else rides in headers, so NATS tools (`nats sub`) show a
//! readable message and nothing is encoded twice.
//!
//! Subjects: `<cluster>.call.<type id, 16 hex digits>` for requests,
//! `<cluster>.note.<type id>` for notifications, `<cluster>.manifest` and
//! `<cluster>.hello` for the routes groups declare. The id, not the name:
//! every type has one, and a name may hold characters a subject cannot.

use std::str::FromStr;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::header::HeaderValue;
use switchyard_proto::{EventType, Meta, RequestContext, RequestId, TraceContext};

/// The event type id, 16 hex digits.
pub(crate) const TYPE: &str = "Switchyard-Type";
/// The id of the group (router process) that sent the message: a group
/// drops what it sent itself.
pub(crate) const ORIGIN: &str = "Switchyard-Origin";
/// What is left of the caller's deadline, in milliseconds: a duration, not
/// an instant, since clocks differ between machines.
pub(crate) const TIMEOUT: &str = "Switchyard-Timeout-Ms";
/// A response's status.
pub(crate) const STATUS: &str = "Switchyard-Status";
/// The event's meta, as a JSON array of pairs.
pub(crate) const META: &str = "Switchyard-Meta";
/// The request id, apart, for whoever watches the subjects.
pub(crate) const REQUEST_ID: &str = "Switchyard-Request-Id";
/// W3C trace context, when the request has one.
pub(crate) const TRACEPARENT: &str = "traceparent";

pub(crate) fn call_subject(cluster: &str, ty: EventType) -> String {
    format!("{cluster}.call.{:016x}", ty.0)
}

pub(crate) fn note_subject(cluster: &str, ty: EventType) -> String {
    format!("{cluster}.note.{:016x}", ty.0)
}

/// The headers of a message carrying an event of `ty`.
pub(crate) fn headers(
    ty: EventType,
    origin: &str,
    meta: &Meta,
    context: &RequestContext,
    status: Option<u16>,
    timeout: Option<Duration>,
) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(TYPE, format!("{:016x}", ty.0));
    h.insert(ORIGIN, origin);
    if let Some(status) = status {
        h.insert(STATUS, status.to_string());
    }
    if let Some(timeout) = timeout {
        h.insert(TIMEOUT, timeout.as_millis().max(1).to_string());
    }
    if !meta.0.is_empty() {
        // JSON escapes CR and LF, which a header value cannot hold.
        if let Ok(json) = serde_json::to_string(&meta.0)
            && let Ok(value) = HeaderValue::from_str(&json)
        {
            h.insert(META, value);
        }
    }
    if let Some(id) = &context.request_id {
        h.insert(REQUEST_ID, id.to_string());
    }
    if let Some(trace) = &context.trace {
        h.insert(TRACEPARENT, trace.to_string());
    }
    h
}

/// What the headers of a message from another group say.
#[derive(Debug)]
pub(crate) struct Decoded {
    pub(crate) event_type: EventType,
    pub(crate) origin: String,
    pub(crate) meta: Meta,
    /// The request id as the other group printed it, and its trace with a
    /// span of this group's.
    pub(crate) context: RequestContext,
    pub(crate) status: Option<u16>,
    pub(crate) timeout: Option<Duration>,
}

/// Reads the headers; a message without a type is not ours (`Err`).
pub(crate) fn decode(headers: Option<&HeaderMap>) -> Result<Decoded, &'static str> {
    let h = headers.ok_or("no headers")?;
    let get = |name: &str| h.get(name).map(|v| v.as_str());
    let event_type = get(TYPE)
        .and_then(|t| u64::from_str_radix(t, 16).ok())
        .filter(|&t| t != 0)
        .map(EventType)
        .ok_or("no event type")?;
    let meta = match get(META) {
        Some(json) => Meta(serde_json::from_str(json).map_err(|_| "bad meta")?),
        None => Meta::default(),
    };
    let status = match get(STATUS) {
        Some(s) => Some(s.parse::<u16>().map_err(|_| "bad status")?),
        None => None,
    };
    let timeout = get(TIMEOUT)
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_millis);
    Ok(Decoded {
        event_type,
        origin: get(ORIGIN).unwrap_or_default().to_owned(),
        meta,
        context: RequestContext {
            request_id: get(REQUEST_ID).and_then(|id| RequestId::given(id.as_bytes())),
            trace: get(TRACEPARENT).and_then(|tp| TraceContext::continue_from(tp.as_bytes())),
        },
        status,
        timeout,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip() {
        let mut meta = Meta::default();
        meta.push("note", "two\nlines");
        let context = RequestContext {
            request_id: RequestId::given(b"abc"),
            trace: Some(TraceContext::make()),
        };
        let ty = EventType::of("demo.Payload");
        let h = headers(
            ty,
            "g1",
            &meta,
            &context,
            Some(201),
            Some(Duration::from_millis(1500)),
        );
        assert_eq!(h.get(REQUEST_ID).unwrap().as_str(), "abc");
        let d = decode(Some(&h)).unwrap();
        assert_eq!(d.context.request_id, context.request_id);
        assert_eq!(
            d.context.trace.map(|t| t.trace_id),
            context.trace.map(|t| t.trace_id)
        );
        assert_eq!(d.event_type, ty);
        assert_eq!(d.origin, "g1");
        assert_eq!(d.meta, meta);
        assert_eq!(d.status, Some(201));
        assert_eq!(d.timeout, Some(Duration::from_millis(1500)));
    }

    #[test]
    fn a_message_without_our_headers_is_refused() {
        assert!(decode(None).is_err());
        let mut h = HeaderMap::new();
        h.insert(TYPE, "zz");
        assert!(decode(Some(&h)).is_err());
    }

    #[test]
    fn subjects_are_under_the_cluster_name() {
        let ty = EventType(0xab);
        assert_eq!(call_subject("prod", ty), "prod.call.00000000000000ab");
        assert_eq!(note_subject("prod", ty), "prod.note.00000000000000ab");
    }
}
