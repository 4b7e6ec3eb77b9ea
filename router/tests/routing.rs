//! The router as a black box: a fake broker and fake managers on real Unix
//! sockets, speaking the real frames.

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use switchyard_proto::control::{Control, HandledType, META_EVENT, ManagerDescription, RouteTable};
use switchyard_proto::link;
use switchyard_proto::transport::{FrameReader, FrameSink};
use switchyard_proto::{DEFAULT_MAX_FRAME, Deadline, Envelope, EventType, Kind, Origin};
use tokio::io::AsyncWriteExt;
use tokio::net::unix::OwnedReadHalf;
use tokio::net::{UnixListener, UnixStream};

const PATIENCE: Duration = Duration::from_secs(20);

struct Peer {
    reader: FrameReader<OwnedReadHalf>,
    sink: FrameSink,
}

impl Peer {
    /// Opens the link as the router's peers do (the process's transport).
    async fn new(stream: UnixStream) -> Peer {
        let (reader, sink) = link::open(stream, 1024, DEFAULT_MAX_FRAME).await.unwrap();
        Peer { reader, sink }
    }

    /// The next frame that is not a route-table announcement.
    async fn next(&mut self) -> Envelope {
        loop {
            let env = tokio::time::timeout(PATIENCE, self.reader.next())
                .await
                .expect("frame in time")
                .expect("readable")
                .expect("not closed");
            if env.kind == Kind::Control
                && let Ok(Control::RouteTable(_)) = env.decode_control()
            {
                continue;
            }
            return env;
        }
    }

    /// Waits for a route table satisfying `pred`.
    async fn table(&mut self, pred: impl Fn(&RouteTable) -> bool) -> RouteTable {
        loop {
            let env = tokio::time::timeout(PATIENCE, self.reader.next())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            if let Ok(Control::RouteTable(t)) = env.decode_control()
                && pred(&t)
            {
                return t;
            }
        }
    }
}

struct Rig {
    dir: PathBuf,
    broker: Peer,
}

impl Drop for Rig {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn unique_dir() -> PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "sy-router-{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn rig(declared: &[&str]) -> Rig {
    let dir = unique_dir();
    let broker_socket = dir.join("broker.sock");
    let broker_listener = UnixListener::bind(&broker_socket).unwrap();
    let router_listener = UnixListener::bind(dir.join("router.sock")).unwrap();
    let config = switchyard_router::Config {
        broker_socket,
        declared_managers: declared.iter().map(|s| s.to_string()).collect(),
        max_frame: DEFAULT_MAX_FRAME,
        queue_capacity: 1024,
        max_outstanding: 2,
        remote: None,
        roster: None,
    };
    let (ready, _) = tokio::sync::oneshot::channel();
    tokio::spawn(switchyard_router::run(
        router_listener,
        config,
        ready,
        std::future::pending(),
    ));
    let (stream, _) = broker_listener.accept().await.unwrap();
    let mut broker = Peer::new(stream).await;
    match broker
        .reader
        .next()
        .await
        .unwrap()
        .unwrap()
        .decode_control()
        .unwrap()
    {
        Control::HelloRouter { .. } => {}
        other => panic!("expected router hello, got {other:?}"),
    }
    Rig { dir, broker }
}

async fn manager(rig: &Rig, name: &str, handles: &[&str], subscribes: &[&str]) -> Peer {
    let stream = UnixStream::connect(rig.dir.join("router.sock")).await.unwrap();
    let mut peer = Peer::new(stream).await;
    let description = ManagerDescription {
        name: name.into(),
        pid: std::process::id(),
        handles: handles
            .iter()
            .map(|h| HandledType {
                name: h.to_string(),
                event_type: EventType::of(h),
                route: None,
                needs: Default::default(),
                public: true,
            })
            .collect(),
        subscribes: subscribes.iter().map(|s| EventType::of(s)).collect(),
        notifications: Vec::new(),
    };
    peer.sink
        .send_wait(Envelope::control(&Control::HelloManager(description)).unwrap())
        .await
        .unwrap();
    match peer.next().await.decode_control().unwrap() {
        Control::Welcome { .. } => peer,
        other => panic!("expected welcome, got {other:?}"),
    }
}

fn request(ty: &str, correlation: u64, pipe: u64) -> Envelope {
    let mut env = Envelope::request(EventType::of(ty), correlation, Bytes::from_static(b"body"));
    env.origin = Origin::Pipe(pipe);
    env
}

#[tokio::test]
async fn requests_reach_the_manager_and_responses_return_by_origin() {
    let mut rig = rig(&["m"]).await;
    let mut m = manager(&rig, "m", &["t.A"], &[]).await;
    rig.broker.table(|t| t.all_up()).await;
    rig.broker.sink.send(request("t.A", 7, 3)).unwrap();
    let got = m.next().await;
    assert_eq!(
        (got.kind, got.correlation, got.origin),
        (Kind::Request, 7, Origin::Pipe(3))
    );
    assert_eq!(got.payload.inline().unwrap().as_ref(), b"body");
    m.sink
        .send(Envelope::response_to(
            &got,
            200,
            Default::default(),
            Bytes::from_static(b"ok"),
        ))
        .unwrap();
    let back = rig.broker.next().await;
    assert_eq!(
        (back.kind, back.status, back.correlation, back.origin),
        (Kind::Response, 200, 7, Origin::Pipe(3))
    );
}

#[tokio::test]
async fn unrouted_requests_are_answered_at_once() {
    let mut rig = rig(&[]).await;
    rig.broker.sink.send(request("t.Nobody", 1, 1)).unwrap();
    assert_eq!(rig.broker.next().await.status, 503);
    // A manager asking for a type nobody ever served: 404.
    let mut m = manager(&rig, "m", &["t.A"], &[]).await;
    let mut call = Envelope::request(EventType::of("t.Nobody"), 5, Bytes::new());
    call.origin = Origin::Unset;
    m.sink.send(call).unwrap();
    let answer = m.next().await;
    assert_eq!((answer.status, answer.correlation), (404, 5));
    // Its name is nowhere to be had: the id stands in.
    let id = format!("{:#x}", EventType::of("t.Nobody").0);
    assert_eq!(detail(&answer), format!("no manager declares event type {id}"));
}

/// A request from a client that named its type (meta `event`): a
/// WebSocket or gRPC call through the listener.
fn named_request(ty: &str, correlation: u64) -> Envelope {
    let mut env = request(ty, correlation, 1);
    env.meta.push(META_EVENT, ty);
    env
}

/// The problem+json detail of an error answer.
fn detail(answer: &Envelope) -> String {
    let body: serde_json::Value = serde_json::from_slice(answer.payload.inline().unwrap()).unwrap();
    body["detail"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_named_type_nobody_declares_is_404_by_its_name() {
    let mut rig = rig(&["m"]).await;
    // `m` has not registered yet: it may be the one that serves the type.
    rig.broker.sink.send(named_request("t.Nobody", 1)).unwrap();
    let early = rig.broker.next().await;
    assert_eq!(early.status, 503, "{}", detail(&early));
    assert!(
        detail(&early).contains("manager `m` has not started yet"),
        "{}",
        detail(&early)
    );

    let m = manager(&rig, "m", &["t.A"], &[]).await;
    rig.broker.sink.send(named_request("t.Nobody", 2)).unwrap();
    let answer = rig.broker.next().await;
    assert_eq!((answer.status, answer.correlation), (404, 2));
    assert_eq!(detail(&answer), "no manager declares event type `t.Nobody`");

    // Declared, but every instance down: still 503.
    drop(m);
    rig.broker.table(|t| !t.all_up()).await;
    rig.broker.sink.send(named_request("t.A", 3)).unwrap();
    let down = rig.broker.next().await;
    assert_eq!(
        (down.status, detail(&down).as_str()),
        (503, "manager `m` is not running")
    );

    // A name that is not the type's is refused: rules are written on
    // names, routing is by id, and the two must agree.
    let mut forged = request("t.Nobody", 4, 1);
    forged.meta.push(META_EVENT, "t.Other");
    rig.broker.sink.send(forged).unwrap();
    let misnamed = rig.broker.next().await;
    assert_eq!(misnamed.status, 400, "{}", detail(&misnamed));
    assert_eq!(
        detail(&misnamed),
        "event type `t.Other` does not match the type id it was sent with"
    );
}

#[tokio::test]
async fn a_disconnecting_manager_fails_its_requests_with_503() {
    let mut rig = rig(&["m"]).await;
    let mut m = manager(&rig, "m", &["t.A"], &[]).await;
    rig.broker.sink.send(request("t.A", 1, 9)).unwrap();
    let _ = m.next().await;
    drop(m);
    let answer = rig.broker.next().await;
    assert_eq!(
        (answer.status, answer.correlation, answer.origin),
        (503, 1, Origin::Pipe(9))
    );
    // Known type, manager gone: 503, not 404.
    rig.broker.sink.send(request("t.A", 2, 9)).unwrap();
    assert_eq!(rig.broker.next().await.status, 503);
}

#[tokio::test]
async fn least_outstanding_spreads_requests_and_capacity_is_bounded() {
    let mut rig = rig(&["m"]).await;
    let mut a = manager(&rig, "m", &["t.A"], &[]).await;
    let mut b = manager(&rig, "m", &["t.A"], &[]).await;
    for c in 1..=4 {
        rig.broker.sink.send(request("t.A", c, 1)).unwrap();
    }
    // Two each (max_outstanding = 2), never three on one.
    let mut seen = vec![a.next().await.correlation, a.next().await.correlation];
    seen.push(b.next().await.correlation);
    seen.push(b.next().await.correlation);
    seen.sort_unstable();
    assert_eq!(seen, [1, 2, 3, 4]);
    // Both at capacity: 503 with Retry-After.
    rig.broker.sink.send(request("t.A", 5, 1)).unwrap();
    let busy = rig.broker.next().await;
    assert_eq!((busy.status, busy.correlation), (503, 5));
    assert_eq!(busy.meta.get("retry-after"), Some("1"));
}

#[tokio::test]
async fn expired_deadlines_get_504() {
    let mut rig = rig(&["m"]).await;
    let mut m = manager(&rig, "m", &["t.A"], &[]).await;
    let mut env = request("t.A", 11, 2);
    env.deadline = Deadline::after(Duration::from_millis(50));
    rig.broker.sink.send(env).unwrap();
    let got = m.next().await;
    let answer = rig.broker.next().await;
    assert_eq!((answer.status, answer.correlation), (504, 11));
    // The manager is told to stop working on it.
    let cancel = m.next().await;
    assert_eq!(cancel.decode_control().unwrap(), Control::Cancel);
    assert_eq!((cancel.correlation, cancel.origin), (11, Origin::Pipe(2)));
    // The manager's late answer is dropped, not delivered twice.
    m.sink
        .send(Envelope::response_to(&got, 200, Default::default(), Bytes::new()))
        .unwrap();
    rig.broker.sink.send(request("t.A", 12, 2)).unwrap();
    let next = m.next().await;
    m.sink
        .send(Envelope::response_to(
            &next,
            200,
            Default::default(),
            Bytes::new(),
        ))
        .unwrap();
    assert_eq!(rig.broker.next().await.correlation, 12);
}

#[tokio::test]
async fn notifications_reach_every_subscriber_but_the_sender() {
    let rig = rig(&[]).await;
    let mut sender = manager(&rig, "s", &[], &["t.Event"]).await;
    let mut x = manager(&rig, "x", &[], &["t.Event"]).await;
    let mut y = manager(&rig, "y", &[], &["t.Event"]).await;
    sender
        .sink
        .send(Envelope::notification(
            EventType::of("t.Event"),
            Bytes::from_static(b"n"),
        ))
        .unwrap();
    assert_eq!(x.next().await.kind, Kind::Notification);
    assert_eq!(y.next().await.kind, Kind::Notification);
    let nothing = tokio::time::timeout(Duration::from_millis(100), sender.reader.next()).await;
    assert!(nothing.is_err(), "the sender does not get its own notification");
}

#[tokio::test]
async fn a_garbage_frame_closes_only_that_connection() {
    let mut rig = rig(&["m"]).await;
    let mut bad = UnixStream::connect(rig.dir.join("router.sock")).await.unwrap();
    bad.write_all(&[0xff, 0xff, 0xff, 0x7f, 1, 2, 3]).await.unwrap();
    let mut m = manager(&rig, "m", &["t.A"], &[]).await;
    rig.broker.sink.send(request("t.A", 1, 1)).unwrap();
    let got = m.next().await;
    m.sink
        .send(Envelope::response_to(&got, 200, Default::default(), Bytes::new()))
        .unwrap();
    assert_eq!(rig.broker.next().await.status, 200);
}

/// A cancel as the broker passes it on: stamped with the pipe.
fn cancel(correlation: u64, pipe: u64) -> Envelope {
    Control::cancel(Origin::Pipe(pipe), correlation).unwrap()
}

#[tokio::test]
async fn a_cancelled_request_is_forgotten_and_its_instance_told() {
    let mut rig = rig(&["m"]).await;
    let mut m = manager(&rig, "m", &["t.A"], &[]).await;
    rig.broker.table(|t| t.all_up()).await;
    // At capacity (max_outstanding = 2).
    rig.broker.sink.send(request("t.A", 1, 4)).unwrap();
    rig.broker.sink.send(request("t.A", 2, 4)).unwrap();
    let first = m.next().await;
    let _ = m.next().await;

    rig.broker.sink.send(cancel(1, 4)).unwrap();
    let told = m.next().await;
    assert_eq!(told.decode_control().unwrap(), Control::Cancel);
    assert_eq!((told.correlation, told.origin), (1, Origin::Pipe(4)));

    // It no longer counts against the instance: a third request goes in.
    rig.broker.sink.send(request("t.A", 3, 4)).unwrap();
    assert_eq!(m.next().await.correlation, 3);
    // Its late answer is dropped; a cancel of another pipe's request, or
    // of an unknown one, changes nothing.
    m.sink
        .send(Envelope::response_to(
            &first,
            200,
            Default::default(),
            Bytes::new(),
        ))
        .unwrap();
    rig.broker.sink.send(cancel(2, 5)).unwrap();
    rig.broker.sink.send(cancel(99, 4)).unwrap();
    let second = request("t.A", 2, 4);
    m.sink
        .send(Envelope::response_to(
            &second,
            200,
            Default::default(),
            Bytes::new(),
        ))
        .unwrap();
    let answer = rig.broker.next().await;
    assert_eq!((answer.status, answer.correlation), (200, 2));
}

#[tokio::test]
async fn a_manager_cancels_its_own_calls_only() {
    let rig = rig(&["m", "n"]).await;
    let caller = manager(&rig, "m", &[], &[]).await;
    let mut callee = manager(&rig, "n", &["t.B"], &[]).await;
    caller
        .sink
        .send(Envelope::request(EventType::of("t.B"), 8, Bytes::new()))
        .unwrap();
    let call = callee.next().await;
    assert!(matches!(call.origin, Origin::Manager(_)));
    // Whatever origin it claims, the router stamps the caller's.
    caller
        .sink
        .send(Control::cancel(Origin::Pipe(1), 8).unwrap())
        .unwrap();
    let told = callee.next().await;
    assert_eq!(told.decode_control().unwrap(), Control::Cancel);
    assert_eq!((told.correlation, told.origin), (8, call.origin));
}

/// What a manager cannot do whoever it says it is (decision 0100): answer
/// a request another instance holds, declare another manager's type, or
/// put listener-only context on its calls.
#[tokio::test]
async fn a_manager_answers_only_its_own_requests_declares_only_its_own_types_and_sets_no_client_context() {
    let mut rig = rig(&["m", "n"]).await;
    let mut m = manager(&rig, "m", &["t.A"], &[]).await;
    let mut n = manager(&rig, "n", &["t.B"], &[]).await;
    rig.broker.table(|t| t.all_up()).await;

    // `n` answers the request `m` holds: dropped; `m`'s answer goes out.
    rig.broker.sink.send(request("t.A", 11, 3)).unwrap();
    let held = m.next().await;
    let forged = Envelope::response_to(&held, 200, Default::default(), Bytes::from_static(b"forged"));
    n.sink.send(forged).unwrap();
    let real = Envelope::response_to(&held, 200, Default::default(), Bytes::from_static(b"real"));
    m.sink.send(real).unwrap();
    let back = rig.broker.next().await;
    assert_eq!(back.correlation, 11);
    assert_eq!(back.payload.inline().unwrap().as_ref(), b"real");

    // Another instance under `n`'s name declaring `m`'s type: refused
    // (the connection closes without a welcome).
    let stream = UnixStream::connect(rig.dir.join("router.sock")).await.unwrap();
    let mut thief = Peer::new(stream).await;
    let description = ManagerDescription {
        name: "n".into(),
        pid: std::process::id(),
        handles: vec![HandledType {
            name: "t.A".into(),
            event_type: EventType::of("t.A"),
            route: None,
            needs: Default::default(),
            public: false,
        }],
        subscribes: Vec::new(),
        notifications: Vec::new(),
    };
    thief
        .sink
        .send_wait(Envelope::control(&Control::HelloManager(description)).unwrap())
        .await
        .unwrap();
    let closed = tokio::time::timeout(PATIENCE, thief.reader.next()).await.unwrap();
    assert!(
        matches!(closed, Ok(None) | Err(_)),
        "refused, not welcomed: {closed:?}"
    );

    // `m` calls `t.B` with a verified-looking identity and client address:
    // `n` gets the request without them, its request id kept.
    let mut call = Envelope::request(EventType::of("t.B"), 5, Bytes::new());
    call.meta
        .push(":identity", r#"{"sub":"admin","method":"jwt","claims":{}}"#);
    call.meta.push(":client", "203.0.113.9");
    // Another manager's name, to reach its Store keys (decision 0114).
    call.meta.push(":manager", "n");
    // A stale meta key of the request id is stripped like any other; the
    // id travels in the typed context, which grants nothing (decision 0146).
    call.meta.push(":request-id", "forged");
    call.context.request_id = switchyard_proto::RequestId::given(b"req-1");
    call.meta.push("content-type", "application/json");
    m.sink.send(call).unwrap();
    let got = n.next().await;
    let keys: Vec<&str> = got.meta.0.iter().map(|(k, _)| k.as_str()).collect();
    // The router names the caller itself, after stripping its claims.
    assert_eq!(keys, ["content-type", ":manager"]);
    assert_eq!(got.meta.get(":manager"), Some("m"));
    assert_eq!(
        got.context.request_id.map(|id| id.to_string()).as_deref(),
        Some("req-1")
    );
}
