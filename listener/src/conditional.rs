//! Conditional requests on a manager's answer (RFC 9110 §13): a `GET` or
//! `HEAD` whose `If-None-Match` names the answer's `ETag` (or whose
//! `If-Modified-Since` is not older than its `Last-Modified`) gets 304
//! without the body, whatever `Range` it also has; a `Range` with an
//! `If-Range` is honoured only when the validator still names the answer,
//! else the whole body is sent.
//! `If-Match` on unsafe methods is the handler's to check (it alone knows
//! the current tag before it changes anything): the listener forwards it
//! (`Context::if_match`). Static files have their own, in `static_files`.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use http_body_util::{BodyExt, Either, Full};
use switchyard_proto::web::etag_matches;

use crate::body::{RangeAsk, parse_range};
use crate::reply::{Reply, error};

/// What a request asks conditionally.
pub(crate) struct Conditions {
    safe: bool,
    if_none_match: Option<String>,
    if_modified_since: Option<SystemTime>,
    range: Option<String>,
    if_range: Option<String>,
}

impl Conditions {
    pub(crate) fn of(method: &Method, headers: &HeaderMap) -> Conditions {
        let text = |name| {
            headers
                .get(name)
                .and_then(|v: &HeaderValue| v.to_str().ok())
                .map(str::to_owned)
        };
        let safe = matches!(*method, Method::GET | Method::HEAD);
        Conditions {
            safe,
            if_none_match: text(header::IF_NONE_MATCH),
            if_modified_since: text(header::IF_MODIFIED_SINCE)
                .and_then(|v| httpdate::parse_http_date(&v).ok()),
            range: (*method == Method::GET).then(|| text(header::RANGE)).flatten(),
            if_range: text(header::IF_RANGE),
        }
    }

    /// The `Range` the answer can be cut to as it is made: one with no
    /// condition. One with a condition waits for the answer's validators:
    /// a matching `If-None-Match` (or `If-Modified-Since`) is a 304 before
    /// any range is considered (RFC 9110 §13.2.2), and `If-Range` decides
    /// whether the range applies at all.
    pub(crate) fn range_now(&self) -> Option<&str> {
        let conditional =
            self.if_range.is_some() || self.if_none_match.is_some() || self.if_modified_since.is_some();
        self.range.as_deref().filter(|_| !conditional)
    }

    /// `reply` as the conditions make it: 304, a range, or as it is.
    pub(crate) async fn apply(&self, reply: Reply) -> Reply {
        if !self.safe || reply.status() != StatusCode::OK {
            return reply;
        }
        let etag = reply.headers().get(header::ETAG).and_then(|v| v.to_str().ok());
        let modified = reply
            .headers()
            .get(header::LAST_MODIFIED)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| httpdate::parse_http_date(v).ok());
        let not_modified = match (&self.if_none_match, self.if_modified_since) {
            (Some(tags), _) => etag.is_some_and(|etag| etag_matches(tags, etag, false)),
            (None, Some(since)) => modified.is_some_and(|m| secs(m) <= secs(since)),
            (None, None) => false,
        };
        if not_modified {
            return not_modified_from(reply);
        }
        let Some(range) = &self.range else {
            return reply;
        };
        let holds = match &self.if_range {
            None => true,
            Some(validator) => {
                let validator = validator.trim();
                if validator.starts_with('"') || validator.starts_with("W/") {
                    etag.is_some_and(|etag| etag_matches(validator, etag, true))
                } else {
                    httpdate::parse_http_date(validator)
                        .ok()
                        .zip(modified)
                        .is_some_and(|(asked, m)| secs(asked) == secs(m))
                }
            }
        };
        if holds { cut(reply, range).await } else { reply }
    }
}

/// 304 with the headers a cache needs to refresh its copy; no body (a
/// streamed one is dropped, which stops its producer).
fn not_modified_from(reply: Reply) -> Reply {
    let (mut parts, _) = reply.into_parts();
    parts.status = StatusCode::NOT_MODIFIED;
    for name in [
        header::CONTENT_TYPE,
        header::CONTENT_LENGTH,
        header::CONTENT_RANGE,
        header::CONTENT_ENCODING,
    ] {
        parts.headers.remove(name);
    }
    http::Response::from_parts(parts, Either::Left(Full::new(Bytes::new())))
}

/// `reply` (a 200) cut to the single byte `range`: 206, or 416.
async fn cut(reply: Reply, range: &str) -> Reply {
    let (mut parts, body) = reply.into_parts();
    match body {
        Either::Left(whole) => {
            let Ok(collected) = whole.collect().await;
            let bytes = collected.to_bytes();
            let len = bytes.len() as u64;
            match parse_range(range, len) {
                RangeAsk::Bytes(first, last) => {
                    parts.status = StatusCode::PARTIAL_CONTENT;
                    content_range(&mut parts.headers, first, last, len);
                    parts.headers.remove(header::CONTENT_LENGTH);
                    let slice = bytes.slice(first as usize..=last as usize);
                    http::Response::from_parts(parts, Either::Left(Full::new(slice)))
                }
                RangeAsk::Unsatisfiable => unsatisfiable(len),
                RangeAsk::Ignore => http::Response::from_parts(parts, Either::Left(Full::new(bytes))),
            }
        }
        Either::Right(mut pipe) => {
            let Some(len) = pipe.remaining.filter(|_| pipe.skip == 0 && !pipe.truncate) else {
                return http::Response::from_parts(parts, Either::Right(pipe));
            };
            match parse_range(range, len) {
                RangeAsk::Bytes(first, last) => {
                    pipe.skip = first;
                    pipe.remaining = Some(last - first + 1);
                    pipe.truncate = true;
                    parts.status = StatusCode::PARTIAL_CONTENT;
                    content_range(&mut parts.headers, first, last, len);
                    parts.headers.remove(header::CONTENT_LENGTH);
                    http::Response::from_parts(parts, Either::Right(pipe))
                }
                RangeAsk::Unsatisfiable => unsatisfiable(len),
                RangeAsk::Ignore => http::Response::from_parts(parts, Either::Right(pipe)),
            }
        }
    }
}

fn content_range(headers: &mut HeaderMap, first: u64, last: u64, len: u64) {
    if let Ok(v) = HeaderValue::from_str(&format!("bytes {first}-{last}/{len}")) {
        headers.insert(header::CONTENT_RANGE, v);
    }
}

fn unsatisfiable(len: u64) -> Reply {
    let mut reply = error(
        StatusCode::RANGE_NOT_SATISFIABLE,
        "the range lies outside the body",
    );
    if let Ok(v) = HeaderValue::from_str(&format!("bytes */{len}")) {
        reply.headers_mut().insert(header::CONTENT_RANGE, v);
    }
    reply
}

/// Marks an answer that left the listener's own code without a content
/// coding: if the compression middleware encodes it, its tag must change.
#[derive(Clone, Copy)]
pub(crate) struct Unencoded;

/// An answer the compression middleware encoded on the fly has other
/// bytes than the one its strong `ETag` names: the tag is made weak
/// (`W/"..."`), as nginx does, so that it still revalidates (304) but never
/// validates a range of different bytes.
pub(crate) fn weaken_if_compressed<B>(mut reply: http::Response<B>) -> http::Response<B> {
    let encoded_here = reply.extensions().get::<Unencoded>().is_some()
        && reply.headers().contains_key(header::CONTENT_ENCODING);
    if encoded_here
        && let Some(tag) = reply.headers().get(header::ETAG)
        && tag.as_bytes().starts_with(b"\"")
        && let Ok(weak) = HeaderValue::from_bytes(&[b"W/", tag.as_bytes()].concat())
    {
        reply.headers_mut().insert(header::ETAG, weak);
    }
    reply
}

/// [`weaken_if_compressed`] around the compression middleware.
#[derive(Clone, Copy)]
pub(crate) struct WeakenLayer;

impl<S> tower::Layer<S> for WeakenLayer {
    type Service = Weaken<S>;
    fn layer(&self, inner: S) -> Weaken<S> {
        Weaken(inner)
    }
}

#[derive(Clone)]
pub(crate) struct Weaken<S>(S);

impl<S, R, B> tower::Service<R> for Weaken<S>
where
    S: tower::Service<R, Response = http::Response<B>>,
{
    type Response = http::Response<B>;
    type Error = S::Error;
    // A fn pointer, not a closure: a closure here makes the connection
    // task's future fail the `Send` check on the body's trait object.
    type Future = futures_util::future::MapOk<S::Future, fn(http::Response<B>) -> http::Response<B>>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        use futures_util::TryFutureExt;
        self.0.call(req).map_ok(weaken_if_compressed::<B> as fn(_) -> _)
    }
}

fn secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
