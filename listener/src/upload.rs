//! An HTTP request to an upload route: the body is written into a pipe as
//! the client sends it, never buffered whole, while the handler reads it on
//! its side. The listener holds one ring's worth of bytes per upload,
//! whatever its length, and the slower side sets the pace.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::decoded::RequestBody;
use bytes::Bytes;
use http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use switchyard_proto::pipe::{self, AsyncPipe};
use switchyard_proto::{Deadline, Envelope, Error, Payload};

use crate::exchange::{exchange_after, request_meta};
use crate::reply::{Reply, error, shm_budget_exhausted};
use crate::routes::Matched;
use crate::state::State;

/// Serves `req`, which matched an upload route.
/// Bodies over `max_upload_bytes` get 413: at once when the length is
/// declared, else when the limit is crossed (the pipe is aborted then).
/// The request timeout counts from the end of the body (an upload may take
/// as long as it keeps moving), and a body that sends nothing for a whole
/// body read timeout is cut with 408.
pub(crate) async fn upload(state: &State, req: Request<RequestBody>, matched: Matched) -> Reply {
    let limit = state.config.max_upload_bytes;
    let too_large = || {
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("upload is larger than {limit} bytes"),
        )
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit) {
        return too_large();
    }
    let (producer, handle) =
        match pipe::pipe(pipe::DEFAULT_CAPACITY, declared).and_then(|(p, h)| Ok((p.into_async()?, h))) {
            Ok(made) => made,
            Err(Error::ShmBudget { .. }) => return shm_budget_exhausted(),
            Err(err) => {
                tracing::error!(%err, "cannot make an upload pipe");
                return error(StatusCode::INTERNAL_SERVER_ERROR, "internal error");
            }
        };
    let (parts, body) = req.into_parts();
    let mut env = Envelope::request(matched.entry.event_type, 0, Bytes::new());
    env.payload = Payload::Stream(handle);
    // No deadline for the hops: the listener times the answer from the end
    // of the body.
    env.deadline = Deadline::NONE;
    request_meta(&mut env, &parts, matched.params, matched.needs.as_deref());

    // A body idle for a whole body read timeout is cut; a handler that
    // takes nothing for a whole request timeout is given up on.
    let stop = Arc::new(Stop::default());
    let idle = Idle {
        client: state.config.body_read_timeout,
        handler: state.config.request_timeout,
    };
    let mut pump = tokio::spawn(pump(body, producer, limit, idle, stop.clone()));
    let body_in = async {
        let _ = (&mut pump).await;
    };
    let reply = exchange_after(state, env, None, body_in).await;
    // The handler answered: whatever of the body it did not read is not
    // wanted (and an answer before the end of the body ends the pump).
    pump.abort();
    if stop.over_limit.load(Ordering::Relaxed) {
        return too_large();
    }
    if let Some(ratio) = stop.expanded.get() {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            &crate::decoded::Expanded { ratio: *ratio }.to_string(),
        );
    }
    if stop.stalled.load(Ordering::Relaxed) {
        return crate::http::body_stalled();
    }
    reply
}

/// How long a pump waits for either side.
#[derive(Clone, Copy)]
struct Idle {
    /// For the client's next piece of body.
    client: Duration,
    /// For the handler to take a piece.
    handler: Duration,
}

/// Why a pump gave up, for the answer.
#[derive(Default)]
struct Stop {
    over_limit: AtomicBool,
    /// The body expanded past this ratio when decoded.
    expanded: std::sync::OnceLock<u32>,
    stalled: AtomicBool,
}

/// Copies the request body into the pipe; a client that breaks off, a body
/// over `limit`, or either side idle for its `idle` bound aborts the pipe so the
/// handler sees an error.
async fn pump(mut body: RequestBody, mut pipe: AsyncPipe, limit: u64, idle: Idle, stop: Arc<Stop>) {
    let mut sent = 0u64;
    loop {
        let Ok(frame) = tokio::time::timeout(idle.client, body.frame()).await else {
            stop.stalled.store(true, Ordering::Relaxed);
            return pipe.abort();
        };
        match frame {
            None => return pipe.finish(),
            Some(Ok(frame)) => {
                let Ok(data) = frame.into_data() else {
                    continue; // trailers
                };
                sent += data.len() as u64;
                if sent > limit {
                    stop.over_limit.store(true, Ordering::Relaxed);
                    return pipe.abort();
                }
                match tokio::time::timeout(idle.handler, pipe.write_all(&data)).await {
                    Ok(Ok(())) => {}
                    // The handler stopped reading; its answer says why.
                    Ok(Err(err)) => return tracing::debug!(%err, "upload pipe closed by the reader"),
                    // The handler takes nothing for a whole timeout: give
                    // up on the body, so the answer's own timeout starts.
                    Err(_) => return pipe.abort(),
                }
            }
            Some(Err(err)) => {
                if let Some(expanded) = crate::decoded::is_expanded(&err) {
                    let _ = stop.expanded.set(expanded.ratio);
                }
                tracing::debug!(%err, "upload body broke off");
                return pipe.abort();
            }
        }
    }
}
