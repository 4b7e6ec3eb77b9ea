//! What a hop answers when it cannot deliver a request (decision 0116).
//!
//! Every answer the group makes itself, rather than a handler, is a
//! [`Refusal`]: a status, a detail for the operator, the [`Hop`] that made
//! it and, for a passing condition, when to come back. Its response carries
//! the hop twice: in the header [`HOP_HEADER`] (`switchyard-error: router`,
//! after linkerd's `l5d-proxy-error`) and in the problem+json member
//! [`HOP_MEMBER`]. A handler's own error carries neither, so a client (and
//! the SDK's `cx.call`) can tell "the group could not deliver this" from
//! "the service said no".

use std::borrow::Cow;
use std::fmt;

use bytes::Bytes;

use crate::{Envelope, Meta};

/// The response header naming the hop that made an answer.
pub const HOP_HEADER: &str = "switchyard-error";
/// The problem+json member naming the hop that made an answer.
pub const HOP_MEMBER: &str = "hop";

/// The part of the group that made an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Hop {
    /// The front door: routing, admission, limits, its own deadline.
    Listener,
    /// Between the listeners and the router.
    Broker,
    /// Which manager serves a type, and whether it can take one more.
    Router,
    /// The process around a manager's plugin (and the SDK inside it).
    ManagerHost,
    /// The link to other groups through NATS.
    Cluster,
}

impl Hop {
    /// The name on the wire (header value, problem member).
    pub const fn name(self) -> &'static str {
        match self {
            Hop::Listener => "listener",
            Hop::Broker => "broker",
            Hop::Router => "router",
            Hop::ManagerHost => "manager-host",
            Hop::Cluster => "cluster",
        }
    }

    /// The hop named `name`, if it is one.
    pub fn parse(name: &str) -> Option<Hop> {
        [
            Hop::Listener,
            Hop::Broker,
            Hop::Router,
            Hop::ManagerHost,
            Hop::Cluster,
        ]
        .into_iter()
        .find(|hop| hop.name() == name)
    }

    /// The hop that made the response with this meta; `None` for a
    /// handler's own answer.
    pub fn of(meta: &Meta) -> Option<Hop> {
        meta.get(HOP_HEADER).and_then(Hop::parse)
    }
}

impl fmt::Display for Hop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An answer the group made itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub hop: Hop,
    /// HTTP semantics: 404 nobody serves it, 503 not now, 504 too late.
    pub status: u16,
    /// For the operator: it may name managers and queues.
    pub detail: Cow<'static, str>,
    /// Seconds after which the same request may succeed (`Retry-After`).
    pub retry_after: Option<u32>,
}

impl Refusal {
    pub fn new(hop: Hop, status: u16, detail: impl Into<Cow<'static, str>>) -> Refusal {
        Refusal {
            hop,
            status,
            detail: detail.into(),
            retry_after: None,
        }
    }

    /// 503 with `Retry-After: 1`: a moment later the request may well be
    /// delivered (a manager restarting, a queue draining, a link
    /// reconnecting).
    pub fn unavailable(hop: Hop, detail: impl Into<Cow<'static, str>>) -> Refusal {
        Refusal::new(hop, 503, detail).retry_after(1)
    }

    /// 504: the request's deadline passed before an answer came.
    pub fn timed_out(hop: Hop, detail: impl Into<Cow<'static, str>>) -> Refusal {
        Refusal::new(hop, 504, detail)
    }

    /// The same refusal, saying when to come back.
    pub fn retry_after(mut self, seconds: u32) -> Refusal {
        self.retry_after = Some(seconds);
        self
    }

    /// The response meta (content type, hop, `Retry-After`) and the
    /// problem+json body.
    pub fn parts(&self) -> (Meta, Bytes) {
        let (mut meta, body) = crate::problem::problem_with(
            self.status,
            &self.detail,
            Some((HOP_MEMBER, serde_json::Value::from(self.hop.name()))),
        );
        meta.push(HOP_HEADER, self.hop.name());
        if let Some(seconds) = self.retry_after {
            meta.push("retry-after", seconds.to_string());
        }
        (meta, body)
    }

    /// The response to `request` saying so: no client waits for a timeout.
    pub fn answer(&self, request: &Envelope) -> Envelope {
        let (meta, body) = self.parts();
        Envelope::response_to(request, self.status, meta, body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EventType;

    #[test]
    fn an_answer_names_its_hop_in_header_and_body() {
        let request = Envelope::request(EventType::of("a.B"), 7, Bytes::new());
        let answer = Refusal::unavailable(Hop::Router, "manager `x` is not running").answer(&request);
        assert_eq!((answer.status, answer.correlation), (503, 7));
        assert_eq!(answer.meta.get(HOP_HEADER), Some("router"));
        assert_eq!(answer.meta.get("retry-after"), Some("1"));
        assert_eq!(Hop::of(&answer.meta), Some(Hop::Router));
        let body: serde_json::Value =
            serde_json::from_slice(&answer.payload.clone().into_bytes().unwrap()).unwrap();
        assert_eq!(body["hop"], "router");
        assert_eq!(body["status"], 503);
        assert_eq!(body["detail"], "manager `x` is not running");
    }

    #[test]
    fn a_refusal_without_a_wait_has_no_retry_after() {
        let (meta, _) = Refusal::new(Hop::Listener, 404, "no route").parts();
        assert_eq!(meta.get("retry-after"), None);
        assert_eq!(Hop::of(&meta), Some(Hop::Listener));
    }

    #[test]
    fn hop_names_round_trip() {
        for hop in [
            Hop::Listener,
            Hop::Broker,
            Hop::Router,
            Hop::ManagerHost,
            Hop::Cluster,
        ] {
            assert_eq!(Hop::parse(hop.name()), Some(hop));
        }
        assert_eq!(Hop::parse("handler"), None);
        assert_eq!(Hop::of(&Meta::default()), None);
    }
}
