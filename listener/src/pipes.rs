//! The pool of return pipes: a few long-lived connections to the broker,
//! registered once and shared by every request of this process.
//!
//! A request takes the next live pipe, parks a oneshot under its correlation
//! id, and is answered by that pipe's reader task. When a pipe breaks, or the
//! broker says the router is gone, the requests waiting on it are answered
//! with 503 at once; the pipe reconnects in the background.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use switchyard_proto::control::{Control, RouteTable};
use switchyard_proto::transport::{FrameReader, FrameSink, spawn_writer};
use switchyard_proto::{Envelope, Kind};
use tokio::net::UnixStream;
use tokio::net::unix::OwnedReadHalf;
use tokio::sync::{oneshot, watch};

use crate::Config;
use crate::routes::Routes;

type Pending = HashMap<u64, oneshot::Sender<Envelope>>;

struct Slot {
    sink: Mutex<Option<FrameSink>>,
    pending: Mutex<Pending>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Slot {
    /// Answers every waiting request with 503.
    fn fail_all(&self, detail: &str) {
        let pending = std::mem::take(&mut *lock(&self.pending));
        for (correlation, tx) in pending {
            let stub = Envelope::request(Default::default(), correlation, Default::default());
            let _ = tx.send(Envelope::error_to(&stub, 503, detail));
        }
    }
}

/// Why a request could not be sent.
pub(crate) enum SendFailure {
    /// Every pipe's queue is full.
    Busy,
    /// No pipe is connected.
    Unavailable,
}

pub(crate) struct Pool {
    slots: Vec<Slot>,
    next_slot: AtomicUsize,
    next_correlation: AtomicU64,
    routes: RwLock<Arc<Routes>>,
    router_up: AtomicBool,
    /// Counts pipes connected and whether a route table has arrived.
    progress: watch::Sender<(usize, bool)>,
    config: Arc<Config>,
}

/// A request in flight: dropping it (answered, timed out, or the client went
/// away) removes its entry from the pending map.
pub(crate) struct InFlight<'a> {
    slot: &'a Slot,
    correlation: u64,
    pub(crate) response: oneshot::Receiver<Envelope>,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        lock(&self.slot.pending).remove(&self.correlation);
    }
}

impl Pool {
    pub(crate) fn start(config: Arc<Config>) -> Arc<Pool> {
        // Correlation ids start at a random point so that a restarted
        // listener never matches a late response meant for its predecessor.
        let seed = switchyard_proto::event::now_micros() ^ ((std::process::id() as u64) << 40);
        let pool = Arc::new(Pool {
            slots: (0..config.pipes)
                .map(|_| Slot {
                    sink: Mutex::new(None),
                    pending: Mutex::new(HashMap::new()),
                })
                .collect(),
            next_slot: AtomicUsize::new(0),
            next_correlation: AtomicU64::new(seed),
            routes: RwLock::new(Arc::new(Routes::default())),
            router_up: AtomicBool::new(false),
            progress: watch::channel((0, false)).0,
            config,
        });
        for index in 0..pool.slots.len() {
            tokio::spawn(pipe_task(pool.clone(), index));
        }
        pool
    }

    /// Resolves once every pipe is connected and the route table is known.
    pub(crate) async fn wait_ready(&self) {
        let want = self.slots.len();
        let mut rx = self.progress.subscribe();
        let _ = rx
            .wait_for(|&(connected, routed)| connected >= want && routed)
            .await;
    }

    pub(crate) fn routes(&self) -> Arc<Routes> {
        self.routes.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn router_up(&self) -> bool {
        self.router_up.load(Ordering::Relaxed)
    }

    /// Sends a request on the next live pipe; the response arrives on the
    /// returned [`InFlight`].
    pub(crate) fn send(&self, mut env: Envelope) -> Result<InFlight<'_>, SendFailure> {
        let n = self.slots.len();
        let start = self.next_slot.fetch_add(1, Ordering::Relaxed);
        let mut saw_full = false;
        for k in 0..n {
            let slot = &self.slots[(start + k) % n];
            let Some(sink) = lock(&slot.sink).clone() else {
                continue;
            };
            let correlation = self.next_correlation.fetch_add(1, Ordering::Relaxed);
            env.correlation = correlation;
            let (tx, response) = oneshot::channel();
            lock(&slot.pending).insert(correlation, tx);
            let in_flight = InFlight {
                slot,
                correlation,
                response,
            };
            match sink.send(env) {
                Ok(()) => return Ok(in_flight),
                Err(refused) => {
                    saw_full |= refused.full;
                    env = *refused.envelope;
                }
            }
        }
        Err(if saw_full {
            SendFailure::Busy
        } else {
            SendFailure::Unavailable
        })
    }

    fn mark(&self, connected_delta: isize, routed: bool) {
        self.progress.send_modify(|(connected, r)| {
            *connected = connected.saturating_add_signed(connected_delta);
            *r |= routed;
        });
    }

    fn apply_routes(&self, table: RouteTable) {
        let mut routes = self.routes.write().unwrap_or_else(|p| p.into_inner());
        *routes = Arc::new(routes.merged(table));
        self.router_up.store(true, Ordering::Relaxed);
        drop(routes);
        self.mark(0, true);
    }
}

async fn pipe_task(pool: Arc<Pool>, index: usize) {
    let mut backoff = Duration::from_millis(2);
    loop {
        match connect(&pool, index).await {
            Ok((reader, sink)) => {
                backoff = Duration::from_millis(2);
                *lock(&pool.slots[index].sink) = Some(sink);
                pool.mark(1, false);
                read_responses(&pool, index, reader).await;
                *lock(&pool.slots[index].sink) = None;
                pool.mark(-1, false);
                pool.slots[index].fail_all("lost the connection to the broker");
                tracing::warn!(pipe = index, "broker pipe lost; reconnecting");
            }
            Err(err) => {
                tracing::debug!(%err, pipe = index, "broker not reachable");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(200));
            }
        }
    }
}

async fn connect(
    pool: &Pool,
    index: usize,
) -> Result<(FrameReader<OwnedReadHalf>, FrameSink), switchyard_proto::Error> {
    let config = &pool.config;
    let stream = UnixStream::connect(&config.broker_socket).await?;
    let (read, write) = stream.into_split();
    let (sink, _writer) = spawn_writer(write, config.queue_capacity, config.max_frame);
    let mut reader = FrameReader::new(read, config.max_frame);
    let hello = Control::HelloPipe {
        pid: std::process::id(),
        index: index as u32,
    };
    sink.send_wait(Envelope::control(&hello)?).await?;
    match reader.next().await? {
        Some(env) if env.kind == Kind::Control => match env.decode_control()? {
            Control::Welcome { .. } => Ok((reader, sink)),
            _ => Err(switchyard_proto::Error::Malformed("expected welcome")),
        },
        _ => Err(switchyard_proto::Error::Closed),
    }
}

async fn read_responses(pool: &Pool, index: usize, mut reader: FrameReader<OwnedReadHalf>) {
    let slot = &pool.slots[index];
    let mut batch = Vec::with_capacity(64);
    loop {
        match reader.read_batch(&mut batch).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(err) => return tracing::warn!(%err, pipe = index, "bad frame from broker"),
        }
        for env in batch.drain(..) {
            match env.kind {
                Kind::Response => {
                    let waiter = lock(&slot.pending).remove(&env.correlation);
                    // No waiter: the request timed out or its client left.
                    if let Some(tx) = waiter {
                        let _ = tx.send(env);
                    }
                }
                Kind::Control => match env.decode_control() {
                    Ok(Control::RouteTable(table)) => pool.apply_routes(table),
                    Ok(Control::RouterLost) => {
                        pool.router_up.store(false, Ordering::Relaxed);
                        slot.fail_all("the router went down while handling the request");
                    }
                    Ok(other) => tracing::debug!(?other, "ignoring control from broker"),
                    Err(err) => tracing::warn!(%err, "bad control frame from broker"),
                },
                other => tracing::debug!(?other, "ignoring frame from broker"),
            }
        }
    }
}
