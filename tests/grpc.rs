//! gRPC against a real group, on the listener's port: unary `Call`, status
//! code mapping, server-streaming `Subscribe` (ticker pushes), a `Session`
//! with interleaved calls and pushes, health (SERVING → NOT_SERVING →
//! SERVING while a manager restarts) and reflection. Every wait is on a
//! message, bounded by PATIENCE.

mod common;

use common::raw_codec::Raw;
use common::*;
use futures_util::StreamExt;
use prost::Message as _;
use serde_json::{Value, json};
use switchyard_client::proto::events_client::EventsClient;
use switchyard_client::proto::{
    CallRequest, ClientMessage, ServerMessage, SubscribeRequest, Unsubscribe, client_message, server_message,
};
use switchyard_client::{ClientError, GrpcClient};
use tokio::sync::mpsc;
use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_types::StatusExt as _;

fn config(extra: &str) -> String {
    format!(
        "[[managers]]\nname = \"basics\"\n\n[[managers]]\nname = \"ticker\"\n\
         [managers.config]\ninterval_ms = 20\npad_bytes = 0\n{extra}"
    )
}

fn group(tag: &'static str) -> Group {
    Group::builder(tag).config(&config("")).start()
}

fn url(g: &Group) -> String {
    format!("http://{}", g.addr)
}

async fn channel(g: &Group) -> Channel {
    Channel::from_shared(url(g)).unwrap().connect().await.unwrap()
}

async fn within<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(PATIENCE, f).await.expect("in time")
}

fn call_request(ty: &str, data: Value) -> CallRequest {
    CallRequest {
        r#type: ty.into(),
        content_type: "application/json".into(),
        payload: data.to_string().into_bytes().into(),
        deadline_ms: 0,
    }
}

// Several threads: the group's drop blocks one while the client's
// connection task answers the listener's graceful GOAWAY on another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unary_call_and_status_codes() {
    let g = group("grpc-call");
    let mut events = EventsClient::new(channel(&g).await);

    let reply = within(events.call(call_request("demo.Hello", json!({"name": "Ada"}))))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status, 200);
    let body: Value = serde_json::from_slice(&reply.payload).unwrap();
    assert_eq!(body["message"], "Hello, Ada!");

    // Validation error (422) → INVALID_ARGUMENT; the details are a standard
    // google.rpc.Status: a BadRequest naming the field, an ErrorInfo
    // carrying the problem+json.
    let err = within(events.call(call_request("demo.Hello", json!({"name": ""}))))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    let details = err.get_error_details();
    let violations = &details.bad_request().expect("a BadRequest").field_violations;
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert_eq!(violations[0].field, "name");
    assert!(!violations[0].description.is_empty());
    let info = details.error_info().expect("an ErrorInfo");
    assert_eq!(
        (info.reason.as_str(), info.domain.as_str()),
        ("UNPROCESSABLE_CONTENT", "switchyard")
    );
    assert_eq!(info.metadata["http_status"], "422");
    let problem: Value = serde_json::from_str(&info.metadata["problem"]).unwrap();
    assert_eq!(problem["status"], 422);
    // The raw details decode as google.rpc.Status with prost alone, too.
    let raw = tonic_types::pb::Status::decode(err.details()).expect("a google.rpc.Status");
    assert_eq!(raw.code, Code::InvalidArgument as i32);
    assert_eq!(raw.details.len(), 2);

    // A type no manager declares: NOT_FOUND, naming it.
    let err = within(events.call(call_request("demo.Nope", json!({}))))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert_eq!(err.message(), "no manager declares event type `demo.Nope`");
    let details = err.get_error_details();
    assert!(details.bad_request().is_none());
    let info = details.error_info().expect("an ErrorInfo");
    assert_eq!(info.reason, "NOT_FOUND");
    let problem: Value = serde_json::from_str(&info.metadata["problem"]).unwrap();
    assert_eq!(problem["status"], 404);

    // Not JSON: refused before it becomes an event.
    let mut bincode = call_request("demo.Hello", json!({}));
    bincode.content_type = "application/bincode".into();
    let err = within(events.call(bincode)).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");

    // The client crate: the WebSocket client's shape.
    let client = GrpcClient::connect(&url(&g)).await.unwrap();
    let calls = (0..50).map(|i| {
        let c = client.clone();
        async move {
            let r: Value = c
                .call("demo.Hello", &json!({"name": format!("x{i}")}))
                .await
                .unwrap();
            assert_eq!(r["message"], format!("Hello, x{i}!"));
        }
    });
    within(futures_util::future::join_all(calls)).await;
    let err = client
        .call::<_, Value>("demo.Hello", &json!({"name": ""}))
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Status { status: 422, .. }), "{err}");

    // The same calls multiplexed on one Session stream, answered by id.
    let session = client.session().await.unwrap();
    let calls = (0..50).map(|i| {
        let s = &session;
        async move {
            let r: Value = s
                .call("demo.Hello", &json!({"name": format!("s{i}")}))
                .await
                .unwrap();
            assert_eq!(r["message"], format!("Hello, s{i}!"));
        }
    });
    within(futures_util::future::join_all(calls)).await;
    let err = session
        .call::<_, Value>("demo.Hello", &json!({"name": ""}))
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Status { status: 422, .. }), "{err}");

    // Plain HTTP still works next to gRPC on the same port.
    assert_eq!(get(g.addr, "/hello/Ada").unwrap().status, 200);
}

// Several threads: the group's drop blocks one while the client's
// connection task answers the listener's graceful GOAWAY on another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_streams_ticker_pushes() {
    let g = group("grpc-subscribe");
    let mut events = EventsClient::new(channel(&g).await);
    let mut stream = within(events.subscribe(SubscribeRequest {
        pattern: "demo.*".into(),
        filter_json: String::new(),
    }))
    .await
    .unwrap()
    .into_inner();
    let mut last = None;
    for _ in 0..5 {
        let push = within(stream.message()).await.unwrap().expect("a push");
        assert_eq!(push.event, "demo.tick");
        let n = serde_json::from_slice::<Value>(&push.payload).unwrap()["n"]
            .as_u64()
            .unwrap();
        assert!(last.is_none_or(|l| n > l), "ticks in order");
        last = Some(n);
    }

    // A bad pattern or filter is INVALID_ARGUMENT.
    let err = within(events.subscribe(SubscribeRequest {
        pattern: "demo.tick".into(),
        filter_json: "{\"n\":{\"like\":1}}".into(),
    }))
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");

    // The client crate's subscription stream.
    let client = GrpcClient::connect(&url(&g)).await.unwrap();
    let mut ticks = client.subscribe("demo.tick").await.unwrap();
    let push = within(ticks.next()).await.expect("a push");
    assert_eq!(push.event, "demo.tick");
    assert!(push.data["n"].is_u64());
}

async fn next_message(stream: &mut tonic::Streaming<ServerMessage>) -> ServerMessage {
    within(stream.message())
        .await
        .unwrap()
        .expect("the session goes on")
}

// Several threads: the group's drop blocks one while the client's
// connection task answers the listener's graceful GOAWAY on another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_interleaves_calls_and_pushes() {
    let g = group("grpc-session");
    let mut events = EventsClient::new(channel(&g).await);
    let (tx, rx) = mpsc::unbounded_channel::<ClientMessage>();
    let out = tokio_stream_from(rx);
    let mut inbound = within(events.session(out)).await.unwrap().into_inner();

    let msg = |id: &str, kind| ClientMessage {
        id: id.into(),
        kind: Some(kind),
    };
    tx.send(msg(
        "s1",
        client_message::Kind::Subscribe(SubscribeRequest {
            pattern: "demo.tick".into(),
            filter_json: String::new(),
        }),
    ))
    .unwrap();
    // Acknowledged before any push of it.
    let ack = next_message(&mut inbound).await;
    assert_eq!(ack.id, "s1");
    assert!(matches!(ack.kind, Some(server_message::Kind::Ack(_))), "{ack:?}");

    // Calls sent while pushes flow; every call answered once, pushes between.
    for i in 0..20 {
        let ty = if i % 5 == 4 { "demo.Nope" } else { "demo.Hello" };
        tx.send(msg(
            &format!("c{i}"),
            client_message::Kind::Call(call_request(ty, json!({"name": format!("n{i}")}))),
        ))
        .unwrap();
    }
    let mut answered = std::collections::HashSet::new();
    let mut pushes = 0;
    while answered.len() < 20 || pushes < 3 {
        let m = next_message(&mut inbound).await;
        match m.kind.expect("a kind") {
            server_message::Kind::Push(p) => {
                assert_eq!(p.event, "demo.tick");
                assert_eq!(p.subscriptions, vec!["s1".to_owned()]);
                pushes += 1;
            }
            server_message::Kind::Reply(r) => {
                let i: usize = m.id[1..].parse().unwrap();
                assert_ne!(i % 5, 4, "{r:?}");
                let body: Value = serde_json::from_slice(&r.payload).unwrap();
                assert_eq!(body["message"], format!("Hello, n{i}!"));
                assert!(answered.insert(m.id));
            }
            server_message::Kind::Error(e) => {
                let i: usize = m.id[1..].parse().unwrap();
                assert_eq!(i % 5, 4, "{e:?}");
                assert_eq!((e.code, e.status), (Code::NotFound as i32, 404), "{e:?}");
                assert!(answered.insert(m.id));
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    // Unsubscribe: acknowledged; after the ack, no push follows.
    tx.send(msg(
        "u1",
        client_message::Kind::Unsubscribe(Unsubscribe {
            subscription: "s1".into(),
        }),
    ))
    .unwrap();
    loop {
        let m = next_message(&mut inbound).await;
        if m.id == "u1" {
            assert!(
                matches!(m.kind, Some(server_message::Kind::Ack(ref a)) if a.count == 1),
                "{m:?}"
            );
            break;
        }
    }
    // A call after the unsubscribe is the very next message.
    tx.send(msg(
        "last",
        client_message::Kind::Call(call_request("demo.Hello", json!({"name": "z"}))),
    ))
    .unwrap();
    let m = next_message(&mut inbound).await;
    assert_eq!(m.id, "last", "{m:?}");
    // Half-closing ends the stream once everything is answered.
    drop(tx);
    assert!(within(inbound.message()).await.unwrap().is_none());
}

/// An unbounded receiver as the request stream of a bidi call.
fn tokio_stream_from<T: Send + 'static>(
    mut rx: mpsc::UnboundedReceiver<T>,
) -> impl futures_util::Stream<Item = T> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

async fn health_status(watch: &mut tonic::Streaming<tonic_health::pb::HealthCheckResponse>) -> ServingStatus {
    let m = within(watch.message()).await.unwrap().expect("health goes on");
    ServingStatus::try_from(m.status).unwrap()
}

// Several threads: the group's drop blocks one while the client's
// connection task answers the listener's graceful GOAWAY on another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_follows_a_manager_restart() {
    let g = Group::builder("grpc-health")
        .config(&config("[restart]\ninitial_backoff_ms = 3000\n"))
        .start();
    let mut health = HealthClient::new(channel(&g).await);
    for service in [
        "",
        "switchyard.v1.Events",
        "switchyard.manager.basics",
        "switchyard.manager.ticker",
    ] {
        let r = within(health.check(HealthCheckRequest {
            service: service.into(),
        }))
        .await
        .unwrap()
        .into_inner();
        assert_eq!(r.status, ServingStatus::Serving as i32, "{service:?}");
    }
    let err = within(health.check(HealthCheckRequest {
        service: "switchyard.manager.nope".into(),
    }))
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    let mut overall = within(health.watch(HealthCheckRequest { service: "".into() }))
        .await
        .unwrap()
        .into_inner();
    let mut basics = within(health.watch(HealthCheckRequest {
        service: "switchyard.manager.basics".into(),
    }))
    .await
    .unwrap()
    .into_inner();
    assert_eq!(health_status(&mut overall).await, ServingStatus::Serving);
    assert_eq!(health_status(&mut basics).await, ServingStatus::Serving);

    g.kill9("basics");
    // Down while the restart backoff (3 s) runs, then up again.
    for watch in [&mut overall, &mut basics] {
        while health_status(watch).await != ServingStatus::NotServing {}
    }
    for watch in [&mut overall, &mut basics] {
        while health_status(watch).await != ServingStatus::Serving {}
    }
    let r = within(health.check(HealthCheckRequest { service: "".into() }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.status, ServingStatus::Serving as i32);
}

// Several threads: the group's drop blocks one while the client's
// connection task answers the listener's graceful GOAWAY on another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_lists_the_services() {
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::{ServerReflectionRequest, ServerReflectionResponse};

    let g = group("grpc-reflection");
    let mut reflection = ServerReflectionClient::new(channel(&g).await);
    let ask = |m| ServerReflectionRequest {
        host: String::new(),
        message_request: Some(m),
    };
    let requests = vec![
        ask(MessageRequest::ListServices(String::new())),
        ask(MessageRequest::FileContainingSymbol(
            "switchyard.v1.Events".into(),
        )),
    ];
    let mut answers = within(reflection.server_reflection_info(futures_util::stream::iter(requests)))
        .await
        .unwrap()
        .into_inner();
    let next =
        |a: Option<ServerReflectionResponse>| a.expect("an answer").message_response.expect("a response");
    match next(within(answers.message()).await.unwrap()) {
        MessageResponse::ListServicesResponse(list) => {
            let names: Vec<_> = list.service.into_iter().map(|s| s.name).collect();
            for want in ["switchyard.v1.Events", "grpc.health.v1.Health"] {
                assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
            }
        }
        other => panic!("expected a service list, got {other:?}"),
    }
    match next(within(answers.message()).await.unwrap()) {
        MessageResponse::FileDescriptorResponse(files) => assert!(!files.file_descriptor_proto.is_empty()),
        other => panic!("expected a file descriptor, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_reaches_subscribers_only_when_allowed() {
    use futures_util::StreamExt;
    let g = Group::builder("grpc-notify")
        .config(&config("[listener.ws]\nnotify = true\n"))
        .start();
    let client = switchyard_client::GrpcClient::connect(&url(&g)).await.unwrap();
    let mut sub = within(client.subscribe("client.*")).await.unwrap();
    within(client.notify("client.ping", &serde_json::json!({"n": 3})))
        .await
        .unwrap();
    let push = within(sub.next()).await.expect("a push");
    assert_eq!(push.event, "client.ping");
    assert_eq!(push.data, serde_json::json!({"n": 3}));
    drop((sub, client, g));

    // Off by default: PERMISSION_DENIED.
    let g = group("grpc-notify-off");
    let mut events = EventsClient::new(channel(&g).await);
    let refused = within(events.notify(switchyard_proto::grpc::NotifyRequest {
        r#type: "client.ping".into(),
        content_type: String::new(),
        payload: b"{}".to_vec().into(),
    }))
    .await
    .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
}

// Several threads: the group's drop blocks one while the client's
// connection task answers the listener's graceful GOAWAY on another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_only_port_serves_the_same_service() {
    let mut g = Group::builder("grpc-port")
        .config("[listener]\ngrpc_bind = \"127.0.0.1:0\"\n")
        .start();
    let line = tokio::task::block_in_place(|| g.wait_line("gRPC (only) listening on http://"));
    let grpc_url = format!("http://{}", line.split("http://").nth(1).unwrap().trim());
    assert_ne!(grpc_url, url(&g), "a port of its own");
    let client = GrpcClient::connect(&grpc_url).await.unwrap();
    let r: Value = within(client.call("demo.Hello", &json!({"name": "port"})))
        .await
        .unwrap();
    assert_eq!(r["message"], "Hello, port!");
    // The main port still serves gRPC by content type, and HTTP.
    let main: Value = within(
        GrpcClient::connect(&url(&g))
            .await
            .unwrap()
            .call("demo.Hello", &json!({"name": "main"})),
    )
    .await
    .unwrap();
    assert_eq!(main["message"], "Hello, main!");
    assert_eq!(get(g.addr, "/hello/Ada").unwrap().status, 200);
    // The gRPC port serves nothing else: a plain GET gets gRPC's
    // UNIMPLEMENTED (12), not the HTTP route.
    let grpc_addr: std::net::SocketAddr = grpc_url.trim_start_matches("http://").parse().unwrap();
    let r = get(grpc_addr, "/hello/Ada").unwrap();
    assert_eq!(r.header("grpc-status"), Some("12"), "{r:?}");
}

// Several threads: the group's drop blocks one while the client's
// connection task answers the listener's graceful GOAWAY on another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_watch_on_an_unknown_service_streams_service_unknown_and_stays_open() {
    use futures_util::FutureExt as _;
    let g = group("grpc-health-unknown");
    let mut health = HealthClient::new(channel(&g).await);
    let mut watch = within(health.watch(HealthCheckRequest {
        service: "switchyard.manager.nope".into(),
    }))
    .await
    .expect("Watch on an unknown name is not an error")
    .into_inner();
    assert_eq!(health_status(&mut watch).await, ServingStatus::ServiceUnknown);
    // A round trip on the same connection after it: had the server ended
    // the watch, its end would have arrived before this answer.
    let r = within(health.check(HealthCheckRequest { service: "".into() }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.status, ServingStatus::Serving as i32);
    assert!(
        watch.message().now_or_never().is_none(),
        "the watch of an unknown service stays open"
    );
    // Check keeps the protocol's NOT_FOUND.
    let err = within(health.check(HealthCheckRequest {
        service: "switchyard.manager.nope".into(),
    }))
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
}

/// A message larger than the 4 MiB the server receives is
/// RESOURCE_EXHAUSTED (the gRPC spec's code for an exceeded receive
/// limit), on a unary call and on a `Session`; the channel keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_the_receive_limit_is_resource_exhausted() {
    let g = group("grpc-too-large");
    let mut events = EventsClient::new(channel(&g).await);
    let mut big = call_request("demo.Hello", json!({"name": "big"}));
    big.payload = vec![b' '; 5 << 20].into();
    let err = within(events.call(big.clone())).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("at most 4194304"), "{err:?}");

    let (tx, rx) = mpsc::unbounded_channel::<ClientMessage>();
    let mut inbound = within(events.session(tokio_stream_from(rx)))
        .await
        .unwrap()
        .into_inner();
    tx.send(ClientMessage {
        id: "big".into(),
        kind: Some(client_message::Kind::Call(big)),
    })
    .unwrap();
    let err = within(inbound.message()).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");

    let reply = within(events.call(call_request("demo.Hello", json!({"name": "after"}))))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status, 200);
}

/// A `Session` that receives a message it cannot decode ends with an
/// error status and a message, not OK: the client must learn that its
/// stream failed, not that it finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_receives_an_undecodable_message_ends_with_an_error() {
    let g = group("grpc-session-garbage");
    let mut grpc = tonic::client::Grpc::new(channel(&g).await);
    within(grpc.ready()).await.unwrap();
    let (tx, rx) = mpsc::unbounded_channel::<bytes::Bytes>();
    let path = http::uri::PathAndQuery::from_static("/switchyard.v1.Events/Session");
    let mut inbound = within(grpc.streaming(tonic::Request::new(tokio_stream_from(rx)), path, Raw))
        .await
        .unwrap()
        .into_inner();
    // A good call first: the session works.
    let good = ClientMessage {
        id: "good".into(),
        kind: Some(client_message::Kind::Call(call_request(
            "demo.Hello",
            json!({"name": "Ada"}),
        ))),
    };
    tx.send(good.encode_to_vec().into()).unwrap();
    let reply = within(inbound.message()).await.unwrap().expect("an answer");
    let reply = ServerMessage::decode(reply).unwrap();
    assert!(
        matches!(reply.kind, Some(server_message::Kind::Reply(ref r)) if r.status == 200),
        "{reply:?}"
    );
    // Field 1 (`id`, a string) announced 16 bytes long, with 2 there.
    tx.send(bytes::Bytes::from_static(&[0x0a, 0x10, b'h', b'i']))
        .unwrap();
    let err = within(inbound.message())
        .await
        .expect_err("the stream ends with an error status");
    assert!(
        matches!(err.code(), Code::Internal | Code::InvalidArgument),
        "{err:?}"
    );
    assert!(!err.message().is_empty(), "{err:?}");
}

/// A reflection request for a symbol no file defines is answered with an
/// `error_response` (NOT_FOUND) on the open stream, which goes on
/// answering: v1 and v1alpha alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_answers_an_unknown_symbol_and_the_stream_goes_on() {
    let g = group("grpc-reflection-unknown");
    let channel = channel(&g).await;
    {
        use tonic_reflection::pb::v1::ServerReflectionRequest;
        use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
        use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
        use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
        let ask = |m| ServerReflectionRequest {
            host: String::new(),
            message_request: Some(m),
        };
        let requests = vec![
            ask(MessageRequest::FileContainingSymbol("no.such.Symbol".into())),
            ask(MessageRequest::FileContainingSymbol(
                "switchyard.v1.Events.Call".into(),
            )),
            ask(MessageRequest::FileByFilename("no/such.proto".into())),
            ask(MessageRequest::ListServices(String::new())),
        ];
        let mut reflection = ServerReflectionClient::new(channel.clone());
        let mut answers = within(reflection.server_reflection_info(futures_util::stream::iter(requests)))
            .await
            .unwrap()
            .into_inner();
        async fn next(
            answers: &mut tonic::Streaming<tonic_reflection::pb::v1::ServerReflectionResponse>,
        ) -> MessageResponse {
            within(answers.message())
                .await
                .expect("the stream goes on")
                .expect("an answer")
                .message_response
                .expect("a response")
        }
        match next(&mut answers).await {
            MessageResponse::ErrorResponse(e) => {
                assert_eq!(e.error_code, Code::NotFound as i32, "{e:?}");
                assert!(e.error_message.contains("no.such.Symbol"), "{e:?}");
            }
            other => panic!("expected an error response, got {other:?}"),
        }
        match next(&mut answers).await {
            MessageResponse::FileDescriptorResponse(f) => assert_eq!(f.file_descriptor_proto.len(), 1),
            other => panic!("expected a file descriptor, got {other:?}"),
        }
        assert!(matches!(
            next(&mut answers).await,
            MessageResponse::ErrorResponse(_)
        ));
        match next(&mut answers).await {
            MessageResponse::ListServicesResponse(list) => {
                assert!(
                    list.service.iter().any(|s| s.name == "demo.v1.Basics"),
                    "{list:?}"
                )
            }
            other => panic!("expected a service list, got {other:?}"),
        }
    }
    {
        use tonic_reflection::pb::v1alpha::ServerReflectionRequest;
        use tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient;
        use tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest;
        use tonic_reflection::pb::v1alpha::server_reflection_response::MessageResponse;
        let ask = |m| ServerReflectionRequest {
            host: String::new(),
            message_request: Some(m),
        };
        let requests = vec![
            ask(MessageRequest::FileContainingSymbol("no.such.Symbol".into())),
            ask(MessageRequest::FileContainingSymbol("demo.v1.Hello".into())),
        ];
        let mut reflection = ServerReflectionClient::new(channel);
        let mut answers = within(reflection.server_reflection_info(futures_util::stream::iter(requests)))
            .await
            .unwrap()
            .into_inner();
        let first = within(answers.message()).await.unwrap().expect("an answer");
        assert!(
            matches!(first.message_response, Some(MessageResponse::ErrorResponse(ref e)) if e.error_code == Code::NotFound as i32),
            "{first:?}"
        );
        let second = within(answers.message())
            .await
            .unwrap()
            .expect("the stream goes on");
        assert!(
            matches!(
                second.message_response,
                Some(MessageResponse::FileDescriptorResponse(_))
            ),
            "{second:?}"
        );
    }
}
