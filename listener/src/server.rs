//! The accept loop: connections taken on the listener's ports (TCP, the
//! gRPC-only port, QUIC) and handed each to a task of its own, the
//! configuration's generations (a reload builds the next, which the
//! connections accepted from then on are served with), and the drain that
//! ends it all.

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;
use switchyard_proto::accept::Acceptor;
use switchyard_proto::supervision::Stop;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

use switchyard_middleware as middleware;

use crate::config::Config;
use crate::conn::{Connections, Io};
use crate::error::Error;
use crate::serve::Serve;
use crate::{access, conn, grpc, http3, jobs, pipes, quic, state, tls};

/// A new configuration for a running listener (`switchyard reload`).
///
/// This is the listener's live-configuration channel: everything a
/// connection is served with — limits, timeouts, TLS certificates (re-read
/// from their files on every update) and whatever later settings build
/// into the per-generation [`State`](state::State) — is rebuilt from
/// `config` and used for the connections accepted from then on, while open
/// connections finish with the generation they started with. Connection
/// admission and the sweeper's timeouts switch at once for every
/// connection. The middleware's decisions (authentication, rules, rate
/// limits) switch at once too: every request and every open session is
/// held to the newest configuration's (decision 0106). What the return
/// pipes were built with (`broker_socket`,
/// `pipes`, `max_frame`, `queue_capacity`, `shm_threshold`) cannot change
/// in a running process: those values are kept, and the supervisor reports
/// them as needing a restart.
pub struct Update {
    /// The whole new configuration.
    pub config: Config,
    /// Told `Ok` once new connections get the new settings, or why the
    /// update was refused (the running settings are then unchanged).
    pub applied: oneshot::Sender<Result<(), Error>>,
}

/// What a connection is served with: one per configuration the listener
/// has had, shared by the connections accepted under it.
struct Generation {
    builder: Arc<auto::Builder<TokioExecutor>>,
    state: Arc<state::State>,
    grpc: Arc<grpc::Grpc>,
    /// The middleware's tower-http layers, wrapped around each connection's
    /// service.
    layers: Arc<middleware::Layers>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    /// `Alt-Svc` for TCP replies, when HTTP/3 is served.
    alt_svc: Option<::http::HeaderValue>,
    /// The QUIC settings for new HTTP/3 connections (a process that owns
    /// the UDP socket).
    quic: Option<quinn::ServerConfig>,
}

impl Generation {
    /// `quic_base`: the running endpoint's settings, whose retry-token key
    /// a reload keeps.
    fn new(state: Arc<state::State>, quic_base: Option<&quinn::ServerConfig>) -> Result<Generation, Error> {
        let config = &state.config;
        let tls = config
            .tls
            .as_ref()
            .map(tls::load)
            .transpose()?
            .map(tokio_rustls::TlsAcceptor::from);
        let (alt_svc, quic) = match (&config.http3, &config.tls) {
            (Some(http3), Some(tls)) => (
                Some(http3.alt_svc()),
                Some(quic::server_config(http3, tls, quic_base)?),
            ),
            _ => (None, None),
        };
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(config.header_read_timeout)
            .max_buf_size(config.max_header_bytes);
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_header_list_size(config.max_header_bytes as u32)
            // WebSocket over h2 (RFC 8441), served by the same session code.
            .enable_connect_protocol();
        let layers = Arc::new(middleware::layers(&config.middleware).map_err(Error::Config)?);
        Ok(Generation {
            builder: Arc::new(builder),
            layers,
            grpc: Arc::new(grpc::Grpc::new(state.clone())),
            state,
            tls,
            alt_svc,
            quic,
        })
    }
}

fn limits(config: &Config) -> conn::Limits {
    conn::Limits {
        max_connections: connection_limit(config.max_connections),
        idle: config.idle_timeout,
        first_request: config.idle_timeout + config.header_read_timeout,
        write_stall: config.write_stall_timeout,
    }
}

/// Serves HTTP on `tcp` (and gRPC alone on `grpc_tcp`, when given, and
/// HTTP/3 on `quic`, when given and `config.http3` is set) until
/// `stop` resolves; then stops accepting and gives in-flight requests the
/// stop's grace to finish ([`Stop::Now`]: none). `ready` fires
/// once every return pipe is registered and the route table is known.
/// Each [`Update`] received on `updates` reconfigures the listener live.
pub async fn run(
    tcp: TcpListener,
    grpc_tcp: Option<TcpListener>,
    quic: Option<std::net::UdpSocket>,
    config: Config,
    ready: oneshot::Sender<()>,
    stop: impl Future<Output = Stop>,
    mut updates: mpsc::Receiver<Update>,
) -> Result<(), Error> {
    config.validate()?;
    let mut config = config;
    if let Some(http3) = &mut config.http3
        && http3.port == 0
    {
        http3.port = tcp.local_addr()?.port();
    }
    let config = Arc::new(config);
    let middleware = Arc::new(middleware::Middleware::new(&config.middleware).map_err(Error::Config)?);
    let pool = pipes::Pool::start(config.clone(), middleware.clone());
    let connections = Connections::start(limits(&config));
    // Before the pipes are ready: a certificate that cannot be used stops
    // the listener at start, not at its first handshake.
    let access = access::AccessLog::open(&config.access_log)?;
    let mut current = Generation::new(
        state::State::start(pool.clone(), config.clone(), middleware, access),
        None,
    )?;
    // Clients' jobs fire under the newest configuration's rules.
    let (states, newest_state) = tokio::sync::watch::channel(current.state.clone());
    if let Some(queue) = pool.take_jobs() {
        tokio::spawn(jobs::serve(queue, newest_state));
    }
    let endpoint = match (quic, &current.quic) {
        (Some(socket), Some(server)) => Some(quinn::Endpoint::new(
            quic::endpoint_config(config.http3.as_ref().expect("a QUIC config comes from http3")),
            Some(server.clone()),
            socket,
            Arc::new(quinn::TokioRuntime),
        )?),
        _ => None,
    };
    let handshakes = Arc::new(quic::Handshakes::default());
    pool.wait_ready().await;
    let _ = ready.send(());
    let scheme = if config.tls.is_some() { "https" } else { "http" };
    tracing::info!(addr = %tcp.local_addr()?, scheme, "accepting connections");
    if let Some(grpc_tcp) = &grpc_tcp {
        tracing::info!(addr = %grpc_tcp.local_addr()?, scheme, "accepting gRPC connections");
    }
    if let Some(endpoint) = &endpoint {
        tracing::info!(addr = %endpoint.local_addr()?, "accepting HTTP/3 (QUIC) connections");
    }
    // "Drain" is told to every connection; "done" is the drop of the last
    // connection task's sender.
    let (done_tx, mut done) = mpsc::channel::<()>(1);

    let mut main_port = Acceptor::new(tcp);
    let mut grpc_port = grpc_tcp.map(Acceptor::new);
    tokio::pin!(stop);
    let grace = loop {
        // A connection on the main port (HTTP, WebSocket and gRPC by content
        // type), or on the gRPC-only port when there is one.
        let (stream, grpc_only) = tokio::select! {
            stop = &mut stop => break stop.grace(),
            Some(update) = updates.recv() => {
                let applied = reconfigure(&current, update.config).map(|next| {
                    connections.set_limits(limits(&next.state.config));
                    if let Some(endpoint) = &endpoint {
                        // None stops new HTTP/3 connections (http3 turned off).
                        endpoint.set_server_config(next.quic.clone());
                    }
                    current = next;
                    // Open sessions follow the new rules and keys too.
                    pool.set_policy(current.state.middleware.clone());
                    states.send_replace(current.state.clone());
                });
                match &applied {
                    Ok(()) => tracing::info!(tls = current.tls.is_some(), "configuration reloaded; new connections use it"),
                    Err(err) => tracing::error!(%err, "configuration not reloaded; keeping the running one"),
                }
                let _ = update.applied.send(applied);
                continue;
            }
            stream = main_port.accept() => (stream, false),
            stream = accept_optional(grpc_port.as_mut()) => (stream, true),
            Some(incoming) = accept_quic(endpoint.as_ref()) => {
                accept_h3(incoming, &current, &connections, &handshakes, &done_tx);
                continue;
            }
        };
        let Some((conn, admission)) = connections.admit() else {
            // A TLS client cannot read a plaintext 503 (and a handshake is
            // what the limit spares us): it is closed instead.
            if current.tls.is_none() {
                refuse(stream);
            }
            continue;
        };
        let _ = stream.set_nodelay(true);
        let peer = stream.peer_addr().ok();
        let io = Io::new(stream, conn.clone(), admission);
        let serve = Serve {
            builder: current.builder.clone(),
            state: current.state.clone(),
            grpc: current.grpc.clone(),
            layers: current.layers.clone(),
            grpc_only,
            conn,
            peer,
            alt_svc: current.alt_svc.clone(),
        };
        tokio::spawn(serve.run(io, current.tls.clone(), done_tx.clone()));
    };
    drop(main_port);
    drop(grpc_port);
    if let Some(endpoint) = &endpoint {
        // New connections are not taken from now on; the open ones get
        // their GOAWAY with the drain below. Their Initials are dropped
        // rather than refused: during an upgrade the new group reads the
        // same socket, and the client's next try may reach it.
        let endpoint = endpoint.clone();
        tokio::spawn(async move {
            while let Some(incoming) = endpoint.accept().await {
                incoming.ignore();
            }
        });
    }
    connections.drain();
    drop(done_tx);
    tracing::info!(connections = connections.count(), ?grace, "draining");
    let deadline = tokio::time::Instant::now() + grace;
    if tokio::time::timeout_at(deadline, done.recv()).await.is_err() {
        tracing::warn!("grace period over; closing remaining connections");
    }
    if let Some(endpoint) = endpoint {
        // What is still open is cut; the close frames leave before exit.
        endpoint.close(quinn::VarInt::from_u32(0x100), b"shutting down");
        let _ = tokio::time::timeout(Duration::from_secs(1), endpoint.wait_idle()).await;
    }
    Ok(())
}

/// Accepts on the QUIC endpoint, or never when there is none.
async fn accept_quic(endpoint: Option<&quinn::Endpoint>) -> Option<quinn::Incoming> {
    match endpoint {
        Some(endpoint) => endpoint.accept().await,
        None => std::future::pending().await,
    }
}

/// A new QUIC connection's first packet: a Retry when its address must be
/// validated first, refused over `max_connections`, else served in a task
/// of its own.
fn accept_h3(
    incoming: quinn::Incoming,
    current: &Generation,
    connections: &Arc<Connections>,
    handshakes: &Arc<quic::Handshakes>,
    done: &mpsc::Sender<()>,
) {
    let Some(http3) = &current.state.config.http3 else {
        return incoming.refuse();
    };
    let verdict = handshakes.verdict(
        http3.retry,
        incoming.remote_address_validated(),
        incoming.may_retry(),
    );
    if verdict == quic::Verdict::Retry {
        if let Err(err) = incoming.retry() {
            tracing::debug!(%err, "QUIC retry not sent");
        }
        return;
    }
    let Some((conn, admission)) = connections.admit() else {
        return incoming.refuse();
    };
    let peer = incoming.remote_address();
    let handshake = handshakes.start();
    let connecting = match incoming.accept() {
        Ok(connecting) => connecting,
        Err(err) => return tracing::debug!(%err, "QUIC connection not accepted"),
    };
    let serve = Serve {
        builder: current.builder.clone(),
        state: current.state.clone(),
        grpc: current.grpc.clone(),
        layers: current.layers.clone(),
        grpc_only: false,
        conn,
        peer: Some(peer),
        alt_svc: None,
    };
    let h3 = http3::H3Conn {
        serve,
        handshake,
        zero_rtt: http3.zero_rtt,
    };
    let done = done.clone();
    tokio::spawn(async move {
        // The place in `max_connections` is held while the connection is.
        let _admission = admission;
        h3.run(connecting, done).await
    });
}

/// The generation `config` makes, sharing the running one's return pipes
/// and request-body memory; the settings those were built with are kept.
fn reconfigure(current: &Generation, mut config: Config) -> Result<Generation, Error> {
    let running = &current.state.config;
    config.broker_socket = running.broker_socket.clone();
    config.pipes = running.pipes;
    config.max_frame = running.max_frame;
    config.queue_capacity = running.queue_capacity;
    config.shm_threshold = running.shm_threshold;
    // The UDP port and this process's place on it cannot change while
    // running either.
    if let (Some(next), Some(running)) = (&mut config.http3, &running.http3) {
        next.port = running.port;
        next.steering = running.steering;
    }
    config.validate()?;
    // Rate-limit buckets start afresh with a reloaded configuration.
    let middleware = Arc::new(middleware::Middleware::new(&config.middleware).map_err(Error::Config)?);
    let access = access::AccessLog::open(&config.access_log)?;
    Generation::new(
        current.state.reconfigured(Arc::new(config), middleware, access),
        current.quic.as_ref(),
    )
}

/// `configured`, or less when the descriptor limit would not allow it: a
/// connection over the limit must be refused by us, not by `EMFILE`.
fn connection_limit(configured: usize) -> usize {
    // Descriptors kept for everything else: return pipes, shared-memory
    // segments, the log, the control channel.
    const RESERVE: u64 = 256;
    let Ok(nofile) = switchyard_proto::accept::nofile_limit() else {
        return configured;
    };
    let room = nofile.saturating_sub(RESERVE).max(1);
    if configured as u64 > room {
        tracing::warn!(
            max_connections = configured,
            nofile,
            limit = room,
            "listener.max_connections exceeds what the descriptor limit allows; using the lower limit"
        );
        return room as usize;
    }
    configured
}

/// Refuses a connection over `max_connections`: a 503 it can read, then
/// close. Never waits: the answer fits in any socket buffer.
fn refuse(stream: TcpStream) {
    static REFUSED: OnceLock<Vec<u8>> = OnceLock::new();
    let answer = REFUSED.get_or_init(|| {
        let refusal = switchyard_proto::Refusal::unavailable(
            switchyard_proto::Hop::Listener,
            "too many connections; retry later",
        );
        let (meta, body) = refusal.parts();
        let mut answer = format!(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-length: {}\r\n",
            body.len()
        );
        for (name, value) in meta.iter() {
            answer.push_str(&format!("{name}: {value}\r\n"));
        }
        answer.push_str("connection: close\r\n\r\n");
        let mut answer = answer.into_bytes();
        answer.extend_from_slice(&body);
        answer
    });
    // What the client already sent is read first, so that the close is a
    // FIN after the answer rather than a reset that may discard it.
    let mut scratch = [0u8; 2048];
    let _ = stream.try_read(&mut scratch);
    let _ = stream.try_write(answer);
}

/// Accepts on `port`, or never when there is none.
async fn accept_optional(port: Option<&mut Acceptor<TcpListener>>) -> tokio::net::TcpStream {
    match port {
        Some(port) => port.accept().await,
        None => std::future::pending().await,
    }
}
