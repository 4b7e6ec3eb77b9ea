//! The router's port to other groups: two queues it owns, one of frames
//! it sends ([`ToRemote`]) and one of frames it takes ([`FromRemote`]).
//! Whatever sits at the far end (the NATS bridge in a group, an in-memory
//! peer in a test) is a link the router never names; the table decides
//! local or remote, the link only carries.

use std::collections::HashSet;
use std::time::Duration;

use switchyard_proto::EventType;
pub use switchyard_proto::remote::{FromRemote, MANIFEST_EXPIRY, Manifest, REMOTE_ID, ToRemote};
use tokio::sync::{mpsc, oneshot};

use crate::Shared;

/// The other groups, as the router is given them: its end of the port and
/// the types it sends there even when served here.
#[derive(Debug)]
pub struct Remote {
    /// The router's end of the port ([`port`]).
    pub port: Port,
    /// Event types sent to the other groups even when a local manager
    /// serves them (`cluster.shared`), while the link is up.
    pub shared: Vec<String>,
}

/// The router's end of the port.
#[derive(Debug)]
pub struct Port {
    to: mpsc::Sender<ToRemote>,
    from: mpsc::Receiver<FromRemote>,
}

/// The link's end of the port: what the link reads from the router and
/// where it writes to it.
#[derive(Debug)]
pub struct Link {
    pub from_router: mpsc::Receiver<ToRemote>,
    pub to_router: mpsc::Sender<FromRemote>,
}

/// A port whose queues hold `capacity` frames each way: a full queue
/// towards the link is an immediate 503 for the request that found it so,
/// never a wait under the table's lock.
pub fn port(capacity: usize) -> (Port, Link) {
    let (to, from_router) = mpsc::channel(capacity.max(1));
    let (to_router, from) = mpsc::channel(capacity.max(1));
    (
        Port { to, from },
        Link {
            from_router,
            to_router,
        },
    )
}

/// Attaches the link to the table and starts the task that applies what
/// it sends. The link comes up in its own time: until it says it is
/// connected, requests for other groups get 503.
pub(crate) fn attach(shared: &Shared, remote: Remote) {
    let Remote { port, shared: types } = remote;
    let types: HashSet<EventType> = types.iter().map(|n| EventType::of(n)).collect();
    shared.lock().set_cluster(port.to, types);
    let shared = shared.clone();
    let mut from = port.from;
    tokio::spawn(async move {
        let mut batch = Vec::with_capacity(64);
        while from.recv_many(&mut batch, 64).await > 0 {
            let mut table = shared.lock();
            for frame in batch.drain(..) {
                match frame {
                    FromRemote::Response(env) => table.complete(env, REMOTE_ID),
                    FromRemote::Request(env) => table.route_request(env),
                    FromRemote::Notification(env) => table.route_notification(env, Some(REMOTE_ID)),
                    FromRemote::Routes { group, manifest } => table.set_remote(group, manifest),
                    FromRemote::Left { group } => table.remote_left(&group),
                    FromRemote::Status(state) => table.set_cluster_link(state),
                }
            }
        }
    });
}

/// A clean stop: the link tells the other groups, which forget this one's
/// routes now rather than after [`MANIFEST_EXPIRY`]. Waits for the link to
/// say it is done, two seconds at most.
pub(crate) async fn leave(shared: &Shared) {
    let Some(to) = shared.lock().remote_port() else {
        return;
    };
    let (done, said) = oneshot::channel();
    let said = async move {
        if to.send(ToRemote::Leave(done)).await.is_ok() {
            let _ = said.await;
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), said).await;
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::{Arc, Mutex};

    use bytes::Bytes;
    use switchyard_proto::control::{HandledType, LinkState, ManagerDescription};
    use switchyard_proto::transport::{FrameReader, spawn_writer};
    use switchyard_proto::{Envelope, Kind, Origin};
    use tokio::net::UnixStream;
    use tokio::time::timeout;

    use super::*;
    use crate::table::Table;
    use crate::{Config, Shared};

    const WAIT: Duration = Duration::from_secs(10);

    /// A frame sink whose frames the test reads on the other end.
    fn sink() -> (switchyard_proto::transport::FrameSink, FrameReader<UnixStream>) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let (sink, _writer) = spawn_writer(ours, 64, switchyard_proto::DEFAULT_MAX_FRAME);
        (
            sink,
            FrameReader::new(theirs, switchyard_proto::DEFAULT_MAX_FRAME),
        )
    }

    /// The next request or response on `reader`, past route tables.
    async fn next_event(reader: &mut FrameReader<UnixStream>) -> Envelope {
        loop {
            let env = timeout(WAIT, reader.next()).await.unwrap().unwrap().unwrap();
            if env.kind != Kind::Control {
                return env;
            }
        }
    }

    /// The next request for the other groups, past manifests.
    async fn next_remote(link: &mut Link) -> Envelope {
        loop {
            match timeout(WAIT, link.from_router.recv()).await.unwrap().unwrap() {
                ToRemote::Request(env) => return env,
                ToRemote::Local(_) => {}
                other => panic!("unexpected frame for the link: {other:?}"),
            }
        }
    }

    /// Waits until the table has applied what the peer sent.
    async fn until(shared: &Shared, what: impl Fn(&Table) -> bool) {
        timeout(WAIT, async {
            while !what(&shared.lock()) {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the table never applied the link's frames");
    }

    fn request(ty: &str, correlation: u64) -> Envelope {
        let mut env = Envelope::request(EventType::of(ty), correlation, Bytes::new());
        env.origin = Origin::Pipe(1);
        env
    }

    /// Local first, the other groups for what no local manager serves, a
    /// 503 while the link is down, and nothing from the link sent back to
    /// it: the routing decisions, with an in-memory peer at the port's far
    /// end instead of NATS.
    #[tokio::test]
    async fn routes_local_first_then_through_the_port() {
        let (port, mut link) = port(16);
        let shared = Shared {
            table: Arc::new(Mutex::new(Table::new(vec!["here".into()], 8))),
            config: Arc::new(Config {
                broker_socket: PathBuf::from("/nonexistent"),
                declared_managers: vec!["here".into()],
                max_frame: switchyard_proto::DEFAULT_MAX_FRAME,
                queue_capacity: 64,
                max_outstanding: 8,
                remote: None,
                roster: None,
            }),
        };
        let (broker, mut answers) = sink();
        shared.lock().set_broker(Some(broker));
        let (manager, mut served) = sink();
        let description = ManagerDescription {
            name: "here".into(),
            pid: 1,
            handles: vec![HandledType {
                name: "t.Local".into(),
                event_type: EventType::of("t.Local"),
                route: None,
                needs: Default::default(),
                public: true,
            }],
            subscribes: vec![],
            notifications: vec![],
        };
        shared.lock().add_instance(description, manager).unwrap();
        attach(&shared, Remote { port, shared: vec![] });

        // The link is not up yet: a type only another group serves is 503.
        let far = Manifest {
            serves: [EventType::of("t.Far"), EventType::of("t.Local")].into(),
            ..Manifest::default()
        };
        link.to_router
            .send(FromRemote::Routes {
                group: "g1".into(),
                manifest: far,
            })
            .await
            .unwrap();
        until(&shared, |t| t.remote_link().is_some_and(|l| l.peers == 1)).await;
        shared.lock().route_request(request("t.Far", 1));
        let refused = next_event(&mut answers).await;
        assert_eq!((refused.correlation, refused.status), (1, 503));

        link.to_router
            .send(FromRemote::Status(LinkState::Connected))
            .await
            .unwrap();
        until(&shared, |t| {
            t.remote_link().is_some_and(|l| l.state == LinkState::Connected)
        })
        .await;

        // Served here and by the other group: here.
        shared.lock().route_request(request("t.Local", 2));
        assert_eq!(next_event(&mut served).await.correlation, 2);
        // Served only there: through the port, and its answer comes back
        // to the caller.
        shared.lock().route_request(request("t.Far", 3));
        let sent = next_remote(&mut link).await;
        assert_eq!(sent.correlation, 3);
        let answer = Envelope::response_to(&sent, 200, Default::default(), Bytes::from_static(b"far"));
        link.to_router.send(FromRemote::Response(answer)).await.unwrap();
        let got = next_event(&mut answers).await;
        assert_eq!((got.correlation, got.status), (3, 200));

        // A call from another group for a type no manager here serves is
        // never sent back to the link.
        let mut looped = request("t.Far", 4);
        looped.origin = Origin::Manager(REMOTE_ID);
        link.to_router.send(FromRemote::Request(looped)).await.unwrap();
        let back = loop {
            match timeout(WAIT, link.from_router.recv()).await.unwrap().unwrap() {
                ToRemote::Response(env) => break env,
                ToRemote::Local(_) => {}
                other => panic!("a call from the link went back to it: {other:?}"),
            }
        };
        assert_eq!(back.correlation, 4);
        assert_ne!(back.status, 200);
    }
}
