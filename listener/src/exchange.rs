//! The exchange with the broker: a request event goes out on a return pipe
//! and its response event comes back, or the path's own failure (overload,
//! no broker, a dropped request, the deadline) answers instead.
//!
//! Every front end goes through here: HTTP turns the response into an HTTP
//! response ([`exchange`]); WebSocket and gRPC take it as a status and a
//! whole body ([`call`]).

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use switchyard_proto::control::META_EVENT;
use switchyard_proto::{Deadline, Envelope, EventType, Hop, Payload, Refusal, StreamHandle, problem};

use switchyard_proto::control::RequestNeeds;

use crate::context::{self, Client, Front};
use crate::pipes::SendFailure;
use crate::public::Sending;
use crate::reply::{Reply, error, into_http, retry_later};
use crate::state::State;
use switchyard_middleware::identity::Identity;

/// Why a request got no response event: the path failed, not the manager.
pub(crate) enum Failure {
    /// Every pipe's queue is full.
    Busy,
    /// No pipe is connected to the broker.
    Unavailable,
    /// The pipe that carried the request broke before the answer came.
    Dropped,
    /// No answer within the timeout.
    Timeout,
}

impl Failure {
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            Failure::Busy | Failure::Unavailable | Failure::Dropped => StatusCode::SERVICE_UNAVAILABLE,
            Failure::Timeout => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    pub(crate) fn detail(&self) -> &'static str {
        match self {
            Failure::Busy => "the server is overloaded",
            Failure::Unavailable => "the broker is not available",
            Failure::Dropped => "the request was dropped",
            Failure::Timeout => "the request deadline passed",
        }
    }
}

/// Sends a request event and waits for its response, at most `timeout`
/// counted from when `started` resolves.
pub(crate) async fn send(
    state: &State,
    env: Envelope,
    timeout: Duration,
    started: impl Future<Output = ()>,
) -> Result<Envelope, Failure> {
    let in_flight = state.pool.send(env).map_err(|failure| match failure {
        SendFailure::Busy => Failure::Busy,
        SendFailure::Unavailable => Failure::Unavailable,
    })?;
    let deadline = async {
        started.await;
        tokio::time::sleep(timeout).await;
    };
    tokio::select! {
        answered = &mut { in_flight }.response => answered.map_err(|_| Failure::Dropped),
        () = deadline => Err(Failure::Timeout),
    }
}

/// The request's content type, query and path parameters, as event meta;
/// its request id, and what its type declares of the rest (`needs`).
pub(crate) fn request_meta(
    env: &mut Envelope,
    parts: &http::request::Parts,
    params: Vec<(String, String)>,
    needs: Option<&RequestNeeds>,
) {
    if let Some(client) = parts.extensions.get::<Client>() {
        let front = Front {
            headers: &parts.headers,
            method: Some(parts.method.as_str()),
            path: Some(parts.uri.path()),
            client,
            identity: parts.extensions.get::<Identity>(),
        };
        context::push(env, needs, &front);
    }
    if let Some(ct) = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    {
        env.meta.push("content-type", ct);
    }
    // The manager picks the representation (decision 0065) and checks
    // `If-Match` before an unsafe change (`Context::if_match`).
    if let Some(accept) = parts
        .headers
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
    {
        env.meta.push("accept", accept);
    }
    if !matches!(parts.method, http::Method::GET | http::Method::HEAD)
        && let Some(tags) = parts
            .headers
            .get(http::header::IF_MATCH)
            .and_then(|v| v.to_str().ok())
    {
        env.meta.push("if-match", tags);
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
    started: impl Future<Output = ()>,
) -> Reply {
    match send(state, env, state.config.request_timeout, started).await {
        Ok(response) => into_http(response, range),
        Err(failure) => {
            let reply = error(failure.status(), failure.detail());
            match failure {
                Failure::Busy => retry_later(reply),
                _ => reply,
            }
        }
    }
}

/// Sends one request through the pipeline; the answer as raw status and body.
pub(crate) async fn round_trip(
    state: &State,
    ty: &str,
    content_type: Option<&str>,
    body: Bytes,
    front: &Front<'_>,
) -> (u16, Bytes) {
    let (status, _, body) = call(state, ty, content_type, body, state.config.request_timeout, front).await;
    (status, body)
}

/// Sends one request event (the one the HTTP path builds: type, body,
/// content type, deadline) through the pipeline and waits at most
/// `timeout`; the answer as status, content type and body. Failures of the
/// path itself are problem+json answers (503, 504). Shared by `/ws` and gRPC.
///
/// The client named the type `ty`: one no manager declares public under
/// that name is refused here as the router refuses an undeclared type
/// (`crate::public`); the event carries the name (meta `event`) too.
pub(crate) async fn call(
    state: &State,
    ty: &str,
    content_type: Option<&str>,
    body: Bytes,
    timeout: Duration,
    front: &Front<'_>,
) -> (u16, Option<String>, Bytes) {
    let problem_bytes = |status: u16, detail: &str| {
        let (status, body) = problem_bytes(status, detail);
        (status, Some(problem::PROBLEM_JSON.to_owned()), body)
    };
    let routes = state.pool.routes();
    if let Err(refused) = crate::public::admit(
        &routes,
        &state.config.middleware.auth.expose,
        ty,
        Sending::Request,
    ) {
        return problem_bytes(refused.status, &refused.detail);
    }
    if let Err(refused) = crate::public::check_job(state, ty, &body, front.identity) {
        return problem_bytes(refused.status, &refused.detail);
    }
    let mut env = Envelope::request(EventType::of(ty), 0, Bytes::new());
    env.payload = match state.request_payload(body) {
        Ok(p) => p,
        Err(_) => return problem_bytes(503, "shared-memory budget exhausted; retry later"),
    };
    env.deadline = Deadline::after(timeout);
    env.meta.push(META_EVENT, ty);
    let needs = routes.needs(env.event_type);
    context::push(&mut env, needs.as_deref(), front);
    if let Some(ct) = content_type {
        env.meta.push("content-type", ct);
        // A bincode request gets a bincode answer; anything else, JSON.
        if ct == "application/x-bincode" {
            env.meta.push("accept", ct);
        }
    }
    let response = match send(state, env, timeout, std::future::ready(())).await {
        Ok(env) => env,
        Err(failure) => return problem_bytes(failure.status().as_u16(), failure.detail()),
    };
    let content_type = response.meta.get("content-type").map(str::to_owned);
    if let Payload::Stream(handle) = response.payload {
        // A message is whole: the stream is read to its end, up to the
        // largest body a message may carry (past it the pipe is dropped,
        // which stops its producer).
        let limit = state.config.max_body_bytes;
        return match read_whole(handle, limit, timeout).await {
            Ok(body) => (response.status, content_type, body),
            Err(detail) => problem_bytes(502, &detail),
        };
    }
    match response.payload.into_bytes() {
        Ok(b) => (response.status, content_type, b),
        Err(_) => problem_bytes(503, "response body unavailable"),
    }
}

/// A streamed response body read whole, for a WebSocket or gRPC message.
async fn read_whole(handle: StreamHandle, limit: usize, timeout: Duration) -> Result<Bytes, String> {
    if handle.length().is_some_and(|len| len > limit as u64) {
        return Err(format!(
            "the streamed response is larger than a message may be ({limit} bytes)"
        ));
    }
    let read = async {
        let mut pipe = handle
            .open()
            .and_then(|end| end.into_async())
            .map_err(|e| e.to_string())?;
        let mut body = bytes::BytesMut::new();
        loop {
            let chunk = pipe.read(64 * 1024).await.map_err(|e| e.to_string())?;
            if chunk.is_empty() {
                return Ok(body.freeze());
            }
            if body.len() + chunk.len() > limit {
                return Err(format!(
                    "the streamed response is larger than a message may be ({limit} bytes)"
                ));
            }
            body.extend_from_slice(&chunk);
        }
    };
    tokio::time::timeout(timeout, read)
        .await
        .unwrap_or_else(|_| Err("the streamed response did not end in time".to_owned()))
}

/// The listener's own answer (decision 0116).
fn problem_bytes(status: u16, detail: &str) -> (u16, Bytes) {
    (
        status,
        Refusal::new(Hop::Listener, status, detail.to_owned()).parts().1,
    )
}

/// Why a client's notification was not emitted: an event status.
pub(crate) struct NotifyRefused {
    pub(crate) status: u16,
    pub(crate) detail: std::borrow::Cow<'static, str>,
}

/// Emits a client-sent notification (JSON `body`) into the group like a
/// manager's `notify`: to subscribed managers and matching clients, when
/// the listener allows it (`listener.ws.notify`). Shared by `/ws` and gRPC.
pub(crate) fn emit_notification(state: &State, ty: &str, body: Bytes) -> Result<(), NotifyRefused> {
    if !state.config.ws.notify {
        return Err(NotifyRefused {
            status: 403,
            detail: "client notifications are disabled (listener.ws.notify)".into(),
        });
    }
    let routes = state.pool.routes();
    crate::public::admit(
        &routes,
        &state.config.middleware.auth.expose,
        ty,
        Sending::Notification,
    )
    .map_err(|refused| NotifyRefused {
        status: refused.status,
        detail: refused.detail.into(),
    })?;
    let mut env = Envelope::notification(EventType::of(ty), Bytes::new());
    // A large body goes in a sealed segment (never a pooled one: several
    // subscribers read it), so that no frame limit drops it on the way.
    env.payload = Payload::for_body(body, state.config.shm_threshold).map_err(|_| NotifyRefused {
        status: 503,
        detail: "shared-memory budget exhausted; retry later".into(),
    })?;
    env.meta.push("content-type", "application/json");
    env.meta.push(META_EVENT, ty);
    if !switchyard_proto::frame::fits(&env, state.config.max_frame) {
        return Err(NotifyRefused {
            status: 413,
            detail: "the notification's type name does not fit in a frame".into(),
        });
    }
    // Fire and forget: the in-flight entry the pool parks is dropped at once.
    state.pool.send(env).map(drop).map_err(|failure| match failure {
        SendFailure::Busy => NotifyRefused {
            status: 503,
            detail: "the server is overloaded".into(),
        },
        SendFailure::Unavailable => NotifyRefused {
            status: 503,
            detail: "the broker is not available".into(),
        },
    })
}
