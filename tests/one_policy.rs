//! One policy, decided on the event (decision 0105), against real groups
//! and real clients: the same forbidden event, reached over every way in
//! — HTTP/1.1, h2, HTTP/3, a `/ws` message, a `/ws` subscription, gRPC
//! `Events/Call`, a gRPC `Session` call and `Subscribe`, and the typed gRPC
//! service — is refused every time (401 without a credential, 403 without
//! the role, or the transport's equivalent), and the allowed one reaches
//! its handler every time. The rules are the demo's kind: `prefix` rules
//! (`/me` for any identity, `/hello` for admins), which before covered
//! HTTP only. An event-scoped rate limit counts each WebSocket message and
//! gRPC call. Cross-origin WebSocket upgrades (HTTP/1.1 and h2) are
//! refused, same-origin and allow-listed ones accepted (decision 0107).

mod common;

use std::net::SocketAddr;
use std::path::Path;

use bytes::{Buf, Bytes};
use common::raw_codec::Raw;
use common::*;
use futures_util::{SinkExt, StreamExt};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::CertificateDer;
use serde_json::{Value, json};
use switchyard_client::proto::events_client::EventsClient;
use switchyard_client::proto::{
    CallRequest, ClientMessage, SubscribeRequest, client_message, server_message,
};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

const KEY: &str = "one-policy-test-secret-of-32-bytes!!";

const RULES: &str = r#"
[[managers]]
name = "basics"

[[managers]]
name = "scheduler"
builtin = "scheduler"

[auth]
expose = ["scheduler.*"]

[auth.jwt]
algorithms = ["HS256"]
secret = "one-policy-test-secret-of-32-bytes!!"

[[auth.rules]]
prefix = "/me"

[[auth.rules]]
prefix = "/hello"
roles = ["admin"]
"#;

fn token(sub: &str, roles: &[&str]) -> String {
    let claims = json!({
        "sub": sub,
        "roles": roles,
        "exp": jsonwebtoken::get_current_timestamp() + 600,
    });
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(KEY.as_bytes()),
    )
    .unwrap()
}

/// The ways in, each a row of the table.
#[derive(Clone, Copy, Debug)]
enum Way {
    Http1,
    H2,
    Http3,
    WsMessage,
    WsSubscription,
    GrpcUnary,
    GrpcSession,
    GrpcSubscribe,
    GrpcTyped,
    /// A job the client schedules (`scheduler.*` exposed) to fire at once:
    /// admitted as the client when scheduled and again when it fires, and
    /// fired as the client's request (decisions 0110, 0113).
    ScheduledJob,
}

const WAYS: [Way; 10] = [
    Way::Http1,
    Way::H2,
    Way::Http3,
    Way::WsMessage,
    Way::WsSubscription,
    Way::GrpcUnary,
    Way::GrpcSession,
    Way::GrpcSubscribe,
    Way::GrpcTyped,
    Way::ScheduledJob,
];

/// What came of one attempt: refused with 401 or 403 (or the transport's
/// equivalent), or let through to the handler (with whatever it answered).
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Refused(u16),
    Reached,
}

fn of_status(status: u64) -> Outcome {
    match status {
        401 | 403 => Outcome::Refused(status as u16),
        _ => Outcome::Reached,
    }
}

fn of_grpc(code: tonic::Code) -> Outcome {
    match code {
        tonic::Code::Unauthenticated => Outcome::Refused(401),
        tonic::Code::PermissionDenied => Outcome::Refused(403),
        _ => Outcome::Reached,
    }
}

/// One event, as each way in spells it.
struct Event {
    name: &'static str,
    path: &'static str,
    data: Value,
    typed: &'static str,
    /// The typed rpc's request message, encoded.
    typed_message: &'static [u8],
}

/// The two groups: plaintext (HTTP/1.1, h2c, WebSocket, gRPC) and TLS
/// with HTTP/3, on the same rules.
struct Groups {
    plain: Group,
    tls: Group,
    udp: SocketAddr,
    ca: CertificateDer<'static>,
    _dir: tempfile::TempDir,
}

fn certificates(dir: &Path) -> CertificateDer<'static> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    std::fs::write(dir.join("cert.pem"), cert.pem() + &issuer.pem()).unwrap();
    std::fs::write(dir.join("key.pem"), key.serialize_pem()).unwrap();
    issuer.der().clone()
}

fn start() -> Groups {
    // The Scheduler logs what a client's fired job was answered at debug.
    let plain = Group::builder("one-policy")
        .config(RULES)
        .env("SWITCHYARD_LOG", "info,switchyard_manager_host=debug")
        .start();
    let dir = scratch_dir("one-policy-tls");
    let ca = certificates(dir.path());
    let file = dir.path().join("switchyard.toml");
    std::fs::write(
        &file,
        format!(
            "{RULES}\n[listener.tls]\ncert = \"{}\"\nkey = \"{}\"\n\n[listener.http3]\nenabled = true\n",
            dir.path().join("cert.pem").display(),
            dir.path().join("key.pem").display()
        ),
    )
    .unwrap();
    let mut tls = Group::builder("one-policy-h3").config_file(&file).start();
    let line = tls.wait_line("HTTP/3 listening on udp ");
    let udp = line.rsplit(' ').next().unwrap().parse().unwrap();
    Groups {
        plain,
        tls,
        udp,
        ca,
        _dir: dir,
    }
}

fn bearer(token: Option<&str>) -> Option<String> {
    token.map(|t| format!("Bearer {t}"))
}

async fn http1(addr: SocketAddr, path: &str, token: Option<&str>) -> Outcome {
    let path = path.to_owned();
    let auth = bearer(token);
    let r = tokio::task::spawn_blocking(move || {
        let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("authorization", a.as_str())).collect();
        request_with(addr, "GET", &path, &headers, b"")
    })
    .await
    .unwrap()
    .unwrap();
    of_status(u64::from(r.status))
}

async fn h2(addr: SocketAddr, path: &str, token: Option<&str>) -> Outcome {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut req = http::Request::get(format!("http://localhost{path}"));
    if let Some(a) = bearer(token) {
        req = req.header("authorization", a);
    }
    let r = tokio::time::timeout(
        PATIENCE,
        send.send_request(req.body(Empty::<Bytes>::new()).unwrap()),
    )
    .await
    .expect("in time")
    .unwrap();
    let status = r.status().as_u16();
    let _ = r.into_body().collect().await;
    of_status(u64::from(status))
}

async fn http3(g: &Groups, path: &str, token: Option<&str>) -> Outcome {
    let endpoint = common::quic::h3_client_endpoint(&g.ca);
    let conn = tokio::time::timeout(PATIENCE, endpoint.connect(g.udp, "localhost").unwrap())
        .await
        .expect("QUIC handshake in time")
        .expect("QUIC handshake");
    let (mut driver, mut sender) = h3::client::new(h3_quinn::Connection::new(conn)).await.unwrap();
    tokio::spawn(async move { std::future::poll_fn(|cx| driver.poll_close(cx)).await });
    let mut req = http::Request::get(format!("https://localhost{path}"));
    if let Some(a) = bearer(token) {
        req = req.header("authorization", a);
    }
    let mut stream = sender.send_request(req.body(()).unwrap()).await.unwrap();
    stream.finish().await.unwrap();
    let r = tokio::time::timeout(PATIENCE, stream.recv_response())
        .await
        .expect("in time")
        .unwrap();
    while let Ok(Some(mut chunk)) = stream.recv_data().await {
        chunk.advance(chunk.remaining());
    }
    of_status(u64::from(r.status().as_u16()))
}

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn ws(addr: SocketAddr, token: Option<&str>) -> Ws {
    let mut req = format!("ws://{addr}/ws").into_client_request().unwrap();
    if let Some(a) = bearer(token) {
        req.headers_mut().insert("authorization", a.parse().unwrap());
    }
    tokio::time::timeout(PATIENCE, tokio_tungstenite::connect_async(req))
        .await
        .expect("in time")
        .expect("upgraded")
        .0
}

async fn ws_answer(ws: &mut Ws, message: Value) -> Value {
    ws.send(Message::text(message.to_string())).await.unwrap();
    loop {
        match tokio::time::timeout(PATIENCE, ws.next())
            .await
            .expect("an answer in time")
        {
            Some(Ok(Message::Text(t))) => return serde_json::from_str(t.as_str()).unwrap(),
            Some(Ok(_)) => continue,
            other => panic!("the session ended: {other:?}"),
        }
    }
}

async fn channel(addr: SocketAddr) -> tonic::transport::Channel {
    tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

fn with_token<T>(message: T, token: Option<&str>) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    if let Some(a) = bearer(token) {
        req.metadata_mut().insert("authorization", a.parse().unwrap());
    }
    req
}

fn call_request(e: &Event) -> CallRequest {
    CallRequest {
        r#type: e.name.into(),
        content_type: "application/json".into(),
        payload: e.data.to_string().into_bytes().into(),
        deadline_ms: 0,
    }
}

async fn reach(g: &Groups, way: Way, e: &Event, token: Option<&str>) -> Outcome {
    let addr = g.plain.addr;
    match way {
        Way::Http1 => http1(addr, e.path, token).await,
        Way::H2 => h2(addr, e.path, token).await,
        Way::Http3 => http3(g, e.path, token).await,
        Way::WsMessage => {
            let mut ws = ws(addr, token).await;
            let answer = ws_answer(&mut ws, json!({"id": 1, "type": e.name, "data": e.data})).await;
            of_status(answer["status"].as_u64().expect("a status"))
        }
        Way::WsSubscription => {
            let mut ws = ws(addr, token).await;
            let answer = ws_answer(&mut ws, json!({"id": 1, "subscribe": e.name})).await;
            match answer.get("subscribed") {
                Some(_) => Outcome::Reached,
                None => of_status(answer["status"].as_u64().expect("a status")),
            }
        }
        Way::GrpcUnary => {
            let mut client = EventsClient::new(channel(addr).await);
            match tokio::time::timeout(PATIENCE, client.call(with_token(call_request(e), token)))
                .await
                .expect("in time")
            {
                Ok(_) => Outcome::Reached,
                Err(status) => of_grpc(status.code()),
            }
        }
        Way::GrpcSession => {
            let mut client = EventsClient::new(channel(addr).await);
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            tx.send(ClientMessage {
                id: "1".into(),
                kind: Some(client_message::Kind::Call(call_request(e))),
            })
            .await
            .unwrap();
            let outbound = tokio_stream_of(rx);
            let mut inbound = tokio::time::timeout(PATIENCE, client.session(with_token(outbound, token)))
                .await
                .expect("in time")
                .expect("a session")
                .into_inner();
            let reply = tokio::time::timeout(PATIENCE, inbound.message())
                .await
                .expect("in time")
                .expect("a message")
                .expect("an answer");
            drop(tx);
            match reply.kind {
                Some(server_message::Kind::Reply(_)) => Outcome::Reached,
                Some(server_message::Kind::Error(err)) => of_status(u64::from(err.status)),
                other => panic!("{other:?}"),
            }
        }
        Way::GrpcSubscribe => {
            let mut client = EventsClient::new(channel(addr).await);
            let req = SubscribeRequest {
                pattern: e.name.into(),
                filter_json: String::new(),
            };
            match tokio::time::timeout(PATIENCE, client.subscribe(with_token(req, token)))
                .await
                .expect("in time")
            {
                Ok(_) => Outcome::Reached,
                Err(status) => of_grpc(status.code()),
            }
        }
        Way::ScheduledJob => {
            static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let id = format!("row-{}", NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
            let mut ws = ws(addr, token).await;
            let job = json!({"id": id, "when": {"after_ms": 0}, "event": e.name, "payload": e.data});
            let answer = ws_answer(
                &mut ws,
                json!({"id": 1, "type": "scheduler.Schedule", "data": job}),
            )
            .await;
            let status = answer["status"].as_u64().expect("a status");
            if status != 200 {
                return of_status(status);
            }
            // Fired: the Scheduler logs what the job was answered.
            let needle = format!("job `{id}`: {} answered ", e.name);
            let line = tokio::task::block_in_place(|| {
                eventually(&format!("job {id} fired"), PATIENCE, || {
                    g.plain.line(&needle).ok_or(())
                })
            });
            let rest = &line[line.find(&needle).unwrap() + needle.len()..];
            let fired: u64 = rest[..3].parse().unwrap_or_else(|_| panic!("{line}"));
            // The handler saw the job's client: `demo.Me` answers its
            // subject, which a job fired as the Scheduler had not.
            if fired < 400 && e.name == "demo.Me" && !rest.contains(r#""sub":"vera""#) {
                panic!("the job reached demo.Me without its client's identity: {line}");
            }
            of_status(fired)
        }
        Way::GrpcTyped => {
            let mut grpc = tonic::client::Grpc::new(channel(addr).await);
            grpc.ready().await.unwrap();
            let path = http::uri::PathAndQuery::from_static(e.typed);
            let req = with_token(Bytes::from_static(e.typed_message), token);
            match tokio::time::timeout(PATIENCE, grpc.unary(req, path, Raw))
                .await
                .expect("in time")
            {
                Ok(_) => Outcome::Reached,
                Err(status) => of_grpc(status.code()),
            }
        }
    }
}

fn tokio_stream_of<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures_util::Stream<Item = T> + Send + 'static {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_event_meets_the_same_rules_on_every_way_in() {
    let g = start();
    let me = Event {
        name: "demo.Me",
        path: "/me",
        data: json!({}),
        typed: "/demo.v1.Basics/Me",
        typed_message: b"",
    };
    let hello = Event {
        name: "demo.Hello",
        path: "/hello/ada",
        data: json!({"name": "ada"}),
        typed: "/demo.v1.Basics/Hello",
        // `name = "ada"` (field 1).
        typed_message: b"\x0a\x03ada",
    };
    let viewer = token("vera", &["viewer"]);
    let admin = token("root", &["admin"]);
    // (event, caller, what every way in must come to).
    let table: [(&Event, Option<&str>, Outcome); 5] = [
        (&me, None, Outcome::Refused(401)),
        (&me, Some(&viewer), Outcome::Reached),
        (&hello, None, Outcome::Refused(401)),
        (&hello, Some(&viewer), Outcome::Refused(403)),
        (&hello, Some(&admin), Outcome::Reached),
    ];
    let mut wrong = Vec::new();
    for (event, caller, expected) in &table {
        for way in WAYS {
            let got = reach(&g, way, event, *caller).await;
            if got != *expected {
                wrong.push(format!(
                    "{} over {way:?} as {}: {got:?}, expected {expected:?}",
                    event.name,
                    if caller.is_some() { "a caller" } else { "anonymous" }
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    let _ = &g.tls;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_rate_limit_counts_each_message_and_call() {
    let config = r#"
[[managers]]
name = "basics"

[[rate_limit.limits]]
prefix = "/noop"
requests = 2
per_s = 3600
"#;
    let g = Group::builder("one-policy-rate").config(config).start();
    // One WebSocket session: its third message is over the limit.
    let mut session = ws(g.addr, None).await;
    let mut statuses = Vec::new();
    for id in 0..3 {
        let answer = ws_answer(&mut session, json!({"id": id, "type": "demo.Noop"})).await;
        statuses.push(answer["status"].as_u64().unwrap());
    }
    assert_eq!(statuses, [200, 200, 429]);
    // The bucket is the client's, whichever way it comes: gRPC and HTTP
    // are over it too.
    let mut client = EventsClient::new(channel(g.addr).await);
    let err = client
        .call(tonic::Request::new(CallRequest {
            r#type: "demo.Noop".into(),
            content_type: "application/json".into(),
            payload: b"{}".to_vec().into(),
            deadline_ms: 0,
        }))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    assert_eq!(get(g.addr, "/noop").unwrap().status, 429);
}

/// Subscribing counts against the limits on the types it matches, like
/// sending one (on `/ws`, gRPC `Subscribe` and a `Session`), so that a
/// client cannot open subscriptions without bound past a limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_rate_limit_counts_each_subscription() {
    let config = r#"
[[managers]]
name = "basics"

[[rate_limit.limits]]
event = "chat.*"
requests = 2
per_s = 3600
"#;
    let g = Group::builder("one-policy-rate-subs").config(config).start();
    let mut session = ws(g.addr, None).await;
    let mut statuses = Vec::new();
    for (id, pattern) in ["chat.said", "*", "chat.*"].iter().enumerate() {
        let answer = ws_answer(&mut session, json!({"id": id, "subscribe": pattern})).await;
        statuses.push(
            answer
                .get("subscribed")
                .map_or_else(|| answer["status"].as_u64().unwrap(), |_| 200),
        );
    }
    assert_eq!(statuses, [200, 200, 429]);
    // A pattern no limit concerns is not counted.
    let answer = ws_answer(&mut session, json!({"id": 9, "subscribe": "news.*"})).await;
    assert!(answer.get("subscribed").is_some(), "{answer}");
    // The client's bucket, whichever way it subscribes.
    let mut client = EventsClient::new(channel(g.addr).await);
    let err = client
        .subscribe(tonic::Request::new(SubscribeRequest {
            pattern: "chat.*".into(),
            filter_json: String::new(),
        }))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(ClientMessage {
        id: "1".into(),
        kind: Some(client_message::Kind::Subscribe(SubscribeRequest {
            pattern: "chat.said".into(),
            filter_json: String::new(),
        })),
    })
    .await
    .unwrap();
    let mut inbound = client
        .session(tonic::Request::new(tokio_stream_of(rx)))
        .await
        .unwrap()
        .into_inner();
    let reply = tokio::time::timeout(PATIENCE, inbound.message())
        .await
        .expect("in time")
        .unwrap()
        .expect("an answer");
    match reply.kind {
        Some(server_message::Kind::Error(e)) => assert_eq!(e.status, 429, "{e:?}"),
        other => panic!("expected 429, got {other:?}"),
    }
    drop(tx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_origin_websocket_upgrades_are_refused() {
    let config = r#"
[[managers]]
name = "basics"

[cors]
allow_origins = ["https://app.example"]
"#;
    let g = Group::builder("one-policy-origin").config(config).start();
    let upgrade = |origin: Option<String>| {
        let mut req = format!("ws://{}/ws", g.addr).into_client_request().unwrap();
        if let Some(o) = origin {
            req.headers_mut().insert("origin", o.parse().unwrap());
        }
        async move {
            match tokio::time::timeout(PATIENCE, tokio_tungstenite::connect_async(req))
                .await
                .expect("in time")
            {
                Ok((_, r)) => r.status().as_u16(),
                Err(tokio_tungstenite::tungstenite::Error::Http(r)) => r.status().as_u16(),
                Err(other) => panic!("{other}"),
            }
        }
    };
    assert_eq!(upgrade(Some("https://evil.example".into())).await, 403);
    assert_eq!(upgrade(Some("null".into())).await, 403);
    // Same host, another port: another origin.
    assert_eq!(
        upgrade(Some(format!("http://127.0.0.1:{}", g.addr.port() ^ 1))).await,
        403
    );
    assert_eq!(upgrade(Some(format!("http://{}", g.addr))).await, 101);
    assert_eq!(upgrade(Some("https://app.example".into())).await, 101);
    // Not a browser: no Origin, nothing to check.
    assert_eq!(upgrade(None).await, 101);

    // Over h2 (RFC 8441): the same check against `:authority`.
    let mut client = common::h2_stream::h2_ready(g.addr).await;
    for (origin, status) in [("https://evil.example", 403), ("http://localhost", 200)] {
        let mut req = http::Request::builder()
            .method(http::Method::CONNECT)
            .uri("http://localhost/ws")
            .header("sec-websocket-version", "13")
            .header("origin", origin)
            .body(())
            .unwrap();
        req.extensions_mut()
            .insert(h2::ext::Protocol::from_static("websocket"));
        let (response, _send) = client.send_request(req, false).unwrap();
        let response = tokio::time::timeout(PATIENCE, response).await.unwrap().unwrap();
        assert_eq!(response.status(), status, "{origin} over h2");
    }
}

#[test]
fn check_prints_what_each_rule_covers() {
    let dir = scratch_dir("one-policy-check");
    let file = dir.path().join("switchyard.toml");
    std::fs::write(&file, RULES).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["check", "-c"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let line = |i: usize| {
        text.lines()
            .find(|l| l.starts_with(&format!("auth.rules[{i}]")))
            .unwrap_or_else(|| panic!("no line for rule {i}: {text}"))
            .to_owned()
    };
    let me = line(0);
    assert!(me.contains("prefix /me") && me.contains("an identity"), "{me}");
    assert!(me.contains("WebSocket, gRPC") && me.contains("demo.Me"), "{me}");
    assert!(!me.contains("demo.Hello"), "{me}");
    let hello = line(1);
    assert!(
        hello.contains("a role of admin") && hello.contains("demo.Hello"),
        "{hello}"
    );
    assert!(
        !hello.contains("demo.Hi,") && !hello.contains("demo.Me"),
        "{hello}"
    );
    // And what each route requires, on each transport.
    let route = |start: &str| {
        text.lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no line for {start}: {text}"))
            .to_owned()
    };
    let me = route("route GET /me (demo.Me)");
    assert!(
        me.contains("an identity (auth.rules[0]) over HTTP")
            && me.contains("an identity (auth.rules[0]) over WebSocket"),
        "{me}"
    );
    let hello = route("route GET /hello/{name} (demo.Hello)");
    assert!(
        hello.contains("a role of admin (auth.rules[1]) over WebSocket"),
        "{hello}"
    );
    let noop = route("route GET /noop (demo.Noop)");
    assert!(noop.contains("nothing (no rule) over HTTP"), "{noop}");
}
