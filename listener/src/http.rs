//! One HTTP request: match, build the event, send it, write the answer.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Either, Full, Limited};
use hyper::body::Incoming;
use switchyard_proto::{Deadline, Envelope, Payload, problem};

use crate::Config;
use crate::pipes::{Pool, SendFailure};
use crate::routes::Lookup;

pub(crate) struct State {
    pub(crate) pool: Arc<Pool>,
    pub(crate) config: Arc<Config>,
    pub(crate) ws: crate::ws::WsConfig,
    /// Reusable shared memory for large request bodies (decision 0011).
    pub(crate) segments: std::sync::Mutex<switchyard_proto::pool::SegmentPool>,
}

/// Shared memory a listener process keeps for reuse by request bodies.
pub(crate) const SEGMENT_POOL_BYTES: usize = 64 * 1024 * 1024;
/// A pooled body not released by its manager within this long is taken for
/// lost (its segment is replaced, never rewritten under a reader).
pub(crate) const SEGMENT_LEASE: Duration = Duration::from_secs(120);
/// A free segment unused this long is released.
pub(crate) const SEGMENT_IDLE: Duration = Duration::from_secs(10);

impl State {
    /// A request body as the event carries it: inline below the threshold,
    /// else written once into a reusable segment (a request has one
    /// consumer, the manager that serves it), else a one-shot memfd.
    pub(crate) fn request_payload(&self, body: Bytes) -> switchyard_proto::Result<Payload> {
        if body.len() >= self.config.shm_threshold {
            let placed = self
                .segments
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .place(&body)?;
            if let Some(pooled) = placed {
                return Ok(Payload::Shm(pooled));
            }
        }
        Payload::for_body(body, self.config.shm_threshold)
    }
}

/// A whole body, or one streamed from a manager's pipe.
pub(crate) type Body = Either<Full<Bytes>, crate::stream::PipeBody>;
type Reply = Response<Body>;

pub(crate) async fn handle(state: Arc<State>, req: Request<Incoming>) -> Result<Reply, Infallible> {
    Ok(match req.uri().path() {
        "/health" => json(StatusCode::OK, serde_json::json!({ "status": "alive" })),
        "/ready" => ready(&state),
        "/ws" if crate::ws::is_upgrade(&req) => crate::ws::upgrade(state, req, false),
        "/ws/echo" if crate::ws::is_upgrade(&req) => crate::ws::upgrade(state, req, true),
        _ => route(&state, req).await,
    })
}

fn ready(state: &State) -> Reply {
    let routes = state.pool.routes();
    let router = state.pool.router_up();
    let ready = state.pool.ready();
    let managers: Vec<_> = routes
        .table
        .managers
        .iter()
        .map(|m| serde_json::json!({ "name": m.name, "instances_up": m.instances_up }))
        .collect();
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json(
        status,
        serde_json::json!({ "ready": ready, "router": router, "managers": managers }),
    )
}

async fn route(state: &State, req: Request<Incoming>) -> Reply {
    let routes = state.pool.routes();
    let matched = match routes.lookup(req.method().as_str(), req.uri().path()) {
        Lookup::Found(m) => m,
        Lookup::WrongMethod(allowed) => {
            let mut reply = error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed for this path");
            if let Ok(v) = HeaderValue::from_str(&allowed.join(", ")) {
                reply.headers_mut().insert(header::ALLOW, v);
            }
            return reply;
        }
        Lookup::NotFound => return error(StatusCode::NOT_FOUND, "no route matches this path"),
    };
    drop(routes);
    if matched.entry.route.stream_body {
        return crate::stream::upload(state, req, matched).await;
    }

    let limit = state.config.max_body_bytes;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("request body is larger than {limit} bytes"),
        );
    }
    let (parts, body) = req.into_parts();
    // A single byte range of a GET is served from the whole response.
    let range = (parts.method == http::Method::GET)
        .then(|| {
            parts
                .headers
                .get(header::RANGE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        })
        .flatten();
    let body = match Limited::new(body, limit).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(err) if err.is::<http_body_util::LengthLimitError>() => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("request body is larger than {limit} bytes"),
            );
        }
        Err(_) => return error(StatusCode::BAD_REQUEST, "could not read the request body"),
    };

    let mut env = Envelope::request(matched.entry.event_type, 0, Bytes::new());
    // A large body is written once into shared memory; the hops after us
    // pass its descriptor along instead of copying the bytes.
    env.payload = match state.request_payload(body) {
        Ok(payload) => payload,
        Err(switchyard_proto::Error::ShmBudget { .. }) => return shm_budget_exhausted(),
        Err(err) => {
            tracing::error!(%err, "cannot place a request body in shared memory");
            return error(StatusCode::INTERNAL_SERVER_ERROR, "internal error");
        }
    };
    env.deadline = Deadline::after(state.config.request_timeout);
    request_meta(&mut env, &parts, matched.params);
    exchange(state, env, range.as_deref()).await
}

/// The request's content type, query and path parameters, as event meta.
pub(crate) fn request_meta(env: &mut Envelope, parts: &http::request::Parts, params: Vec<(String, String)>) {
    if let Some(ct) = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    {
        env.meta.push("content-type", ct);
    }
    if let Some(query) = parts.uri.query() {
        env.meta.push("query", query);
    }
    for (name, value) in params {
        env.meta.push(format!("p.{name}"), value);
    }
}

/// Sends the request event and turns its response event into HTTP; 504
/// when it takes longer than the request timeout.
pub(crate) async fn exchange(state: &State, env: Envelope, range: Option<&str>) -> Reply {
    exchange_after(state, env, range, std::future::ready(())).await
}

/// [`exchange`] whose timeout starts only once `started` resolves (an
/// upload: when its body is all in).
pub(crate) async fn exchange_after(
    state: &State,
    env: Envelope,
    range: Option<&str>,
    started: impl std::future::Future<Output = ()>,
) -> Reply {
    let in_flight = match state.pool.send(env) {
        Ok(f) => f,
        Err(SendFailure::Busy) => {
            let mut reply = error(StatusCode::SERVICE_UNAVAILABLE, "the server is overloaded");
            reply
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            return reply;
        }
        Err(SendFailure::Unavailable) => {
            return error(StatusCode::SERVICE_UNAVAILABLE, "the broker is not available");
        }
    };
    let timeout = state.config.request_timeout;
    let deadline = async {
        started.await;
        tokio::time::sleep(timeout).await;
    };
    let response = tokio::select! {
        answered = &mut { in_flight }.response => match answered {
            Ok(env) => env,
            Err(_) => return error(StatusCode::SERVICE_UNAVAILABLE, "the request was dropped"),
        },
        () = deadline => return error(StatusCode::GATEWAY_TIMEOUT, "the request deadline passed"),
    };
    into_http(response, range)
}

/// What a `Range` header asks of a body of `len` bytes.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum RangeAsk {
    /// One satisfiable range, inclusive.
    Bytes(u64, u64),
    /// A single range that lies outside the body.
    Unsatisfiable,
    /// Not a single byte range we serve (several ranges, other units,
    /// garbage): the whole body is served, as RFC 9110 allows.
    Ignore,
}

pub(crate) fn parse_range(header: &str, len: u64) -> RangeAsk {
    let Some(spec) = header.trim().strip_prefix("bytes=") else {
        return RangeAsk::Ignore;
    };
    if spec.contains(',') {
        return RangeAsk::Ignore;
    }
    let Some((first, last)) = spec.trim().split_once('-') else {
        return RangeAsk::Ignore;
    };
    let (first, last) = (first.trim(), last.trim());
    match (first.parse::<u64>(), last.parse::<u64>()) {
        // bytes=a-b
        (Ok(a), Ok(b)) if a <= b => {
            if a >= len {
                RangeAsk::Unsatisfiable
            } else {
                RangeAsk::Bytes(a, b.min(len - 1))
            }
        }
        // bytes=a-
        (Ok(a), Err(_)) if last.is_empty() => {
            if a >= len {
                RangeAsk::Unsatisfiable
            } else {
                RangeAsk::Bytes(a, len - 1)
            }
        }
        // bytes=-n: the last n bytes
        (Err(_), Ok(n)) if first.is_empty() => {
            if n == 0 || len == 0 {
                RangeAsk::Unsatisfiable
            } else {
                RangeAsk::Bytes(len.saturating_sub(n), len - 1)
            }
        }
        _ => RangeAsk::Ignore,
    }
}

fn into_http(mut env: Envelope, range: Option<&str>) -> Reply {
    let status = StatusCode::from_u16(env.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if matches!(env.payload, Payload::Stream(_))
        && let Payload::Stream(handle) = std::mem::take(&mut env.payload)
    {
        return crate::stream::download(status, &env.meta, handle, range);
    }
    // A shared-memory body is mapped, not copied: hyper writes straight
    // from the mapping, which is released when the response is sent.
    let body = match env.payload.bytes() {
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

/// The response event's meta as HTTP headers (invalid ones are skipped).
pub(crate) fn copy_headers(meta: &switchyard_proto::Meta, reply: &mut Reply) {
    let headers = reply.headers_mut();
    for (name, value) in meta.iter() {
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

fn json(status: StatusCode, value: serde_json::Value) -> Reply {
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
    let mut reply = error(
        StatusCode::SERVICE_UNAVAILABLE,
        "shared-memory budget exhausted; retry later",
    );
    reply
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    reply
}

/// A problem+json error produced by the listener itself.
pub(crate) fn error(status: StatusCode, detail: &str) -> Reply {
    let (_, body) = problem::problem(status.as_u16(), detail);
    let mut reply = Response::new(Either::Left(Full::new(body)));
    *reply.status_mut() = status;
    reply.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(problem::PROBLEM_JSON),
    );
    reply
}

#[cfg(test)]
mod tests {
    use super::{RangeAsk, parse_range};

    #[test]
    fn ranges() {
        assert_eq!(parse_range("bytes=0-9", 100), RangeAsk::Bytes(0, 9));
        assert_eq!(parse_range("bytes=90-200", 100), RangeAsk::Bytes(90, 99));
        assert_eq!(parse_range("bytes=50-", 100), RangeAsk::Bytes(50, 99));
        assert_eq!(parse_range("bytes=-10", 100), RangeAsk::Bytes(90, 99));
        assert_eq!(parse_range("bytes=-500", 100), RangeAsk::Bytes(0, 99));
        assert_eq!(parse_range("bytes=100-", 100), RangeAsk::Unsatisfiable);
        assert_eq!(parse_range("bytes=-0", 100), RangeAsk::Unsatisfiable);
        assert_eq!(parse_range("bytes=0-1,5-6", 100), RangeAsk::Ignore);
        assert_eq!(parse_range("items=0-1", 100), RangeAsk::Ignore);
        assert_eq!(parse_range("bytes=9-1", 100), RangeAsk::Ignore);
        assert_eq!(parse_range("bytes=x-y", 100), RangeAsk::Ignore);
    }
}
