//! HTTP/3: one QUIC connection's requests, served by the same service as
//! a TCP connection's (middleware layers, dispatch, every leaf), so routes,
//! limits, rules, streamed bodies and failure answers are the same.
//!
//! A connection is admitted like a TCP one (`max_connections`) and watched
//! by the same sweeper through its [`Conn`]: no request within `idle_timeout
//! + header_read_timeout` of its first packet, no request in progress for
//! `idle_timeout`, or a response its client stops taking for
//! `write_stall_timeout` closes it (an idle one with a GOAWAY first). When
//! the listener drains, the connection sends GOAWAY, finishes the requests
//! it had accepted, lingers until its client has had the last bytes
//! ([`linger`]), and closes with `H3_NO_ERROR`.
//!
//! With `zero_rtt`, requests may arrive in early data before the handshake
//! completes; those of unsafe methods are answered 425 Too Early (RFC 8470)
//! since early data can be replayed.

use std::convert::Infallible;
use std::future::poll_fn;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use h3::error::Code;
use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::BodyExt;
use tokio::sync::mpsc;
use tower::ServiceExt;

use crate::conn::{Close, Conn, Signal};
use crate::incoming::{H3Body, Incoming};
use crate::quic::HandshakeGuard;
use crate::serve::Serve;

type SendStream = h3::server::RequestStream<h3_quinn::SendStream<Bytes>, Bytes>;

/// How long a closing connection waits for its GOAWAY and close to leave.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

/// What one QUIC connection is served with.
pub(crate) struct H3Conn {
    pub(crate) serve: Serve,
    pub(crate) handshake: HandshakeGuard,
    pub(crate) zero_rtt: bool,
}

impl H3Conn {
    /// Completes the handshake, then serves the connection's requests until
    /// it ends, the sweeper closes it or the listener drains.
    pub(crate) async fn run(self, connecting: quinn::Connecting, _done: mpsc::Sender<()>) {
        let H3Conn {
            serve,
            handshake,
            zero_rtt,
        } = self;
        let conn = serve.conn.clone();
        // Whether the handshake is complete: until then a request came in
        // early data.
        let confirmed = Arc::new(AtomicBool::new(!zero_rtt));
        let quic = if zero_rtt {
            match connecting.into_0rtt() {
                Ok((quic, accepted)) => {
                    let confirmed = confirmed.clone();
                    tokio::spawn(async move {
                        // Resolves when the handshake completes (its value
                        // says whether the client used 0-RTT), or when the
                        // connection dies, after which nothing is served.
                        accepted.await;
                        confirmed.store(true, Ordering::Release);
                    });
                    quic
                }
                // Never for a server (quinn always converts), but harmless.
                Err(connecting) => match handshake_or_close(connecting, &conn).await {
                    Some(quic) => quic,
                    None => return,
                },
            }
        } else {
            match handshake_or_close(connecting, &conn).await {
                Some(quic) => quic,
                None => return,
            }
        };
        drop(handshake);
        tracing::debug!(peer = %quic.remote_address(), "HTTP/3 connection established");
        let max_field_section = serve.state.config.max_header_bytes as u64;
        let header_timeout = serve.state.config.header_read_timeout;
        let h3 = h3::server::builder()
            .max_field_section_size(max_field_section)
            .build::<_, Bytes>(h3_quinn::Connection::new(quic.clone()))
            .await;
        let mut h3 = match h3 {
            Ok(h3) => h3,
            Err(err) => return tracing::debug!(%err, "HTTP/3 connection setup failed"),
        };
        let service = Arc::new(serve).service();
        let mut draining = false;
        // h3 ends `accept` on the client's GOAWAY, not on ours: the
        // requests in flight are counted here for the drain.
        let in_flight = Arc::new(InFlight::default());
        let closed = loop {
            if draining && in_flight.count.load(Ordering::Acquire) == 0 {
                break None;
            }
            let signal = poll_fn(|cx| match conn.poll_signal(cx) {
                Signal::Close(reason) => Poll::Ready(Some(reason)),
                Signal::Drain if !draining => Poll::Ready(None),
                Signal::Drain | Signal::None => Poll::Pending,
            });
            let accepted = tokio::select! {
                accepted = h3.accept() => accepted,
                _ = in_flight.done.notified(), if draining => continue,
                signal = signal => match signal {
                    Some(reason) => break Some(reason),
                    None => {
                        // GOAWAY naming the stream after the last accepted
                        // (h3 adds the count to it): what was accepted is
                        // finished, nothing new is taken.
                        draining = true;
                        if let Err(err) = h3.shutdown(1).await {
                            tracing::debug!(%err, "HTTP/3 GOAWAY not sent");
                            break None;
                        }
                        continue;
                    }
                },
            };
            match accepted {
                Ok(Some(resolver)) => {
                    let service = service.clone();
                    let counted = InFlight::start(&in_flight);
                    // A replay of early data never completes the handshake,
                    // so a replayed request is always seen as early.
                    let early = !confirmed.load(Ordering::Acquire);
                    let gone = quic.clone();
                    tokio::spawn(async move {
                        let _counted = counted;
                        let serve = async {
                            let resolved =
                                tokio::time::timeout(header_timeout, resolver.resolve_request()).await;
                            match resolved {
                                Ok(Ok((req, stream))) => request(service, req, stream, early).await,
                                Ok(Err(err)) => tracing::debug!(%err, "HTTP/3 request head refused"),
                                Err(_) => tracing::debug!("HTTP/3 request head not whole in time"),
                            }
                        };
                        // A client whose connection is gone (closed, or
                        // silent past the idle timeout) reads no answer:
                        // dropping the request cancels its work in the
                        // group, as for a TCP client that hangs up.
                        tokio::select! {
                            () = serve => {}
                            _ = gone.closed() => {}
                        }
                    });
                }
                // The client's GOAWAY or ours, every request finished.
                Ok(None) => break None,
                Err(err) => {
                    if !err.is_h3_no_error() {
                        tracing::debug!(%err, "HTTP/3 connection ended with an error");
                    }
                    break None;
                }
            }
        };
        match closed {
            Some(reason) => {
                tracing::debug!(reason = reason.describe(), "closing an HTTP/3 connection");
                if reason == Close::Idle {
                    // Nothing in flight: a GOAWAY first, as h2 gets.
                    let _ = tokio::time::timeout(CLOSE_WAIT, h3.shutdown(1)).await;
                    linger(&quic).await;
                }
            }
            None => linger(&quic).await,
        }
        quic.close(Code::H3_NO_ERROR.value().try_into().unwrap_or_default(), b"");
        // The close frame leaves with the endpoint's next send; the
        // connection's state goes with the last handle.
        let _ = tokio::time::timeout(CLOSE_WAIT, quic.closed()).await;
    }
}

/// Waits, before closing, until the client has had the last response
/// bytes: a close discards what is not yet acknowledged, and h3 does not
/// say when a stream's data is. A client still taking data sends ACKs, so
/// once it has been silent for four round trips (at least 100 ms), or has
/// closed itself, nothing is left in flight. The drain's grace period
/// bounds a client that keeps talking.
async fn linger(quic: &quinn::Connection) {
    let mut heard = quic.stats().udp_rx.datagrams;
    loop {
        let quiet = (quic.rtt() * 4).max(Duration::from_millis(100));
        tokio::select! {
            _ = quic.closed() => return,
            _ = tokio::time::sleep(quiet) => {}
        }
        let now = quic.stats().udp_rx.datagrams;
        if now == heard {
            return;
        }
        heard = now;
    }
}

/// Requests of one connection being served.
#[derive(Default)]
struct InFlight {
    count: std::sync::atomic::AtomicUsize,
    /// Told each time one ends.
    done: tokio::sync::Notify,
}

/// One request counted in [`InFlight`] until dropped.
struct Counted(Arc<InFlight>);

impl InFlight {
    fn start(this: &Arc<InFlight>) -> Counted {
        this.count.fetch_add(1, Ordering::AcqRel);
        Counted(this.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, Ordering::AcqRel);
        self.0.done.notify_one();
    }
}

/// The handshake, or none when it fails or the sweeper closes the
/// connection first (a client that stalls it is one that sends no request).
async fn handshake_or_close(connecting: quinn::Connecting, conn: &Conn) -> Option<quinn::Connection> {
    tokio::select! {
        quic = connecting => match quic {
            Ok(quic) => Some(quic),
            Err(err) => {
                tracing::debug!(%err, "QUIC handshake failed");
                None
            }
        },
        reason = conn.closing() => {
            tracing::debug!(reason = reason.describe(), "closing a QUIC connection during its handshake");
            None
        }
    }
}

/// Serves one request: through the listener's service, its answer written
/// to the stream. `early`: it arrived before the handshake completed.
async fn request<S, B>(
    service: S,
    req: Request<()>,
    stream: h3::server::RequestStream<h3_quinn::BidiStream<Bytes>, Bytes>,
    early: bool,
) where
    S: tower::Service<Request<Incoming>, Response = Response<B>, Error = Infallible>,
    B: http_body::Body<Data = Bytes>,
    B::Error: std::fmt::Display,
{
    let (mut send, recv) = stream.split();
    if early && !matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS) {
        let reply = crate::reply::error(
            StatusCode::TOO_EARLY,
            "sent in 0-RTT early data, which can be replayed; send it again after the handshake",
        );
        return answer(&mut send, reply, false).await;
    }
    let head = req.method() == Method::HEAD;
    let (parts, ()) = req.into_parts();
    let body = Incoming::H3(H3Body::new(recv, &parts.headers));
    let Ok(response) = service.oneshot(Request::from_parts(parts, body)).await;
    answer(&mut send, response, head).await
}

/// Headers that name the connection, not the message: not allowed in
/// HTTP/3 (RFC 9114 §4.2); the listener sets some of them for HTTP/1.1.
const CONNECTION_HEADERS: [header::HeaderName; 4] = [
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    HeaderName::from_static("keep-alive"),
];

/// Writes `response` on `send`: head, data, trailers. A body that fails
/// midway resets the stream, so the client never takes a cut body for a
/// whole one. `head`: the answer to a `HEAD`, whose length (if any) is
/// the `GET`'s and whose body is never sent.
async fn answer<B>(send: &mut SendStream, response: Response<B>, head: bool)
where
    B: http_body::Body<Data = Bytes>,
    B::Error: std::fmt::Display,
{
    let (mut parts, body) = response.into_parts();
    for name in &CONNECTION_HEADERS {
        parts.headers.remove(name);
    }
    // What hyper does for TCP: every answer is dated (RFC 9110 §6.6.1:
    // an origin server with a clock must), and a body of known length says
    // so, except where a length is not allowed or, for a HEAD, where the
    // empty body is not the one a GET would have.
    if !parts.headers.contains_key(header::DATE)
        && let Ok(date) = HeaderValue::from_str(&httpdate::fmt_http_date(std::time::SystemTime::now()))
    {
        parts.headers.insert(header::DATE, date);
    }
    let bodiless = head
        || parts.status.is_informational()
        || parts.status == StatusCode::NO_CONTENT
        || parts.status == StatusCode::NOT_MODIFIED;
    if !bodiless
        && !parts.headers.contains_key(header::CONTENT_LENGTH)
        && let Some(length) = body.size_hint().exact()
    {
        parts
            .headers
            .insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    }
    if let Err(err) = send.send_response(Response::from_parts(parts, ())).await {
        return tracing::debug!(%err, "HTTP/3 response head not sent");
    }
    if head {
        // Dropping the body stops whatever still produces it.
        drop(body);
        if let Err(err) = send.finish().await {
            tracing::debug!(%err, "HTTP/3 response not finished");
        }
        return;
    }
    let mut body = pin!(body);
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(err) => {
                tracing::debug!(%err, "HTTP/3 response body failed; resetting the stream");
                return send.stop_stream(Code::H3_INTERNAL_ERROR);
            }
        };
        let sent = match frame.into_data() {
            Ok(data) if data.is_empty() => Ok(()),
            Ok(data) => send.send_data(data).await,
            Err(frame) => match frame.into_trailers() {
                Ok(trailers) => send.send_trailers(trailers).await,
                Err(_) => Ok(()),
            },
        };
        if let Err(err) = sent {
            // The client reset the stream or went away.
            return tracing::debug!(%err, "HTTP/3 response not taken");
        }
    }
    if let Err(err) = send.finish().await {
        tracing::debug!(%err, "HTTP/3 response not finished");
    }
}
