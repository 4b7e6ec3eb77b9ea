//! The process pool: worker processes that run one job at a time.
//!
//! The manager host binds a Unix socket ([`bind`]) and owns a
//! [`ProcessPool`]; each worker process ([`serve`]) connects to it, is
//! checked by its kernel-reported credentials (same uid, a child of the
//! group's supervisor) and then receives jobs as request frames (event type
//! = job type, correlation = job id) and answers each with a response frame.
//!
//! The pool hands a job to an idle worker or queues it (bounded). A worker
//! whose connection ends while it runs a job has died: the job fails with
//! [`WORKER_DIED`](crate::WORKER_DIED) and is not retried. A job past its
//! deadline fails with 504 and its worker is killed with SIGKILL, through a
//! pidfd the kernel gave for the peer when it connected (never by pid: the
//! pid of a worker that died may name another process by then); the
//! supervisor replaces it and the new worker connects, so the pool's size
//! restores. A job its submitter cancels is taken out of the queue, or
//! stopped the same way.
//!
//! When the last worker is gone (they crash and restart, or crash-loop and
//! wait out their delay), jobs wait for one for [`NO_WORKER_WAIT`]; past it
//! they fail with [`NO_WORKER`] (503, the client gets `Retry-After`) until
//! a worker connects again, instead of queueing until their deadline.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use switchyard_proto::backoff::Backoff;
use switchyard_proto::link;
use switchyard_proto::process::Pidfd;
use switchyard_proto::supervision::Stop;
use switchyard_proto::transport::{FrameReader, FrameSink, PeerPolicy};
use switchyard_proto::{Envelope, Kind, Meta, Payload};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;

use crate::{Done, Job, Refused, Runner, WORKER_DIED, timed_out};

/// Frames queued towards one worker (it runs one job at a time).
const WORKER_QUEUE: usize = 16;

/// How long jobs wait when no worker is connected before they are refused
/// with [`NO_WORKER`]. A worker that merely restarts is back well within
/// it; one that crash-loops is not.
pub const NO_WORKER_WAIT: Duration = Duration::from_secs(1);

/// Status and message of a job refused because no worker process has been
/// running for [`NO_WORKER_WAIT`].
pub const NO_WORKER: (u16, &str) = (
    503,
    "no worker process is running (they are being restarted); try again later",
);

/// Binds the pool's socket at `path` (replacing a stale one), readable and
/// writable by the owner only.
pub fn bind(path: &Path) -> std::io::Result<std::os::unix::net::UnixListener> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => return Err(err),
    }
    let listener = std::os::unix::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

struct Worker {
    sink: FrameSink,
    pid: u32,
    /// The worker process as the kernel knew it when it connected: what a
    /// deadline kills.
    pidfd: Pidfd,
    /// The job it is running.
    running: Option<u64>,
    /// That job's span, for the lines its deadline or its worker's death
    /// write.
    running_span: tracing::Span,
    /// Killed for a deadline: it gets no more jobs.
    doomed: bool,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Job>,
    workers: HashMap<u64, Worker>,
    idle: VecDeque<u64>,
    timers: HashMap<u64, AbortHandle>,
    next_worker: u64,
    /// No worker has been connected for [`NO_WORKER_WAIT`]: jobs are
    /// refused until one connects.
    starved: bool,
}

struct Shared {
    state: Mutex<State>,
    results: mpsc::UnboundedSender<Done>,
    capacity: usize,
}

impl Worker {
    /// Sends `job` to this worker; on success it is the job the worker
    /// runs, and its span the one the worker's lines about it go in.
    fn start(&mut self, job: &Job) -> bool {
        if self.sink.send(job_frame(job)).is_err() {
            return false;
        }
        self.running = Some(job.id);
        self.running_span = job.span();
        true
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn finish(&self, state: &mut State, done: Done) {
        if let Some(timer) = state.timers.remove(&done.id) {
            timer.abort();
        }
        let _ = self.results.send(done);
    }

    /// Fails every queued job with [`NO_WORKER`].
    fn refuse_queued(&self, state: &mut State) {
        let (status, message) = NO_WORKER;
        while let Some(job) = state.queue.pop_front() {
            self.finish(
                state,
                Done {
                    id: job.id,
                    status,
                    body: Bytes::from_static(message.as_bytes()),
                },
            );
        }
    }
}

/// Gives `worker` the next queued job, or marks it idle.
fn feed(state: &mut State, worker: u64) {
    let Some(w) = state.workers.get_mut(&worker) else {
        return;
    };
    if w.doomed || w.running.is_some() {
        return;
    }
    let Some(job) = state.queue.pop_front() else {
        state.idle.push_back(worker);
        return;
    };
    if !w.start(&job) {
        // Its connection is closing (the reader will remove it): the
        // job waits for another worker.
        state.queue.push_front(job);
        w.doomed = true;
    }
}

fn job_frame(job: &Job) -> Envelope {
    let mut env = Envelope::request(job.job_type, job.id, job.body.clone());
    env.context = job.tags.clone();
    // A large job crosses in shared memory; if none can be had it goes
    // inline and the frame limit decides.
    if let Ok(payload) = Payload::for_body(job.body.clone(), switchyard_proto::shm::DEFAULT_THRESHOLD) {
        env.payload = payload;
    }
    env
}

/// The manager side of a process pool.
pub struct ProcessPool {
    shared: Arc<Shared>,
    accept: AbortHandle,
}

impl Drop for ProcessPool {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl ProcessPool {
    pub(crate) fn new(
        listener: std::os::unix::net::UnixListener,
        capacity: usize,
        max_frame: usize,
        results: mpsc::UnboundedSender<Done>,
    ) -> std::io::Result<ProcessPool> {
        listener.set_nonblocking(true)?;
        let listener = tokio::net::UnixListener::from_std(listener)?;
        let shared = Arc::new(Shared {
            state: Mutex::default(),
            results,
            capacity,
        });
        let accept = tokio::spawn(accept(listener, shared.clone(), max_frame)).abort_handle();
        Ok(ProcessPool { shared, accept })
    }

    pub(crate) fn submit(&self, job: Job) -> Result<(), Refused> {
        let shared = &self.shared;
        let mut state = shared.lock();
        let (id, timeout) = (job.id, job.timeout);
        if state.starved {
            let (status, message) = NO_WORKER;
            let _ = shared.results.send(Done {
                id,
                status,
                body: Bytes::from_static(message.as_bytes()),
            });
            return Ok(());
        }
        let mut job = Some(job);
        while let Some(worker) = state.idle.pop_front() {
            let Some(w) = state.workers.get_mut(&worker) else {
                continue;
            };
            let Some(j) = job.take() else { break };
            if w.start(&j) {
                break;
            }
            w.doomed = true;
            job = Some(j);
        }
        if let Some(job) = job {
            if state.queue.len() >= shared.capacity {
                return Err(Refused::Full);
            }
            state.queue.push_back(job);
        }
        let weak = Arc::downgrade(shared);
        let timer = tokio::spawn(async move {
            tokio::time::sleep(timeout).await;
            if let Some(shared) = weak.upgrade() {
                expire(&shared, id, timeout);
            }
        });
        state.timers.insert(id, timer.abort_handle());
        Ok(())
    }

    pub(crate) fn queued(&self) -> usize {
        self.shared.lock().queue.len()
    }

    /// A queued job leaves the queue; a running one has its worker killed,
    /// as past a deadline: the job's function cannot be interrupted any
    /// other way, and the worker is replaced.
    pub(crate) fn cancel(&self, id: u64) {
        if stop(&self.shared, id, Why::Cancelled) {
            let _ = self.shared.results.send(crate::cancelled(id));
        }
    }
}

/// The deadline of job `id` passed: answer 504, and kill its worker if one
/// is running it.
fn expire(shared: &Shared, id: u64, timeout: Duration) {
    if stop(shared, id, Why::Deadline) {
        let _ = shared.results.send(timed_out(id, timeout));
    }
}

/// Why a job is stopped before its result.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Why {
    Deadline,
    Cancelled,
}

/// Takes job `id` out of the queue, or kills the worker running it. False
/// when it has finished already.
fn stop(shared: &Shared, id: u64, why: Why) -> bool {
    let mut state = shared.lock();
    let Some(timer) = state.timers.remove(&id) else {
        return false; // finished meanwhile
    };
    timer.abort();
    if let Some(at) = state.queue.iter().position(|j| j.id == id) {
        if let Some(job) = state.queue.remove(at) {
            let _job = job.span().entered();
            match why {
                Why::Deadline => tracing::warn!("job past its deadline while queued"),
                Why::Cancelled => tracing::debug!("job cancelled while queued"),
            }
        }
    } else if let Some(w) = state.workers.values_mut().find(|w| w.running == Some(id)) {
        w.running = None;
        w.doomed = true;
        let _job = w.running_span.enter();
        // A client's cancel is routine; a job outliving its deadline is not.
        match why {
            Why::Deadline => tracing::warn!(pid = w.pid, "job past its deadline; killing its worker"),
            Why::Cancelled => tracing::info!(pid = w.pid, "job cancelled; killing its worker"),
        }
        if let Err(err) = w.pidfd.kill() {
            tracing::error!(pid = w.pid, %err, "cannot kill a runaway worker");
        }
    }
    true
}

async fn accept(listener: tokio::net::UnixListener, shared: Arc<Shared>, max_frame: usize) {
    let policy = PeerPolicy::for_group();
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(err) => {
                tracing::warn!(%err, "worker socket accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let pid = match policy.check(&stream) {
            Ok(pid) => pid,
            Err(err) => {
                tracing::warn!(%err, "refusing worker connection");
                continue;
            }
        };
        // A worker we could not kill on a deadline is no worker.
        let pidfd = match Pidfd::of_peer(&stream) {
            Ok(fd) => fd,
            Err(err) => {
                tracing::warn!(pid, %err, "refusing worker connection: no pidfd for it");
                continue;
            }
        };
        let (reader, sink) = match link::open(stream, WORKER_QUEUE, max_frame).await {
            Ok(link) => link,
            Err(err) => {
                tracing::warn!(pid, %err, "refusing worker connection: the link did not open");
                continue;
            }
        };
        let id = {
            let mut state = shared.lock();
            let id = state.next_worker;
            state.next_worker += 1;
            state.workers.insert(
                id,
                Worker {
                    sink,
                    pid,
                    pidfd,
                    running: None,
                    running_span: tracing::Span::none(),
                    doomed: false,
                },
            );
            state.starved = false;
            feed(&mut state, id);
            id
        };
        tracing::info!(pid, "worker connected");
        tokio::spawn(read_worker(reader, shared.clone(), id));
    }
}

async fn read_worker(
    mut reader: FrameReader<tokio::net::unix::OwnedReadHalf>,
    shared: Arc<Shared>,
    worker: u64,
) {
    let mut batch = Vec::new();
    while let Ok(true) = reader.read_batch(&mut batch).await {
        let mut state = shared.lock();
        for env in batch.drain(..) {
            if env.kind != Kind::Response {
                continue;
            }
            let Some(w) = state.workers.get_mut(&worker) else {
                break;
            };
            if w.running != Some(env.correlation) {
                continue; // answered already (its deadline passed)
            }
            w.running = None;
            let (status, body) = match env.payload.clone().into_bytes() {
                Ok(body) => (env.status, body),
                Err(err) => {
                    tracing::warn!(%err, "cannot map a job result");
                    (503, bytes::Bytes::from_static(b"job result unavailable"))
                }
            };
            shared.finish(
                &mut state,
                Done {
                    id: env.correlation,
                    status,
                    body,
                },
            );
            feed(&mut state, worker);
        }
    }
    let mut state = shared.lock();
    state.idle.retain(|&w| w != worker);
    if let Some(w) = state.workers.remove(&worker) {
        tracing::info!(pid = w.pid, "worker disconnected");
        if let Some(job) = w.running {
            let (status, message) = WORKER_DIED;
            w.running_span
                .in_scope(|| tracing::warn!(pid = w.pid, "the worker process died while running the job"));
            shared.finish(
                &mut state,
                Done {
                    id: job,
                    status,
                    body: Bytes::from_static(message.as_bytes()),
                },
            );
        }
    }
    if state.workers.is_empty() {
        let weak = Arc::downgrade(&shared);
        tokio::spawn(async move {
            tokio::time::sleep(NO_WORKER_WAIT).await;
            let Some(shared) = weak.upgrade() else { return };
            let mut state = shared.lock();
            if state.workers.is_empty() && !state.starved {
                tracing::warn!(
                    queued = state.queue.len(),
                    "no worker process for {} ms; refusing jobs until one connects",
                    NO_WORKER_WAIT.as_millis()
                );
                state.starved = true;
                shared.refuse_queued(&mut state);
            }
        });
    }
}

/// The worker process's loop: connects to the pool's socket at `socket`
/// (again whenever the connection ends, e.g. when the manager restarts),
/// runs each job with `runner` and answers it. `ready` fires on the first
/// connection. Returns when `shutdown` resolves.
pub async fn serve(
    socket: &Path,
    max_frame: usize,
    runner: Runner,
    ready: oneshot::Sender<()>,
    shutdown: impl Future<Output = Stop>,
) {
    let mut ready = Some(ready);
    tokio::pin!(shutdown);
    let mut backoff = Backoff::peer();
    loop {
        let connected = tokio::select! {
            _ = &mut shutdown => return,
            c = UnixStream::connect(socket) => c,
        };
        let stream = match connected {
            Ok(s) => s,
            Err(err) => {
                tracing::debug!(%err, "manager's worker socket not reachable yet");
                tokio::select! {
                    _ = &mut shutdown => return,
                    _ = tokio::time::sleep(backoff.next_delay()) => {}
                }
                continue;
            }
        };
        backoff.reset();
        if let Some(ready) = ready.take() {
            let _ = ready.send(());
        }
        tracing::debug!("connected to the manager");
        let (mut reader, sink) = match link::open(stream, WORKER_QUEUE, max_frame).await {
            Ok(link) => link,
            Err(err) => {
                tracing::warn!(%err, "the link to the manager did not open");
                tokio::select! {
                    _ = &mut shutdown => return,
                    _ = tokio::time::sleep(backoff.next_delay()) => {}
                }
                continue;
            }
        };
        let mut batch = Vec::new();
        loop {
            let more = tokio::select! {
                _ = &mut shutdown => return,
                more = reader.read_batch(&mut batch) => more,
            };
            if !matches!(more, Ok(true)) {
                break;
            }
            for env in batch.drain(..) {
                if env.kind != Kind::Request {
                    continue;
                }
                let span = crate::job_span(env.correlation, env.event_type, &env.context);
                let output = span.in_scope(|| {
                    let output = match env.payload.clone().into_bytes() {
                        Ok(body) => runner(env.event_type, &body),
                        Err(err) => crate::JobOutput::error(503, format!("job input unavailable: {err}")),
                    };
                    crate::log_result(&output);
                    output
                });
                let mut answer =
                    Envelope::response_to(&env, output.status, Meta::default(), output.body.clone());
                if let Ok(payload) = Payload::for_body(output.body, switchyard_proto::shm::DEFAULT_THRESHOLD)
                {
                    answer.payload = payload;
                }
                if sink.send_wait(answer).await.is_err() {
                    break;
                }
            }
        }
        tracing::info!("connection to the manager lost; reconnecting");
    }
}
