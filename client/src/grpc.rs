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
//! breaks subscribes again in the background with exponential backoff (10 ms
//! up to 2 s), and its stream goes on (pushes sent meanwhile are lost).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::Stream;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use switchyard_proto::grpc::events_client::EventsClient;
use switchyard_proto::grpc::{CallRequest, NotifyRequest, SubscribeRequest};
use tokio::sync::mpsc;
use tonic::transport::Channel;

use crate::{ClientError, DEFAULT_TIMEOUT, Push};

/// A gRPC client of `switchyard.v1.Events`. Cheap to clone (one HTTP/2
/// connection).
#[derive(Clone)]
pub struct GrpcClient {
    events: EventsClient<Channel>,
    timeout: Duration,
}

impl GrpcClient {
    /// Connects to `url` (`http://host:port`, the listener's port); fails if
    /// the first attempt does.
    pub async fn connect(url: &str) -> Result<GrpcClient, ClientError> {
        GrpcClient::connect_with_timeout(url, DEFAULT_TIMEOUT).await
    }

    /// [`connect`](Self::connect) with the deadline every call gets.
    pub async fn connect_with_timeout(url: &str, timeout: Duration) -> Result<GrpcClient, ClientError> {
        let channel = Channel::from_shared(url.to_owned())
            .map_err(|e| ClientError::Connect(e.to_string()))?
            .connect()
            .await
            .map_err(|e| ClientError::Connect(e.to_string()))?;
        Ok(GrpcClient {
            events: EventsClient::new(channel),
            timeout,
        })
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
        let mut request = tonic::Request::new(request);
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
        self.events.clone().notify(request).await.map_err(from_status)?;
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
            .subscribe(request.clone())
            .await
            .map_err(from_status)?
            .into_inner();
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(forward(events, request, first, tx));
        Ok(GrpcSubscription { rx, task })
    }
}

/// Forwards pushes; when the stream breaks, subscribes again with backoff
/// until the subscription is dropped.
async fn forward(
    mut events: EventsClient<Channel>,
    request: SubscribeRequest,
    mut stream: tonic::Streaming<switchyard_proto::grpc::Push>,
    tx: mpsc::UnboundedSender<Push>,
) {
    let mut backoff = Duration::from_millis(10);
    loop {
        while let Ok(Some(push)) = stream.message().await {
            backoff = Duration::from_millis(10);
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
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
            if tx.is_closed() {
                return;
            }
            if let Ok(s) = events.subscribe(request.clone()).await {
                stream = s.into_inner();
                break;
            }
        }
    }
}

fn from_status(status: tonic::Status) -> ClientError {
    // An event error carries its problem+json body as the details.
    if let Ok(problem) = serde_json::from_slice::<Value>(status.details())
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
