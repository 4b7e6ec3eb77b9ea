//! HTTP responses: a manager's response event made HTTP (whole, a range of
//! it, or streamed from its pipe), and the answers the listener gives
//! itself (problem+json errors, JSON).

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Response, StatusCode, header};
use http_body_util::{Either, Full};
use switchyard_proto::{Envelope, Hop, Meta, Payload, Refusal, StreamHandle, problem, refusal};

use crate::body::{Body, PipeBody, RangeAsk, parse_range};

pub(crate) type Reply = Response<Body>;

/// The response event as HTTP: its status, meta as headers and body; a
/// single byte `range` of a whole 200 body is answered 206 (or 416).
pub(crate) fn into_http(mut env: Envelope, range: Option<&str>) -> Reply {
    let status = StatusCode::from_u16(env.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if matches!(env.payload, Payload::Stream(_))
        && let Payload::Stream(handle) = std::mem::take(&mut env.payload)
    {
        return download(status, &env.meta, handle, range);
    }
    // A sealed shared-memory body is mapped, not copied: hyper writes
    // straight from the mapping, released when the response is sent. A
    // pooled one is read out of its segment, freed for reuse at once.
    let body = match std::mem::take(&mut env.payload).into_bytes() {
        Ok(b) => b,
        Err(err) => {
            tracing::error!(%err, "cannot map a response body");
            return error(StatusCode::SERVICE_UNAVAILABLE, "response body unavailable");
        }
    };
    // A single range of a whole 200 body: 206 with that slice (no copy), or
    // 416 when it lies outside the body.
    let (status, body, content_range) = match range.map(|r| parse_range(r, body.len() as u64)) {
        Some(RangeAsk::Bytes(first, last)) if status == StatusCode::OK => {
            let len = body.len();
            let slice = body.slice(first as usize..=last as usize);
            (
                StatusCode::PARTIAL_CONTENT,
                slice,
                Some(format!("bytes {first}-{last}/{len}")),
            )
        }
        Some(RangeAsk::Unsatisfiable) if status == StatusCode::OK => {
            let mut reply = error(
                StatusCode::RANGE_NOT_SATISFIABLE,
                "the range lies outside the body",
            );
            if let Ok(v) = HeaderValue::from_str(&format!("bytes */{}", body.len())) {
                reply.headers_mut().insert(header::CONTENT_RANGE, v);
            }
            return reply;
        }
        _ => (status, body, None),
    };
    let mut reply = Response::new(Either::Left(Full::new(body)));
    *reply.status_mut() = status;
    if let Some(v) = content_range.and_then(|v| HeaderValue::from_str(&v).ok()) {
        reply.headers_mut().insert(header::CONTENT_RANGE, v);
    }
    copy_headers(&env.meta, &mut reply);
    reply
}

/// The HTTP response for a response event whose body is a pipe: headers
/// now, bytes as they come. A known length gives `Content-Length` and
/// makes a single `Range` servable (206 by skipping to its start, 416).
fn download(status: StatusCode, meta: &Meta, handle: StreamHandle, range: Option<&str>) -> Reply {
    let length = handle.length();
    let opened = handle.open().and_then(|end| end.into_async());
    let pipe = match opened {
        Ok(pipe) => pipe,
        Err(err) => {
            tracing::error!(%err, "cannot open a response stream");
            return error(StatusCode::BAD_GATEWAY, "the response stream could not be opened");
        }
    };
    let mut body = PipeBody {
        pipe,
        skip: 0,
        remaining: length,
        truncate: false,
    };
    let mut content_range = None;
    let mut status = status;
    if let (Some(range), Some(len), StatusCode::OK) = (range, length, status) {
        match parse_range(range, len) {
            RangeAsk::Bytes(first, last) => {
                body.skip = first;
                body.remaining = Some(last - first + 1);
                body.truncate = true;
                status = StatusCode::PARTIAL_CONTENT;
                content_range = Some(format!("bytes {first}-{last}/{len}"));
            }
            RangeAsk::Unsatisfiable => {
                // Dropping the body closes the pipe: the producer stops.
                let mut reply = error(
                    StatusCode::RANGE_NOT_SATISFIABLE,
                    "the range lies outside the body",
                );
                if let Ok(v) = HeaderValue::from_str(&format!("bytes */{len}")) {
                    reply.headers_mut().insert(header::CONTENT_RANGE, v);
                }
                return reply;
            }
            RangeAsk::Ignore => {}
        }
    }
    let mut reply = Response::new(Either::Right(body));
    *reply.status_mut() = status;
    if let Some(v) = content_range.and_then(|v| HeaderValue::from_str(&v).ok()) {
        reply.headers_mut().insert(header::CONTENT_RANGE, v);
    }
    if length.is_some() {
        reply
            .headers_mut()
            .insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    }
    copy_headers(meta, &mut reply);
    reply
}

/// The microseconds the manager spent on a request, as it said.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ManagerTime(pub(crate) u64);

/// Headers the listener may add to a manager's answer: the five default
/// security headers, `x-request-id`, `alt-svc`, `traceparent` and
/// `server-timing`, and a few to spare.
const LISTENER_HEADERS: usize = 12;

/// The response event's meta as HTTP headers (invalid ones are skipped).
fn copy_headers(meta: &Meta, reply: &mut Reply) {
    // Asked for by `[tracing] server_timing`: for `Server-Timing`.
    if let Some(us) = meta
        .get(switchyard_proto::event::META_MANAGER_MICROS)
        .and_then(|v| v.parse().ok())
    {
        reply.extensions_mut().insert(ManagerTime(us));
    }
    let headers = reply.headers_mut();
    // Room for the headers the listener adds on the way out (security
    // headers, `x-request-id`, `alt-svc`, tracing's), so the map is
    // allocated once instead of growing and rehashing per request.
    headers.reserve(meta.0.len() + LISTENER_HEADERS);
    // The request's context (`:request-id`) never becomes a header.
    for (name, value) in meta
        .iter()
        .filter(|(k, _)| !switchyard_proto::event::is_context_key(k))
    {
        match (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            (Ok(n), Ok(v)) => {
                headers.append(n, v);
            }
            _ => tracing::debug!(name, "skipping invalid response header"),
        }
    }
}

/// A JSON answer of the listener's own.
pub(crate) fn json(status: StatusCode, value: serde_json::Value) -> Reply {
    let mut reply = Response::new(Either::Left(Full::new(Bytes::from(value.to_string()))));
    *reply.status_mut() = status;
    reply
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    reply
}

/// 503 with `Retry-After`: this process's shared-memory budget is spent
/// (decision 0007); a moment later bodies will have been released.
pub(crate) fn shm_budget_exhausted() -> Reply {
    retry_later(error(
        StatusCode::SERVICE_UNAVAILABLE,
        "shared-memory budget exhausted; retry later",
    ))
}

/// `reply` with `Retry-After: 1`.
pub(crate) fn retry_later(mut reply: Reply) -> Reply {
    reply
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    reply
}

/// 405 with `Allow` for a method other than `GET` or `HEAD` on one of the
/// listener's own read-only routes (`/health`, `/ready`, `/openapi.json`,
/// `/docs`): what their description promises.
pub(crate) fn only_get_and_head(method: &http::Method) -> Option<Reply> {
    if method == http::Method::GET || method == http::Method::HEAD {
        return None;
    }
    let mut reply = error(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD");
    reply
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
    Some(reply)
}

/// The answer to `GET`/`HEAD` of an API document (`switchyard_apidoc`
/// renders it once per configuration generation).
pub(crate) fn document(method: &http::Method, (body, content_type): (Bytes, &'static str)) -> Reply {
    if let Some(refused) = only_get_and_head(method) {
        return refused;
    }
    let head = method == http::Method::HEAD;
    let length = body.len();
    let mut reply = Response::new(Either::Left(Full::new(if head { Bytes::new() } else { body })));
    let headers = reply.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if head {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    }
    reply
}

/// A problem+json error produced by the listener itself: marked as the
/// listener's (`switchyard-error: listener`, decision 0116), so a client
/// tells it from a handler's own.
pub(crate) fn error(status: StatusCode, detail: &str) -> Reply {
    let refusal = Refusal::new(Hop::Listener, status.as_u16(), detail.to_owned());
    let (_, body) = refusal.parts();
    let mut reply = Response::new(Either::Left(Full::new(body)));
    *reply.status_mut() = status;
    let headers = reply.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(problem::PROBLEM_JSON),
    );
    headers.insert(
        HeaderName::from_static(refusal::HOP_HEADER),
        HeaderValue::from_static(Hop::Listener.name()),
    );
    reply
}
