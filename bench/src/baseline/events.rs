//! The baseline's event transports: `demo.Noop` over WebSocket (`/ws`, the
//! request/response part of docs/websocket.md) and over gRPC
//! (`switchyard.v1.Events` `Call` and `Session`), answered in-process, so
//! that the suite's `ws` and `grpc` scenarios have a zero-hop counterpart
//! speaking the same protocols as `switchyard up`.

use std::sync::Arc;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use switchyard_proto::grpc::events_server::{Events, EventsServer};
use switchyard_proto::grpc::{
    Ack, CallReply, CallRequest, ClientMessage, Error as GrpcError, NotifyRequest, Push, ServerMessage,
    SubscribeRequest, client_message, server_message,
};
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::Role;
use tonic::codegen::tokio_stream;
use tonic::{Status, Streaming};

const NOOP: &str = "demo.Noop";

/// The answer to `demo.Noop`, or the demo's 404 for any other type.
fn answer(ty: &str) -> Result<&'static [u8], (u16, &'static str)> {
    if ty == NOOP {
        Ok(br#"{"ok":true}"#)
    } else {
        Err((404, "the baseline answers demo.Noop only"))
    }
}

fn problem(status: u16, detail: &str) -> Bytes {
    switchyard_proto::problem::problem(status, detail).1
}

/// `switchyard.v1.Events`, answered in-process.
#[derive(Clone, Copy, Default)]
pub struct GrpcBaseline;

impl GrpcBaseline {
    /// The tonic service, ready to serve.
    pub fn service() -> EventsServer<GrpcBaseline> {
        EventsServer::new(GrpcBaseline)
    }
}

fn reply(ty: &str) -> Result<CallReply, (u16, &'static str)> {
    answer(ty).map(|payload| CallReply {
        status: 200,
        content_type: "application/json".into(),
        payload: Bytes::from_static(payload),
    })
}

#[tonic::async_trait]
impl Events for GrpcBaseline {
    async fn call(&self, request: tonic::Request<CallRequest>) -> Result<tonic::Response<CallReply>, Status> {
        // As the listener does: the event's problem+json in the details.
        reply(&request.get_ref().r#type)
            .map(tonic::Response::new)
            .map_err(|(status, message)| {
                Status::with_details(tonic::Code::NotFound, message, problem(status, message))
            })
    }

    type SubscribeStream = tokio_stream::Empty<Result<Push, Status>>;
    async fn subscribe(
        &self,
        _: tonic::Request<SubscribeRequest>,
    ) -> Result<tonic::Response<Self::SubscribeStream>, Status> {
        Err(Status::unimplemented("the baseline has no notifications"))
    }

    async fn notify(&self, _: tonic::Request<NotifyRequest>) -> Result<tonic::Response<Ack>, Status> {
        Err(Status::unimplemented("the baseline has no notifications"))
    }

    type SessionStream = tokio_stream::wrappers::ReceiverStream<Result<ServerMessage, Status>>;
    async fn session(
        &self,
        request: tonic::Request<Streaming<ClientMessage>>,
    ) -> Result<tonic::Response<Self::SessionStream>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(256);
        tokio::spawn(async move {
            while let Ok(Some(message)) = inbound.message().await {
                let Some(client_message::Kind::Call(call)) = message.kind else {
                    continue;
                };
                let kind = match reply(&call.r#type) {
                    Ok(reply) => server_message::Kind::Reply(reply),
                    Err((status, message)) => server_message::Kind::Error(GrpcError {
                        code: tonic::Code::NotFound as i32,
                        status: u32::from(status),
                        message: message.into(),
                        details: problem(status, message),
                    }),
                };
                let answer = ServerMessage {
                    id: message.id,
                    kind: Some(kind),
                };
                if tx.send(Ok(answer)).await.is_err() {
                    return;
                }
            }
        });
        Ok(tonic::Response::new(tokio_stream::wrappers::ReceiverStream::new(
            rx,
        )))
    }
}

/// Whether `req` asks for a WebSocket upgrade.
pub(super) fn is_upgrade(req: &Request<Incoming>) -> bool {
    req.headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

/// Accepts the upgrade (101) and serves the connection's requests.
pub(super) fn upgrade(mut req: Request<Incoming>) -> Response<Full<Bytes>> {
    let Some(key) = req.headers().get("sec-websocket-key").cloned() else {
        let mut reply = Response::new(Full::new(Bytes::from_static(b"missing Sec-WebSocket-Key")));
        *reply.status_mut() = StatusCode::BAD_REQUEST;
        return reply;
    };
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let upgraded = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let Ok(upgraded) = upgraded.await else { return };
        let ws = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        serve_ws(ws).await;
    });
    let mut reply = Response::new(Full::new(Bytes::new()));
    *reply.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = reply.headers_mut();
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    if let Ok(v) = HeaderValue::from_str(&accept) {
        headers.insert("sec-websocket-accept", v);
    }
    reply
}

/// `{"id","type","data"}` → `{"id","status","data"|"error"}`, in order.
async fn serve_ws<S>(ws: WebSocketStream<S>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut sink, mut stream) = ws.split();
    let noop: Arc<Value> = Arc::new(json!({"ok": true}));
    while let Some(Ok(message)) = stream.next().await {
        let text = match message {
            Message::Text(text) => text,
            Message::Ping(payload) => {
                if sink.send(Message::Pong(payload)).await.is_err() {
                    return;
                }
                continue;
            }
            Message::Close(_) => return,
            _ => continue,
        };
        let Ok(request) = serde_json::from_str::<Value>(&text) else {
            continue;
        };
        let id = request.get("id").cloned().unwrap_or(Value::Null);
        let ty = request.get("type").and_then(Value::as_str).unwrap_or_default();
        let out = match answer(ty) {
            Ok(_) => json!({"id": id, "status": 200, "data": *noop}),
            Err((status, message)) => {
                let problem: Value = serde_json::from_slice(&problem(status, message)).unwrap_or(Value::Null);
                json!({"id": id, "status": status, "error": problem})
            }
        };
        if sink.send(Message::text(out.to_string())).await.is_err() {
            return;
        }
    }
}
