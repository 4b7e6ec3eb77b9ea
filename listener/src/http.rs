//! An HTTP request to a route with a whole body: read the body (up to the
//! limit), build the request event, exchange it, answer with the response.

use std::time::Duration;

use crate::decoded::RequestBody;
use bytes::{Bytes, BytesMut};
use http::{HeaderValue, Request, StatusCode, header};
use http_body_util::BodyExt;
use switchyard_proto::{Deadline, Envelope};

use crate::conditional::Conditions;
use crate::exchange::{exchange, request_meta};
use crate::reply::{Reply, error, shm_budget_exhausted};
use crate::routes::Matched;
use crate::state::State;

/// Serves `req`, which matched a route whose handler takes the body whole.
pub(crate) async fn forward(state: &State, req: Request<RequestBody>, matched: Matched) -> Reply {
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
    // A single byte range of a GET is served from the whole response;
    // with `If-Range`, once the answer's validators are known.
    let conditions = Conditions::of(&parts.method, &parts.headers);
    let body = match read_body(body, limit, state.config.body_read_timeout).await {
        Ok(body) => body,
        Err(BodyError::TooLarge) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("request body is larger than {limit} bytes"),
            );
        }
        Err(BodyError::Expanded(why)) => return error(StatusCode::PAYLOAD_TOO_LARGE, &why),
        Err(BodyError::Stalled) => return body_stalled(),
        Err(BodyError::Broken) => return error(StatusCode::BAD_REQUEST, "could not read the request body"),
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
    request_meta(&mut env, &parts, matched.params, matched.needs.as_deref());
    let reply = exchange(state, env, conditions.range_now()).await;
    conditions.apply(reply).await
}

/// Why a request body could not be read whole.
enum BodyError {
    /// Over the limit.
    TooLarge,
    /// Decoded, it expands past the allowed ratio (why, for the answer).
    Expanded(String),
    /// Nothing arrived for a whole body read timeout.
    Stalled,
    /// The client broke off or sent a malformed body.
    Broken,
}

/// Reads `body` whole, up to `limit` bytes, giving the client at most
/// `idle` between two pieces. A body in one piece is not copied.
async fn read_body(mut body: RequestBody, limit: usize, idle: Duration) -> Result<Bytes, BodyError> {
    let mut first: Option<Bytes> = None;
    let mut more = BytesMut::new();
    while !http_body::Body::is_end_stream(&body) {
        let frame = match tokio::time::timeout(idle, body.frame()).await {
            Err(_) => return Err(BodyError::Stalled),
            Ok(None) => break,
            Ok(Some(Err(err))) => {
                return Err(match crate::decoded::is_expanded(&err) {
                    Some(expanded) => BodyError::Expanded(expanded.to_string()),
                    None => BodyError::Broken,
                });
            }
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        let len = first.as_ref().map_or(0, Bytes::len) + more.len() + data.len();
        if len > limit {
            return Err(BodyError::TooLarge);
        }
        match &first {
            None => first = Some(data),
            Some(_) => more.extend_from_slice(&data),
        }
    }
    Ok(match first {
        None => Bytes::new(),
        Some(first) if more.is_empty() => first,
        Some(first) => {
            let mut whole = BytesMut::with_capacity(first.len() + more.len());
            whole.extend_from_slice(&first);
            whole.extend_from_slice(&more);
            whole.freeze()
        }
    })
}

/// 408 for a request body that stopped arriving; the connection is closed,
/// since the rest of the body can no longer be told from the next request.
pub(crate) fn body_stalled() -> Reply {
    let mut reply = error(
        StatusCode::REQUEST_TIMEOUT,
        "the request body stalled; send it without long pauses",
    );
    reply
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    reply
}
