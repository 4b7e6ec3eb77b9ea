//! One connection served: its TLS handshake, the middleware's layers
//! around each of its requests, the bytes it holds for its client, and how
//! it ends when the listener drains. TCP and HTTP/3 connections alike.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use http_body_util::Either;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::sync::mpsc;

use switchyard_middleware as middleware;

use crate::conn::{Close, Conn, Io, Signal, Tracked};
use crate::{body, conditional, conn, decoded, dispatch, grpc, incoming, reply, state};

/// How long a connection accepted just before a drain, with no request
/// yet, is given to send its first (answered with `connection: close`).
/// Its client is usually mid-handshake or mid-write: microseconds to a few
/// milliseconds.
const DRAIN_FIRST_REQUEST: Duration = Duration::from_secs(1);

/// What a connection task needs to serve one connection.
pub(crate) struct Serve {
    pub(crate) builder: Arc<auto::Builder<TokioExecutor>>,
    pub(crate) state: Arc<state::State>,
    pub(crate) grpc: Arc<grpc::Grpc>,
    /// The middleware's tower-http layers, wrapped around each connection's
    /// service.
    pub(crate) layers: Arc<middleware::Layers>,
    pub(crate) grpc_only: bool,
    pub(crate) conn: Arc<Conn>,
    /// The TCP peer (the client, or a proxy in front of it); the UDP peer
    /// of an HTTP/3 connection.
    pub(crate) peer: Option<std::net::SocketAddr>,
    /// `Alt-Svc` for this connection's replies (TCP, with HTTP/3 served).
    pub(crate) alt_svc: Option<::http::HeaderValue>,
}

type Response = ::http::Response<Tracked<Either<body::Body, tonic::body::Body>>>;

impl Serve {
    /// Serves the connection, after its TLS handshake when `tls` is given.
    /// The handshake is abandoned when the sweeper flags the connection
    /// (a client that stalls it is treated as one that sends no request).
    pub(crate) async fn run(self, io: Io, tls: Option<tokio_rustls::TlsAcceptor>, _done: mpsc::Sender<()>) {
        let Some(acceptor) = tls else {
            return self.serve(TokioIo::new(io)).await;
        };
        let conn = self.conn.clone();
        let handshake = tokio::select! {
            stream = acceptor.accept(io) => stream,
            reason = conn.closing() => {
                return tracing::debug!(reason = reason.describe(), "closing a connection during its TLS handshake");
            }
        };
        match handshake {
            Ok(stream) => self.serve(TokioIo::new(stream)).await,
            // A client's fault (wrong certificate, no common protocol) or a
            // dropped connection: nothing the server can act on.
            Err(err) => tracing::debug!(%err, "TLS handshake failed"),
        }
    }

    /// Serves the connection until it ends or the sweeper closes it; when
    /// the listener drains, hyper finishes what is in flight and stops.
    async fn serve<I>(self, io: TokioIo<I>)
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let conn = self.conn.clone();
        let builder = self.builder.clone();
        let service = hyper_util::service::TowerToHyperService::new(tower::ServiceExt::map_request(
            Arc::new(self).service(),
            |req: ::http::Request<hyper::body::Incoming>| req.map(incoming::Incoming::Tcp),
        ));
        let connection = builder.serve_connection_with_upgrades(io, service);
        tokio::pin!(connection);
        let (mut draining, mut shut) = (false, false);
        // How long a draining connection that has had no request yet waits
        // for its first.
        let mut first_request: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
        let closed = std::future::poll_fn(|cx| {
            loop {
                match conn.poll_signal(cx) {
                    Signal::Close(reason) => return Poll::Ready(Some(reason)),
                    Signal::Drain if !draining => {
                        draining = true;
                        first_request = Some(Box::pin(tokio::time::sleep(DRAIN_FIRST_REQUEST)));
                    }
                    Signal::Drain | Signal::None => {}
                }
                // Told to drain, a connection is let go once it has had a
                // request: one accepted just before, whose request is not
                // read yet, gets it answered (with `connection: close`)
                // instead of a close its client would see as a reset (an
                // upgrade's old group drains while its clients connect).
                // One that sends nothing is let go after a moment.
                let waited = first_request
                    .as_mut()
                    .is_some_and(|late| late.as_mut().poll(cx).is_ready());
                if draining && !shut && (conn.has_served() || waited) {
                    shut = true;
                    first_request = None;
                    connection.as_mut().graceful_shutdown();
                }
                match connection.as_mut().poll(cx) {
                    Poll::Ready(ended) => {
                        if let Err(err) = ended {
                            tracing::debug!(%err, "connection ended with an error");
                        }
                        return Poll::Ready(None);
                    }
                    // Its first request arrived during this poll.
                    Poll::Pending if draining && !shut && conn.has_served() => continue,
                    Poll::Pending => return Poll::Pending,
                }
            }
        })
        .await;
        if let Some(reason) = closed {
            tracing::debug!(reason = reason.describe(), "closing a connection");
            if reason == Close::Idle {
                // Nothing in flight: h2 gets its GOAWAY.
                connection.as_mut().graceful_shutdown();
                let _ = tokio::time::timeout(Duration::from_secs(1), connection.as_mut()).await;
            }
        }
    }

    /// The connection's service, from request to answer: the middleware's
    /// layers around [`Serve::respond`]. TCP and HTTP/3 connections alike.
    pub(crate) fn service(
        self: Arc<Self>,
    ) -> impl tower::Service<
        ::http::Request<incoming::Incoming>,
        Response = ::http::Response<
            impl http_body::Body<
                Data = bytes::Bytes,
                Error: Into<tower_http::BoxError> + std::fmt::Display + Send,
            > + Send
            + 'static,
        >,
        Error = Infallible,
        Future: Send,
    > + Clone
    + Send
    + 'static {
        let layers = self.layers.clone();
        let max_ratio = layers.max_decode_ratio;
        let respond = tower::service_fn(move |req| {
            let this = self.clone();
            // Boxed: the request's whole state machine is kilobytes, and
            // every layer and hyper's dispatcher would otherwise move it
            // (BENCHMARKS.md 2026-12-01 (evening), a boxed request future).
            use futures_util::FutureExt;
            async move { this.respond(req).await }
                .boxed()
                .map(Ok::<_, Infallible>)
        });
        // Outermost first: CORS answers preflights and marks every answer,
        // compressed ones too; request bodies are decoded before anything
        // reads them (decision 0046).
        tower::ServiceBuilder::new()
            .option_layer(layers.cors.clone())
            .layer(conditional::WeakenLayer)
            .layer(layers.compression.clone())
            .map_request(|req: ::http::Request<incoming::Incoming>| req.map(decoded::Counted::new))
            .layer(layers.decompression.clone())
            .map_request(
                move |req: ::http::Request<
                    tower_http::decompression::DecompressionBody<decoded::Counted>,
                >| { req.map(|body| decoded::Decoded::new(body, max_ratio)) },
            )
            .service(respond)
    }

    /// One request of the connection: served, then its body tracked.
    async fn respond(&self, req: ::http::Request<decoded::RequestBody>) -> Response {
        let conn = &self.conn;
        conn.request_started();
        // h2 and HTTP/3 buffer what they are given past the client's window.
        let piece = (req.version() >= ::http::Version::HTTP_2).then_some(conn::H2_PIECE);
        let reply = dispatch::serve(&self.state, &self.grpc, self.grpc_only, conn, self.peer, req).await;
        // Only a whole body is held in memory; a streamed one holds a ring.
        let held = match reply.body() {
            Either::Left(Either::Left(whole)) => http_body::Body::size_hint(whole).exact().unwrap_or(0),
            _ => 0,
        };
        let cap = self.state.config.max_connection_bytes;
        let reply = if held > 0 && conn.held_bytes() > 0 && conn.held_bytes() + held > cap {
            // Dropping the answer releases its memory at once.
            reply::retry_later(reply::error(
                ::http::StatusCode::SERVICE_UNAVAILABLE,
                &format!(
                    "this connection holds {} response bytes its client has not read (at most {cap}); read them first",
                    conn.held_bytes()
                ),
            ))
            .map(Either::Left)
        } else {
            reply
        };
        let conn = conn.clone();
        let mut reply = reply;
        if !reply.headers().contains_key(::http::header::CONTENT_ENCODING) {
            reply.extensions_mut().insert(conditional::Unencoded);
        }
        advertise(reply.headers_mut(), &self.alt_svc);
        reply.map(|body| Tracked::new(body, conn, piece, held))
    }
}

/// `Alt-Svc` on a TCP reply that has none of its own.
fn advertise(headers: &mut ::http::HeaderMap, alt_svc: &Option<::http::HeaderValue>) {
    if let Some(value) = alt_svc
        && !headers.contains_key(::http::header::ALT_SVC)
    {
        headers.insert(::http::header::ALT_SVC, value.clone());
    }
}
