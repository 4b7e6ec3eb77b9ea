//! The simulated clients: one connection each (or one per request, with
//! `--new-connection`), HTTP/1.1 or h2, over TLS for an https URL, or
//! HTTP/3 over QUIC (`--http3`, module `crate::h3`), sending
//! the prepared requests round-robin, closed loop or on the open-loop
//! schedule.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, anyhow};
use bytes::Bytes;
use hdrhistogram::Histogram;
use http::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use http::uri::{PathAndQuery, Scheme};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;
use tokio::task::AbortHandle;
use tokio::time::{Instant, sleep_until, timeout, timeout_at};

use super::options::{Options, Route};
use super::report::Counts;
use super::schedule::Schedule;

/// Bounds a probe (`/openapi.json`, `/ready`, the first connect) of a server that hangs.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Largest probe body read: an OpenAPI document of a big application fits.
const PROBE_MAX_BODY: usize = 16 * 1024 * 1024;

/// Pause after a refused connect, so that a server that is down costs a
/// hundred errors a second per client instead of a core spinning on them.
const CONNECT_BACKOFF: Duration = Duration::from_millis(10);

/// Largest latency recorded: an hour, far beyond any step.
const MAX_LATENCY_US: u64 = 3_600_000_000;

/// How to reach the server and what every request carries.
pub(super) struct Server {
    addr: SocketAddr,
    http2: bool,
    /// Set for WebSocket or gRPC: the event every request calls and its data.
    event: Option<EventCall>,
    origin: Uri,
    token: Option<HeaderValue>,
    headers: Vec<(http::HeaderName, HeaderValue)>,
    /// https: the client side of TLS and the name the certificate must have.
    tls: Option<(tokio_rustls::TlsConnector, rustls::pki_types::ServerName<'static>)>,
    /// `--http3`: QUIC to the same address on UDP (the probes of
    /// `/openapi.json` and `/ready` still go over TCP).
    http3: Option<crate::h3::Connector>,
    /// A new connection for every request (`--new-connection`).
    pub(super) new_connection: bool,
}

impl Server {
    /// Resolves the URL's host and keeps the first address that accepts a
    /// connection, so that a server that is not there fails the run at once
    /// instead of filling a table with transport errors.
    pub(super) async fn connect(opts: &Options) -> anyhow::Result<Server> {
        let authority = opts.url.authority().context("the URL has no host")?;
        let host = authority.host().trim_start_matches('[').trim_end_matches(']');
        let https = opts.url.scheme() == Some(&Scheme::HTTPS);
        anyhow::ensure!(
            !(https && (opts.ws || opts.grpc || opts.grpc_bidi)),
            "--ws, --grpc and --grpc-bidi do not take an https URL yet"
        );
        anyhow::ensure!(!opts.http3 || https, "--http3 needs an https URL");
        let tls = if https {
            let alpn: &[&[u8]] = if opts.http2 { &[b"h2"] } else { &[b"http/1.1"] };
            let config = crate::tls::client_config(opts.cacert.as_deref(), opts.insecure, alpn)?;
            let name = rustls::pki_types::ServerName::try_from(host.to_owned())
                .with_context(|| format!("{host} is not a name a certificate can have"))?;
            Some((tokio_rustls::TlsConnector::from(config), name))
        } else {
            None
        };
        let h3_tls = match (&tls, opts.http3) {
            (Some((connector, _)), true) => Some(connector.config().clone()),
            _ => None,
        };
        let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
        let addrs: Vec<SocketAddr> = timeout(PROBE_TIMEOUT, tokio::net::lookup_host((host, port)))
            .await
            .with_context(|| format!("resolving {host} timed out"))?
            .with_context(|| format!("cannot resolve {host}"))?
            .collect();
        let mut last_error = anyhow!("{host} resolves to no address");
        for addr in addrs {
            match timeout(PROBE_TIMEOUT, TcpStream::connect(addr)).await {
                Ok(Ok(_)) => {
                    let http3 = match &h3_tls {
                        Some(tls) => {
                            let connector = crate::h3::Connector::new(tls, addr, host)?;
                            // A server with no HTTP/3 fails the run here, not in every request.
                            timeout(PROBE_TIMEOUT, connector.connect())
                                .await
                                .map_err(|_| anyhow!("no QUIC handshake with udp {addr} in time"))?
                                .with_context(|| format!("cannot reach HTTP/3 on udp {addr}"))?;
                            Some(connector)
                        }
                        None => None,
                    };
                    let token = match &opts.token {
                        Some(token) => Some(
                            HeaderValue::try_from(format!("Bearer {token}"))
                                .context("the token is not a valid header value")?,
                        ),
                        None => None,
                    };
                    let origin = Uri::builder()
                        .scheme(if https { Scheme::HTTPS } else { Scheme::HTTP })
                        .authority(authority.clone())
                        .path_and_query("/")
                        .build()?;
                    return Ok(Server {
                        addr,
                        http2: opts.http2,
                        event: EventCall::from_options(opts)?,
                        origin,
                        token,
                        headers: opts.headers.clone(),
                        tls,
                        http3,
                        new_connection: opts.new_connection,
                    });
                }
                Ok(Err(err)) => last_error = anyhow!(err).context(format!("cannot connect to {addr}")),
                Err(_) => last_error = anyhow!("connecting to {addr} timed out"),
            }
        }
        Err(last_error)
    }

    /// "HTTP/1.1", "h2", "WebSocket" or "gRPC".
    pub(super) fn protocol(&self) -> &'static str {
        match &self.event {
            Some(EventCall {
                transport: EventTransport::Grpc,
                ..
            }) => "gRPC",
            Some(EventCall {
                transport: EventTransport::GrpcBidi,
                ..
            }) => "gRPC bidi (Session)",
            Some(_) => "WebSocket",
            None if self.http3.is_some() => "HTTP/3",
            None if self.http2 => "h2",
            None => "HTTP/1.1",
        }
    }

    /// Everything about `route`'s requests that does not change between them.
    pub(super) fn prepare(&self, route: &Route, body: Option<&Bytes>) -> anyhow::Result<Prepared> {
        let path: PathAndQuery = route.path.parse()?;
        // h2 and HTTP/3 take :scheme and :authority from the URI, HTTP/1.1
        // the origin form and `host`.
        let absolute = self.http2 || self.http3.is_some();
        let uri = if absolute {
            let mut parts = self.origin.clone().into_parts();
            parts.path_and_query = Some(path);
            Uri::from_parts(parts)?
        } else {
            Uri::from(path)
        };
        // Only writes carry the body: servers may refuse a GET or DELETE with one.
        let body = match route.method {
            Method::POST | Method::PUT | Method::PATCH => body.cloned().unwrap_or_default(),
            _ => Bytes::new(),
        };
        let mut headers = HeaderMap::new();
        if !absolute {
            let host = self.origin.authority().map_or("", |a| a.as_str());
            headers.insert(HOST, HeaderValue::from_str(host)?);
        }
        if !body.is_empty() {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        if let Some(token) = &self.token {
            headers.insert(AUTHORIZATION, token.clone());
        }
        // The first -H of a name replaces the default; later ones of that name add to it.
        let mut named = HashSet::new();
        for (name, value) in &self.headers {
            if named.insert(name) {
                headers.remove(name);
            }
            headers.append(name, value.clone());
        }
        Ok(Prepared {
            method: route.method.clone(),
            uri,
            headers,
            body,
        })
    }

    /// `GET path` on a connection of its own: status and body.
    pub(super) async fn fetch(&self, path: &str) -> anyhow::Result<(StatusCode, Bytes)> {
        let mut request = self.prepare(&Route::get(path), None)?.request();
        if self.http3.is_some() && !self.http2 {
            // Over TCP, HTTP/1.1: the origin form and `host`.
            if let Some(path) = request.uri().path_and_query().cloned() {
                *request.uri_mut() = Uri::from(path);
            }
            let host = self.origin.authority().map_or("", |a| a.as_str());
            request.headers_mut().insert(HOST, HeaderValue::from_str(host)?);
        }
        let exchange = async {
            let mut conn = Conn::open_http(self).await?;
            conn.ready().await?;
            let response = conn.send(request).await?;
            let status = response.status();
            let body = Limited::new(response.into_body(), PROBE_MAX_BODY)
                .collect()
                .await
                .map_err(|err| anyhow!(err))?
                .to_bytes();
            anyhow::Ok((status, body))
        };
        timeout(PROBE_TIMEOUT, exchange)
            .await
            .map_err(|_| anyhow!("no answer within {} s", PROBE_TIMEOUT.as_secs()))?
    }
}

/// A request ready to be cloned and sent.
pub(super) struct Prepared {
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
}

impl Prepared {
    /// The head alone, for HTTP/3 (the body goes as DATA).
    fn head(&self) -> Request<()> {
        let mut request = Request::new(());
        *request.method_mut() = self.method.clone();
        *request.uri_mut() = self.uri.clone();
        *request.headers_mut() = self.headers.clone();
        request
    }

    fn request(&self) -> Request<Full<Bytes>> {
        let mut request = Request::new(Full::new(self.body.clone()));
        *request.method_mut() = self.method.clone();
        *request.uri_mut() = self.uri.clone();
        *request.headers_mut() = self.headers.clone();
        request
    }
}

/// What the clients of a run share.
pub(super) struct Workload {
    pub(super) server: Server,
    pub(super) requests: Vec<Prepared>,
}

/// The latencies of one window, shared by its clients: one histogram per
/// client would cost ~190 KB each (microseconds up to an hour at 3 significant
/// figures), hundreds of megabytes at a thousand clients, where the lock is
/// taken once per response by at most a couple of runtime threads.
pub(super) struct Latencies(Mutex<Histogram<u64>>);

impl Latencies {
    pub(super) fn new() -> Latencies {
        // The bounds are constants that hdrhistogram accepts.
        let histogram = Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("valid histogram bounds");
        Latencies(Mutex::new(histogram))
    }

    pub(super) fn record(&self, latency: Duration) {
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        // A sub-microsecond response is recorded as 1 µs, the histogram's resolution.
        let mut histogram = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        histogram.saturating_record(us.max(1));
    }

    pub(super) fn into_histogram(self) -> Histogram<u64> {
        self.0.into_inner().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What one client (or, merged, all the clients) saw in one window.
#[derive(Default)]
pub(super) struct Tally {
    pub(super) counts: Counts,
    /// When the requests cut by the end of the window were due (at most one a client).
    pub(super) cut: Vec<Instant>,
}

impl Tally {
    pub(super) fn merge(&mut self, other: Tally) {
        self.counts.merge(&other.counts);
        self.cut.extend(other.cut);
    }
}

/// Client `id`: sends requests until `deadline`.
///
/// Closed loop (no `schedule`): the next request goes as soon as the previous
/// response is in, and latency is from send to the end of the response body.
/// Open loop: the client takes the next slot of the shared schedule as it
/// falls due (at once if it is overdue) and latency is from the slot's due
/// time, so that a server that holds the clients up is charged for the
/// requests it kept from being sent (coordinated omission).
pub(super) async fn client(
    workload: Arc<Workload>,
    latencies: Arc<Latencies>,
    schedule: Option<Arc<Schedule>>,
    id: usize,
    deadline: Instant,
) -> Tally {
    let mut tally = Tally::default();
    let mut conn = None;
    let fresh = workload.server.new_connection;
    for k in 0.. {
        let due = match &schedule {
            None => Some(Instant::now()).filter(|now| *now < deadline),
            Some(schedule) => timeout_at(deadline, schedule.next()).await.ok(),
        };
        let Some(due) = due else { break };
        // Round-robin, each client starting one route further, so that every step mixes them evenly.
        let prepared = &workload.requests[(id + k) % workload.requests.len()];
        let started = Instant::now();
        let attempted = timeout_at(deadline, attempt(&mut conn, &workload.server, prepared)).await;
        if fresh {
            conn = None;
        }
        match attempted {
            Ok(Ok((status, sent))) => {
                // Closed loop, from the send: a connect is not the server's
                // response time, unless every request makes one.
                let from = match (&schedule, fresh) {
                    (Some(_), _) => due,
                    (None, true) => started,
                    (None, false) => sent,
                };
                latencies.record(from.elapsed());
                tally.counts.add_status(status.as_u16());
            }
            Ok(Err(Failure::Connect)) => {
                tally.counts.transport += 1;
                sleep_until((Instant::now() + CONNECT_BACKOFF).min(deadline)).await;
            }
            Ok(Err(Failure::Exchange)) => tally.counts.transport += 1,
            Err(_) => {
                tally.cut.push(due);
                break;
            }
        }
    }
    tally
}

/// A request over WebSocket or gRPC: one event type, one body.
struct EventCall {
    transport: EventTransport,
    event: String,
    data: serde_json::Value,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum EventTransport {
    Ws,
    Grpc,
    GrpcBidi,
}

impl EventCall {
    fn from_options(opts: &Options) -> anyhow::Result<Option<EventCall>> {
        let transport = if opts.ws {
            EventTransport::Ws
        } else if opts.grpc {
            EventTransport::Grpc
        } else if opts.grpc_bidi {
            EventTransport::GrpcBidi
        } else {
            return Ok(None);
        };
        let data = match &opts.body {
            Some(body) => serde_json::from_slice(body).context("--body must be JSON for --ws and --grpc")?,
            None => serde_json::json!({}),
        };
        Ok(Some(EventCall {
            transport,
            event: opts.event.clone(),
            data,
        }))
    }
}

/// A call's outcome as an HTTP status: 200, the event's error status, or a
/// transport failure.
async fn call_event(conn: &Conn, call: &EventCall) -> Result<StatusCode, Failure> {
    let result: Result<serde_json::Value, switchyard_client::ClientError> = match &conn.sender {
        Sender::Ws(client) => client.call(&call.event, &call.data).await,
        Sender::Grpc(client) => client.call(&call.event, &call.data).await,
        Sender::GrpcBidi(session) => session.call(&call.event, &call.data).await,
        _ => return Err(Failure::Exchange),
    };
    match result {
        Ok(_) => Ok(StatusCode::OK),
        Err(switchyard_client::ClientError::Status { status, .. }) => {
            Ok(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        }
        Err(_) => Err(Failure::Exchange),
    }
}

enum Failure {
    /// No connection could be made.
    Connect,
    /// The connection failed during the exchange: reset, closed, malformed.
    Exchange,
}

/// One request on the client's connection, opened or replaced as needed; the
/// response body is read to its end. Returns the status and when the request
/// went out.
async fn attempt(
    conn: &mut Option<Conn>,
    server: &Server,
    prepared: &Prepared,
) -> Result<(StatusCode, Instant), Failure> {
    // A connection the server closed between requests (keep-alive limit,
    // `connection: close`) is replaced without counting an error: nothing was lost.
    if let Some(open) = conn
        && open.ready().await.is_err()
    {
        *conn = None;
    }
    let open = match conn {
        Some(open) => open,
        None => {
            let mut fresh = Conn::open(server).await.map_err(|_| Failure::Connect)?;
            fresh.ready().await.map_err(|_| Failure::Connect)?;
            conn.insert(fresh)
        }
    };
    let sent = Instant::now();
    if let Some(call) = &server.event {
        return match call_event(open, call).await {
            Ok(status) => Ok((status, sent)),
            Err(failure) => {
                *conn = None;
                Err(failure)
            }
        };
    }
    if let Sender::H3(h3) = &mut open.sender {
        return match h3.exchange(prepared.head(), prepared.body.clone()).await {
            Ok(status) => Ok((status, sent)),
            Err(_) => {
                *conn = None;
                Err(Failure::Exchange)
            }
        };
    }
    match exchange(open, prepared.request()).await {
        Ok(status) => Ok((status, sent)),
        Err(_) => {
            *conn = None;
            Err(Failure::Exchange)
        }
    }
}

async fn exchange(conn: &mut Conn, request: Request<Full<Bytes>>) -> hyper::Result<StatusCode> {
    let response = conn.send(request).await?;
    let status = response.status();
    let mut body = response.into_body();
    // Drained frame by frame: the bytes are not needed, only the time they took.
    while let Some(frame) = body.frame().await {
        frame?;
    }
    Ok(status)
}

/// A client connection and the task that drives it.
struct Conn {
    sender: Sender,
    driver: Option<AbortHandle>,
}

enum Sender {
    H1(http1::SendRequest<Full<Bytes>>),
    H2(http2::SendRequest<Full<Bytes>>),
    Ws(switchyard_client::Client),
    Grpc(switchyard_client::GrpcClient),
    GrpcBidi(switchyard_client::GrpcSession),
    H3(crate::h3::Connection),
}

impl Conn {
    async fn open(server: &Server) -> anyhow::Result<Conn> {
        let addr = server.addr;
        match server.event.as_ref().map(|e| e.transport) {
            Some(transport @ (EventTransport::Grpc | EventTransport::GrpcBidi)) => {
                let client = switchyard_client::GrpcClient::connect(&format!("http://{addr}"))
                    .await
                    .map_err(|e| anyhow!("{e}"))?;
                let sender = if transport == EventTransport::GrpcBidi {
                    Sender::GrpcBidi(client.session().await.map_err(|e| anyhow!("{e}"))?)
                } else {
                    Sender::Grpc(client)
                };
                return Ok(Conn { sender, driver: None });
            }
            Some(EventTransport::Ws) => {
                let client = switchyard_client::Client::connect(&format!("ws://{addr}/ws"))
                    .await
                    .map_err(|e| anyhow!("{e}"))?;
                return Ok(Conn {
                    sender: Sender::Ws(client),
                    driver: None,
                });
            }
            None => {}
        }
        if let Some(connector) = &server.http3 {
            return Ok(Conn {
                sender: Sender::H3(connector.connect().await?),
                driver: None,
            });
        }
        Conn::open_http(server).await
    }

    async fn open_http(server: &Server) -> anyhow::Result<Conn> {
        let stream = TcpStream::connect(server.addr).await?;
        // Small requests must not wait for Nagle's algorithm.
        stream.set_nodelay(true)?;
        match &server.tls {
            Some((connector, name)) => {
                let stream = connector.connect(name.clone(), stream).await?;
                Conn::handshake(TokioIo::new(stream), server.http2).await
            }
            None => Conn::handshake(TokioIo::new(stream), server.http2).await,
        }
    }

    async fn handshake<I>(io: TokioIo<I>, http2: bool) -> anyhow::Result<Conn>
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, driver) = if http2 {
            let (sender, connection) = http2::handshake(TokioExecutor::new(), io).await?;
            (Sender::H2(sender), tokio::spawn(connection).abort_handle())
        } else {
            let (sender, connection) = http1::handshake(io).await?;
            (Sender::H1(sender), tokio::spawn(connection).abort_handle())
        };
        Ok(Conn {
            sender,
            driver: Some(driver),
        })
    }

    async fn ready(&mut self) -> hyper::Result<()> {
        match &mut self.sender {
            Sender::H1(sender) => sender.ready().await,
            Sender::H2(sender) => sender.ready().await,
            // The clients reconnect on their own; a closed HTTP/3
            // connection fails its next request and is replaced.
            Sender::Ws(_) | Sender::Grpc(_) | Sender::GrpcBidi(_) | Sender::H3(_) => Ok(()),
        }
    }

    async fn send(&mut self, request: Request<Full<Bytes>>) -> hyper::Result<Response<Incoming>> {
        match &mut self.sender {
            Sender::H1(sender) => sender.send_request(request).await,
            Sender::H2(sender) => sender.send_request(request).await,
            Sender::Ws(_) | Sender::Grpc(_) | Sender::GrpcBidi(_) | Sender::H3(_) => {
                unreachable!("event transports go through call_event, HTTP/3 through its own exchange")
            }
        }
    }
}

impl Drop for Conn {
    /// A request cut at the end of a step leaves its connection mid-exchange;
    /// aborting the driver closes the socket instead of waiting on a server
    /// that may never answer.
    fn drop(&mut self) {
        if let Some(driver) = &self.driver {
            driver.abort();
        }
    }
}
