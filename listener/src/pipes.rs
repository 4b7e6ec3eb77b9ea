//! The pool of return pipes: a few long-lived connections to the broker,
//! registered once and shared by every request of this process.
//!
//! A request takes the next live pipe, parks a oneshot under its correlation
//! id, and is answered by that pipe's reader task. When a pipe breaks, or the
//! broker says the router is gone, the requests waiting on it are answered
//! with 503 at once; the pipe reconnects in the background.
//!
//! Sessions (WebSocket connections, gRPC `Subscribe` and `Session` streams)
//! live on one pipe each (by session number): their subscriptions go to the
//! broker on it, and the broker's pushes for them come back on it. Each
//! session has a bounded outbound queue ([`Outbox`]); a push that finds it
//! full drops the session (WebSocket: closed with 1008 "too slow"; gRPC: the
//! stream ends with RESOURCE_EXHAUSTED) without slowing anyone else. When a pipe reconnects, its sessions' subscriptions
//! are sent again (the broker forgot them with the old pipe).
//!
//! With `group.return_path = "direct"` (decision 0143) each request also
//! carries a return token, and each manager instance that serves this
//! process offers it one return link (through whichever pipe it first
//! answers), told which pipes are this process's: its answers then come
//! straight from it, not through router and broker. An answer on a return
//! link is taken only if it echoes its request's token; the first answer
//! for a request wins, whichever way it came, and a later one is dropped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use switchyard_proto::backoff::Backoff;
use switchyard_proto::control::{Control, Filter, META_EVENT, META_JOB, META_TO, RouteTable, pattern_prefix};
use switchyard_proto::grpc::{Push, ServerMessage, server_message};
use switchyard_proto::link;
use switchyard_proto::returns::{self, Tokens};
use switchyard_proto::supervision::{Extra, GAUGES};
use switchyard_proto::transport::{FrameReader, FrameSink};
use switchyard_proto::{Envelope, Hop, Kind, Origin, Refusal};
use tokio::net::UnixStream;
use tokio::net::unix::OwnedReadHalf;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_tungstenite::tungstenite::Message;

use crate::config::Config;
use crate::routes::Routes;
use switchyard_middleware::Middleware;
use switchyard_middleware::paths::EventPaths;
use switchyard_middleware::session::{CloseReason, Policy, SessionAuth, SessionHost};

type Pending = HashMap<u64, oneshot::Sender<Envelope>>;

struct Slot {
    sink: Mutex<Option<FrameSink>>,
    pending: Mutex<Pending>,
    sessions: Mutex<HashMap<u64, Session>>,
    /// The broker's id for this pipe while it is connected (0: not).
    id: AtomicU64,
}

/// Return links this process holds at most (one per manager instance that
/// served it): past this an offer is refused and that instance answers
/// through the router. Each link is two shared-memory rings.
const MAX_RETURN_LINKS: usize = 256;

/// A return link, by the pid of the manager process at its other end and
/// the instance number its offer gave.
struct ReturnLink {
    /// Tells the instance which pipes are ours; `None` while opening.
    sink: Option<FrameSink>,
    task: tokio::task::AbortHandle,
    serial: u64,
}

/// A session's bounded outbound queue: what its pushes become.
pub(crate) enum Outbox {
    /// A WebSocket connection: JSON text messages.
    Ws(mpsc::Sender<Message>),
    /// A gRPC stream: `ServerMessage { push }` (a `Subscribe` stream unwraps
    /// them).
    Grpc(mpsc::Sender<Result<ServerMessage, tonic::Status>>),
}

/// A session (WebSocket connection or gRPC stream) as its pipe sees it.
pub(crate) struct Session {
    /// The session's bounded outbound queue.
    pub(crate) tx: Outbox,
    /// Set to end the session with a close code.
    pub(crate) kill: watch::Sender<CloseReason>,
    pub(crate) subs: HashMap<u64, Subscription>,
    /// Its caller, against whom each push is checked (`None`: the policy
    /// is not consulted, as for `/ws/echo`).
    pub(crate) auth: Option<Arc<SessionAuth>>,
}

/// One subscription of a session.
pub(crate) struct Subscription {
    /// The client's id for it (echoed in pushes).
    pub(crate) id: serde_json::Value,
    pub(crate) pattern: String,
    pub(crate) filter_json: String,
}

/// Checks a subscription's pattern and optional filter; returns the filter
/// as JSON text (empty for none), or why it is refused (status 400).
pub(crate) fn check_subscription(
    pattern: &str,
    filter: Option<&serde_json::Value>,
) -> Result<String, String> {
    if let Err(reason) = pattern_prefix(pattern) {
        return Err(format!("bad pattern: {reason}"));
    }
    match filter {
        None | Some(serde_json::Value::Null) => Ok(String::new()),
        Some(f) => match Filter::parse(f) {
            Ok(_) => Ok(f.to_string()),
            Err(reason) => Err(format!("bad filter: {reason}")),
        },
    }
}

/// Closes its session when dropped (a gRPC stream ends by being dropped).
pub(crate) struct SessionGuard {
    pub(crate) pool: Arc<Pool>,
    pub(crate) session: u64,
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        self.pool.close_session(self.session);
    }
}

impl Subscription {
    fn control(&self, session: u64, sub: u64) -> Control {
        Control::Subscribe {
            session,
            sub,
            pattern: self.pattern.clone(),
            filter_json: self.filter_json.clone(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Slot {
    /// Tells the broker that request `correlation` sent on this pipe is no
    /// longer wanted. Best effort: a full or broken pipe loses it, and the
    /// request's deadline still ends the work.
    fn cancel(&self, correlation: u64) {
        let Some(sink) = lock(&self.sink).clone() else {
            return;
        };
        match Control::cancel(Origin::Unset, correlation) {
            Ok(env) => {
                if let Err(refused) = sink.send(env) {
                    tracing::debug!(%refused, correlation, "cancel not sent to the broker");
                }
            }
            Err(err) => tracing::error!(%err, "cannot encode a cancel"),
        }
    }

    /// Answers every waiting request with 503.
    fn fail_all(&self, detail: &'static str) {
        let pending = std::mem::take(&mut *lock(&self.pending));
        let refusal = Refusal::new(Hop::Listener, 503, detail);
        for (correlation, tx) in pending {
            let stub = Envelope::request(Default::default(), correlation, Default::default());
            let _ = tx.send(refusal.answer(&stub));
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
    next_session: AtomicU64,
    routes: RwLock<Arc<Routes>>,
    router_up: AtomicBool,
    /// Counts pipes connected and whether a route table has arrived.
    progress: watch::Sender<(usize, bool)>,
    /// Bumped whenever the route table or the router's state changes.
    changes: watch::Sender<u64>,
    /// The policy in force for sessions, whichever configuration they
    /// were opened under.
    policy: watch::Sender<Policy>,
    /// Clients' jobs the broker handed this process to admit (`crate::jobs`),
    /// and the receiving end until `lib.rs` takes it.
    jobs: mpsc::Sender<Envelope>,
    job_queue: Mutex<Option<mpsc::Receiver<Envelope>>>,
    config: Arc<Config>,
    /// Answers come straight from the managers (decision 0143).
    direct: bool,
    /// Keys the return token of every request from its correlation.
    tokens: Tokens,
    /// Return links, by the manager process's pid (the kernel's word for
    /// who made the socket pair) and the instance number of its offer.
    links: Mutex<HashMap<(u32, u64), ReturnLink>>,
    next_link: AtomicU64,
}

/// Clients' jobs waiting to be admitted in one listener process; past
/// this a request job is answered 503 and retried by the Scheduler.
const JOB_QUEUE: usize = 1024;

/// A request in flight: dropping it (answered, timed out, or the client went
/// away) removes its entry from the pending map. Dropped unanswered, it
/// cancels the request through the group: the work it asked for stops
/// (docs/decisions/0092-cancellation-as-a-control-frame.md).
pub(crate) struct InFlight<'a> {
    slot: &'a Slot,
    correlation: u64,
    /// A request, not a notification: something may be working on it.
    cancels: bool,
    pub(crate) response: oneshot::Receiver<Envelope>,
    /// Counted while it lives: a listener thread with answers to await
    /// keeps its CPU a little before it sleeps (decision 0162).
    _awaited: switchyard_proto::park::Awaited,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        // The pipe's reader removes the entry when the answer comes, so
        // an answered request costs nothing more here.
        let unanswered = lock(&self.slot.pending).remove(&self.correlation).is_some();
        if unanswered && self.cancels {
            self.slot.cancel(self.correlation);
        }
    }
}

impl Pool {
    pub(crate) fn start(config: Arc<Config>, middleware: Arc<Middleware>) -> Arc<Pool> {
        // Correlation ids start at a random point so that a restarted
        // listener never matches a late response meant for its predecessor.
        let seed = switchyard_proto::event::now_micros() ^ ((std::process::id() as u64) << 40);
        let (jobs, job_queue) = mpsc::channel(JOB_QUEUE);
        let pool = Arc::new(Pool {
            slots: (0..config.pipes)
                .map(|_| Slot {
                    sink: Mutex::new(None),
                    pending: Mutex::new(HashMap::new()),
                    sessions: Mutex::new(HashMap::new()),
                    id: AtomicU64::new(0),
                })
                .collect(),
            next_slot: AtomicUsize::new(0),
            next_correlation: AtomicU64::new(seed),
            next_session: AtomicU64::new(1),
            routes: RwLock::new(Arc::new(Routes::default())),
            router_up: AtomicBool::new(false),
            progress: watch::channel((0, false)).0,
            changes: watch::channel(0).0,
            policy: watch::channel(Policy {
                middleware,
                generation: 0,
            })
            .0,
            jobs,
            job_queue: Mutex::new(Some(job_queue)),
            config,
            direct: returns::direct(),
            tokens: Tokens::new(),
            links: Mutex::new(HashMap::new()),
            next_link: AtomicU64::new(1),
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

    /// Whether the group is ready: the router is up and every declared
    /// manager has an instance up (`/ready`, gRPC health).
    pub(crate) fn ready(&self) -> bool {
        self.router_up() && self.routes().table.all_up()
    }

    /// Changes whenever [`routes`](Self::routes) or
    /// [`router_up`](Self::router_up) may have.
    pub(crate) fn watch_changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// The policy sessions are held to now.
    pub(crate) fn policy(&self) -> Policy {
        self.policy.borrow().clone()
    }

    /// Changes with every reload's policy.
    pub(crate) fn watch_policy(&self) -> watch::Receiver<Policy> {
        self.policy.subscribe()
    }

    /// A reload's middleware becomes the sessions' policy; each open
    /// session checks itself against it (`middleware::session`).
    pub(crate) fn set_policy(&self, middleware: Arc<Middleware>) {
        self.policy.send_modify(|p| {
            p.middleware = middleware;
            p.generation += 1;
        });
    }

    /// The clients' jobs this process is handed (once).
    pub(crate) fn take_jobs(&self) -> Option<mpsc::Receiver<Envelope>> {
        lock(&self.job_queue).take()
    }

    /// A client's job from the broker: queued for `crate::jobs`, or, when
    /// the queue is full, a request answered 503 (the Scheduler retries).
    fn job(&self, env: Envelope) {
        if let Err(mpsc::error::TrySendError::Full(env) | mpsc::error::TrySendError::Closed(env)) =
            self.jobs.try_send(env)
        {
            if env.kind == Kind::Request {
                self.answer(
                    Refusal::unavailable(Hop::Listener, "the listener is admitting too many jobs")
                        .answer(&env),
                );
            } else {
                tracing::warn!("a client's notification job dropped: too many jobs to admit");
            }
        }
    }

    /// Sends the answer to a job's call on any live pipe: the broker
    /// passes it to the router by its origin, whichever pipe it came on.
    pub(crate) fn answer(&self, env: Envelope) {
        let mut env = env;
        for slot in &self.slots {
            let Some(sink) = lock(&slot.sink).clone() else {
                continue;
            };
            match sink.send(env) {
                Ok(()) => return,
                Err(refused) => env = *refused.envelope,
            }
        }
        tracing::warn!("the answer to a client's job was dropped: no pipe took it");
    }

    /// The patterns session `session` is subscribed to.
    pub(crate) fn patterns(&self, session: u64) -> Vec<String> {
        lock(&self.slot_of(session).sessions)
            .get(&session)
            .map(|s| s.subs.values().map(|sub| sub.pattern.clone()).collect())
            .unwrap_or_default()
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
            if self.direct && env.kind == Kind::Request {
                env.token = self.tokens.token(correlation);
            }
            let (tx, response) = oneshot::channel();
            lock(&slot.pending).insert(correlation, tx);
            let mut in_flight = InFlight {
                slot,
                correlation,
                cancels: false,
                response,
                _awaited: switchyard_proto::park::Awaited::start(),
            };
            let request = env.kind == Kind::Request;
            match sink.send(env) {
                Ok(()) => {
                    in_flight.cancels = request;
                    return Ok(in_flight);
                }
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

    fn slot_of(&self, session: u64) -> &Slot {
        &self.slots[session as usize % self.slots.len()]
    }

    /// Sends a session's control message on its pipe (when the pipe is down,
    /// its reconnection re-sends the session's subscriptions).
    fn session_control(&self, session: u64, message: &Control) {
        let Some(sink) = lock(&self.slot_of(session).sink).clone() else {
            return;
        };
        match Envelope::control(message) {
            Ok(env) => {
                if let Err(refused) = sink.send(env) {
                    tracing::warn!(%refused, session, "subscription change not sent to the broker");
                }
            }
            Err(err) => tracing::error!(%err, "cannot encode a session control"),
        }
    }

    /// Registers a session; returns its number.
    pub(crate) fn open_session(
        &self,
        tx: Outbox,
        kill: watch::Sender<CloseReason>,
        auth: Option<Arc<SessionAuth>>,
    ) -> u64 {
        let session = self.next_session.fetch_add(1, Ordering::Relaxed);
        let entry = Session {
            tx,
            kill,
            subs: HashMap::new(),
            auth,
        };
        lock(&self.slot_of(session).sessions).insert(session, entry);
        session
    }

    /// Adds a subscription to a session and tells the broker.
    pub(crate) fn subscribe(&self, session: u64, sub: u64, subscription: Subscription) {
        let message = subscription.control(session, sub);
        if let Some(s) = lock(&self.slot_of(session).sessions).get_mut(&session) {
            s.subs.insert(sub, subscription);
        }
        self.session_control(session, &message);
    }

    /// Ends the subscriptions of a session for which `pick` holds; returns
    /// how many.
    pub(crate) fn unsubscribe(&self, session: u64, pick: impl Fn(&Subscription) -> bool) -> usize {
        let gone: Vec<u64> = match lock(&self.slot_of(session).sessions).get_mut(&session) {
            Some(s) => {
                let gone: Vec<u64> = s.subs.iter().filter(|(_, v)| pick(v)).map(|(k, _)| *k).collect();
                for sub in &gone {
                    s.subs.remove(sub);
                }
                gone
            }
            None => Vec::new(),
        };
        for &sub in &gone {
            self.session_control(session, &Control::Unsubscribe { session, sub });
        }
        gone.len()
    }

    /// Subscriptions a session holds.
    pub(crate) fn subscriptions(&self, session: u64) -> usize {
        lock(&self.slot_of(session).sessions)
            .get(&session)
            .map_or(0, |s| s.subs.len())
    }

    /// Forgets a session and tells the broker.
    pub(crate) fn close_session(&self, session: u64) {
        let had = lock(&self.slot_of(session).sessions).remove(&session);
        if had.is_some_and(|s| !s.subs.is_empty()) {
            self.session_control(session, &Control::SessionClosed { session });
        }
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
        self.changed();
    }
}

/// What a session's watch (`middleware::session`) reads of the pool that
/// holds the sessions.
impl SessionHost for Pool {
    fn watch_policy(&self) -> watch::Receiver<Policy> {
        Pool::watch_policy(self)
    }

    fn event_paths(&self) -> Arc<EventPaths> {
        Pool::routes(self).event_paths().clone()
    }

    fn patterns(&self, session: u64) -> Vec<String> {
        Pool::patterns(self, session)
    }
}

async fn pipe_task(pool: Arc<Pool>, index: usize) {
    let mut backoff = Backoff::peer();
    loop {
        match connect(&pool, index).await {
            Ok((reader, sink, id)) => {
                backoff.reset();
                resubscribe(&pool.slots[index], &sink);
                *lock(&pool.slots[index].sink) = Some(sink);
                pool.slots[index].id.store(id, Ordering::Relaxed);
                pool.tell_return_links();
                pool.mark(1, false);
                read_responses(&pool, index, reader).await;
                *lock(&pool.slots[index].sink) = None;
                pool.slots[index].id.store(0, Ordering::Relaxed);
                pool.mark(-1, false);
                pool.slots[index].fail_all("lost the connection to the broker");
                tracing::warn!(pipe = index, "broker pipe lost; reconnecting");
            }
            Err(err) => {
                tracing::debug!(%err, pipe = index, "broker not reachable");
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    }
}

/// A new pipe: the broker knows none of its sessions' subscriptions yet.
fn resubscribe(slot: &Slot, sink: &FrameSink) {
    let sessions = lock(&slot.sessions);
    for (&session, s) in sessions.iter() {
        for (&sub, subscription) in &s.subs {
            if let Ok(env) = Envelope::control(&subscription.control(session, sub)) {
                let _ = sink.send(env);
            }
        }
    }
}

async fn connect(
    pool: &Pool,
    index: usize,
) -> Result<(FrameReader<OwnedReadHalf>, FrameSink, u64), switchyard_proto::Error> {
    let config = &pool.config;
    let stream = UnixStream::connect(&config.broker_socket).await?;
    let (mut reader, sink) = link::open(stream, config.queue_capacity, config.max_frame).await?;
    let hello = Control::HelloPipe {
        pid: std::process::id(),
        index: index as u32,
    };
    sink.send_wait(Envelope::control(&hello)?).await?;
    match reader.next().await? {
        Some(env) if env.kind == Kind::Control => match env.decode_control()? {
            Control::Welcome { id } => Ok((reader, sink, id)),
            _ => Err(switchyard_proto::Error::Malformed("expected welcome")),
        },
        _ => Err(switchyard_proto::Error::Closed),
    }
}

async fn read_responses(pool: &Arc<Pool>, index: usize, mut reader: FrameReader<OwnedReadHalf>) {
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
                Kind::Control if returns::is_offer(&env) => open_return(pool, env),
                Kind::Control => match env.decode_control() {
                    Ok(Control::RouteTable(table)) => pool.apply_routes(table),
                    Ok(Control::RouterLost) => {
                        pool.router_up.store(false, Ordering::Relaxed);
                        pool.changed();
                        slot.fail_all("the router went down while handling the request");
                    }
                    Ok(other) => tracing::debug!(?other, "ignoring control from broker"),
                    Err(err) => tracing::warn!(%err, "bad control frame from broker"),
                },
                // Clients' jobs to admit (decision 0113).
                Kind::Request => pool.job(env),
                Kind::Notification if env.meta.get(META_JOB).is_some() => pool.job(env),
                Kind::Notification => push(pool, slot, &env),
                other => tracing::debug!(?other, "ignoring frame from broker"),
            }
        }
    }
}

/// A manager instance offers this process a return link (through one of
/// its pipes): read it for the life of the process or the instance. An
/// instance that has one already is told again which pipes are ours.
fn open_return(pool: &Arc<Pool>, offer: Envelope) {
    if !pool.direct {
        return tracing::debug!("return-link offer ignored: answers come through the router");
    }
    let (socket, instance) = match returns::accept(offer) {
        Ok(offered) => offered,
        Err(err) => return tracing::warn!(%err, "bad return-link offer"),
    };
    // The kernel's word for who made the pair, and the instance it names:
    // one link per instance.
    let Some(pid) = socket.peer_cred().ok().and_then(|c| c.pid()).map(|p| p as u32) else {
        return tracing::warn!("return-link offer from an unknown process refused");
    };
    let key = (pid, instance);
    let mut links = lock(&pool.links);
    links.retain(|_, link| !link.task.is_finished());
    if let Some(link) = links.get(&key) {
        // Offered through another pipe before it heard which are ours.
        if let Some(sink) = &link.sink {
            pool.tell_pipes(sink);
        }
        return tracing::debug!(
            pid,
            "second return-link offer of an instance: told its link our pipes"
        );
    }
    if links.len() >= MAX_RETURN_LINKS {
        return tracing::warn!(
            pid,
            max = MAX_RETURN_LINKS,
            "return-link offer refused: this process holds the most it may; that instance answers through the router"
        );
    }
    let serial = pool.next_link.fetch_add(1, Ordering::Relaxed);
    let task = tokio::spawn(read_return(pool.clone(), key, serial, socket)).abort_handle();
    links.insert(
        key,
        ReturnLink {
            sink: None,
            task,
            serial,
        },
    );
}

/// Return links open in this process (`switchyard status`: the
/// listener's `return_links`).
static RETURN_LINKS: AtomicU64 = AtomicU64::new(0);

/// Counts one open return link while it lives (a read task that is
/// aborted drops it too).
struct Counted;

impl Counted {
    fn new() -> Counted {
        let n = RETURN_LINKS.fetch_add(1, Ordering::Relaxed) + 1;
        GAUGES.set_extra(Extra::ReturnLinks, n);
        Counted
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        let n = RETURN_LINKS.fetch_sub(1, Ordering::Relaxed).saturating_sub(1);
        GAUGES.set_extra(Extra::ReturnLinks, n);
    }
}

impl Pool {
    /// Tells every return link which pipes are ours now (a pipe connected
    /// under a new id).
    fn tell_return_links(&self) {
        for link in lock(&self.links).values() {
            if let Some(sink) = &link.sink {
                self.tell_pipes(sink);
            }
        }
    }

    fn tell_pipes(&self, sink: &FrameSink) {
        let pipes: Vec<u64> = self
            .slots
            .iter()
            .map(|slot| slot.id.load(Ordering::Relaxed))
            .filter(|&id| id != 0)
            .collect();
        match Envelope::control(&Control::ReturnPipes { pipes }) {
            Ok(env) => {
                if let Err(refused) = sink.send(env) {
                    tracing::debug!(%refused, "pipes not told to a return link");
                }
            }
            Err(err) => tracing::error!(%err, "cannot encode our pipes"),
        }
    }

    /// The waiter of request `correlation`, whichever pipe it went on
    /// (correlations are unique in the process).
    fn take_waiter(&self, correlation: u64) -> Option<oneshot::Sender<Envelope>> {
        self.slots
            .iter()
            .find_map(|slot| lock(&slot.pending).remove(&correlation))
    }
}

/// Answers straight from one manager instance: each is taken only if it
/// echoes its request's token, and only while the request still waits.
async fn read_return(pool: Arc<Pool>, key: (u32, u64), serial: u64, socket: UnixStream) {
    read_return_link(&pool, key, serial, socket).await;
    let mut links = lock(&pool.links);
    if links.get(&key).is_some_and(|l| l.serial == serial) {
        links.remove(&key);
    }
}

async fn read_return_link(pool: &Arc<Pool>, key: (u32, u64), serial: u64, socket: UnixStream) {
    let pid = key.0;
    let config = &pool.config;
    let (mut reader, sink) = match link::open(socket, config.queue_capacity, config.max_frame).await {
        Ok(link) => link,
        Err(err) => return tracing::debug!(%err, pid, "return link not opened"),
    };
    let _counted = Counted::new();
    // The sink stays here with the link: the instance sees the link end
    // only when this process or its own end does. Our pipes are the first
    // frame on it, and the instance's word that we took the link: an
    // offer we refuse is closed unread, which on the socket transport
    // looks like an open link until then.
    pool.tell_pipes(&sink);
    if let Some(link) = lock(&pool.links).get_mut(&key).filter(|l| l.serial == serial) {
        link.sink = Some(sink.clone());
    }
    let mut refused = 0u64;
    let mut batch = Vec::with_capacity(64);
    loop {
        match reader.read_batch(&mut batch).await {
            Ok(true) => {}
            Ok(false) => return tracing::debug!(pid, "return link closed by its instance"),
            Err(err) => return tracing::warn!(%err, pid, "bad frame on a return link; closing it"),
        }
        for env in batch.drain(..) {
            if env.kind != Kind::Response {
                tracing::debug!(kind = ?env.kind, "ignoring frame on a return link");
                continue;
            }
            if !pool.tokens.check(&env) {
                refused += 1;
                if refused == 1 {
                    tracing::warn!(
                        pid,
                        correlation = env.correlation,
                        "direct answer refused: it does not carry its request's token (later ones on this link are logged at debug)"
                    );
                } else {
                    tracing::debug!(
                        pid,
                        correlation = env.correlation,
                        "direct answer refused: wrong token"
                    );
                }
                continue;
            }
            // No waiter: answered already (503, 504), or its client left.
            if let Some(tx) = pool.take_waiter(env.correlation) {
                let _ = tx.send(env);
            }
        }
    }
}

/// A push from the broker: one message per session it names, queued
/// without waiting; a session whose queue is full is dropped.
fn push(pool: &Pool, slot: &Slot, env: &Envelope) {
    let Some(to) = env.meta.get(META_TO) else { return };
    let body = match env.payload.clone().into_bytes() {
        Ok(b) => b,
        Err(err) => return tracing::warn!(%err, "push body unavailable"),
    };
    // Pushes are JSON; a body that is not (an old sender's bincode) is null.
    let data = if serde_json::from_slice::<serde::de::IgnoredAny>(&body).is_ok() {
        String::from_utf8_lossy(&body).into_owned()
    } else {
        "null".to_owned()
    };
    let mut by_session: HashMap<u64, Vec<u64>> = HashMap::new();
    for pair in to.split(',') {
        if let Some((session, sub)) = pair.split_once(':')
            && let (Ok(session), Ok(sub)) = (session.parse::<u64>(), sub.parse::<u64>())
        {
            by_session.entry(session).or_default().push(sub);
        }
    }
    let mut dropped = Vec::new();
    let policy = pool.policy();
    let routes = pool.routes();
    {
        let sessions = lock(&slot.sessions);
        for (session, subs) in by_session {
            let Some(s) = sessions.get(&session) else { continue };
            let ids: Vec<&serde_json::Value> = subs
                .iter()
                .filter_map(|sub| s.subs.get(sub).map(|x| &x.id))
                .collect();
            // Unsubscribed meanwhile: nothing to deliver.
            let Some(first) = subs.iter().find_map(|sub| s.subs.get(sub)) else {
                continue;
            };
            let name = env.meta.get(META_EVENT).unwrap_or(&first.pattern);
            // The subscription was allowed for the pattern; this
            // notification meets the rules for its own type too
            // (decision 0106), under the rules in force now.
            if let Some(auth) = &s.auth
                && !auth.may_receive(&policy, name, routes.event_paths())
            {
                continue;
            }
            let sent = match &s.tx {
                Outbox::Ws(tx) => {
                    let text = format!(
                        r#"{{"event":{},"sub":{},"data":{data}}}"#,
                        serde_json::Value::from(name),
                        serde_json::to_string(&ids).unwrap_or_else(|_| "[]".into()),
                    );
                    tx.try_send(Message::text(text))
                        .map_err(|e| matches!(e, mpsc::error::TrySendError::Full(_)))
                }
                Outbox::Grpc(tx) => {
                    let push = Push {
                        event: name.to_owned(),
                        payload: body.clone(),
                        subscriptions: ids
                            .iter()
                            .map(|id| id.as_str().unwrap_or_default().to_owned())
                            .collect(),
                        content_type: "application/json".to_owned(),
                    };
                    let message = ServerMessage {
                        id: String::new(),
                        kind: Some(server_message::Kind::Push(push)),
                    };
                    tx.try_send(Ok(message))
                        .map_err(|e| matches!(e, mpsc::error::TrySendError::Full(_)))
                }
            };
            match sent {
                Ok(()) => {}
                Err(true) => {
                    let kind = match s.tx {
                        Outbox::Ws(_) => "websocket",
                        Outbox::Grpc(_) => "grpc",
                    };
                    tracing::warn!(session, "dropping slow {kind} client: its send queue is full");
                    s.kill.send_replace(Some((1008, "too slow: send queue full")));
                    dropped.push(session);
                }
                Err(false) => dropped.push(session),
            }
        }
    }
    for session in dropped {
        pool.close_session(session);
    }
}
