//! The listener: where HTTP requests become events and responses become HTTP.
//!
//! A listener process accepts connections (HTTP/1.1 and h2 on one port, told
//! apart by the connection preface), matches each request against the route
//! table the managers declared, turns it into a request [`Envelope`] and sends
//! it to the broker over one of its pooled return pipes. The response comes
//! back on the same pipe, matched by correlation id, and is written out as
//! the manager produced it. The listener enforces the limits a client can
//! abuse (header size and read time, body size, request deadline) and answers
//! `/health` and `/ready` itself. It owns no business logic and no state that
//! outlives a request.
//!
//! # Layout
//! Modules follow a request's path. Front ends are leaves over a shared
//! core: a leaf imports only the core, never another leaf, and the core
//! imports no leaf.
//!
//! - [`run`] (here, with [`Config`]): the accept loop and graceful drain.
//! - `dispatch`: which front end serves a request (gRPC by content type,
//!   `/health`, `/ready`, WebSocket upgrades, else the route table).
//! - Leaves:
//!   - `http`: a route whose body is taken whole → event → response.
//!   - `upload`: a route whose body is streamed into a pipe as it arrives.
//!   - `ws`: WebSocket sessions (`/ws`, `/ws/echo`) by upgrade on the port.
//!   - `grpc`: `switchyard.v1.Events`, health and reflection, by content
//!     type (`application/grpc*`) on the same port.
//! - Core:
//!   - `exchange`: a request event out to the broker and its answer back;
//!     as HTTP (`exchange`) or as status and whole body (`call`, for
//!     WebSocket and gRPC); client notifications.
//!   - `reply`: response events made HTTP (whole, ranges, streamed), and
//!     the listener's own problem+json and JSON answers.
//!   - `body`: response bodies (whole or read from a pipe), `Range` parsing.
//!   - `state`: what every request shares; request bodies placed in shared
//!     memory.
//!   - `pipes`: the pool of return pipes to the broker, the pending map and
//!     the sessions (WebSocket, gRPC streams) with their subscriptions.
//!   - `routes`: the route table, merged from the router's announcements.
//!
//! [`Envelope`]: switchyard_proto::Envelope

#![forbid(unsafe_code)]

mod body;
mod dispatch;
mod exchange;
mod grpc;
mod http;
#[allow(dead_code)] // filled by the authentication middleware (issue 13)
mod identity;
mod pipes;
mod reply;
mod routes;
mod state;
mod upload;
mod ws;

pub use routes::percent_decode;

use std::convert::Infallible;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use switchyard_proto::accept::Acceptor;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// Errors that stop the listener.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("listener socket: {0}")]
    Io(#[from] std::io::Error),
    #[error("invalid listener configuration: {0}")]
    Config(String),
}

/// The listener's settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// The broker's socket, where the return pipes connect.
    pub broker_socket: PathBuf,
    /// Return pipes in the pool (about one per runtime thread).
    pub pipes: usize,
    /// Largest frame accepted or sent, in bytes.
    pub max_frame: usize,
    /// Frames queued per pipe before requests get 503.
    pub queue_capacity: usize,
    /// Largest request head (request line and headers), in bytes; at least 8192.
    pub max_header_bytes: usize,
    /// Largest request body, in bytes; larger gets 413.
    pub max_body_bytes: usize,
    /// Largest body of an upload route (streamed through a pipe, never
    /// buffered whole), in bytes; larger gets 413.
    pub max_upload_bytes: u64,
    /// Time a client has to send the whole request head (slowloris guard).
    pub header_read_timeout: Duration,
    /// Deadline of a request from arrival to response; past it, 504.
    pub request_timeout: Duration,
    /// Request bodies of at least this many bytes go through shared memory.
    pub shm_threshold: usize,
    /// WebSocket limits.
    pub ws: WsConfig,
}

/// WebSocket limits (`[listener.ws]` in switchyard.toml).
#[derive(Clone, Debug)]
pub struct WsConfig {
    /// Largest message (and frame) a client may send; more closes with 1009.
    pub max_message_bytes: usize,
    /// Subscriptions one connection may hold; more are refused (error 429).
    pub max_subscriptions: usize,
    /// Messages queued towards one client; a push that finds it full drops
    /// the client (1008 "too slow").
    pub queue: usize,
    /// The server pings this often; a client that has not answered the
    /// previous ping by the next one is closed (1008).
    pub ping_interval: Duration,
    /// Requests of one connection in flight at once; the connection is not
    /// read further until one completes.
    pub max_in_flight: usize,
    /// Whether clients may emit notifications (`{"notify": type, "data"}`)
    /// into the group. Off by default: it lets any client reach every
    /// subscribed manager.
    pub notify: bool,
}

impl Default for WsConfig {
    fn default() -> Self {
        WsConfig {
            max_message_bytes: 256 * 1024,
            max_subscriptions: 64,
            queue: 1024,
            ping_interval: Duration::from_secs(20),
            max_in_flight: 256,
            notify: false,
        }
    }
}

impl Config {
    fn validate(&self) -> Result<(), Error> {
        if self.max_header_bytes < 8192 {
            return Err(Error::Config("max_header_bytes must be at least 8192".into()));
        }
        if self.pipes == 0 {
            return Err(Error::Config("pipes must be at least 1".into()));
        }
        // Bodies at or above the threshold cross in shared memory; below it
        // they ride in frames, which must have room for them.
        if self.shm_threshold + 64 * 1024 > self.max_frame {
            return Err(Error::Config(format!(
                "shm_threshold ({}) must leave 64 KiB of room under max_frame ({})",
                self.shm_threshold, self.max_frame
            )));
        }
        Ok(())
    }
}

/// Serves HTTP on `tcp` (and gRPC alone on `grpc_tcp`, when given) until
/// `drain` resolves with a grace period; then stops accepting and gives
/// in-flight requests that long to finish. `ready` fires
/// once every return pipe is registered and the route table is known.
pub async fn run(
    tcp: TcpListener,
    grpc_tcp: Option<TcpListener>,
    config: Config,
    ready: oneshot::Sender<()>,
    drain: impl Future<Output = Duration>,
) -> Result<(), Error> {
    config.validate()?;
    let config = Arc::new(config);
    let pool = pipes::Pool::start(config.clone());
    pool.wait_ready().await;
    let _ = ready.send(());
    tracing::info!(addr = %tcp.local_addr()?, "accepting connections");
    if let Some(grpc_tcp) = &grpc_tcp {
        tracing::info!(addr = %grpc_tcp.local_addr()?, "accepting gRPC connections");
    }

    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(config.header_read_timeout)
        .max_buf_size(config.max_header_bytes);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(config.max_header_bytes as u32);
    let builder = Arc::new(builder);
    let graceful = GracefulShutdown::new();
    let state = state::State::start(pool, config.clone());
    let grpc = Arc::new(grpc::Grpc::new(state.clone()));

    let mut main_port = Acceptor::new(tcp);
    let mut grpc_port = grpc_tcp.map(Acceptor::new);
    tokio::pin!(drain);
    let grace = loop {
        // A connection on the main port (HTTP, WebSocket and gRPC by content
        // type), or on the gRPC-only port when there is one.
        let (stream, grpc_only) = tokio::select! {
            grace = &mut drain => break grace,
            stream = main_port.accept() => (stream, false),
            stream = accept_optional(grpc_port.as_mut()) => (stream, true),
        };
        let _ = stream.set_nodelay(true);
        let builder = builder.clone();
        let state = state.clone();
        let grpc = grpc.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let reply = dispatch::serve(state.clone(), grpc.clone(), grpc_only, req);
                async move { Ok::<_, Infallible>(reply.await) }
            });
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
            if let Err(err) = watcher.watch(conn.into_owned()).await {
                tracing::debug!(%err, "connection ended with an error");
            }
        });
    };
    drop(main_port);
    drop(grpc_port);
    tracing::info!(connections = graceful.count(), ?grace, "draining");
    if tokio::time::timeout(grace, graceful.shutdown()).await.is_err() {
        tracing::warn!("grace period over; closing remaining connections");
    }
    Ok(())
}

/// Accepts on `port`, or never when there is none.
async fn accept_optional(port: Option<&mut Acceptor<TcpListener>>) -> tokio::net::TcpStream {
    match port {
        Some(port) => port.accept().await,
        None => std::future::pending().await,
    }
}
