//! The broker: the single meeting point between the listener processes and
//! the rest of the group.
//!
//! Each listener keeps a small pool of return pipes to the broker, registered
//! once; the router keeps one connection. The broker stamps every request with
//! the pipe it came from ([`Origin::Pipe`]), forwards it to the router, and
//! routes each response back by that stamp alone: it keeps no per-request
//! state, so nothing in it grows with traffic and nothing needs expiring.
//! A listener's cancel of a request (its client went away) goes the same
//! way, stamped with the same pipe.
//! With answers straight back (decision 0143) the broker sees no answers
//! to listeners' requests at all, only each manager instance's offer of a
//! return link to a pipe, which it passes on by origin as it would a
//! response.
//! It relays the router's route table to every listener, and when the router
//! goes away it tells every pipe at once so that listeners answer the
//! requests in flight with 503 instead of waiting for their deadline.
//!
//! It also keeps the registry of WebSocket sessions of every listener
//! process (a session lives on one pipe) and their subscriptions. The router
//! forwards every notification here; the broker finds the subscriptions it
//! matches through an index (`subs`), and sends each pipe one push frame
//! naming the sessions it reaches; a body too large to ride inline goes as
//! a sealed shared-memory descriptor, the same one to every pipe. Each pipe's queue is bounded and never
//! waited on: a pipe that cannot keep up loses that push, nobody else does
//! (each session's own bounded queue lives in its listener).
//!
//! Who may say which hello is the supervisor's to say: with a roster
//! ([`Config::roster`]), a pipe's hello is taken only from a listener
//! process and the router's only from the router, by the pid the kernel
//! reports for the connection (docs/decisions/0100-roles-by-pid.md).
//!
//! # Layout
//! - [`run`]: accept loop and the two kinds of connection (pipe, router).
//! - `subs`: the subscription index and fan-out matching.

#![forbid(unsafe_code)]

mod subs;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use switchyard_proto::accept::Acceptor;
use switchyard_proto::control::{Control, GroupRole, META_EVENT, META_JOB, META_TO, RouteTable};
use switchyard_proto::link;
use switchyard_proto::supervision::{RosterWatch, Stop, member_of};
use switchyard_proto::transport::{FrameReader, FrameSink, PeerPolicy, Refused};
use switchyard_proto::{Envelope, Hop, Kind, Meta, Origin, Payload, Refusal, ShmBody};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::oneshot;

/// Errors that stop the broker.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("broker socket: {0}")]
    Io(#[from] std::io::Error),
}

/// The broker's settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// Largest frame accepted or sent, in bytes.
    pub max_frame: usize,
    /// Frames queued per outbound connection before requests are refused with 503.
    pub queue_capacity: usize,
    /// Which pid holds which role, from the supervisor: a pipe's hello is
    /// taken only from a listener, the router's only from the router.
    /// `None` (no supervisor, as in library tests) trusts every hello.
    pub roster: Option<RosterWatch>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_frame: switchyard_proto::DEFAULT_MAX_FRAME,
            queue_capacity: 8192,
            roster: None,
        }
    }
}

struct Pipe {
    sink: FrameSink,
    /// Pipe 0 of each listener receives the route table.
    index: u32,
}

#[derive(Default)]
struct State {
    pipes: HashMap<u64, Pipe>,
    router: Option<(u64, FrameSink)>,
    table: Option<RouteTable>,
    next_id: u64,
    subs: subs::Subscriptions,
    /// Turns through the pipes for clients' jobs to admit.
    next_job: usize,
}

#[derive(Clone)]
struct Shared {
    state: Arc<Mutex<State>>,
    config: Config,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock is a bug; keep serving with the data.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Serves the broker on `listener` until `shutdown` resolves. `ready` fires
/// once the broker accepts connections.
pub async fn run(
    listener: UnixListener,
    config: Config,
    ready: oneshot::Sender<()>,
    shutdown: impl Future<Output = Stop>,
) -> Result<(), Error> {
    let shared = Shared {
        state: Arc::default(),
        config,
    };
    let policy = PeerPolicy::for_group();
    tokio::spawn(report_gauges(shared.clone()));
    let _ = ready.send(());
    let mut acceptor = Acceptor::new(listener);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return Ok(()),
            stream = acceptor.accept_peer(&policy) => {
                tokio::spawn(connection(shared.clone(), stream));
            }
        }
    }
}

async fn connection(shared: Shared, stream: UnixStream) {
    let max = shared.config.max_frame;
    // The kernel's word for who connected; a hello's own `pid` is a claim.
    let peer = stream.peer_cred().ok().and_then(|c| c.pid()).unwrap_or(0) as u32;
    let (mut reader, sink) = match link::open(stream, shared.config.queue_capacity, max).await {
        Ok(link) => link,
        Err(err) => return tracing::warn!(%err, "connection failed to open"),
    };
    let hello = match tokio::time::timeout(Duration::from_secs(5), reader.next()).await {
        Ok(Ok(Some(env))) if env.kind == Kind::Control => env.decode_control(),
        Ok(Ok(_)) => return tracing::warn!("connection sent no hello"),
        Ok(Err(err)) => return tracing::warn!(%err, "bad hello frame"),
        Err(_) => return tracing::warn!("no hello within 5 s"),
    };
    let claimed = match &hello {
        Ok(Control::HelloPipe { .. }) => GroupRole::Listener,
        Ok(Control::HelloRouter { .. }) => GroupRole::Router,
        _ => GroupRole::Listener,
    };
    if let Some(roster) = &shared.config.roster {
        let mut roster = roster.clone();
        let role = member_of(&mut roster, peer).await.map(|m| m.role);
        if role != Some(claimed) {
            // Closing is the whole answer: a peer that is not what it
            // claims gets nothing, and the group goes on as it was.
            return tracing::warn!(
                pid = peer,
                claimed = ?claimed,
                holds = ?role,
                "refusing hello: the supervisor did not give this process that role"
            );
        }
    }
    match hello {
        Ok(Control::HelloPipe { index, .. }) => pipe(shared, reader, sink, peer, index).await,
        Ok(Control::HelloRouter { .. }) => router(shared, reader, sink, peer).await,
        Ok(other) => tracing::warn!(?other, "unexpected hello"),
        Err(err) => tracing::warn!(%err, "undecodable hello"),
    }
}

/// How often the broker's gauges are refreshed for `switchyard status`.
const GAUGE_PERIOD: Duration = Duration::from_millis(250);

/// The broker holds no request (it routes by pipe id and forgets), so its
/// in-flight gauge is 0; its queued gauge is the frames waiting in its
/// outgoing queues, to the router and to every listener pipe.
async fn report_gauges(shared: Shared) {
    let mut tick = tokio::time::interval(GAUGE_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let (queued, subscriptions) = {
            let st = shared.lock();
            let queued = st.pipes.values().map(|p| p.sink.queued()).sum::<usize>()
                + st.router.as_ref().map_or(0, |(_, sink)| sink.queued());
            (queued, st.subs.len())
        };
        let gauges = &switchyard_proto::supervision::GAUGES;
        gauges.set(0, queued);
        gauges.set_extra(
            switchyard_proto::supervision::Extra::WsSubscriptions,
            subscriptions as u64,
        );
    }
}

fn control(message: &Control) -> Option<Envelope> {
    Envelope::control(message)
        .map_err(|err| tracing::error!(%err, "cannot encode control"))
        .ok()
}

async fn pipe(
    shared: Shared,
    mut reader: FrameReader<tokio::net::unix::OwnedReadHalf>,
    sink: FrameSink,
    pid: u32,
    index: u32,
) {
    let id = {
        let mut st = shared.lock();
        st.next_id += 1;
        let id = st.next_id;
        let welcome = control(&Control::Welcome { id });
        let _ = welcome.map(|w| sink.send(w));
        if index == 0 {
            let news = match (&st.router, &st.table) {
                (Some(_), Some(table)) => control(&Control::RouteTable(table.clone())),
                (None, _) => control(&Control::RouterLost),
                _ => None,
            };
            let _ = news.map(|n| sink.send(n));
        }
        st.pipes.insert(
            id,
            Pipe {
                sink: sink.clone(),
                index,
            },
        );
        id
    };
    tracing::debug!(pid, index, id, "listener pipe registered");
    let mut batch = Vec::with_capacity(64);
    loop {
        match reader.read_batch(&mut batch).await {
            Ok(true) => {}
            Ok(false) => break,
            Err(err) => {
                tracing::warn!(%err, pid, "closing listener pipe");
                break;
            }
        }
        let mut st = shared.lock();
        for mut env in batch.drain(..) {
            match env.kind {
                Kind::Request | Kind::Notification => {
                    env.origin = Origin::Pipe(id);
                    if env.kind == Kind::Request {
                        tracing::debug!(
                            request_id = env.context.request_id_field(),
                            trace_id = env.context.trace_id_field(),
                            pipe = id,
                            "request to the router"
                        );
                    }
                    let refused = match &st.router {
                        Some((_, router)) => router.send(env).err(),
                        None => Some(Refused {
                            envelope: Box::new(env),
                            full: false,
                        }),
                    };
                    if let Some(Refused { envelope, full }) = refused
                        && envelope.kind == Kind::Request
                    {
                        // Either passes: the queue drains, the router is
                        // restarted by the supervisor.
                        let detail = if full {
                            "router queue is full"
                        } else {
                            "router is not available"
                        };
                        tracing::debug!(
                            request_id = envelope.context.request_id_field(),
                            trace_id = envelope.context.trace_id_field(),
                            detail,
                            "request refused"
                        );
                        let _ = sink.send(Refusal::unavailable(Hop::Broker, detail).answer(&envelope));
                    }
                }
                // A listener's answer to a client's job (decision 0113):
                // on to the router as it came, which takes it only for a
                // job it sent the listeners.
                Kind::Response if matches!(env.origin, Origin::Manager(_)) => {
                    if let Some((_, router)) = &st.router
                        && let Err(refused) = router.send(env)
                    {
                        tracing::debug!(%refused, pipe = id, "job answer not forwarded to the router");
                    }
                }
                Kind::Control => match env.decode_control() {
                    Ok(Control::Cancel) => {
                        // Stamped like its request, so a pipe can cancel
                        // only what it sent itself.
                        env.origin = Origin::Pipe(id);
                        if let Some((_, router)) = &st.router
                            && let Err(refused) = router.send(env)
                        {
                            tracing::debug!(%refused, pipe = id, "cancel not forwarded to the router");
                        }
                    }
                    Ok(message) => session_control(&mut st, id, message),
                    Err(err) => tracing::warn!(%err, pid, "bad control frame from listener pipe"),
                },
                other => tracing::debug!(?other, "ignoring frame from listener pipe"),
            }
        }
    }
    let mut st = shared.lock();
    st.pipes.remove(&id);
    st.subs.close_pipe(id);
}

/// A session's subscription change, from the pipe that holds the session.
fn session_control(st: &mut State, pipe: u64, message: Control) {
    match message {
        Control::Subscribe {
            session,
            sub,
            pattern,
            filter_json,
        } => {
            let key = subs::SubKey { pipe, session, sub };
            // The listener validated it; a refusal here is a version skew.
            if let Err(err) = st.subs.subscribe(key, &pattern, &filter_json) {
                tracing::warn!(%err, %pattern, "subscription refused");
            }
        }
        Control::Unsubscribe { session, sub } => st.subs.unsubscribe(subs::SubKey { pipe, session, sub }),
        Control::SessionClosed { session } => st.subs.close_session(pipe, session),
        other => tracing::debug!(?other, "ignoring control from listener pipe"),
    }
}

/// Most bytes of recipient list (meta `to`) one push frame carries; a pipe
/// with more recipients gets several frames, each with the same body.
const MAX_TO_BYTES: usize = 32 * 1024;
/// Room kept in a push frame for its header besides the body and `to`
/// (event name, type, lengths).
const PUSH_HEADROOM: usize = 16 * 1024;

/// Sends `env` to every session subscribed to it: one frame per pipe (or a
/// few, past [`MAX_TO_BYTES`] of recipients), naming its recipients in meta
/// `to`; the body is shared, not copied. A body too large to ride inline
/// next to the recipients goes as a sealed shared-memory body (the one it
/// came in, or one made here once for every pipe), so no subscriber misses
/// a notification for its size.
fn fan_out(st: &State, env: &Envelope, max_frame: usize) {
    if st.subs.is_empty() {
        return;
    }
    // The body is read for the subscriptions' filters: a sealed body is
    // mapped (it cannot change), and goes on as the same descriptor.
    let (body, mut sealed) = match &env.payload {
        Payload::Inline(bytes) => (bytes.clone(), None),
        Payload::Shm(shm) if !shm.is_pooled() => match shm.clone().map() {
            Ok(bytes) => (bytes, Some(env.payload.clone())),
            Err(err) => return tracing::warn!(%err, "notification body unavailable; not pushed"),
        },
        // A pool segment is for one consumer (decision 0011); a sender that
        // pooled a notification gets it copied out and sealed if need be.
        Payload::Shm(shm) => match shm.clone().map() {
            Ok(bytes) => (bytes, None),
            Err(err) => return tracing::warn!(%err, "notification body unavailable; not pushed"),
        },
        Payload::Stream(_) => {
            return tracing::warn!(event_type = ?env.event_type, "a streamed notification cannot be pushed");
        }
    };
    let name = env.meta.get(META_EVENT);
    let recipients = st.subs.recipients(env.event_type, name, &body);
    let inline = body.len() + MAX_TO_BYTES + PUSH_HEADROOM + name.map_or(0, str::len) <= max_frame;
    for (pipe, list) in recipients {
        let Some(p) = st.pipes.get(&pipe) else { continue };
        let mut to = String::new();
        let mut pending = list.iter().peekable();
        while let Some((session, sub)) = pending.next() {
            if !to.is_empty() {
                to.push(',');
            }
            to.push_str(&format!("{session}:{sub}"));
            if to.len() < MAX_TO_BYTES - 48 && pending.peek().is_some() {
                continue;
            }
            let payload = if let Some(shared) = &sealed {
                shared.clone()
            } else if inline {
                Payload::Inline(body.clone())
            } else {
                match ShmBody::create(&body) {
                    Ok(shm) => sealed.insert(Payload::Shm(shm)).clone(),
                    Err(err) => {
                        return tracing::warn!(%err, bytes = body.len(), "notification not pushed: no shared memory for its body");
                    }
                }
            };
            let mut meta = Meta::default();
            if let Some(name) = name {
                meta.push(META_EVENT, name);
            }
            meta.push(META_TO, std::mem::take(&mut to));
            let push = Envelope {
                meta,
                payload,
                ..Envelope::notification(env.event_type, Bytes::new())
            };
            if let Err(refused) = p.sink.send(push) {
                tracing::warn!(%refused, pipe, "push dropped: the listener pipe is not keeping up");
                break;
            }
        }
    }
}

/// Hands a client's job to one listener pipe, in turn; a request no pipe
/// takes is answered 503 to the router.
fn job_to_listener(st: &mut State, env: Envelope) {
    let mut pipes: Vec<u64> = st.pipes.keys().copied().collect();
    pipes.sort_unstable();
    let mut env = env;
    for k in 0..pipes.len() {
        let pick = pipes[(st.next_job + k) % pipes.len()];
        let Some(pipe) = st.pipes.get(&pick) else { continue };
        match pipe.sink.send(env) {
            Ok(()) => {
                st.next_job = st.next_job.wrapping_add(k + 1);
                return;
            }
            Err(refused) => env = *refused.envelope,
        }
    }
    if env.kind == Kind::Request
        && let Some((_, router)) = &st.router
    {
        let _ =
            router.send(Refusal::unavailable(Hop::Broker, "no listener can take the job now").answer(&env));
    } else {
        tracing::warn!("a client's notification job dropped: no listener can take it");
    }
}

async fn router(
    shared: Shared,
    mut reader: FrameReader<tokio::net::unix::OwnedReadHalf>,
    sink: FrameSink,
    pid: u32,
) {
    let generation = {
        let mut st = shared.lock();
        st.next_id += 1;
        let generation = st.next_id;
        st.router = Some((generation, sink));
        generation
    };
    tracing::info!(pid, "router connected");
    let mut batch = Vec::with_capacity(64);
    loop {
        match reader.read_batch(&mut batch).await {
            Ok(true) => {}
            Ok(false) => break,
            Err(err) => {
                tracing::warn!(%err, "closing router connection");
                break;
            }
        }
        let mut st = shared.lock();
        for env in batch.drain(..) {
            match (env.kind, env.origin) {
                (Kind::Response | Kind::StreamItem, Origin::Pipe(id)) => {
                    // The pipe may be gone (listener restarted): drop.
                    match st.pipes.get(&id) {
                        Some(pipe) => {
                            if let Err(refused) = pipe.sink.send(env) {
                                let request_id = refused.envelope.context.request_id_field();
                                let trace_id = refused.envelope.context.trace_id_field();
                                tracing::debug!(%refused, id, request_id, trace_id, "response dropped");
                            }
                        }
                        None => tracing::debug!(
                            id,
                            request_id = env.context.request_id_field(),
                            trace_id = env.context.trace_id_field(),
                            "response to a gone pipe dropped"
                        ),
                    }
                }
                // A manager instance's return link for one pipe (decision
                // 0143): passed on by its origin, as a response is.
                (Kind::Control, Origin::Pipe(id)) if switchyard_proto::returns::is_offer(&env) => {
                    match st.pipes.get(&id) {
                        Some(pipe) => {
                            if let Err(refused) = pipe.sink.send(env) {
                                tracing::debug!(%refused, id, "return-link offer dropped");
                            }
                        }
                        None => tracing::debug!(id, "return-link offer for a gone pipe dropped"),
                    }
                }
                (Kind::Control, _) => match env.decode_control() {
                    Ok(Control::RouteTable(table)) => {
                        if let Some(news) = control(&Control::RouteTable(table.clone())) {
                            for pipe in st.pipes.values().filter(|p| p.index == 0) {
                                let _ = pipe.sink.send(news.clone());
                            }
                        }
                        st.table = Some(table);
                    }
                    Ok(other) => tracing::debug!(?other, "ignoring control from router"),
                    Err(err) => tracing::warn!(%err, "bad control frame from router"),
                },
                // A client's job (the router sends only the built-in
                // Scheduler's): one listener admits it as its client.
                (Kind::Request, Origin::Manager(_)) => job_to_listener(&mut st, env),
                (Kind::Notification, _) if env.meta.get(META_JOB).is_some() => job_to_listener(&mut st, env),
                (Kind::Notification, _) => fan_out(&st, &env, shared.config.max_frame),
                (kind, origin) => tracing::debug!(?kind, ?origin, "ignoring frame from router"),
            }
        }
    }
    let mut st = shared.lock();
    if matches!(st.router, Some((g, _)) if g == generation) {
        st.router = None;
        // With no listener connected (the group stopping: listeners stop
        // first) nothing can be in flight, and the router's leaving is no
        // failure.
        if st.pipes.is_empty() {
            tracing::info!("router connection closed; no listener connected");
        } else {
            tracing::warn!("router connection lost; failing requests in flight");
        }
        if let Some(lost) = control(&Control::RouterLost) {
            for pipe in st.pipes.values() {
                let _ = pipe.sink.send(lost.clone());
            }
        }
    }
}
