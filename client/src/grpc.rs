//! The gRPC client of `switchyard.v1.Events` (docs/grpc.md), with the shape
//! of the WebSocket [`Client`](crate::Client): typed calls and subscription
//! streams.
//!
//! ```no_run
//! # async fn demo() -> Result<(), switchyard_client::ClientError> {
//! use futures_util::StreamExt;
//! let client = switchyard_client::GrpcClient::connect("http://127.0.0.1:8080").await?;
//! let greeting: serde_json::Value = client.call("demo.Hello", &serde_json::json!({"name": "Ada"})).await?;
//! let mut ticks = client.subscribe("demo.*").await?;
//! while let Some(push) = ticks.next().await {
//!     println!("{} {}", push.event, push.data);
//! }
//! # Ok(()) }
//! ```
//!
//! The channel (HTTP/2) reconnects by itself; a subscription whose stream
//! breaks subscribes again in the background with exponential backoff with jitter (10 ms
//! up to 2 s), and its stream goes on (pushes sent meanwhile are lost).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::Stream;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use switchyard_proto::backoff::Backoff;
use switchyard_proto::grpc::events_client::EventsClient;

use switchyard_proto::grpc::{
    CallRequest, ClientMessage, NotifyRequest, ServerMessage, SubscribeRequest, client_message,
    server_message,
};
use tokio::sync::{mpsc, oneshot};
use tonic::transport::Channel;

use crate::{Call, ClientError, ConnectOptions, DEFAULT_TIMEOUT, Push};

/// A gRPC client of `switchyard.v1.Events`. Cheap to clone (one HTTP/2
/// connection).
#[derive(Clone)]
pub struct GrpcClient {
    events: EventsClient<Channel>,
    timeout: Duration,
    /// Metadata every call carries (`authorization`, an API key).
    credential: Option<Metadata>,
}

/// A credential as gRPC metadata.
type Metadata = (
    tonic::metadata::MetadataKey<tonic::metadata::Ascii>,
    tonic::metadata::MetadataValue<tonic::metadata::Ascii>,
);

/// `request` with the credential's metadata.
fn authorized<T>(credential: &Option<Metadata>, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some((key, value)) = credential {
        request.metadata_mut().insert(key.clone(), value.clone());
    }
    request
}

/// How a [`GrpcClient`] connects.
pub type GrpcClientBuilder = ConnectOptions<GrpcClient>;

impl ConnectOptions<GrpcClient> {
    /// Connects; fails if the first attempt does. The credential is
    /// checked per call (a refused one: [`ClientError::Status`] 401).
    pub async fn connect(self) -> Result<GrpcClient, ClientError> {
        let credential = self
            .credential
            .map(|c| {
                let (name, value) = c.header();
                let key = tonic::metadata::MetadataKey::from_bytes(name.as_bytes())
                    .map_err(|e| ClientError::Connect(format!("credential header `{name}`: {e}")))?;
                let value = value
                    .parse()
                    .map_err(|e| ClientError::Connect(format!("credential value: {e}")))?;
                Ok::<_, ClientError>((key, value))
            })
            .transpose()?;
        let channel = Channel::from_shared(self.url)
            .map_err(|e| ClientError::Connect(e.to_string()))?
            .connect()
            .await
            .map_err(|e| ClientError::Connect(e.to_string()))?;
        Ok(GrpcClient {
            events: EventsClient::new(channel),
            timeout: self.timeout,
            credential,
        })
    }
}

impl GrpcClient {
    /// Connects to `url` (`http://host:port`, the listener's port); fails if
    /// the first attempt does.
    pub async fn connect(url: &str) -> Result<GrpcClient, ClientError> {
        GrpcClient::connect_with_timeout(url, DEFAULT_TIMEOUT).await
    }

    /// [`connect`](Self::connect) with the deadline every call gets.
    pub async fn connect_with_timeout(url: &str, timeout: Duration) -> Result<GrpcClient, ClientError> {
        GrpcClient::builder(url).timeout(timeout).connect().await
    }

    /// A client with a credential or another deadline:
    /// `GrpcClient::builder(url).api_key(key).connect().await`.
    pub fn builder(url: &str) -> GrpcClientBuilder {
        ConnectOptions::new(url)
    }

    /// Sends `event` as a request of its type and decodes the reply as its
    /// [`Call::Reply`].
    pub async fn request<E: Call>(&self, event: &E) -> Result<E::Reply, ClientError> {
        self.call(E::EVENT_NAME, event).await
    }

    /// The generated client, for what the typed API does not cover.
    pub fn raw(&self) -> EventsClient<Channel> {
        self.events.clone()
    }

    /// Sends a request of event type `ty` with `event` as its JSON payload
    /// and decodes the reply's payload as `R`.
    pub async fn call<E: Serialize, R: DeserializeOwned>(
        &self,
        ty: &str,
        event: &E,
    ) -> Result<R, ClientError> {
        let request = CallRequest {
            r#type: ty.to_owned(),
            content_type: "application/json".to_owned(),
            payload: serde_json::to_vec(event)?.into(),
            deadline_ms: self.timeout.as_millis() as u64,
        };
        let mut request = authorized(&self.credential, request);
        request.set_timeout(self.timeout);
        let reply = self
            .events
            .clone()
            .call(request)
            .await
            .map_err(from_status)?
            .into_inner();
        Ok(serde_json::from_slice(&reply.payload)?)
    }

    /// Emits a notification of type `ty` with `event` as its JSON payload
    /// into the group (subscribed managers, matching clients). The server
    /// must allow it (`listener.ws.notify`); otherwise PERMISSION_DENIED.
    pub async fn notify<E: Serialize>(&self, ty: &str, event: &E) -> Result<(), ClientError> {
        let request = NotifyRequest {
            r#type: ty.to_owned(),
            content_type: "application/json".to_owned(),
            payload: serde_json::to_vec(event)?.into(),
        };
        self.events
            .clone()
            .notify(authorized(&self.credential, request))
            .await
            .map_err(from_status)?;
        Ok(())
    }

    /// Subscribes to notifications matching `pattern` (`order.created`,
    /// `order.*`, `*`); active when this returns.
    pub async fn subscribe(&self, pattern: &str) -> Result<GrpcSubscription, ClientError> {
        self.subscribe_filtered(pattern, None).await
    }

    /// Subscribes with a field filter (the language of docs/websocket.md).
    pub async fn subscribe_filtered(
        &self,
        pattern: &str,
        filter: Option<Value>,
    ) -> Result<GrpcSubscription, ClientError> {
        let request = SubscribeRequest {
            pattern: pattern.to_owned(),
            filter_json: filter.map(|f| f.to_string()).unwrap_or_default(),
        };
        let mut events = self.events.clone();
        let first = events
            .subscribe(authorized(&self.credential, request.clone()))
            .await
            .map_err(from_status)?
            .into_inner();
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(forward(events, self.credential.clone(), request, first, tx));
        Ok(GrpcSubscription { rx, task })
    }

    /// Opens a bidirectional `Session`: calls on one stream, many in flight
    /// at once, each answered by its id (no HTTP/2 stream per call).
    pub async fn session(&self) -> Result<GrpcSession, ClientError> {
        let (tx, out) = mpsc::channel(256);
        let outbound = tonic::codegen::tokio_stream::wrappers::ReceiverStream::new(out);
        let inbound = self
            .events
            .clone()
            .session(authorized(&self.credential, outbound))
            .await
            .map_err(from_status)?
            .into_inner();
        let pending: Pending = Arc::default();
        let task = tokio::spawn(dispatch(inbound, pending.clone()));
        Ok(GrpcSession {
            tx,
            pending,
            next: AtomicU64::new(1),
            timeout: self.timeout,
            task,
        })
    }
}

type Pending = Arc<Mutex<HashMap<String, oneshot::Sender<server_message::Kind>>>>;

/// A `Session` stream used for calls ([`GrpcClient::session`]). Dropping it
/// ends the stream.
pub struct GrpcSession {
    tx: mpsc::Sender<ClientMessage>,
    pending: Pending,
    next: AtomicU64,
    timeout: Duration,
    task: tokio::task::JoinHandle<()>,
}

impl GrpcSession {
    /// Like [`GrpcClient::call`], on the session's stream.
    pub async fn call<E: Serialize, R: DeserializeOwned>(
        &self,
        ty: &str,
        event: &E,
    ) -> Result<R, ClientError> {
        let id = self.next.fetch_add(1, Ordering::Relaxed).to_string();
        let (answer, answered) = oneshot::channel();
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.clone(), answer);
        let message = ClientMessage {
            id: id.clone(),
            kind: Some(client_message::Kind::Call(CallRequest {
                r#type: ty.to_owned(),
                content_type: "application/json".to_owned(),
                payload: serde_json::to_vec(event)?.into(),
                deadline_ms: self.timeout.as_millis() as u64,
            })),
        };
        let outcome = async {
            self.tx
                .send(message)
                .await
                .map_err(|_| ClientError::Disconnected)?;
            answered.await.map_err(|_| ClientError::Disconnected)
        };
        let kind = match tokio::time::timeout(self.timeout, outcome).await {
            Ok(answer) => answer?,
            Err(_) => {
                self.pending.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
                return Err(ClientError::Timeout(self.timeout));
            }
        };
        match kind {
            server_message::Kind::Reply(reply) => Ok(serde_json::from_slice(&reply.payload)?),
            server_message::Kind::Error(error) => {
                Err(match serde_json::from_slice::<Value>(&error.details) {
                    Ok(problem) => ClientError::Status {
                        status: error.status as u16,
                        problem,
                    },
                    Err(_) => ClientError::Grpc {
                        code: tonic::Code::from(error.code),
                        message: error.message,
                    },
                })
            }
            other => Err(ClientError::Grpc {
                code: tonic::Code::Internal,
                message: format!("unexpected answer to a call: {other:?}"),
            }),
        }
    }
}

impl Drop for GrpcSession {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Hands each answer on the session stream to the call waiting for its id.
async fn dispatch(mut inbound: tonic::Streaming<ServerMessage>, pending: Pending) {
    while let Ok(Some(message)) = inbound.message().await {
        let Some(kind) = message.kind else { continue };
        let waiter = pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&message.id);
        if let Some(waiter) = waiter {
            let _ = waiter.send(kind);
        }
    }
    // The stream ended: every waiting call learns it (its sender drops).
    pending.lock().unwrap_or_else(|p| p.into_inner()).clear();
}

/// Forwards pushes; when the stream breaks, subscribes again with backoff
/// until the subscription is dropped.
async fn forward(
    mut events: EventsClient<Channel>,
    credential: Option<Metadata>,
    request: SubscribeRequest,
    mut stream: tonic::Streaming<switchyard_proto::grpc::Push>,
    tx: mpsc::UnboundedSender<Push>,
) {
    let mut backoff = Backoff::client();
    loop {
        while let Ok(Some(push)) = stream.message().await {
            backoff.reset();
            let data = serde_json::from_slice(&push.payload).unwrap_or(Value::Null);
            if tx
                .send(Push {
                    event: push.event,
                    data,
                })
                .is_err()
            {
                return;
            }
        }
        loop {
            tokio::time::sleep(backoff.next_delay()).await;
            if tx.is_closed() {
                return;
            }
            if let Ok(s) = events.subscribe(authorized(&credential, request.clone())).await {
                stream = s.into_inner();
                break;
            }
        }
    }
}

fn from_status(status: tonic::Status) -> ClientError {
    // An event error carries its problem+json in the `ErrorInfo` of its
    // standard `google.rpc.Status` details.
    use tonic_types::StatusExt;
    let details = status.get_error_details();
    if let Some(problem) = details
        .error_info()
        .and_then(|info| info.metadata.get("problem"))
        .and_then(|text| serde_json::from_str::<Value>(text).ok())
        && let Some(code) = problem.get("status").and_then(Value::as_u64)
    {
        return ClientError::Status {
            status: code as u16,
            problem,
        };
    }
    ClientError::Grpc {
        code: status.code(),
        message: status.message().to_owned(),
    }
}

/// A stream of the pushes of one gRPC subscription; dropping it ends the
/// subscription.
pub struct GrpcSubscription {
    rx: mpsc::UnboundedReceiver<Push>,
    task: tokio::task::JoinHandle<()>,
}

impl Stream for GrpcSubscription {
    type Item = Push;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Push>> {
        self.rx.poll_recv(cx)
    }
}

impl Drop for GrpcSubscription {
    fn drop(&mut self) {
        self.task.abort();
    }
}
