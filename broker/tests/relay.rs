//! The broker as a black box: fake listener pipes and a fake router on real
//! Unix sockets.

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use switchyard_proto::control::{Control, RouteTable};
use switchyard_proto::link;
use switchyard_proto::transport::{FrameReader, FrameSink};
use switchyard_proto::{DEFAULT_MAX_FRAME, Envelope, EventType, Kind, Origin};
use tokio::io::AsyncWriteExt;
use tokio::net::unix::OwnedReadHalf;
use tokio::net::{UnixListener, UnixStream};

const PATIENCE: Duration = Duration::from_secs(20);

struct Peer {
    reader: FrameReader<OwnedReadHalf>,
    sink: FrameSink,
}

impl Peer {
    async fn connect(path: &PathBuf, hello: Control) -> Peer {
        let stream = UnixStream::connect(path).await.unwrap();
        let (reader, sink) = link::open(stream, 1024, DEFAULT_MAX_FRAME).await.unwrap();
        sink.send_wait(Envelope::control(&hello).unwrap()).await.unwrap();
        Peer { reader, sink }
    }

    async fn next(&mut self) -> Envelope {
        tokio::time::timeout(PATIENCE, self.reader.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
    }

    async fn control(&mut self) -> Control {
        let env = self.next().await;
        assert_eq!(env.kind, Kind::Control);
        env.decode_control().unwrap()
    }
}

async fn broker() -> (PathBuf, PathBuf) {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "sy-broker-{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("broker.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let (ready, _) = tokio::sync::oneshot::channel();
    tokio::spawn(switchyard_broker::run(
        listener,
        switchyard_broker::Config::default(),
        ready,
        std::future::pending(),
    ));
    (dir, path)
}

#[tokio::test]
async fn relays_requests_responses_and_route_tables() {
    let (dir, path) = broker().await;
    let mut pipe = Peer::connect(&path, Control::HelloPipe { pid: 1, index: 0 }).await;
    assert!(matches!(pipe.control().await, Control::Welcome { .. }));
    // No router yet: the pipe is told, and a request is refused at once.
    assert_eq!(pipe.control().await, Control::RouterLost);
    pipe.sink
        .send(Envelope::request(EventType::of("t"), 1, Bytes::new()))
        .unwrap();
    let refused = pipe.next().await;
    assert_eq!(
        (refused.kind, refused.status, refused.correlation),
        (Kind::Response, 503, 1)
    );

    let mut router = Peer::connect(&path, Control::HelloRouter { pid: 2 }).await;
    let table = RouteTable {
        version: 1,
        ..Default::default()
    };
    router
        .sink
        .send(Envelope::control(&Control::RouteTable(table.clone())).unwrap())
        .unwrap();
    assert_eq!(pipe.control().await, Control::RouteTable(table));

    pipe.sink
        .send(Envelope::request(
            EventType::of("t"),
            2,
            Bytes::from_static(b"in"),
        ))
        .unwrap();
    let forwarded = router.next().await;
    assert_eq!(forwarded.correlation, 2);
    assert!(
        matches!(forwarded.origin, Origin::Pipe(_)),
        "stamped with the pipe"
    );
    router
        .sink
        .send(Envelope::response_to(
            &forwarded,
            200,
            Default::default(),
            Bytes::from_static(b"out"),
        ))
        .unwrap();
    let back = pipe.next().await;
    assert_eq!((back.status, back.correlation), (200, 2));
    assert_eq!(back.payload.inline().unwrap().as_ref(), b"out");

    // The router goes away: every pipe hears of it at once.
    drop(router);
    assert_eq!(pipe.control().await, Control::RouterLost);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn garbage_closes_only_the_offending_connection() {
    let (dir, path) = broker().await;
    let mut bad = UnixStream::connect(&path).await.unwrap();
    bad.write_all(b"\x08\x00\x00\x00\xff\xff\xff\xffgarbage")
        .await
        .unwrap();
    let mut router = Peer::connect(&path, Control::HelloRouter { pid: 2 }).await;
    let table = RouteTable {
        version: 7,
        ..Default::default()
    };
    router
        .sink
        .send(Envelope::control(&Control::RouteTable(table.clone())).unwrap())
        .unwrap();
    let mut pipe = Peer::connect(&path, Control::HelloPipe { pid: 1, index: 0 }).await;
    assert!(matches!(pipe.control().await, Control::Welcome { .. }));
    // The table comes from the router's connection: once the pipe has it,
    // the router is registered.
    while pipe.control().await != Control::RouteTable(table.clone()) {}
    pipe.sink
        .send(Envelope::request(EventType::of("t"), 3, Bytes::new()))
        .unwrap();
    let forwarded = router.next().await;
    assert_eq!(forwarded.correlation, 3);
    let _ = std::fs::remove_dir_all(dir);
}

/// With a roster, a hello is taken only from the role the supervisor gave
/// the connecting pid (decision 0100): this test process is a listener,
/// so its `HelloRouter` is refused and its pipe welcomed, until the
/// supervisor makes it the router.
#[tokio::test]
async fn a_hello_is_taken_only_from_the_role_the_roster_gives_the_pid() {
    use switchyard_proto::control::{GroupRole, Member, Roster};
    let dir = std::env::temp_dir().join(format!("sy-broker-roster-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("broker.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let roster = |role| {
        Some(Roster {
            version: 1,
            members: vec![Member {
                pid: std::process::id(),
                role,
                name: "listener".into(),
                fires_jobs: false,
            }],
        })
    };
    let (rosters, watch) = tokio::sync::watch::channel(roster(GroupRole::Listener));
    let config = switchyard_broker::Config {
        roster: Some(watch),
        ..Default::default()
    };
    let (ready, _) = tokio::sync::oneshot::channel();
    tokio::spawn(switchyard_broker::run(
        listener,
        config,
        ready,
        std::future::pending(),
    ));

    // Whatever pid the hello names, the kernel's is the one checked.
    let mut router = Peer::connect(&path, Control::HelloRouter { pid: 1 }).await;
    let closed = tokio::time::timeout(PATIENCE, router.reader.next())
        .await
        .unwrap();
    assert!(matches!(closed, Ok(None) | Err(_)), "refused: {closed:?}");

    let mut pipe = Peer::connect(&path, Control::HelloPipe { pid: 1, index: 0 }).await;
    assert!(matches!(pipe.control().await, Control::Welcome { .. }));

    // The supervisor makes this process the router: now it may say so.
    rosters.send_replace(roster(GroupRole::Router));
    let router = Peer::connect(&path, Control::HelloRouter { pid: 1 }).await;
    // Taken: the pipe hears the router is back with the next route table.
    router
        .sink
        .send(Envelope::control(&Control::RouteTable(RouteTable::default())).unwrap())
        .unwrap();
    loop {
        if let Control::RouteTable(_) = pipe.control().await {
            break;
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
