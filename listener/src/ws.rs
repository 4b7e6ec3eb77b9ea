//! WebSocket on the listener's port: `/ws` (JSON requests, subscriptions and
//! pushes, interleaved on one connection) and `/ws/echo` (every message
//! travels to the `demo.WsEcho` handler and back unchanged). The protocol is
//! in docs/websocket.md.
//!
//! A session opens by an HTTP/1.1 upgrade (`101`) or, on an h2 connection,
//! by an extended CONNECT (RFC 8441: `:protocol = websocket`, answered
//! `200`); past the handshake both are the same byte stream and the same
//! session code below.
//!
//! A session is one task reading the socket and one writing it. The writer
//! drains the session's bounded outbound queue (responses, acks, errors,
//! pushes) and writes whatever is queued before one flush. Responses wait
//! for room in the queue (a client that does not read slows only its own
//! requests, at most `max_in_flight` of them); pushes and the server's
//! pings never wait: a full queue drops the client with close 1008 "too
//! slow". Below the queue, tungstenite's write buffer is bounded too, pongs
//! included (they coalesce past the bound; `frames`), and a connection
//! whose writes make no progress for `write_stall_timeout` is closed by
//! the listener's sweeper (`conn`).
//!
//! An idle session costs a few KiB: tungstenite's eager read buffer (128
//! KiB by default, zero-filled) is kept small, and grows only for a large
//! message.

use std::sync::Arc;
use std::time::Duration;

use crate::decoded::RequestBody;
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use switchyard_proto::control::{WsBinaryReply, WsBinaryRequest};
use switchyard_proto::{Hop, Refusal};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::error::CapacityError;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

use crate::conn::Conn;
use crate::context::Opener;
use crate::exchange::{call, emit_notification, round_trip};
use crate::pipes::{Outbox, Subscription, check_subscription};
use crate::reply::{Reply, error};
use crate::state::State;
use switchyard_middleware::Credential;
use switchyard_middleware::session::{self as policy, CloseReason, SessionAuth};

/// `AsyncWrite` for a read-side wrapper `$wrapper<S>` around a stream in
/// its `inner` field: every write goes straight to `inner`.
macro_rules! write_through {
    ($wrapper:ident) => {
        impl<S: AsyncWrite + Unpin> AsyncWrite for $wrapper<S> {
            fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
                Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
            }

            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                self.inner.is_write_vectored()
            }

            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                Pin::new(&mut self.get_mut().inner).poll_flush(cx)
            }

            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
            }
        }
    };
}
use write_through;

mod deflate;
mod frames;
mod refused;

use deflate::Inflate;
use frames::{FrameGuard, fragments};
use refused::{Refused, refusal};

/// The event `/ws/echo` messages become.
pub(crate) const ECHO_EVENT: &str = "demo.WsEcho";

type Ws = WebSocketStream<Inflate<FrameGuard<TokioIo<hyper::upgrade::Upgraded>>>>;

/// tungstenite's read buffer, allocated (and zero-filled) for every
/// connection: most of an idle connection's cost at the default 128 KiB.
/// A larger message grows it while it is read.
const READ_BUFFER: usize = 4 * 1024;
/// Written frames gather up to this before a write; each batch of the
/// writer is flushed anyway.
const WRITE_BUFFER: usize = 16 * 1024;
/// tungstenite's write buffer never holds more than this: a few of the
/// listener's frames (at most `frames::FRAGMENT` each); past it, pongs to a
/// client that does not read coalesce into one.
const MAX_WRITE_BUFFER: usize = WRITE_BUFFER + 2 * frames::FRAGMENT;

/// Why a session closes when the sweeper flags its connection.
const TOO_SLOW: CloseReason = Some((1008, "too slow: not reading"));

/// Whether the request opens a WebSocket: an HTTP/1.1 upgrade, or an h2
/// extended CONNECT (RFC 8441). Over HTTP/3 neither exists here (RFC 9220
/// is not served), so such a request is routed like any other.
pub(crate) fn is_upgrade<B>(req: &Request<B>) -> bool {
    match req.version() {
        http::Version::HTTP_2 => return is_extended_connect(req),
        http::Version::HTTP_3 => return false,
        _ => {}
    }
    let has = |name: header::HeaderName, token: &str| {
        req.headers().get_all(name).iter().any(|v| {
            v.to_str()
                .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
        })
    };
    has(header::CONNECTION, "upgrade") && has(header::UPGRADE, "websocket")
}

/// An h2 extended CONNECT for the `websocket` protocol. hyper passes the
/// `:protocol` pseudo-header on only when the server enabled
/// `SETTINGS_ENABLE_CONNECT_PROTOCOL`.
fn is_extended_connect<B>(req: &Request<B>) -> bool {
    req.method() == http::Method::CONNECT
        && req
            .extensions()
            .get::<hyper::ext::Protocol>()
            .is_some_and(|p| p.as_str().eq_ignore_ascii_case("websocket"))
}

/// Answers the handshake (HTTP/1.1: 101; h2 extended CONNECT: 200) and
/// serves the session once hyper hands the stream over.
pub(crate) fn upgrade(
    state: Arc<State>,
    conn: &Arc<Conn>,
    mut req: Request<RequestBody>,
    echo: bool,
    credential: Credential,
) -> Reply {
    let h2 = req.version() == http::Version::HTTP_2;
    if !h2 && req.method() != http::Method::GET {
        return error(StatusCode::METHOD_NOT_ALLOWED, "a WebSocket upgrade is a GET");
    }
    if req
        .headers()
        .get(header::SEC_WEBSOCKET_VERSION)
        .map(|v| v.as_bytes())
        != Some(b"13")
    {
        let mut reply = error(StatusCode::UPGRADE_REQUIRED, "WebSocket version 13 is required");
        reply
            .headers_mut()
            .insert(header::SEC_WEBSOCKET_VERSION, HeaderValue::from_static("13"));
        return reply;
    }
    // RFC 8441 §5: over h2 there is no key and no accept; the stream's
    // CONNECT already proves the client speaks the protocol.
    let accept = if h2 {
        None
    } else {
        let Some(key) = req.headers().get(header::SEC_WEBSOCKET_KEY) else {
            return error(StatusCode::BAD_REQUEST, "missing Sec-WebSocket-Key");
        };
        Some(tokio_tungstenite::tungstenite::handshake::derive_accept_key(
            key.as_bytes(),
        ))
    };
    // What every request of the session knows of its client: the upgrade's
    // headers (cookies, say), address and identity.
    let opener = Arc::new(Opener::of(req.headers(), req.extensions(), &state.pool.routes()));
    // The middleware admitted the upgrade; its identity (in `opener`) is
    // the session's, and each message's event meets the policy
    // (`middleware::session` watches the rest of the session's life).
    let auth = SessionAuth::new(opener.identity.clone(), credential);
    let protocol = chosen_protocol(req.headers(), &state.config.ws.subprotocols);
    let deflate = if state.config.ws.deflate {
        deflate::negotiate(req.headers())
    } else {
        None
    };
    let agreed = deflate.as_ref().map(|(agreed, _)| *agreed);
    let on_upgrade = hyper::upgrade::on(&mut req);
    let cfg = state.config.ws.clone();
    let session_conn = conn.clone();
    // From now on the session's pings say whether the client is alive,
    // until it ends.
    let counted = conn.upgraded();
    tokio::spawn(async move {
        let _counted = counted;
        let conn = session_conn;
        let upgraded = match on_upgrade.await {
            Ok(u) => u,
            Err(err) => return tracing::debug!(%err, "websocket upgrade failed"),
        };
        let config = WebSocketConfig::default()
            .read_buffer_size(READ_BUFFER)
            .write_buffer_size(WRITE_BUFFER)
            .max_write_buffer_size(MAX_WRITE_BUFFER)
            .max_message_size(Some(cfg.max_message_bytes))
            .max_frame_size(Some(cfg.max_message_bytes));
        let io = FrameGuard::new(TokioIo::new(upgraded), cfg.message_timeout);
        let io = Inflate::new(io, agreed.is_some(), cfg.max_message_bytes);
        let ws = WebSocketStream::from_raw_socket(io, Role::Server, Some(config)).await;
        let _open = crate::metrics::WsSession::open();
        let compress = agreed.is_some_and(|a| a.compress_out);
        if echo {
            echo_session(state, conn, ws, opener, auth, compress).await
        } else {
            session(state, conn, ws, opener, auth, compress).await
        }
    });
    let mut reply = Response::new(http_body_util::Either::Left(Full::new(Bytes::new())));
    // Over h2 a 2xx to the CONNECT opens the stream, and connection-level
    // headers are not allowed.
    if let Some(accept) = accept {
        *reply.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let headers = reply.headers_mut();
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        if let Ok(v) = HeaderValue::from_str(&accept) {
            headers.insert(header::SEC_WEBSOCKET_ACCEPT, v);
        }
    }
    let headers = reply.headers_mut();
    if let Some(v) = protocol {
        headers.insert(header::SEC_WEBSOCKET_PROTOCOL, v);
    }
    if let Some((_, v)) = deflate {
        headers.insert(header::SEC_WEBSOCKET_EXTENSIONS, v);
    }
    reply
}

/// The subprotocol the answer names (RFC 6455 §4.2.2): the first one the
/// client offered that the server speaks (`listener.ws.subprotocols`), else
/// none. A `bearer.<token>` entry is a credential, never a protocol, and is
/// never echoed back; browsers fail a handshake that offered protocols and
/// got none, so a client that puts its token there offers a protocol name
/// the server speaks beside it.
fn chosen_protocol(headers: &http::HeaderMap, speaks: &[String]) -> Option<HeaderValue> {
    headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .find(|p| speaks.iter().any(|s| s == p))
        .and_then(|p| HeaderValue::from_str(p).ok())
}

fn close_message(reason: CloseReason) -> Message {
    let (code, text) = reason.unwrap_or((1000, ""));
    Message::Close(Some(CloseFrame {
        code: CloseCode::from(code),
        reason: text.into(),
    }))
}

/// How a read error ends the session.
fn read_error(err: &WsError) -> CloseReason {
    match err {
        WsError::Capacity(CapacityError::MessageTooLong { .. }) => Some((1009, "message too big")),
        WsError::Utf8(_) => Some((1007, "invalid UTF-8")),
        WsError::Protocol(_) => Some((1002, "protocol error")),
        WsError::Io(e) => match refusal(e)? {
            Refused::EmptyFragments => Some((1008, "too many empty fragments")),
            Refused::Unfinished => Some((1008, "message not finished in time")),
            Refused::TooBig => Some((1009, "message too big")),
            Refused::Corrupt => Some((1007, "invalid compressed data")),
            Refused::Protocol => Some((1002, "protocol error")),
        },
        _ => None,
    }
}

/// Writes the session's queue to the socket until the queue ends or the
/// session is killed; then sends the close frame (bounded wait: a client
/// that does not read is not waited for).
async fn writer(
    mut sink: futures_util::stream::SplitSink<Ws, Message>,
    mut rx: mpsc::Receiver<Message>,
    mut kill: watch::Receiver<CloseReason>,
    compress: bool,
) {
    let mut batch = Vec::with_capacity(64);
    loop {
        tokio::select! {
            biased;
            _ = kill.changed() => break,
            n = rx.recv_many(&mut batch, 64) => {
                if n == 0 {
                    break;
                }
                let write = async {
                    for m in batch.drain(..) {
                        for frame in fragments(m, compress) {
                            feed(&mut sink, frame).await?;
                        }
                    }
                    sink.flush().await
                };
                tokio::select! {
                    biased;
                    _ = kill.changed() => break,
                    written = write => if written.is_err() { return },
                }
            }
        }
    }
    let reason = *kill.borrow();
    if reason.is_some() {
        let _ = tokio::time::timeout(Duration::from_secs(1), sink.send(close_message(reason))).await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), sink.close()).await;
}

/// Queues `frame` in tungstenite's bounded write buffer, writing the buffer
/// out first when it is full (of pongs a flood left there): waits as long
/// as the client does not read, which the sweeper bounds.
async fn feed<S>(sink: &mut S, frame: Message) -> Result<(), WsError>
where
    S: futures_util::Sink<Message, Error = WsError> + Unpin,
{
    let mut frame = frame;
    loop {
        match sink.feed(frame).await {
            Err(WsError::WriteBufferFull(back)) => {
                sink.flush().await?;
                frame = *back;
            }
            fed => return fed,
        }
    }
}

fn problem_json(status: u16, detail: &str) -> Value {
    let (_, body) = Refusal::new(Hop::Listener, status, detail.to_owned()).parts();
    serde_json::from_slice(&body).unwrap_or(Value::Null)
}

/// `{"id":..,"status":..,"error":{problem}}`.
fn error_message(id: Option<&Value>, status: u16, detail: &str) -> Message {
    let mut out = serde_json::Map::new();
    if let Some(id) = id {
        out.insert("id".into(), id.clone());
    }
    out.insert("status".into(), status.into());
    out.insert("error".into(), problem_json(status, detail));
    Message::text(Value::Object(out).to_string())
}

/// The `/ws` session: requests, subscriptions, pushes.
async fn session(
    state: Arc<State>,
    conn: Arc<Conn>,
    ws: Ws,
    opener: Arc<Opener>,
    auth: Arc<SessionAuth>,
    compress: bool,
) {
    let cfg = state.config.ws.clone();
    let (sink, mut stream) = ws.split();
    let (tx, rx) = mpsc::channel::<Message>(cfg.queue);
    let (kill, mut killed) = watch::channel::<CloseReason>(None);
    let id = state
        .pool
        .open_session(Outbox::Ws(tx.clone()), kill.clone(), Some(auth.clone()));
    policy::watch(state.pool.clone(), Some(id), auth.clone(), kill.clone());
    let writer = tokio::spawn(writer(sink, rx, kill.subscribe(), compress));
    let in_flight = Arc::new(Semaphore::new(cfg.max_in_flight));
    let mut ping = tokio::time::interval(cfg.ping_interval);
    ping.reset();
    let mut awaiting_pong = false;
    let mut next_sub = 1u64;
    // Raised when the session ends for any reason but the listener's own
    // drain: the requests it still has in flight are then dropped, which
    // cancels them through the group, since nobody is left to read their
    // answers. A drain lets them finish.
    let (abandon, abandoned) = watch::channel(false);
    let mut draining = false;
    loop {
        let msg = tokio::select! {
            _ = killed.changed() => break,
            _ = conn.closing() => {
                draining = true;
                kill.send_replace(TOO_SLOW);
                break;
            }
            _ = ping.tick() => {
                if awaiting_pong {
                    kill.send_replace(Some((1008, "no pong to the last ping")));
                    break;
                }
                awaiting_pong = true;
                if let Err(mpsc::error::TrySendError::Full(_)) = tx.try_send(Message::Ping(Bytes::new())) {
                    kill.send_replace(Some((1008, "too slow: send queue full")));
                    break;
                }
                continue;
            }
            msg = stream.next() => msg,
        };
        let text = match msg {
            None => break,
            Some(Err(err)) => {
                let reason = read_error(&err);
                tracing::debug!(%err, "websocket read ended");
                if reason.is_some() {
                    kill.send_replace(reason);
                }
                break;
            }
            Some(Ok(Message::Text(t))) => t,
            Some(Ok(Message::Binary(bytes))) => {
                // A bincode request: answered with a bincode reply.
                match switchyard_proto::codec::decode::<WsBinaryRequest>(&bytes) {
                    Ok(request) => {
                        if let Err(refusal) = state.pool.policy().middleware.admit_event(
                            auth.identity.as_ref(),
                            opener.client.ip,
                            &request.event_type,
                            state.pool.routes().event_paths(),
                        ) {
                            let e = error_message(None, refusal.status(), &refusal.detail());
                            if tx.send(e).await.is_err() {
                                break;
                            }
                            continue;
                        }
                        let Ok(permit) = in_flight.clone().acquire_owned().await else {
                            break;
                        };
                        let (state, tx, opener) = (state.clone(), tx.clone(), opener.clone());
                        let abandoned = abandoned.clone();
                        tokio::spawn(async move {
                            tokio::select! {
                                reply = binary_request(&state, request, &opener) => {
                                    let _ = tx.send(reply).await;
                                }
                                () = session_abandoned(abandoned) => {}
                            }
                            drop(permit);
                        });
                    }
                    Err(_) => {
                        let e = error_message(None, 400, "a binary message is a bincode WsBinaryRequest");
                        if tx.send(e).await.is_err() {
                            break;
                        }
                    }
                }
                continue;
            }
            Some(Ok(Message::Pong(_))) => {
                awaiting_pong = false;
                continue;
            }
            Some(Ok(Message::Close(_))) => break,
            Some(Ok(_)) => continue,
        };
        // Any message shows the client is alive.
        awaiting_pong = false;
        let Ok(Value::Object(m)) = serde_json::from_str::<Value>(text.as_str()) else {
            let e = error_message(None, 400, "a message is one JSON object (see docs/websocket.md)");
            if tx.send(e).await.is_err() {
                break;
            }
            continue;
        };
        let msg_id = m.get("id").cloned();
        // What the message asks for, as the rules see it.
        let asked = match (m.get("subscribe"), m.get("notify"), m.get("type")) {
            (Some(Value::String(p)), _, _) => Some((p.as_str(), true)),
            (None, Some(Value::String(t)), _) | (None, None, Some(Value::String(t))) => {
                Some((t.as_str(), false))
            }
            _ => None,
        };
        let refused = asked.and_then(|(event, subscription)| {
            let policy = state.pool.policy();
            let routes = state.pool.routes();
            let who = auth.identity.as_ref();
            if subscription {
                policy
                    .middleware
                    .admit_subscription(who, opener.client.ip, event, routes.event_paths())
                    .err()
            } else {
                policy
                    .middleware
                    .admit_event(who, opener.client.ip, event, routes.event_paths())
                    .err()
            }
        });
        let reply = if let Some(refusal) = refused {
            Some(error_message(
                msg_id.as_ref(),
                refusal.status(),
                &refusal.detail(),
            ))
        } else if let Some(pattern) = m.get("subscribe") {
            Some(subscribe(
                &state,
                id,
                &mut next_sub,
                msg_id.as_ref(),
                pattern,
                m.get("filter"),
            ))
        } else if let Some(which) = m.get("unsubscribe") {
            Some(unsubscribe(&state, id, msg_id.as_ref(), which))
        } else if let Some(ty) = m.get("notify") {
            Some(notify(&state, msg_id.as_ref(), ty, m.get("data")))
        } else if let Some(Value::String(ty)) = m.get("type") {
            let Ok(permit) = in_flight.clone().acquire_owned().await else {
                break;
            };
            let data = m
                .get("data")
                .cloned()
                .unwrap_or(Value::Object(Default::default()));
            let (state, tx, ty, opener) = (state.clone(), tx.clone(), ty.clone(), opener.clone());
            let abandoned = abandoned.clone();
            tokio::spawn(async move {
                tokio::select! {
                    reply = request(&state, &ty, msg_id.as_ref(), &data, &opener) => {
                        let _ = tx.send(reply).await;
                    }
                    () = session_abandoned(abandoned) => {}
                }
                drop(permit);
            });
            None
        } else {
            Some(error_message(
                msg_id.as_ref(),
                400,
                "a message has `type` (a request), `subscribe`, `unsubscribe` or `notify`",
            ))
        };
        if let Some(reply) = reply
            && tx.send(reply).await.is_err()
        {
            break;
        }
    }
    state.pool.close_session(id);
    if !draining {
        abandon.send_replace(true);
    }
    // The writer ends at once when killed, else once the queue's senders
    // are gone (requests still in flight hold one until they are answered).
    drop(tx);
    let _ = writer.await;
}

/// Resolves once the session is abandoned (never, if its end came
/// without that word).
async fn session_abandoned(mut abandoned: watch::Receiver<bool>) {
    if abandoned.wait_for(|gone| *gone).await.is_err() {
        std::future::pending::<()>().await;
    }
}

fn subscribe(
    state: &State,
    session: u64,
    next_sub: &mut u64,
    id: Option<&Value>,
    pattern: &Value,
    filter: Option<&Value>,
) -> Message {
    let Value::String(pattern) = pattern else {
        return error_message(id, 400, "`subscribe` takes a pattern string");
    };
    let filter_json = match check_subscription(pattern, filter) {
        Ok(f) => f,
        Err(reason) => return error_message(id, 400, &reason),
    };
    let max = state.config.ws.max_subscriptions;
    if state.pool.subscriptions(session) >= max {
        return error_message(id, 429, &format!("at most {max} subscriptions per connection"));
    }
    let sub = *next_sub;
    *next_sub += 1;
    let client_id = id.cloned().unwrap_or_else(|| Value::from(pattern.as_str()));
    state.pool.subscribe(
        session,
        sub,
        Subscription {
            id: client_id.clone(),
            pattern: pattern.clone(),
            filter_json,
        },
    );
    Message::text(serde_json::json!({ "id": client_id, "subscribed": pattern }).to_string())
}

fn unsubscribe(state: &State, session: u64, id: Option<&Value>, which: &Value) -> Message {
    let removed = state.pool.unsubscribe(session, |s| {
        &s.id == which || which.as_str() == Some(s.pattern.as_str())
    });
    if removed == 0 {
        return error_message(id, 404, "no subscription has this id or pattern");
    }
    let mut out = serde_json::Map::new();
    if let Some(id) = id {
        out.insert("id".into(), id.clone());
    }
    out.insert("unsubscribed".into(), which.clone());
    out.insert("count".into(), removed.into());
    Message::text(Value::Object(out).to_string())
}

/// A binary `/ws` request → its binary reply.
async fn binary_request(state: &State, request: WsBinaryRequest, opener: &Opener) -> Message {
    const BINCODE: &str = "application/x-bincode";
    let client = opener.client.next_request();
    let (status, content_type, body) = call(
        state,
        &request.event_type,
        Some(BINCODE),
        Bytes::from(request.payload),
        state.config.request_timeout,
        &opener.front(&client),
    )
    .await;
    let reply = WsBinaryReply {
        id: request.id,
        status,
        content_type: content_type.unwrap_or_default(),
        payload: body.to_vec(),
    };
    match switchyard_proto::codec::encode(&reply) {
        Ok(bytes) => Message::Binary(Bytes::from(bytes)),
        Err(_) => error_message(None, 500, "internal error"),
    }
}

/// A `/ws` notification: `{"id","notify","data"}` → `{"id","notified"}`.
fn notify(state: &State, id: Option<&Value>, ty: &Value, data: Option<&Value>) -> Message {
    let Value::String(ty) = ty else {
        return error_message(id, 400, "`notify` takes an event type name");
    };
    let body = Bytes::from(
        data.cloned()
            .unwrap_or(Value::Object(Default::default()))
            .to_string(),
    );
    match emit_notification(state, ty, body) {
        Ok(()) => {
            let mut out = serde_json::Map::new();
            if let Some(id) = id {
                out.insert("id".into(), id.clone());
            }
            out.insert("notified".into(), Value::String(ty.clone()));
            Message::text(Value::Object(out).to_string())
        }
        Err(refused) => error_message(id, refused.status, &refused.detail),
    }
}

/// A `/ws` request: `{"id","type","data"}` → `{"id","status","data"|"error"}`.
async fn request(state: &State, ty: &str, id: Option<&Value>, data: &Value, opener: &Opener) -> Message {
    let body = Bytes::from(data.to_string());
    // Each request of a session is a request of its own, with its own id.
    let client = opener.client.next_request();
    let (status, body) = round_trip(state, ty, Some("application/json"), body, &opener.front(&client)).await;
    let payload: Value = serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    let mut out = serde_json::Map::new();
    if let Some(id) = id {
        out.insert("id".into(), id.clone());
    }
    out.insert("status".into(), status.into());
    out.insert(if status < 400 { "data" } else { "error" }.into(), payload);
    Message::text(Value::Object(out).to_string())
}

/// The `/ws/echo` session: each text or binary message goes to
/// `demo.WsEcho` and its reply comes back as the same kind of message, in
/// order. A failed round trip closes with 1011; a caller the rules do not
/// let send `demo.WsEcho` is closed at once with 1008.
async fn echo_session(
    state: Arc<State>,
    conn: Arc<Conn>,
    ws: Ws,
    opener: Arc<Opener>,
    auth: Arc<SessionAuth>,
    compress: bool,
) {
    let (mut sink, mut stream) = ws.split();
    // Ends at the token's `exp`, or when a reload no longer accepts it.
    let (kill, mut killed) = watch::channel::<CloseReason>(None);
    policy::watch(state.pool.clone(), None, auth, kill);
    if state
        .pool
        .policy()
        .middleware
        .authorize_event(
            opener.identity.as_ref(),
            ECHO_EVENT,
            state.pool.routes().event_paths(),
        )
        .is_err()
    {
        let policy = close_message(Some((1008, "not allowed to send demo.WsEcho")));
        let _ = tokio::time::timeout(Duration::from_secs(1), sink.send(policy)).await;
        return;
    }
    loop {
        let msg = tokio::select! {
            msg = stream.next() => match msg {
                Some(msg) => msg,
                None => break,
            },
            _ = conn.closing() => {
                let _ = tokio::time::timeout(Duration::from_secs(1), sink.send(close_message(TOO_SLOW))).await;
                return;
            }
            _ = killed.changed() => {
                let reason = *killed.borrow();
                let _ = tokio::time::timeout(Duration::from_secs(1), sink.send(close_message(reason))).await;
                return;
            }
        };
        let (binary, body) = match msg {
            Ok(Message::Text(t)) => (false, Bytes::from(t)),
            Ok(Message::Binary(b)) => (true, b),
            Ok(Message::Close(_)) => break,
            Ok(_) => continue,
            Err(err) => {
                if let Some(reason) = read_error(&err) {
                    let _ =
                        tokio::time::timeout(Duration::from_secs(1), sink.send(close_message(Some(reason))))
                            .await;
                }
                return;
            }
        };
        let client = opener.client.next_request();
        let front = opener.front(&client);
        let (status, reply) =
            round_trip(&state, ECHO_EVENT, Some("application/octet-stream"), body, &front).await;
        let out = if status != 200 {
            tracing::warn!(status, "websocket echo round trip failed");
            close_message(Some((1011, "server error")))
        } else if binary {
            Message::Binary(reply)
        } else {
            match String::from_utf8(reply.to_vec()) {
                Ok(s) => Message::text(s),
                Err(_) => close_message(Some((1011, "server error"))),
            }
        };
        let closing = matches!(out, Message::Close(_));
        let sent = async {
            for frame in fragments(out, compress) {
                feed(&mut sink, frame).await?;
            }
            sink.flush().await
        };
        // A client that takes nothing: the sweeper ends the wait.
        let sent = tokio::select! {
            sent = sent => sent.is_ok(),
            _ = conn.closing() => false,
        };
        if !sent || closing {
            break;
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), sink.close()).await;
}

#[cfg(test)]
#[path = "ws_fuzz.rs"]
mod fuzz;
