//! Rust clients for Switchyard's front ends: the WebSocket [`Client`] (the
//! protocol is docs/websocket.md) and the [`GrpcClient`] (docs/grpc.md),
//! with the same shape: `connect`, typed `call`, `subscribe` streams.
//!
//! ```no_run
//! # async fn demo() -> Result<(), switchyard_client::ClientError> {
//! use futures_util::StreamExt;
//! let client = switchyard_client::Client::connect("ws://127.0.0.1:8080/ws").await?;
//! let greeting: serde_json::Value = client.call("demo.Hello", &serde_json::json!({"name": "Ada"})).await?;
//! let mut ticks = client.subscribe("demo.*").await?;
//! while let Some(push) = ticks.next().await {
//!     println!("{} {}", push.event, push.data);
//! }
//! # Ok(()) }
//! ```
//!
//! The group's built-in Store and Scheduler have typed handles on both
//! clients: `client.store().get::<T>("k")`, `client.scheduler().schedule(..)`.
//!
//! An event type that names its reply ([`Call`]) is sent with
//! [`Client::request`], its reply type inferred:
//! `let ticket = client.request(&CreateTicket { .. }).await?`.
//!
//! Behind `[auth]`, a client presents a [`Credential`] (a bearer token or
//! an API key) on the WebSocket upgrade and on every gRPC call:
//! `Client::builder(url).bearer(token).connect()`.
//!
//! One connection carries every call and subscription, interleaved. When it
//! drops, calls in flight fail with [`ClientError::Disconnected`], and the
//! client reconnects in the background with exponential backoff with jitter (10 ms up
//! to 2 s) and subscribes again to everything it was subscribed to; the
//! subscription streams go on (pushes sent while disconnected are lost).
//!
//! # Layout
//! - this file: the WebSocket [`Client`] and the errors.
//! - `grpc`: the [`GrpcClient`].
//! - `state`: [`Store`] and [`Scheduler`], the built-in managers' typed
//!   handles on either client ([`Caller`]).

#![forbid(unsafe_code)]

mod grpc;
mod state;

pub use grpc::{GrpcClient, GrpcClientBuilder, GrpcSession, GrpcSubscription};
pub use state::{Caller, Scheduler, Store};
/// The Store's and the Scheduler's events (`switchyard-events`, which the
/// SDK re-exports too).
pub use switchyard_events::{DeclaredReply, EventName, scheduler, store};
/// Which part of the group refused a request ([`ClientError::hop`]).
pub use switchyard_proto::Hop;
/// The generated gRPC messages and client of `switchyard.v1.Events`.
pub use switchyard_proto::grpc as proto;

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll};
use std::time::Duration;
use switchyard_proto::backoff::Backoff;

use futures_util::{SinkExt, Stream, StreamExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::Message;

/// Default deadline of a call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// What a call or subscription can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect: {0}")]
    Connect(String),
    #[error("the connection dropped before the answer came")]
    Disconnected,
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The server answered with an error status; `problem` is its
    /// problem+json body.
    #[error("status {status}: {problem}")]
    Status { status: u16, problem: Value },
    /// A gRPC failure that is not an event's error status.
    #[error("grpc status {code:?}: {message}")]
    Grpc { code: tonic::Code, message: String },
    #[error("cannot encode or decode: {0}")]
    Json(#[from] serde_json::Error),
    /// An answer that does not fit the type asked for (a Store value of
    /// another type), with what and why.
    #[error("{0}")]
    Decode(String),
}

impl ClientError {
    /// The status of an error answer (`None` for a failure that is no
    /// answer: a dropped connection, a timeout, a gRPC failure).
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The part of the group that made this answer when the group could
    /// not deliver the request — a `503` of the router's ("not running")
    /// is not the service's own `503` (decision 0116); `None` for a
    /// handler's own error and for failures that are no answer.
    pub fn hop(&self) -> Option<Hop> {
        match self {
            ClientError::Status { problem, .. } => problem
                .get(switchyard_proto::refusal::HOP_MEMBER)
                .and_then(Value::as_str)
                .and_then(Hop::parse),
            _ => None,
        }
    }
}

/// An event type whose reply type is known, so that [`Client::request`]
/// and [`GrpcClient::request`] infer what they decode. The type's name is
/// its [`EventName`], which `#[derive(Event)]` implements. An event declared
/// with `#[event(reply = R)]` is one already; for an event that names no
/// reply, the crate that defines it says what it answers:
///
/// ```ignore
/// impl switchyard_client::Call for CreateTicket {
///     type Reply = Ticket;
/// }
/// ```
pub trait Call: EventName + Serialize {
    /// What the handler of this event answers.
    type Reply: DeserializeOwned;
}

/// An event that declares its reply (`#[event(reply = R)]`) is a `Call`
/// with that reply: nothing to write by hand.
impl<E> Call for E
where
    E: DeclaredReply + Serialize,
    <E as DeclaredReply>::Reply: DeserializeOwned,
{
    type Reply = <E as DeclaredReply>::Reply;
}

/// What a client presents to a group with `[auth]` (docs/security.md):
/// on the WebSocket upgrade request, and on every gRPC call.
#[derive(Clone)]
pub enum Credential {
    /// `Authorization: Bearer <token>` (a JWT).
    Bearer(String),
    /// An API key in `header` (the group's `auth.api_keys.header`,
    /// `x-api-key` by default).
    ApiKey { header: String, key: String },
}

impl Credential {
    /// An API key in the default header, `x-api-key`.
    pub fn api_key(key: impl Into<String>) -> Credential {
        Credential::ApiKey {
            header: "x-api-key".to_owned(),
            key: key.into(),
        }
    }

    /// The header's name and value.
    fn header(&self) -> (String, String) {
        match self {
            Credential::Bearer(token) => ("authorization".to_owned(), format!("Bearer {token}")),
            Credential::ApiKey { header, key } => (header.to_ascii_lowercase(), key.clone()),
        }
    }
}

/// Never prints the secret.
impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credential::Bearer(_) => f.write_str("Bearer(..)"),
            Credential::ApiKey { header, .. } => write!(f, "ApiKey({header}: ..)"),
        }
    }
}

/// How a client connects, the same for both: the address, the deadline
/// of every call, the credential. `C` is the client it makes:
/// [`Client::builder`] ([`ClientBuilder`]) or [`GrpcClient::builder`]
/// ([`GrpcClientBuilder`]), each with its own `connect`.
pub struct ConnectOptions<C> {
    url: String,
    timeout: Duration,
    credential: Option<Credential>,
    client: std::marker::PhantomData<fn() -> C>,
}

/// How a [`Client`] connects.
pub type ClientBuilder = ConnectOptions<Client>;

impl<C> ConnectOptions<C> {
    fn new(url: &str) -> Self {
        ConnectOptions {
            url: url.to_owned(),
            timeout: DEFAULT_TIMEOUT,
            credential: None,
            client: std::marker::PhantomData,
        }
    }

    /// The deadline of every call (default [`DEFAULT_TIMEOUT`]).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Presents `credential`: on the WebSocket upgrade, on every gRPC call.
    pub fn credential(mut self, credential: Credential) -> Self {
        self.credential = Some(credential);
        self
    }

    /// Presents a bearer token.
    pub fn bearer(self, token: impl Into<String>) -> Self {
        self.credential(Credential::Bearer(token.into()))
    }

    /// Presents an API key in `x-api-key`.
    pub fn api_key(self, key: impl Into<String>) -> Self {
        self.credential(Credential::api_key(key))
    }
}

impl<C> Clone for ConnectOptions<C> {
    fn clone(&self) -> Self {
        ConnectOptions {
            url: self.url.clone(),
            timeout: self.timeout,
            credential: self.credential.clone(),
            client: std::marker::PhantomData,
        }
    }
}

/// The credential is printed as [`Credential`]'s `Debug` does: never the secret.
impl<C> std::fmt::Debug for ConnectOptions<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectOptions")
            .field("url", &self.url)
            .field("timeout", &self.timeout)
            .field("credential", &self.credential)
            .finish()
    }
}

impl ConnectOptions<Client> {
    /// Connects; fails if the first attempt does (a refused credential:
    /// [`ClientError::Status`] with 401 or 403). Reconnects present the
    /// same credential.
    pub async fn connect(self) -> Result<Client, ClientError> {
        let socket = open(&self.url, self.credential.as_ref()).await?;
        let inner = Arc::new(Inner {
            url: self.url,
            credential: self.credential,
            out: Mutex::new(None),
            pending: Mutex::new(HashMap::new()),
            subs: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            timeout: self.timeout,
        });
        // The first connection's queue exists before `connect` returns, so
        // the first call never finds the client disconnected.
        let (tx, rx) = mpsc::unbounded_channel();
        *lock(&inner.out) = Some(tx);
        tokio::spawn(run(Arc::downgrade(&inner), socket, rx));
        Ok(Client { inner })
    }
}

/// One pushed notification.
#[derive(Clone, Debug)]
pub struct Push {
    /// The notification's type, e.g. `order.created`.
    pub event: String,
    /// Its JSON body.
    pub data: Value,
}

impl Push {
    /// The body as `T`.
    pub fn data_as<T: DeserializeOwned>(&self) -> Result<T, ClientError> {
        Ok(serde_json::from_value(self.data.clone())?)
    }
}

struct Sub {
    request: Value,
    tx: mpsc::UnboundedSender<Push>,
}

struct Inner {
    url: String,
    credential: Option<Credential>,
    out: Mutex<Option<mpsc::UnboundedSender<Message>>>,
    pending: Mutex<HashMap<String, oneshot::Sender<Value>>>,
    subs: Mutex<HashMap<String, Sub>>,
    next_id: AtomicU64,
    timeout: Duration,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A WebSocket client of `/ws`. Cheap to clone; the connection closes when
/// the last clone (and subscription) is dropped.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

impl Client {
    /// Connects to `url` (`ws://host:port/ws`); fails if the first attempt does.
    pub async fn connect(url: &str) -> Result<Client, ClientError> {
        Client::connect_with_timeout(url, DEFAULT_TIMEOUT).await
    }

    /// [`connect`](Self::connect) with the deadline every call gets.
    pub async fn connect_with_timeout(url: &str, timeout: Duration) -> Result<Client, ClientError> {
        Client::builder(url).timeout(timeout).connect().await
    }

    /// A client with a credential or another deadline:
    /// `Client::builder(url).bearer(token).connect().await`.
    pub fn builder(url: &str) -> ClientBuilder {
        ConnectOptions::new(url)
    }

    fn next_id(&self, prefix: &str) -> String {
        format!("{prefix}{}", self.inner.next_id.fetch_add(1, Ordering::Relaxed))
    }

    /// Sends `message` (with its `id`) and waits for the answer carrying that id.
    async fn ask(&self, id: &str, message: Value) -> Result<Value, ClientError> {
        let (tx, rx) = oneshot::channel();
        lock(&self.inner.pending).insert(id.to_owned(), tx);
        let sent = lock(&self.inner.out)
            .as_ref()
            .is_some_and(|out| out.send(Message::text(message.to_string())).is_ok());
        if !sent {
            lock(&self.inner.pending).remove(id);
            return Err(ClientError::Disconnected);
        }
        let answer = match tokio::time::timeout(self.inner.timeout, rx).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => return Err(ClientError::Disconnected),
            Err(_) => {
                lock(&self.inner.pending).remove(id);
                return Err(ClientError::Timeout(self.inner.timeout));
            }
        };
        match answer.get("status").and_then(Value::as_u64) {
            Some(status) if status >= 400 => Err(ClientError::Status {
                status: status as u16,
                problem: answer.get("error").cloned().unwrap_or(Value::Null),
            }),
            _ => Ok(answer),
        }
    }

    /// Sends a request of event type `ty` with `event` as its JSON data and
    /// decodes the answer's data as `R`.
    pub async fn call<E: Serialize, R: DeserializeOwned>(
        &self,
        ty: &str,
        event: &E,
    ) -> Result<R, ClientError> {
        let id = self.next_id("c");
        let message = serde_json::json!({ "id": id, "type": ty, "data": serde_json::to_value(event)? });
        let answer = self.ask(&id, message).await?;
        Ok(serde_json::from_value(
            answer.get("data").cloned().unwrap_or(Value::Null),
        )?)
    }

    /// Sends `event` as a request of its type and decodes the answer as
    /// its [`Call::Reply`]: `let ticket = client.request(&CreateTicket { .. }).await?`.
    pub async fn request<E: Call>(&self, event: &E) -> Result<E::Reply, ClientError> {
        self.call(E::EVENT_NAME, event).await
    }

    /// Emits a notification of type `ty` with `event` as its JSON data into
    /// the group: subscribed managers and matching clients receive it. The
    /// server must allow it (`listener.ws.notify`); otherwise the answer is
    /// a 403 [`ClientError::Status`].
    pub async fn notify<E: Serialize>(&self, ty: &str, event: &E) -> Result<(), ClientError> {
        let id = self.next_id("n");
        let message = serde_json::json!({ "id": id, "notify": ty, "data": serde_json::to_value(event)? });
        self.ask(&id, message).await.map(drop)
    }

    /// Subscribes to notifications matching `pattern` (`order.created`,
    /// `order.*`, `*`).
    pub async fn subscribe(&self, pattern: &str) -> Result<Subscription, ClientError> {
        self.subscribe_filtered(pattern, None).await
    }

    /// Subscribes with a field filter (`{"customer_id": 42}`,
    /// `{"qty": {"gt": 2}}`; see docs/websocket.md).
    pub async fn subscribe_filtered(
        &self,
        pattern: &str,
        filter: Option<Value>,
    ) -> Result<Subscription, ClientError> {
        let id = self.next_id("s");
        let mut request = serde_json::json!({ "id": id, "subscribe": pattern });
        if let Some(filter) = filter {
            request["filter"] = filter;
        }
        let (tx, rx) = mpsc::unbounded_channel();
        lock(&self.inner.subs).insert(
            id.clone(),
            Sub {
                request: request.clone(),
                tx,
            },
        );
        if let Err(err) = self.ask(&id, request).await {
            lock(&self.inner.subs).remove(&id);
            return Err(err);
        }
        Ok(Subscription {
            id,
            rx,
            client: Arc::downgrade(&self.inner),
        })
    }
}

/// A stream of the pushes of one subscription; dropping it unsubscribes.
pub struct Subscription {
    id: String,
    rx: mpsc::UnboundedReceiver<Push>,
    client: Weak<Inner>,
}

impl Subscription {
    /// The subscription's id on the connection.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl Stream for Subscription {
    type Item = Push;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Push>> {
        self.rx.poll_recv(cx)
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Some(inner) = self.client.upgrade() {
            lock(&inner.subs).remove(&self.id);
            if let Some(out) = lock(&inner.out).as_ref() {
                let _ = out.send(Message::text(
                    serde_json::json!({ "unsubscribe": self.id }).to_string(),
                ));
            }
        }
    }
}

async fn open(url: &str, credential: Option<&Credential>) -> Result<Socket, ClientError> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::http::{HeaderName, HeaderValue};
    let mut request = url
        .into_client_request()
        .map_err(|e| ClientError::Connect(e.to_string()))?;
    if let Some(credential) = credential {
        let (name, value) = credential.header();
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|e| ClientError::Connect(format!("credential header `{name}`: {e}")))?;
        let value = HeaderValue::from_str(&value)
            .map_err(|e| ClientError::Connect(format!("credential value: {e}")))?;
        request.headers_mut().insert(name, value);
    }
    match tokio_tungstenite::connect_async(request).await {
        Ok((socket, _)) => Ok(socket),
        // The upgrade refused (401, 403): the status, as a call's would be.
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            let problem = response
                .body()
                .as_deref()
                .and_then(|b| serde_json::from_slice(b).ok())
                .unwrap_or(Value::Null);
            Err(ClientError::Status {
                status: response.status().as_u16(),
                problem,
            })
        }
        Err(e) => Err(ClientError::Connect(e.to_string())),
    }
}

/// Serves connections until the client is dropped: pumps messages, routes
/// answers and pushes, reconnects with backoff and re-subscribes.
async fn run(inner: Weak<Inner>, first: Socket, first_rx: mpsc::UnboundedReceiver<Message>) {
    let mut socket = Some(first);
    let mut first_rx = Some(first_rx);
    let mut backoff = Backoff::client();
    loop {
        let ws = match socket.take() {
            Some(ws) => ws,
            None => {
                let Some((url, credential)) = inner.upgrade().map(|i| (i.url.clone(), i.credential.clone()))
                else {
                    return;
                };
                match open(&url, credential.as_ref()).await {
                    Ok(ws) => ws,
                    Err(err) => {
                        tracing::debug!(%err, "reconnect failed");
                        tokio::time::sleep(backoff.next_delay()).await;
                        continue;
                    }
                }
            }
        };
        let mut rx = match first_rx.take() {
            Some(rx) => rx,
            None => {
                let (tx, rx) = mpsc::unbounded_channel::<Message>();
                let Some(i) = inner.upgrade() else { return };
                // Subscribe again to everything (a no-op on the first connection).
                for sub in lock(&i.subs).values() {
                    let _ = tx.send(Message::text(sub.request.to_string()));
                }
                *lock(&i.out) = Some(tx);
                rx
            }
        };
        let (mut sink, mut stream) = ws.split();
        let connected_at = tokio::time::Instant::now();
        loop {
            tokio::select! {
                out = rx.recv() => match out {
                    Some(m) => if sink.send(m).await.is_err() { break },
                    // Every client handle is gone.
                    None => { let _ = sink.close().await; return }
                },
                msg = stream.next() => match msg {
                    Some(Ok(Message::Text(t))) => {
                        let Some(i) = inner.upgrade() else { return };
                        dispatch(&i, t.as_str());
                    }
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                    Some(Ok(_)) => {}
                },
            }
        }
        let Some(i) = inner.upgrade() else { return };
        *lock(&i.out) = None;
        // Calls in flight get Disconnected (their senders drop).
        lock(&i.pending).clear();
        drop(i);
        if connected_at.elapsed() > Duration::from_secs(1) {
            backoff.reset();
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

fn dispatch(inner: &Inner, text: &str) {
    let Ok(message) = serde_json::from_str::<Value>(text) else {
        return tracing::debug!("unparsable message from server");
    };
    if let Some(event) = message.get("event").and_then(Value::as_str) {
        let data = message.get("data").cloned().unwrap_or(Value::Null);
        let subs = lock(&inner.subs);
        for id in message.get("sub").and_then(Value::as_array).into_iter().flatten() {
            if let Some(sub) = id.as_str().and_then(|id| subs.get(id)) {
                let _ = sub.tx.send(Push {
                    event: event.to_owned(),
                    data: data.clone(),
                });
            }
        }
        return;
    }
    let Some(id) = message.get("id").and_then(Value::as_str) else {
        return tracing::debug!(%text, "message from server without id");
    };
    if let Some(waiter) = lock(&inner.pending).remove(id) {
        let _ = waiter.send(message);
    }
}
