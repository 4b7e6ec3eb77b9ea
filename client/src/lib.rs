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

pub use grpc::{GrpcClient, GrpcSession, GrpcSubscription};
pub use state::{Caller, Scheduler, Store};
/// The Store's and the Scheduler's events, as the SDK defines them.
pub use switchyard_manager::{scheduler, store};
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
        let socket = open(url).await?;
        let inner = Arc::new(Inner {
            url: url.to_owned(),
            out: Mutex::new(None),
            pending: Mutex::new(HashMap::new()),
            subs: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            timeout,
        });
        // The first connection's queue exists before `connect` returns, so
        // the first call never finds the client disconnected.
        let (tx, rx) = mpsc::unbounded_channel();
        *lock(&inner.out) = Some(tx);
        tokio::spawn(run(Arc::downgrade(&inner), socket, rx));
        Ok(Client { inner })
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

async fn open(url: &str) -> Result<Socket, ClientError> {
    tokio_tungstenite::connect_async(url)
        .await
        .map(|(socket, _)| socket)
        .map_err(|e| ClientError::Connect(e.to_string()))
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
                let Some(url) = inner.upgrade().map(|i| i.url.clone()) else {
                    return;
                };
                match open(&url).await {
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
