//! The `routing` scenario: raw router round trips, no HTTP. The real router
//! (`switchyard_router::run`) serves on its own current-thread runtime and
//! thread, as it does in its own process; two fake managers, each on a
//! current-thread runtime and thread of its own like a real manager process,
//! speak the real frames over real Unix sockets. The caller (handling
//! `bench.A`) keeps a fixed window of `bench.B` requests outstanding, the
//! responder (handling `bench.B`) answers each one, and every answer lets the
//! caller send the next request: a closed loop whose rate is the router's
//! round trips per second at that depth.

use std::collections::HashMap;
use std::future::Future;
use std::path::Path;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use hdrhistogram::Histogram;
use switchyard_proto::control::{Control, HandledType, ManagerDescription};
use switchyard_proto::link;
use switchyard_proto::transport::{FrameReader, FrameSink};
use switchyard_proto::{DEFAULT_MAX_FRAME, Envelope, EventType, Kind, Meta};
use tokio::net::UnixStream;
use tokio::net::unix::OwnedReadHalf;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::tmp::scratch;

/// Router round trips per second the raw routing rig must reach (the
/// Python system: 12–18 k).
pub const TARGET_ROUND_TRIPS: f64 = 300_000.0;

/// Longest wait for any one step of the rig (a hello, a batch of answers)
/// before the run is declared stuck: far above any healthy round trip.
const PATIENCE: Duration = Duration::from_secs(10);

/// The group's defaults (`[group]` in docs/configuration.md), so that the
/// router runs as it does in `switchyard up`.
const QUEUE_CAPACITY: usize = 16 * 1024;
const MAX_OUTSTANDING: u32 = 4096;

/// Small bodies, as a typical event between managers.
const PING: &[u8] = b"{\"seq\":1,\"note\":\"ping\"}";
const PONG: &[u8] = b"{\"ok\":true}";

const CALLER: &str = "bench-caller";
const RESPONDER: &str = "bench-responder";
const CALLED_TYPE: &str = "bench.B";

/// What one measurement found.
#[derive(Clone, Debug, PartialEq)]
pub struct RoutingRun {
    /// Requests kept outstanding.
    pub window: usize,
    /// Round trips completed inside the measured window.
    pub round_trips: u64,
    /// Length of the measured window.
    pub seconds: f64,
    /// Round-trip latency percentiles, as the caller saw them.
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
}

impl RoutingRun {
    pub fn per_second(&self) -> f64 {
        self.round_trips as f64 / self.seconds
    }
}

/// Runs a router with a caller and a responder, keeps `window` requests in
/// flight for `warmup` unrecorded and then `duration` recorded, and tears
/// everything down again.
pub fn measure(window: usize, warmup: Duration, duration: Duration) -> anyhow::Result<RoutingRun> {
    anyhow::ensure!(
        (1..=MAX_OUTSTANDING as usize).contains(&window),
        "the window must be between 1 and {MAX_OUTSTANDING}"
    );
    let dir = scratch("routing")?;
    let router_socket = dir.path().join("router.sock");
    let (router, stop_router) = start_router(dir.path())?;

    let (registered, responder_registered) = oneshot::channel();
    let (stop_responder, responder_stop) = oneshot::channel::<()>();
    let socket = router_socket.clone();
    let responder = on_own_runtime("fake-responder", async move {
        responder(&socket, registered, responder_stop).await
    })?;
    let socket = router_socket;
    let caller = on_own_runtime("fake-caller", async move {
        caller(&socket, responder_registered, window, warmup, duration).await
    })?;

    let measured = join(caller);
    // Stopped in any case, so that a failed caller does not leave threads behind.
    let _ = stop_responder.send(());
    let answered = join(responder);
    let _ = stop_router.send(());
    let routed = join(router);
    let run = measured?;
    answered.context("the responder failed")?;
    routed.context("the router failed")?;
    Ok(run)
}

/// The real router on its own thread, with a fake broker that drains what
/// the router tells it (route tables): without a broker the router would
/// keep reconnecting, which a router in a group never does.
fn start_router(dir: &Path) -> anyhow::Result<(JoinHandle<anyhow::Result<()>>, oneshot::Sender<()>)> {
    // Bound here, before any thread starts, so that the managers' connects
    // cannot race the router's bind.
    let bind = |name: &str| -> anyhow::Result<std::os::unix::net::UnixListener> {
        let path = dir.join(name);
        let listener = std::os::unix::net::UnixListener::bind(&path)
            .with_context(|| format!("cannot bind {}", path.display()))?;
        listener.set_nonblocking(true)?;
        Ok(listener)
    };
    let broker = bind("broker.sock")?;
    let router = bind("router.sock")?;
    let config = switchyard_router::Config {
        broker_socket: dir.join("broker.sock"),
        declared_managers: vec![CALLER.to_owned(), RESPONDER.to_owned()],
        max_frame: DEFAULT_MAX_FRAME,
        queue_capacity: QUEUE_CAPACITY,
        max_outstanding: MAX_OUTSTANDING,
        remote: None,
        roster: None,
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let thread = on_own_runtime("router", async move {
        let broker = tokio::net::UnixListener::from_std(broker)?;
        tokio::spawn(async move {
            if let Ok((stream, _)) = broker.accept().await
                && let Ok((mut reader, _sink)) = link::open(stream, QUEUE_CAPACITY, DEFAULT_MAX_FRAME).await
            {
                let mut batch = Vec::new();
                while let Ok(true) = reader.read_batch(&mut batch).await {
                    batch.clear();
                }
            }
        });
        let router = tokio::net::UnixListener::from_std(router)?;
        // Readiness means "connected to the broker", which the managers do not need.
        let (ready, _) = oneshot::channel();
        switchyard_router::run(router, config, ready, async {
            let _ = stopped.await;
            switchyard_proto::supervision::Stop::Now
        })
        .await?;
        Ok(())
    })?;
    Ok((thread, stop))
}

/// Runs `task` on a current-thread runtime of its own, on a thread of its own.
fn on_own_runtime<T: Send + 'static>(
    name: &str,
    task: impl Future<Output = anyhow::Result<T>> + Send + 'static,
) -> anyhow::Result<JoinHandle<anyhow::Result<T>>> {
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("cannot build a tokio runtime")?;
            runtime.block_on(task)
        })
        .with_context(|| format!("cannot start the {name} thread"))
}

fn join<T>(thread: JoinHandle<anyhow::Result<T>>) -> anyhow::Result<T> {
    thread
        .join()
        .map_err(|_| anyhow::anyhow!("a rig thread panicked"))?
}

/// A fake manager's connection to the router.
struct Link {
    reader: FrameReader<OwnedReadHalf>,
    sink: FrameSink,
}

impl Link {
    /// Connects and registers as manager `name` answering `handles`.
    async fn register(socket: &Path, name: &str, handles: &str) -> anyhow::Result<Link> {
        let stream = UnixStream::connect(socket)
            .await
            .with_context(|| format!("cannot connect to {}", socket.display()))?;
        let (mut reader, sink) = link::open(stream, QUEUE_CAPACITY, DEFAULT_MAX_FRAME).await?;
        let hello = Control::HelloManager(ManagerDescription {
            name: name.to_owned(),
            pid: std::process::id(),
            handles: vec![HandledType {
                name: handles.to_owned(),
                event_type: EventType::of(handles),
                route: None,
                needs: Default::default(),
                public: true,
            }],
            subscribes: Vec::new(),
            notifications: Vec::new(),
        });
        sink.send_wait(Envelope::control(&hello)?).await?;
        loop {
            let env = tokio::time::timeout(PATIENCE, reader.next())
                .await
                .with_context(|| format!("{name}: no welcome from the router"))??
                .with_context(|| format!("{name}: the router closed the connection"))?;
            if env.kind == Kind::Control
                && let Control::Welcome { .. } = env.decode_control()?
            {
                return Ok(Link { reader, sink });
            }
        }
    }
}

/// Answers every request until told to stop; returns how many it answered.
async fn responder(
    socket: &Path,
    registered: oneshot::Sender<()>,
    stop: oneshot::Receiver<()>,
) -> anyhow::Result<u64> {
    let mut link = Link::register(socket, RESPONDER, CALLED_TYPE).await?;
    let _ = registered.send(());
    let pong = Bytes::from_static(PONG);
    let mut batch = Vec::with_capacity(64);
    let mut answered = 0;
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => return Ok(answered),
            more = link.reader.read_batch(&mut batch) => {
                if !more? {
                    return Ok(answered);
                }
            }
        }
        for env in batch.drain(..).filter(|env| env.kind == Kind::Request) {
            let answer = Envelope::response_to(&env, 200, Meta::default(), pong.clone());
            link.sink
                .send(answer)
                .map_err(|refused| anyhow::anyhow!("responder: {refused}"))?;
            answered += 1;
        }
    }
}

/// Keeps `window` requests outstanding; counts the round trips that finish
/// in the recorded window and their latencies.
async fn caller(
    socket: &Path,
    responder_registered: oneshot::Receiver<()>,
    window: usize,
    warmup: Duration,
    duration: Duration,
) -> anyhow::Result<RoutingRun> {
    let mut link = Link::register(socket, CALLER, "bench.A").await?;
    // A request sent before the responder is in the router's table gets 404.
    tokio::time::timeout(PATIENCE, responder_registered)
        .await
        .context("the responder did not register in time")?
        .context("the responder failed before registering")?;

    let called = EventType::of(CALLED_TYPE);
    let ping = Bytes::from_static(PING);
    let mut sent_at: HashMap<u64, Instant> = HashMap::with_capacity(window);
    let mut next = 0u64;
    let mut send = |sent_at: &mut HashMap<u64, Instant>, now: Instant| -> anyhow::Result<()> {
        link.sink
            .send(Envelope::request(called, next, ping.clone()))
            .map_err(|refused| anyhow::anyhow!("caller: {refused}"))?;
        sent_at.insert(next, now);
        next += 1;
        Ok(())
    };

    let start = Instant::now();
    let (record_from, end) = (start + warmup, start + warmup + duration);
    for _ in 0..window {
        send(&mut sent_at, start)?;
    }
    // Nanoseconds: a round trip takes tens of µs, too few for whole µs.
    // Bounded rather than auto-resizing: `saturating_record` clamps to the
    // current top and never resizes. PATIENCE bounds any real latency.
    let mut latency_ns = Histogram::<u64>::new_with_bounds(1, 2 * PATIENCE.as_nanos() as u64, 3)
        .context("histogram bounds")?;
    let mut round_trips = 0;
    let mut batch = Vec::with_capacity(window.min(1024));
    while !sent_at.is_empty() {
        let more = tokio::time::timeout(PATIENCE, link.reader.read_batch(&mut batch))
            .await
            .context("no answers from the router in time")??;
        if !more {
            bail!("the router closed the caller's connection");
        }
        // One clock read per batch: every answer of it arrived at once.
        let now = Instant::now();
        for env in batch.drain(..).filter(|env| env.kind == Kind::Response) {
            if env.status != 200 {
                bail!(
                    "the router answered {} to request {}",
                    env.status,
                    env.correlation
                );
            }
            let sent = sent_at
                .remove(&env.correlation)
                .with_context(|| format!("an answer to unknown request {}", env.correlation))?;
            if (record_from..end).contains(&now) {
                round_trips += 1;
                latency_ns.saturating_record(u64::try_from((now - sent).as_nanos()).unwrap_or(u64::MAX));
            }
            // Past the end the window drains, so that the router is idle when torn down.
            if now < end {
                send(&mut sent_at, now)?;
            }
        }
    }
    let us = |q: f64| (!latency_ns.is_empty()).then(|| latency_ns.value_at_quantile(q) as f64 / 1000.0);
    Ok(RoutingRun {
        window,
        round_trips,
        seconds: duration.as_secs_f64(),
        p50_us: us(0.50),
        p99_us: us(0.99),
    })
}
