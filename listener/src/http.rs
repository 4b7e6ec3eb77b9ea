//! An HTTP request to a route with a whole body: read the body (up to the
//! limit), build the request event, exchange it, answer with the response.

use bytes::Bytes;
use http::{Request, StatusCode, header};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use switchyard_proto::{Deadline, Envelope};

use crate::exchange::{exchange, request_meta};
use crate::reply::{Reply, error, shm_budget_exhausted};
use crate::routes::Matched;
use crate::state::State;

/// Serves `req`, which matched a route whose handler takes the body whole.
pub(crate) async fn forward(state: &State, req: Request<Incoming>, matched: Matched) -> Reply {
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
