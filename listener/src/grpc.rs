//! gRPC on the listener's port: requests whose content type is
//! `application/grpc*` go here instead of the HTTP router (docs/grpc.md).
//!
//! Served: `switchyard.v1.Events` (unary `Call`, server-streaming
//! `Subscribe`, bidirectional `Session`), `grpc.health.v1.Health` and server
//! reflection (v1 and v1alpha). A call is the same request event the HTTP
//! and `/ws` paths build, sent on the return pipes; a `Subscribe` or
//! `Session` stream is one more session of the pipes, with the same
//! subscriptions, push path and bounded queue as a WebSocket connection.
//!
//! `health` and `reflection` implement those protocols to the letter
//! (decision 0095); `limit` holds every request's messages to the receive
//! limit; `typed` serves the services made from the event schemas.

pub(crate) mod deadline;
mod health;
mod limit;
mod reflection;
mod typed;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::decoded::RequestBody;
use futures_util::Stream;
use http::{Request, Response};
use serde_json::Value;
use switchyard_proto::grpc::events_server::{Events, EventsServer};
use switchyard_proto::grpc::{
    Ack, CallReply, CallRequest, ClientMessage, NotifyRequest, Push, ServerMessage, SubscribeRequest,
    client_message, code_for_status, server_message,
};
use switchyard_proto::{Hop, refusal};
use tokio::sync::{Semaphore, mpsc, watch};
use tonic::body::Body;
use tonic::codegen::Service;
use tonic::server::NamedService;
use tonic::{Status, Streaming};
use tonic_types::{ErrorDetails, FieldViolation, StatusExt};

use crate::context::{Front, Opener};
use crate::exchange::emit_notification;
use crate::pipes::{Outbox, SessionGuard, Subscription, check_subscription};
use crate::state::State;
use switchyard_middleware::Refusal;
use switchyard_middleware::identity::Identity;
use switchyard_middleware::session::{self as policy, CloseReason, SessionAuth};

/// Whether a gRPC request is one that needs no credential: health checks
/// and reflection, which load balancers and tools call as they are.
pub(crate) fn is_public<B>(req: &Request<B>) -> bool {
    let path = req.uri().path();
    path.starts_with("/grpc.health.") || path.starts_with("/grpc.reflection.")
}

/// Whether a request is gRPC (by content type).
pub(crate) fn is_grpc<B>(req: &Request<B>) -> bool {
    req.headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// A gRPC request's body, its messages held to the receive limit.
pub(crate) type GrpcBody = limit::Limited<RequestBody>;

type Handler =
    Box<dyn Fn(Request<GrpcBody>) -> Pin<Box<dyn Future<Output = Response<Body>> + Send>> + Send + Sync>;

fn handler<S>(service: S) -> (&'static str, Handler)
where
    S: Service<Request<GrpcBody>, Response = Response<Body>, Error = Infallible>
        + NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let handle: Handler = Box::new(move |req| {
        let mut service = service.clone();
        Box::pin(async move {
            match service.call(req).await {
                Ok(reply) => reply,
                Err(never) => match never {},
            }
        })
    });
    (S::NAME, handle)
}

/// The gRPC services, dispatched by the path's service name.
pub(crate) struct Grpc {
    state: Arc<State>,
    /// Made at the first gRPC request: the descriptor pools of the typed
    /// services and of reflection are 2.4 MiB of the demo listener's heap
    /// (decision 0159), which a group that serves no gRPC never needs.
    services: OnceLock<Services>,
}

struct Services {
    by_name: Vec<(&'static str, Handler)>,
    /// The typed services made from the event schemas (by full path).
    typed: Option<typed::Typed>,
}

/// The health service names: the whole group is `""` (and the Events
/// service); each manager is `switchyard.manager.<name>`.
pub(crate) const MANAGER_PREFIX: &str = "switchyard.manager.";

impl Grpc {
    pub(crate) fn new(state: Arc<State>) -> Grpc {
        Grpc {
            state,
            services: OnceLock::new(),
        }
    }

    fn services(&self) -> &Services {
        self.services.get_or_init(|| Services::new(self.state.clone()))
    }

    /// Serves one gRPC request.
    pub(crate) async fn serve(&self, req: Request<RequestBody>) -> Response<Body> {
        let mut req = req.map(limit::Limited::new);
        // The client's deadline, for the calls that become events.
        match deadline::parse(req.headers()) {
            Ok(None) => {}
            Ok(Some(timeout)) => {
                req.extensions_mut().insert(deadline::ClientDeadline(timeout));
            }
            Err(malformed) => return Status::invalid_argument(malformed).into_http(),
        }
        let path = req.uri().path();
        let service = path
            .strip_prefix('/')
            .and_then(|p| p.split_once('/'))
            .map(|(service, _)| service);
        let services = self.services();
        if let Some((_, handle)) = services.by_name.iter().find(|(name, _)| Some(*name) == service) {
            return handle(req).await;
        }
        let unknown = Status::unimplemented(format!("no service {}", service.unwrap_or(path)));
        match &services.typed {
            Some(typed) => typed
                .serve(&self.state, req)
                .await
                .unwrap_or_else(|| unknown.into_http()),
            None => unknown.into_http(),
        }
    }
}

impl Services {
    fn new(state: Arc<State>) -> Services {
        let health = health::service(state.clone());
        let clients =
            crate::api::for_clients(&state.config.api.catalog, &state.config.middleware.auth.expose);
        let typed = match typed::Typed::new(&clients) {
            Ok(typed) => typed,
            Err(err) => {
                tracing::error!(%err, "no typed gRPC services");
                None
            }
        };
        let mut services = vec![
            handler(EventsServer::new(EventsService { state: state.clone() })),
            handler(health),
        ];
        let mut sets = vec![
            switchyard_proto::grpc::FILE_DESCRIPTOR_SET,
            tonic_health::pb::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
        ];
        if let Some(t) = &typed {
            sets.push(&t.descriptors);
        }
        match reflection::Files::new(&sets) {
            Ok(files) => {
                use tonic_reflection::pb::{v1, v1alpha};
                let reflection = reflection::Reflection::new(files);
                services.push(handler(
                    v1::server_reflection_server::ServerReflectionServer::new(reflection.clone()),
                ));
                services.push(handler(
                    v1alpha::server_reflection_server::ServerReflectionServer::new(reflection),
                ));
            }
            Err(err) => tracing::error!(%err, "no gRPC reflection"),
        }
        Services {
            by_name: services,
            typed,
        }
    }
}

struct EventsService {
    state: Arc<State>,
}

/// A failed call: the event status (0 when the call never became an event)
/// and the gRPC status.
struct CallError {
    status: u16,
    grpc: Status,
}

impl From<Refusal> for CallError {
    fn from(refusal: Refusal) -> CallError {
        CallError {
            status: refusal.status(),
            grpc: refusal.grpc(),
        }
    }
}

impl CallError {
    fn invalid(detail: impl Into<String>) -> CallError {
        CallError {
            status: 400,
            grpc: Status::invalid_argument(detail),
        }
    }
}

/// A unary call: the request event, its reply or the mapped error.
/// `front`: the request's context (the call's metadata, or its stream's).
/// The caller's identity (the stream's credential) is `front`'s.
async fn call(state: &State, req: CallRequest, front: &Front<'_>) -> Result<CallReply, CallError> {
    if req.r#type.is_empty() {
        return Err(CallError::invalid("`type` names the event type"));
    }
    state.pool.policy().middleware.admit_event(
        front.identity,
        front.client.ip,
        &req.r#type,
        state.pool.routes().event_paths(),
    )?;
    let content_type = if req.content_type.is_empty() {
        "application/json"
    } else {
        req.content_type.as_str()
    };
    if !content_type.starts_with("application/json") {
        return Err(CallError::invalid(format!(
            "content type {content_type} is not supported; send application/json"
        )));
    }
    let limit = state.config.request_timeout;
    let timeout = match req.deadline_ms {
        0 => limit,
        ms => Duration::from_millis(ms).min(limit),
    };
    if req.payload.len() > state.config.max_body_bytes {
        return Err(CallError {
            status: 413,
            grpc: Status::resource_exhausted(format!(
                "payload is larger than {} bytes",
                state.config.max_body_bytes
            )),
        });
    }
    let (status, content_type, body) = crate::exchange::call(
        state,
        &req.r#type,
        Some(content_type),
        req.payload,
        timeout,
        front,
    )
    .await;
    if status < 400 {
        return Ok(CallReply {
            status: status.into(),
            content_type: content_type.unwrap_or_default(),
            payload: body,
        });
    }
    Err(CallError {
        status,
        grpc: event_status(status, &body),
    })
}

/// An event's error as a gRPC status: the problem+json's detail (or
/// title) is the message, and the details are a standard
/// `google.rpc.Status` (decision 0062) that any gRPC library decodes: an
/// `ErrorInfo` (reason from the HTTP status, domain `switchyard`, metadata
/// `http_status` and the whole `problem` JSON) and, for 400 and 422, a
/// `BadRequest` with one field violation per invalid field.
pub(crate) fn event_status(status: u16, body: &[u8]) -> Status {
    let problem = serde_json::from_slice::<Value>(body).ok();
    let message = problem
        .as_ref()
        .and_then(|v| {
            v.get("detail")
                .or_else(|| v.get("title"))
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .unwrap_or_else(|| format!("event status {status}"));
    let mut details = ErrorDetails::new();
    if matches!(status, 400 | 422) {
        let violations: Vec<FieldViolation> = problem
            .as_ref()
            .and_then(|p| p.get("errors"))
            .and_then(Value::as_array)
            .map(|errors| {
                errors
                    .iter()
                    .map(|e| {
                        let text = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
                        FieldViolation::new(text("field"), text("message"))
                    })
                    .collect()
            })
            .unwrap_or_default();
        if !violations.is_empty() {
            details.set_bad_request(violations);
        }
    }
    let mut metadata = std::collections::HashMap::new();
    metadata.insert("http_status".to_owned(), status.to_string());
    if problem.is_some() {
        metadata.insert("problem".to_owned(), String::from_utf8_lossy(body).into_owned());
    }
    // An answer the group made itself names its hop, as the HTTP one does
    // (decision 0116): in the details and as response metadata.
    let hop = problem
        .as_ref()
        .and_then(|p| p.get(refusal::HOP_MEMBER))
        .and_then(Value::as_str)
        .and_then(Hop::parse);
    if let Some(hop) = hop {
        metadata.insert(refusal::HOP_MEMBER.to_owned(), hop.name().to_owned());
    }
    let reason = switchyard_proto::problem::reason(status)
        .to_ascii_uppercase()
        .replace(' ', "_");
    details.set_error_info(reason, "switchyard", metadata);
    let mut grpc = Status::with_error_details(code_for_status(status), message, details);
    if let Some(hop) = hop {
        grpc.metadata_mut().insert(
            refusal::HOP_HEADER,
            tonic::metadata::MetadataValue::from_static(hop.name()),
        );
    }
    grpc
}

/// Checks a subscribe request; the filter as JSON text.
fn check(req: &SubscribeRequest) -> Result<String, String> {
    let filter = if req.filter_json.trim().is_empty() {
        None
    } else {
        Some(serde_json::from_str::<Value>(&req.filter_json).map_err(|e| format!("bad filter: {e}"))?)
    };
    check_subscription(&req.pattern, filter.as_ref())
}

type GrpcTx = mpsc::Sender<Result<ServerMessage, Status>>;

/// What a stream keeps of its caller (`middleware::session`): the
/// identity the call was admitted with and its credential.
fn session_auth(
    state: &State,
    metadata: &tonic::metadata::MetadataMap,
    extensions: &http::Extensions,
) -> Arc<SessionAuth> {
    let client = extensions
        .get::<crate::context::Client>()
        .and_then(|c| c.ip)
        .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED.into());
    let credential =
        state
            .pool
            .policy()
            .middleware
            .credential(&metadata.clone().into_headers(), None, client, false);
    SessionAuth::new(extensions.get::<Identity>().cloned(), credential)
}

/// Opens a session whose pushes go to a new bounded queue, checked against
/// `auth` and watched for as long as it lives.
fn open(
    state: &Arc<State>,
    auth: Arc<SessionAuth>,
) -> (
    SessionGuard,
    GrpcTx,
    mpsc::Receiver<Result<ServerMessage, Status>>,
    watch::Receiver<CloseReason>,
) {
    let (tx, rx) = mpsc::channel(state.config.ws.queue);
    let (kill, killed) = watch::channel::<CloseReason>(None);
    let session = state
        .pool
        .open_session(Outbox::Grpc(tx.clone()), kill.clone(), Some(auth.clone()));
    policy::watch(state.pool.clone(), Some(session), auth, kill);
    let guard = SessionGuard {
        pool: state.pool.clone(),
        session,
    };
    (guard, tx, rx, killed)
}

/// The outbound stream of a session: its queue until it closes, or an
/// error once the session is dropped for being too slow.
fn outbound(
    guard: Option<SessionGuard>,
    rx: mpsc::Receiver<Result<ServerMessage, Status>>,
    killed: watch::Receiver<CloseReason>,
) -> impl Stream<Item = Result<ServerMessage, Status>> + Send + 'static {
    futures_util::stream::unfold(
        (guard, rx, killed, false),
        |(guard, mut rx, mut killed, done)| async move {
            if done {
                return None;
            }
            let next = tokio::select! {
                biased;
                Ok(()) = killed.changed() => None,
                m = rx.recv() => m,
            };
            match next {
                Some(m) => Some((m, (guard, rx, killed, false))),
                None => {
                    let reason = *killed.borrow();
                    let reason = reason?;
                    let status = policy::grpc_status(reason)
                        .unwrap_or_else(|| Status::resource_exhausted(format!("stream ended: {}", reason.1)));
                    Some((Err(status), (guard, rx, killed, true)))
                }
            }
        },
    )
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl Events for EventsService {
    async fn notify(&self, request: tonic::Request<NotifyRequest>) -> Result<tonic::Response<Ack>, Status> {
        let ct = &request.get_ref().content_type;
        if !(ct.is_empty() || ct.starts_with("application/json")) {
            return Err(Status::invalid_argument("notifications are JSON"));
        }
        let identity = request.extensions().get::<Identity>();
        let client = request
            .extensions()
            .get::<crate::context::Client>()
            .and_then(|c| c.ip);
        self.state
            .pool
            .policy()
            .middleware
            .admit_event(
                identity,
                client,
                &request.get_ref().r#type,
                self.state.pool.routes().event_paths(),
            )
            .map_err(|r| r.grpc())?;
        let request = request.into_inner();
        if serde_json::from_slice::<serde::de::IgnoredAny>(&request.payload).is_err() {
            return Err(Status::invalid_argument("the payload is not valid JSON"));
        }
        emit_notification(&self.state, &request.r#type, request.payload)
            .map(|()| tonic::Response::new(Ack { count: 1 }))
            .map_err(|refused| Status::new(code_for_status(refused.status), refused.detail))
    }

    async fn call(&self, request: tonic::Request<CallRequest>) -> Result<tonic::Response<CallReply>, Status> {
        // A unary call is one request: the id the listener gave it (and
        // answers in the response headers) is its own.
        let (metadata, extensions, mut request) = request.into_parts();
        deadline::tighten(&mut request, extensions.get());
        let opener = Opener::of(&metadata.into_headers(), &extensions, &self.state.pool.routes());
        call(&self.state, request, &opener.front(&opener.client))
            .await
            .map(tonic::Response::new)
            .map_err(|e| e.grpc)
    }

    type SubscribeStream = BoxStream<Push>;

    async fn subscribe(
        &self,
        request: tonic::Request<SubscribeRequest>,
    ) -> Result<tonic::Response<Self::SubscribeStream>, Status> {
        let auth = session_auth(&self.state, request.metadata(), request.extensions());
        let client = request
            .extensions()
            .get::<crate::context::Client>()
            .and_then(|c| c.ip);
        let req = request.into_inner();
        let filter_json = check(&req).map_err(Status::invalid_argument)?;
        self.state
            .pool
            .policy()
            .middleware
            .admit_subscription(
                auth.identity.as_ref(),
                client,
                &req.pattern,
                self.state.pool.routes().event_paths(),
            )
            .map_err(|r| r.grpc())?;
        let (guard, tx, rx, killed) = open(&self.state, auth);
        // The pool holds the queue's sender: the stream ends with the session.
        drop(tx);
        self.state.pool.subscribe(
            guard.session,
            1,
            Subscription {
                id: Value::from(req.pattern.as_str()),
                pattern: req.pattern,
                filter_json,
            },
        );
        let pushes = futures_util::StreamExt::filter_map(outbound(Some(guard), rx, killed), |m| async move {
            match m {
                Ok(ServerMessage {
                    kind: Some(server_message::Kind::Push(push)),
                    ..
                }) => Some(Ok(push)),
                Ok(_) => None,
                Err(status) => Some(Err(status)),
            }
        });
        Ok(tonic::Response::new(Box::pin(pushes)))
    }

    type SessionStream = BoxStream<ServerMessage>;

    async fn session(
        &self,
        request: tonic::Request<Streaming<ClientMessage>>,
    ) -> Result<tonic::Response<Self::SessionStream>, Status> {
        let (metadata, extensions, inbound) = request.into_parts();
        let auth = session_auth(&self.state, &metadata, &extensions);
        let opener = Arc::new(Opener::of(
            &metadata.into_headers(),
            &extensions,
            &self.state.pool.routes(),
        ));
        let (guard, tx, rx, killed) = open(&self.state, auth);
        tokio::spawn(read_session(self.state.clone(), guard, tx, inbound, opener));
        Ok(tonic::Response::new(Box::pin(outbound(None, rx, killed))))
    }
}

fn answer(id: String, kind: server_message::Kind) -> Result<ServerMessage, Status> {
    Ok(ServerMessage { id, kind: Some(kind) })
}

fn error(id: String, status: u16, grpc: &Status) -> Result<ServerMessage, Status> {
    answer(
        id,
        server_message::Kind::Error(switchyard_proto::grpc::Error {
            code: grpc.code() as i32,
            status: status.into(),
            message: grpc.message().to_owned(),
            // A session's error carries the problem+json itself (events.proto).
            details: grpc
                .get_error_details()
                .error_info()
                .and_then(|info| info.metadata.get("problem"))
                .map(|p| p.as_bytes().to_vec())
                .unwrap_or_default()
                .into(),
        }),
    )
}

/// Reads a `Session`'s client messages (sent by `opener`'s identity) until the
/// client half-closes or goes away; then, once its calls are answered,
/// ends the session (which ends the outbound stream). A message that
/// cannot be read (undecodable, over the size limit) ends the stream with
/// its error status rather than OK, so the client learns its stream failed.
async fn read_session(
    state: Arc<State>,
    guard: SessionGuard,
    tx: GrpcTx,
    mut inbound: Streaming<ClientMessage>,
    opener: Arc<Opener>,
) {
    let session = guard.session;
    let max_in_flight = state.config.ws.max_in_flight;
    let in_flight = Arc::new(Semaphore::new(max_in_flight));
    let mut next_sub = 1u64;
    let mut failed = None;
    loop {
        let msg = tokio::select! {
            _ = tx.closed() => break,
            m = inbound.message() => m,
        };
        let ClientMessage { id, kind } = match msg {
            Ok(Some(m)) => m,
            Ok(None) => break,
            Err(status) => {
                tracing::debug!(%status, "grpc session read ended");
                failed = Some(status);
                break;
            }
        };
        let reply = match kind {
            Some(client_message::Kind::Call(req)) => {
                let Ok(permit) = in_flight.clone().acquire_owned().await else {
                    break;
                };
                let (state, tx, opener) = (state.clone(), tx.clone(), opener.clone());
                tokio::spawn(async move {
                    // Each call of a stream has its own request id.
                    let client = opener.client.next_request();
                    // A stream its client reset answers nobody: the call
                    // is dropped, which cancels it through the group.
                    let front = opener.front(&client);
                    let answered = tokio::select! {
                        answered = call(&state, req, &front) => answered,
                        () = tx.closed() => return,
                    };
                    let reply = match answered {
                        Ok(reply) => answer(id, server_message::Kind::Reply(reply)),
                        Err(e) => error(id, e.status, &e.grpc),
                    };
                    let _ = tx.send(reply).await;
                    drop(permit);
                });
                continue;
            }
            Some(client_message::Kind::Subscribe(req)) => match check(&req)
                .map_err(|reason| (400, Status::invalid_argument(reason)))
                .and_then(|filter| {
                    state
                        .pool
                        .policy()
                        .middleware
                        .admit_subscription(
                            opener.identity.as_ref(),
                            opener.client.ip,
                            &req.pattern,
                            state.pool.routes().event_paths(),
                        )
                        .map(|()| filter)
                        .map_err(|refusal| (refusal.status(), refusal.grpc()))
                }) {
                Err((status, grpc)) => error(id, status, &grpc),
                Ok(_) if state.pool.subscriptions(session) >= state.config.ws.max_subscriptions => {
                    let max = state.config.ws.max_subscriptions;
                    let status =
                        Status::resource_exhausted(format!("at most {max} subscriptions per stream"));
                    error(id, 429, &status)
                }
                Ok(filter_json) => {
                    let sub_id = if id.is_empty() {
                        req.pattern.clone()
                    } else {
                        id.clone()
                    };
                    state.pool.subscribe(
                        session,
                        next_sub,
                        Subscription {
                            id: Value::from(sub_id),
                            pattern: req.pattern,
                            filter_json,
                        },
                    );
                    next_sub += 1;
                    answer(id, server_message::Kind::Ack(Ack { count: 1 }))
                }
            },
            Some(client_message::Kind::Unsubscribe(req)) => {
                let which = req.subscription;
                let removed = state
                    .pool
                    .unsubscribe(session, |s| s.id.as_str() == Some(&which) || s.pattern == which);
                if removed == 0 {
                    error(
                        id,
                        404,
                        &Status::not_found("no subscription has this id or pattern"),
                    )
                } else {
                    answer(
                        id,
                        server_message::Kind::Ack(Ack {
                            count: removed as u32,
                        }),
                    )
                }
            }
            None => error(
                id,
                400,
                &Status::invalid_argument("a message has call, subscribe or unsubscribe"),
            ),
        };
        if tx.send(reply).await.is_err() {
            break;
        }
    }
    // Let the calls in flight answer (unless the client is gone), then end.
    tokio::select! {
        _ = tx.closed() => {}
        _ = in_flight.acquire_many(max_in_flight as u32) => {}
    }
    if let Some(status) = failed {
        tokio::select! {
            _ = tx.closed() => {}
            _ = tx.send(Err(status)) => {}
        }
    }
    drop(guard);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_groups_answer_names_its_hop_in_the_status_and_a_handlers_does_not() {
        let (_, body) =
            switchyard_proto::Refusal::unavailable(Hop::Router, "manager `x` is not running").parts();
        let status = event_status(503, &body);
        assert_eq!(status.code(), tonic::Code::Unavailable);
        let header = status
            .metadata()
            .get(refusal::HOP_HEADER)
            .and_then(|v| v.to_str().ok());
        assert_eq!(header, Some("router"));
        let info = status
            .get_error_details()
            .error_info()
            .cloned()
            .expect("an ErrorInfo");
        assert_eq!(info.metadata.get("hop").map(String::as_str), Some("router"));

        let own = event_status(503, br#"{"status":503,"detail":"busy"}"#);
        assert!(own.metadata().get(refusal::HOP_HEADER).is_none());
        let info = own
            .get_error_details()
            .error_info()
            .cloned()
            .expect("an ErrorInfo");
        assert!(!info.metadata.contains_key("hop"));
    }
}
