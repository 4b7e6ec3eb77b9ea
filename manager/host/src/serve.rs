//! The manager host's loop: one process, one manager instance behind the
//! plugin boundary.
//!
//! Connects to the router, declares what the manager serves, then turns each
//! batch of frames into one [`Plugin::step`] and each output back into frames.
//! Requests from different callers may carry equal correlation ids, so the
//! host gives each request a local id of its own for the plugin and maps the
//! answer back. A request the router cancels (its client left, or its
//! deadline passed) is forgotten and the plugin drops its handler; the jobs
//! and calls the plugin then gives up are taken from the worker pool or
//! cancelled at the router. An answer to a listener's request goes straight
//! into this instance's return link to that listener process, and the
//! router is told once per step which requests were answered so (decision
//! 0143). If the router goes away, calls the plugin is awaiting fail
//! with 503 and the host reconnects and declares itself again. Every step
//! runs under the [`watchdog`](crate::watchdog): one that does not return
//! within `handler_timeout` ends the process.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use switchyard_proto::backoff::Backoff;
use switchyard_proto::control::Control;
use switchyard_proto::link;
use switchyard_proto::supervision::{Extra, GAUGES, Stop};
use switchyard_proto::transport::{FrameReader, FrameSink};
use switchyard_proto::{Deadline, Envelope, EventType, Hop, Kind, Origin, Payload, Refusal};
use switchyard_worker::{Done, Job, Kind as WorkerKind, Pool};
use tokio::net::UnixStream;
use tokio::net::unix::OwnedReadHalf;
use tokio::sync::{mpsc, oneshot};

use switchyard_manager_abi::handover;
use switchyard_manager_abi::messages::{Caller, Description, FromPlugin, ToPlugin};

use crate::callbacks::{Tags, WAKE, log, request_ids};
use crate::loader::{LoadError, Plugin};
use crate::returns::{Returns, Sent};
use crate::watchdog::Watchdog;

/// The host's settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// The configured manager name (what the router and status show).
    pub name: String,
    /// This instance's number among the manager's instances (0-based, as
    /// `switchyard status` shows it).
    pub instance: u32,
    /// The router's socket.
    pub router_socket: PathBuf,
    /// Largest frame accepted or sent, in bytes.
    pub max_frame: usize,
    /// Frames queued towards the router.
    pub queue_capacity: usize,
    /// Bodies of at least this many bytes leave through shared memory.
    pub shm_threshold: usize,
    /// Longest a call into the plugin may take before the watchdog kills
    /// this process (`group.handler_timeout_ms`).
    pub handler_timeout: Duration,
    /// The manager's worker pool.
    pub workers: Workers,
}

/// A manager's worker pool settings (`[managers.workers]`).
#[derive(Clone, Debug)]
pub struct Workers {
    pub kind: WorkerKind,
    /// Threads, or worker processes (those are started by the supervisor).
    pub size: usize,
    /// Jobs that may wait for a worker; more are refused with 503.
    pub queue: usize,
    /// Deadline of a job that does not set its own.
    pub job_timeout: Duration,
    /// Process pools: the socket the workers connect to.
    pub socket: PathBuf,
}

impl Workers {
    /// Starts the pool (process pools: binds its socket). Call inside the
    /// host's runtime.
    fn start(
        &self,
        plugin: &Plugin,
        max_frame: usize,
    ) -> Result<(Pool, mpsc::UnboundedReceiver<Done>), LoadError> {
        match self.kind {
            WorkerKind::Thread => Ok(Pool::threads(self.size, self.queue, plugin.job_runner())),
            WorkerKind::Process => switchyard_worker::process::bind(&self.socket)
                .and_then(|listener| Pool::processes(listener, self.queue, max_frame))
                .map_err(|e| {
                    LoadError::Workers(format!(
                        "cannot listen for workers on {}: {e}",
                        self.socket.display()
                    ))
                }),
        }
    }
}

/// How [`Host::serve`] ended.
enum Served {
    /// The router connection closed: reconnect.
    RouterLost,
    /// Told to stop, or drained.
    Stopped,
}

/// Serves `plugin` until `shutdown` resolves (and, for a drain, until what
/// it holds is answered). `ready` fires once the router has accepted the
/// manager's declaration. Returns an error only when the plugin itself
/// breaks (the supervisor then restarts the process).
pub async fn run(
    mut plugin: Plugin,
    description: Description,
    config: Config,
    ready: oneshot::Sender<()>,
    shutdown: impl Future<Output = Stop>,
) -> Result<(), LoadError> {
    let mut ready = Some(ready);
    tokio::pin!(shutdown);
    let mut backoff = Backoff::peer();
    let (pool, mut results) = config.workers.start(&plugin, config.max_frame)?;
    GAUGES.set_extra(Extra::WorkersSize, config.workers.size as u64);
    let watchdog = Watchdog::start(config.handler_timeout, &description).map_err(LoadError::Watchdog)?;
    let mut host = Host {
        watchdog,
        requests: HashMap::new(),
        calls: HashSet::new(),
        next_local: 1,
        pool,
        job_timeout: config.workers.job_timeout,
        immediate: Vec::new(),
        ticks: description.timers,
        timer_next: None,
        cancelled: HashSet::new(),
        returns: Returns::default(),
        completed: Vec::new(),
        completions_due: None,
    };
    loop {
        let link = tokio::select! {
            _ = &mut shutdown => return Ok(()),
            link = connect(&description, &config) => link,
        };
        match link {
            Ok((reader, sink, writer, id)) => {
                backoff.reset();
                tracing::info!(
                    instance = config.instance,
                    router_id = id,
                    "registered with router"
                );
                if let Some(ready) = ready.take() {
                    let _ = ready.send(());
                }
                let link = Link { reader, sink: &sink };
                match host
                    .serve(&mut plugin, &config, link, &mut results, shutdown.as_mut())
                    .await?
                {
                    Served::Stopped => {
                        // The router closes what was answered straight
                        // back, not 503 it as this instance's leftovers.
                        if !sink.is_closed() {
                            host.tell_completed(&sink);
                        }
                        // The answers just given are still queued: the
                        // writer ends once they are written, when its last
                        // sink is gone.
                        drop(sink);
                        let _ = tokio::time::timeout(Duration::from_secs(2), writer).await;
                        host.returns.flush(Duration::from_secs(2)).await;
                        return Ok(());
                    }
                    Served::RouterLost => {}
                }
                tracing::warn!("router connection lost; reconnecting");
                host.router_lost(&mut plugin)?;
            }
            Err(err) => {
                tracing::debug!(%err, "router not reachable yet");
                tokio::select! {
                    _ = &mut shutdown => return Ok(()),
                    _ = tokio::time::sleep(backoff.next_delay()) => {}
                }
            }
        }
    }
}

/// The router link: its reader, its sink and the sink's writer task, and
/// the id the router gave this instance.
type Connected = (FrameReader<OwnedReadHalf>, FrameSink, link::Writer, u64);

async fn connect(description: &Description, config: &Config) -> Result<Connected, switchyard_proto::Error> {
    let stream = UnixStream::connect(&config.router_socket).await?;
    // The writer task is kept: a draining instance waits for it, so its
    // last answers are out before it exits.
    let (mut reader, sink, writer) =
        link::open_flushed(stream, link::transport(), config.queue_capacity, config.max_frame).await?;
    let hello = Control::HelloManager(description.for_router(&config.name));
    sink.send_wait(Envelope::control(&hello)?).await?;
    match reader.next().await? {
        Some(env) if env.kind == Kind::Control => match env.decode_control()? {
            Control::Welcome { id } => Ok((reader, sink, writer, id)),
            _ => Err(switchyard_proto::Error::Malformed("expected welcome")),
        },
        _ => Err(switchyard_proto::Error::Closed),
    }
}

/// Every plugin gets a `ToPlugin::Wake` this often, busy or idle, and does
/// its housekeeping then (releasing idle shared memory), off the request
/// path and without needing traffic.
pub const IDLE_STEP: Duration = Duration::from_secs(2);

/// When to step the timers of a plugin that has not said when the next
/// one is due: TICK_PERIOD from now.
fn unsaid_timer() -> tokio::time::Instant {
    tokio::time::Instant::now() + switchyard_manager_abi::TICK_PERIOD
}

struct Host {
    /// Watches every step of the plugin.
    watchdog: Watchdog,
    /// Local request id → the request's return address, and its return
    /// token (0: none; the answer goes through the router).
    requests: HashMap<u64, (Origin, u64, EventType, u64)>,
    /// Calls the plugin is waiting on (their ids are our correlations).
    calls: HashSet<u64>,
    next_local: u64,
    pool: Pool,
    job_timeout: Duration,
    /// Inputs for the plugin produced while dispatching its outputs (jobs
    /// the pool refused at once).
    immediate: Vec<ToPlugin>,
    /// The manager has timers: step them when the plugin says the next
    /// is due, every `TICK_PERIOD` until it has.
    ticks: bool,
    /// When the plugin said its next timer is due (`FromPlugin::NextTimer`);
    /// none since the last timer step: every `TICK_PERIOD` until it says.
    timer_next: Option<tokio::time::Instant>,
    /// Requests cancelled in the step under way: the plugin may have
    /// answered one before it read the cancel.
    cancelled: HashSet<u64>,
    /// Links straight back to listener processes (decision 0143).
    returns: Returns,
    /// Requests answered through [`returns`](Self::returns) since the
    /// router was last told, as (pipe, correlation).
    completed: Vec<(u64, u64)>,
    /// When the router must be told of `completed` at the latest.
    completions_due: Option<tokio::time::Instant>,
}

/// How long the router may go untold of answers given straight back
/// (decision 0149): a step that sends the router nothing else holds its
/// completions this long for the steps after it, so one record, and one
/// wake-up of the router, closes several requests. The router's view of an
/// instance's load lags by at most this.
const COMPLETIONS_WITHIN: Duration = Duration::from_millis(1);

/// Completions held past this many go at once, whatever the time.
const COMPLETIONS_AT_ONCE: usize = 64;

/// The connection to the router.
struct Link<'a> {
    reader: FrameReader<OwnedReadHalf>,
    sink: &'a FrameSink,
}

impl Host {
    /// Serves the router connection until it closes or `shutdown` says to
    /// stop; a drain goes on serving until the router has acknowledged it
    /// and every request and call the host holds is answered.
    async fn serve(
        &mut self,
        plugin: &mut Plugin,
        config: &Config,
        link: Link<'_>,
        results: &mut mpsc::UnboundedReceiver<Done>,
        mut shutdown: std::pin::Pin<&mut impl Future<Output = Stop>>,
    ) -> Result<Served, LoadError> {
        let Link { mut reader, sink } = link;
        // Set once told to drain: when the grace ends.
        let mut drain_until: Option<tokio::time::Instant> = None;
        // The router's answer to our `Draining`: no request follows it.
        let mut drain_acknowledged = false;
        let mut batch = Vec::with_capacity(64);
        let mut inputs = Vec::with_capacity(64);
        // The plugin's timers: stepped when it said the next one is due
        // (an idle manager with a timer a second apart wakes once a
        // second), every TICK_PERIOD until it has said.
        let timer = tokio::time::sleep_until(self.timer_next.unwrap_or_else(unsaid_timer));
        tokio::pin!(timer);
        let mut idle = tokio::time::interval(IDLE_STEP);
        idle.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let tell = tokio::time::sleep_until(tokio::time::Instant::now());
        tokio::pin!(tell);
        loop {
            if drain_acknowledged && self.requests.is_empty() && self.calls.is_empty() {
                tracing::info!("drained: every request answered");
                return Ok(Served::Stopped);
            }
            tokio::select! {
                how = shutdown.as_mut(), if drain_until.is_none() => match how {
                    Stop::Now => {
                        // A planned stop: said before the link closes, so
                        // the router logs this instance's leaving as such
                        // (and warns only if requests it held fail).
                        if let Ok(env) = Envelope::control(&Control::Draining) {
                            let _ = sink.send(env);
                        }
                        return Ok(Served::Stopped);
                    }
                    Stop::Drain(grace) => {
                        tracing::info!(in_flight = self.requests.len(), "draining: the router sends nothing new");
                        drain_until = Some(tokio::time::Instant::now() + grace);
                        let told = Envelope::control(&Control::Draining)
                            .map_err(|e| e.to_string())
                            .and_then(|env| sink.send(env).map_err(|e| e.to_string()));
                        if let Err(err) = told {
                            tracing::warn!(%err, "cannot tell the router; stopping");
                            return Ok(Served::Stopped);
                        }
                    }
                },
                _ = tokio::time::sleep_until(drain_until.unwrap_or_else(tokio::time::Instant::now)), if drain_until.is_some() => {
                    tracing::warn!(unanswered = self.requests.len(), "drain grace period over; stopping");
                    return Ok(Served::Stopped);
                }
                () = &mut timer, if self.ticks => {
                    inputs.push(ToPlugin::Timers { ahead_ms: 0 });
                    // Until the plugin's answer to this step says when.
                    self.timer_next = None;
                    timer.as_mut().reset(unsaid_timer());
                }
                read = reader.read_batch(&mut batch) => match read {
                    // While draining, a lost router has failed what we held.
                    Ok(true) => {}
                    Ok(false) if drain_until.is_some() => return Ok(Served::Stopped),
                    Ok(false) => return Ok(Served::RouterLost),
                    Err(err) => {
                        tracing::warn!(%err, "closing router connection");
                        return Ok(if drain_until.is_some() { Served::Stopped } else { Served::RouterLost });
                    }
                },
                () = &mut tell, if self.completions_due.is_some() => self.tell_completed(sink),
                _ = WAKE.notified() => inputs.push(ToPlugin::Wake),
                _ = idle.tick() => inputs.push(ToPlugin::Wake),
                Some(done) = results.recv() => {
                    inputs.push(job_result(done));
                    while let Ok(done) = results.try_recv() {
                        inputs.push(job_result(done));
                    }
                }
            }
            for mut env in batch.drain(..) {
                if env.kind == Kind::Control {
                    match env.decode_control() {
                        Ok(Control::Draining) => drain_acknowledged = true,
                        Ok(Control::Cancel) => self.cancel(env.origin, env.correlation, &mut inputs),
                        _ => {}
                    }
                    continue;
                }
                // A request's pipe goes to the plugin as it is (an upload).
                let mut stream = None;
                if env.kind == Kind::Request
                    && matches!(env.payload, Payload::Stream(_))
                    && let Payload::Stream(handle) = std::mem::take(&mut env.payload)
                {
                    match handover::release_stream(handle) {
                        Ok(raw) => stream = Some(raw),
                        Err(err) => {
                            tracing::warn!(%err, "cannot take a request body stream");
                            let _ = sink.send(
                                Refusal::new(Hop::ManagerHost, 503, "request body unavailable").answer(&env),
                            );
                            continue;
                        }
                    }
                }
                // Inline bytes, a sealed body mapped, or a pooled one read out.
                let body = match std::mem::take(&mut env.payload).into_bytes() {
                    Ok(bytes) => bytes,
                    Err(err) => {
                        tracing::warn!(%err, "cannot map a shared-memory body");
                        if env.kind == Kind::Request {
                            let _ = sink.send(
                                Refusal::new(Hop::ManagerHost, 503, "request body unavailable").answer(&env),
                            );
                        }
                        continue;
                    }
                };
                match env.kind {
                    Kind::Request => {
                        let local = self.next_local;
                        self.next_local += 1;
                        let token = if switchyard_proto::returns::direct() {
                            env.token
                        } else {
                            0
                        };
                        self.requests
                            .insert(local, (env.origin, env.correlation, env.event_type, token));
                        if let Some(tags) = Tags::of(&env) {
                            tracing::debug!(
                                request_id = tags.context.request_id_field(),
                                trace_id = tags.context.trace_id_field(),
                                correlation = local,
                                "request to the plugin"
                            );
                            request_ids().insert(local, tags);
                        }
                        // The return address says who sent it: only the
                        // router stamps `Manager`.
                        let caller = match env.origin {
                            Origin::Manager(_) => Caller::Manager,
                            _ => Caller::Client,
                        };
                        inputs.push(ToPlugin::Request {
                            correlation: local,
                            event_type: env.event_type,
                            meta: env.meta,
                            body,
                            stream,
                            caller,
                            context: env.context,
                        });
                    }
                    Kind::Response => {
                        if self.calls.remove(&env.correlation) {
                            inputs.push(ToPlugin::CallResult {
                                call: env.correlation,
                                status: env.status,
                                meta: env.meta,
                                body,
                            });
                        }
                    }
                    Kind::Notification => inputs.push(ToPlugin::Notification {
                        event_type: env.event_type,
                        meta: env.meta,
                        body,
                    }),
                    other => tracing::debug!(?other, "ignoring frame from router"),
                }
            }
            if inputs.is_empty() {
                continue;
            }
            let outputs = match self.step(plugin, &inputs) {
                Ok(outputs) => outputs,
                // The batch never reached a handler (the plugin refused it
                // whole): answer its requests and keep serving.
                Err(err) => {
                    tracing::error!(%err, "plugin refused a batch");
                    self.refuse(&inputs, sink);
                    Vec::new()
                }
            };
            inputs.clear();
            self.dispatch(outputs, config, sink);
            while !self.immediate.is_empty() {
                let now = std::mem::take(&mut self.immediate);
                let outputs = self.step(plugin, &now)?;
                self.dispatch(outputs, config, sink);
            }
            self.cancelled.clear();
            if let Some(due) = self.timer_next
                && timer.deadline() != due
            {
                timer.as_mut().reset(due);
            }
            if let Some(due) = self.completions_due
                && tell.deadline() != due
            {
                tell.as_mut().reset(due);
            }
            let queued = self.pool.queued();
            GAUGES.set(self.requests.len() + self.calls.len(), queued);
            let out = JOBS_OUT.load(std::sync::atomic::Ordering::Relaxed);
            GAUGES.set_extra(Extra::WorkersBusy, out.saturating_sub(queued as u64));
        }
    }

    /// The router says request `correlation` of `origin` is no longer
    /// wanted: the plugin drops its handler. Found by a scan of the
    /// requests in progress, so that nothing is kept per request for the
    /// rare cancel; one already answered is not there.
    fn cancel(&mut self, origin: Origin, correlation: u64, inputs: &mut Vec<ToPlugin>) {
        let local = self
            .requests
            .iter()
            .find(|(_, (o, c, _, _))| *o == origin && *c == correlation)
            .map(|(&local, _)| local);
        let Some(local) = local else { return };
        self.requests.remove(&local);
        let tags = request_ids().remove(&local).unwrap_or_default();
        tracing::debug!(
            request_id = tags.context.request_id_field(),
            trace_id = tags.context.trace_id_field(),
            correlation = local,
            "request cancelled; dropping its handler"
        );
        self.cancelled.insert(local);
        inputs.push(ToPlugin::Cancel { correlation: local });
    }

    /// One call into the plugin, under the watchdog.
    fn step(&self, plugin: &mut Plugin, inputs: &[ToPlugin]) -> Result<Vec<FromPlugin>, LoadError> {
        let _stepping = self.watchdog.step(inputs);
        plugin.step(inputs)
    }

    /// Answers the requests of a batch the plugin could not take with 500.
    ///
    /// A refused request's stream descriptors (uploads) are left open, not
    /// closed here: the plugin may have adopted (and closed) some before it
    /// failed, and closing a number twice could close an unrelated
    /// descriptor. A refused batch is a plugin bug; it costs two
    /// descriptors per upload in it.
    fn refuse(&mut self, inputs: &[ToPlugin], sink: &FrameSink) {
        for input in inputs {
            if let ToPlugin::Request {
                correlation: local, ..
            } = input
                && let Some((origin, correlation, event_type, _)) = self.requests.remove(local)
            {
                let mut env = Envelope::request(event_type, correlation, Bytes::new());
                env.origin = origin;
                let mut answer = Refusal::new(Hop::ManagerHost, 500, "internal error").answer(&env);
                if let Some(tags) = request_ids().remove(local) {
                    tags.stamp(&mut answer);
                }
                let _ = sink.send(answer);
            }
        }
    }

    fn dispatch(&mut self, outputs: Vec<FromPlugin>, config: &Config, sink: &FrameSink) {
        let mut to_router = false;
        for output in outputs {
            let env = match output {
                FromPlugin::Response {
                    correlation,
                    status,
                    meta,
                    body,
                    handle,
                } => {
                    // Adopted first: an unknown request's stream is closed
                    // (its producer then stops), not leaked.
                    let handle = handle.map(handover::adopt_body);
                    let tags = request_ids().remove(&correlation);
                    let Some((origin, correlation, event_type, token)) = self.requests.remove(&correlation)
                    else {
                        // Answered in the step that cancelled it: nobody waits.
                        if !self.cancelled.contains(&correlation) {
                            tracing::warn!(correlation, "plugin answered an unknown request");
                        }
                        continue;
                    };
                    let mut env = Envelope::request(event_type, correlation, Bytes::new());
                    env.origin = origin;
                    let payload = match handle {
                        Some(adopted) => adopted,
                        None => Payload::for_body(body, config.shm_threshold),
                    };
                    let mut reply = match payload {
                        Ok(payload) => {
                            let mut reply = Envelope::response_to(&env, status, meta, Bytes::new());
                            reply.payload = payload;
                            reply
                        }
                        Err(err) => {
                            tracing::error!(%err, "cannot place a response body in shared memory");
                            Refusal::unavailable(Hop::ManagerHost, "response body unavailable; retry later")
                                .answer(&env)
                        }
                    };
                    // The response names its request too, for the lines
                    // the router and broker may write about it.
                    if let Some(tags) = &tags {
                        tags.stamp(&mut reply);
                    }
                    // A listener's request: straight back into the return
                    // link to its listener process (decision 0143).
                    if let (Some(pipe), true) = (crate::returns::pipe_of(origin), token != 0) {
                        reply.token = token;
                        match self
                            .returns
                            .send(pipe, reply, sink, config.queue_capacity, config.max_frame)
                        {
                            Ok(Sent::Direct) => {
                                self.completed.push((pipe, correlation));
                                continue;
                            }
                            Ok(Sent::Held) => continue,
                            Err(back) => reply = back,
                        }
                    }
                    reply
                }
                FromPlugin::Call {
                    call,
                    event_type,
                    meta,
                    body,
                    timeout_ms,
                    context,
                } => {
                    self.calls.insert(call);
                    let mut env = Envelope::request(event_type, call, Bytes::new());
                    env.payload = match Payload::for_body(body, config.shm_threshold) {
                        Ok(payload) => payload,
                        Err(err) => {
                            tracing::error!(%err, "cannot place a call body in shared memory");
                            continue;
                        }
                    };
                    env.meta = meta;
                    env.context = context;
                    env.deadline = Deadline::after(Duration::from_millis(timeout_ms));
                    env
                }
                FromPlugin::Notify {
                    event_type,
                    meta,
                    body,
                } => {
                    let mut env = Envelope::notification(event_type, Bytes::new());
                    env.payload = match Payload::for_body(body, config.shm_threshold) {
                        Ok(payload) => payload,
                        Err(err) => {
                            tracing::error!(%err, "notification dropped: no shared memory for its body");
                            continue;
                        }
                    };
                    env.meta = meta;
                    env
                }
                FromPlugin::Log {
                    level,
                    correlation,
                    message,
                } => {
                    log(level, correlation, &message);
                    continue;
                }
                FromPlugin::Cancel { id } => {
                    if self.calls.remove(&id) {
                        // The router stamps this instance as the origin.
                        match Control::cancel(Origin::Unset, id) {
                            Ok(env) => env,
                            Err(err) => {
                                tracing::error!(%err, "cannot encode a cancel");
                                continue;
                            }
                        }
                    } else {
                        self.pool.cancel(id);
                        continue;
                    }
                }
                FromPlugin::NextTimer { in_ms } => {
                    // Never a busy loop; never past a day (the plugin
                    // says again after every timer step).
                    let wait = Duration::from_millis(in_ms.clamp(1, 86_400_000));
                    self.timer_next = Some(tokio::time::Instant::now() + wait);
                    continue;
                }
                FromPlugin::Job {
                    job,
                    job_type,
                    body,
                    timeout_ms,
                    correlation,
                } => {
                    let timeout = if timeout_ms == 0 {
                        self.job_timeout
                    } else {
                        Duration::from_millis(timeout_ms)
                    };
                    // The request's id and trace go with the job, so the
                    // lines a worker writes about it name them too.
                    let tags = (correlation != 0)
                        .then(|| request_ids().get(&correlation).map(|r| r.context.clone()))
                        .flatten()
                        .unwrap_or_default();
                    let submitted = self.pool.submit(Job {
                        id: job,
                        job_type,
                        body,
                        timeout,
                        tags,
                    });
                    if submitted.is_ok() {
                        JOBS_OUT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    } else {
                        let (status, message) = switchyard_worker::QUEUE_FULL;
                        self.immediate.push(ToPlugin::JobResult {
                            job,
                            status,
                            body: Bytes::from_static(message.as_bytes()),
                        });
                    }
                    continue;
                }
            };
            match sink.send(env) {
                Ok(()) => to_router = true,
                Err(refused) => tracing::warn!(%refused, "frame to router dropped"),
            }
        }
        // The answers that went straight back are told to the router in
        // one record: with this step's other frames to it when it has
        // any, else within COMPLETIONS_WITHIN, so the router's in-flight
        // table and balancing stay right (decision 0149).
        if self.completed.is_empty() {
            return;
        }
        if to_router || self.completed.len() >= COMPLETIONS_AT_ONCE {
            self.tell_completed(sink);
        } else if self.completions_due.is_none() {
            self.completions_due = Some(tokio::time::Instant::now() + COMPLETIONS_WITHIN);
        }
    }

    /// Tells the router of every request answered straight back so far.
    fn tell_completed(&mut self, sink: &FrameSink) {
        self.completions_due = None;
        crate::returns::completed(sink, std::mem::take(&mut self.completed));
    }

    /// The router is gone: its requests are answered by the router's own
    /// successor (it failed them), and the plugin's pending calls fail now.
    fn router_lost(&mut self, plugin: &mut Plugin) -> Result<(), LoadError> {
        self.requests.clear();
        // The router failed its requests already; the next one knows none.
        self.completed.clear();
        self.completions_due = None;
        request_ids().clear();
        if self.calls.is_empty() {
            return Ok(());
        }
        let (meta, body) =
            Refusal::unavailable(Hop::ManagerHost, "the router went down during the call").parts();
        let inputs: Vec<ToPlugin> = self
            .calls
            .drain()
            .map(|call| ToPlugin::CallResult {
                call,
                status: 503,
                meta: meta.clone(),
                body: body.clone(),
            })
            .collect();
        // Whatever the plugin answers now has nowhere to go but the log.
        for output in self.step(plugin, &inputs)? {
            if let FromPlugin::Log {
                level,
                correlation,
                message,
            } = output
            {
                log(level, correlation, &message);
            }
        }
        Ok(())
    }
}

/// Jobs submitted to the pool whose result has not come back (queued or
/// running): the workers' occupancy for `/metrics`.
static JOBS_OUT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn job_result(done: Done) -> ToPlugin {
    let _ = JOBS_OUT.fetch_update(
        std::sync::atomic::Ordering::Relaxed,
        std::sync::atomic::Ordering::Relaxed,
        |n| Some(n.saturating_sub(1)),
    );
    ToPlugin::JobResult {
        job: done.id,
        status: done.status,
        body: done.body,
    }
}
