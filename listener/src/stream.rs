//! Streamed bodies over HTTP: downloads read from a manager's pipe as the
//! client takes them, uploads written into a pipe as the client sends them.
//! Either way the listener holds one ring's worth of bytes per stream,
//! whatever the stream's length, and the slower side sets the pace.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Either};
use hyper::body::Incoming;
use switchyard_proto::pipe::{self, AsyncPipe};
use switchyard_proto::{Deadline, Envelope, Error, Meta, Payload, StreamHandle};

use crate::http::{
    RangeAsk, State, copy_headers, error, exchange_after, parse_range, request_meta, shm_budget_exhausted,
};
use crate::routes::Matched;

type Reply = Response<crate::http::Body>;

/// A response body read from a pipe. Dropping it (the client went away)
/// closes the pipe, and the producer's next write fails.
pub(crate) struct PipeBody {
    pipe: AsyncPipe,
    /// Bytes to discard first (the start of a range).
    skip: u64,
    /// Bytes still to deliver, when the length is known.
    remaining: Option<u64>,
    /// A range ends before the stream does: stop there without error.
    truncate: bool,
}

impl Body for PipeBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let this = self.get_mut();
        loop {
            if this.remaining == Some(0) {
                return Poll::Ready(None);
            }
            let mut chunk = match this.pipe.poll_read(cx, pipe::DEFAULT_CAPACITY) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(err)) => return Poll::Ready(Some(Err(err))),
                Poll::Ready(Ok(chunk)) => chunk,
            };
            if chunk.is_empty() {
                // A known length not reached is a broken stream, not an end.
                return Poll::Ready(
                    this.remaining
                        .map(|_| Err(Error::PipeAborted("the stream was shorter than announced"))),
                );
            }
            if this.skip > 0 {
                let n = this.skip.min(chunk.len() as u64);
                chunk.advance(n as usize);
                this.skip -= n;
                if chunk.is_empty() {
                    continue;
                }
            }
            if let Some(remaining) = &mut this.remaining {
                if chunk.len() as u64 > *remaining {
                    if !this.truncate {
                        return Poll::Ready(Some(Err(Error::PipeAborted(
                            "the stream was longer than announced",
                        ))));
                    }
                    chunk.truncate(*remaining as usize);
                }
                *remaining -= chunk.len() as u64;
            }
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == Some(0)
    }

    fn size_hint(&self) -> SizeHint {
        // Exact when known: hyper then sends Content-Length, else chunked.
        self.remaining.map(SizeHint::with_exact).unwrap_or_default()
    }
}

/// The HTTP response for a response event whose body is a pipe: headers
/// now, bytes as they come. A known length gives `Content-Length` and
/// makes a single `Range` servable (206 by skipping to its start, 416).
pub(crate) fn download(status: StatusCode, meta: &Meta, handle: StreamHandle, range: Option<&str>) -> Reply {
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

/// A request to an upload route: the body goes into a pipe as it arrives
/// (never buffered whole), and the handler reads it on its side meanwhile.
/// Bodies over `max_upload_bytes` get 413: at once when the length is
/// declared, else when the limit is crossed (the pipe is aborted then).
/// The request timeout counts from the end of the body (an upload may take
/// as long as it keeps moving), and a body that stalls for a whole request
/// timeout is cut with 408.
pub(crate) async fn upload(state: &State, req: Request<Incoming>, matched: Matched) -> Reply {
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
    request_meta(&mut env, &parts, matched.params);

    // A body idle for a whole request timeout is cut.
    let (stop, idle) = (Arc::new(Stop::default()), state.config.request_timeout);
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
    if stop.stalled.load(Ordering::Relaxed) {
        return error(
            StatusCode::REQUEST_TIMEOUT,
            "the request body stalled; send it without long pauses",
        );
    }
    reply
}

/// Why a pump gave up, for the answer.
#[derive(Default)]
struct Stop {
    over_limit: AtomicBool,
    stalled: AtomicBool,
}

/// Copies the request body into the pipe; a client that breaks off, a body
/// over `limit`, or one that stalls for `idle` aborts the pipe so the
/// handler sees an error.
async fn pump(mut body: Incoming, mut pipe: AsyncPipe, limit: u64, idle: Duration, stop: Arc<Stop>) {
    let mut sent = 0u64;
    loop {
        let Ok(frame) = tokio::time::timeout(idle, body.frame()).await else {
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
                match tokio::time::timeout(idle, pipe.write_all(&data)).await {
                    Ok(Ok(())) => {}
                    // The handler stopped reading; its answer says why.
                    Ok(Err(err)) => return tracing::debug!(%err, "upload pipe closed by the reader"),
                    // The handler takes nothing for a whole timeout: give
                    // up on the body, so the answer's own timeout starts.
                    Err(_) => return pipe.abort(),
                }
            }
            Some(Err(err)) => {
                tracing::debug!(%err, "upload body broke off");
                return pipe.abort();
            }
        }
    }
}
