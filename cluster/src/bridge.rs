//! The connection to NATS and the tasks that move frames across it.
//!
//! One task ([`start`]'s loop) takes what the router sends
//! ([`ToRemote`]) in order; each call across groups, and each reply owed to
//! another group, runs on a task of its own so a slow group never holds up
//! another. Subscriptions: one queue subscription per event type this group
//! serves (so NATS balances calls over every group that serves it), one to
//! every notification of the cluster, and two for the route manifests.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::client::RequestErrorKind;
use async_nats::connection::State;
use async_nats::{Client, ConnectErrorKind, ConnectOptions, Event, Message, Subject};
use bytes::Bytes;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use switchyard_proto::control::LinkState;
use switchyard_proto::event::Payload;
use switchyard_proto::remote::{FromRemote, Manifest, REMOTE_ID, ToRemote};
use switchyard_proto::{Deadline, Envelope, EventType, Hop, Kind, Origin, Refusal};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::wire::{self, call_subject, note_subject};
use crate::{Config, Error};

/// Starts the connection (in the background: NATS being down does not
/// stop the router) and the bridge's tasks, on the far end of the
/// router's port: frames from the router arrive on `from_router`, what
/// the cluster sends goes out on `to_router`. `shm_threshold`: bodies
/// from the cluster at least this large go into shared memory, as the
/// listener's do. The bridge runs until the router drops its end.
pub async fn start(
    config: Config,
    shm_threshold: usize,
    from_router: mpsc::Receiver<ToRemote>,
    to_router: mpsc::Sender<FromRemote>,
) -> Result<(), Error> {
    let group = group_id();
    let (events_tx, events) = mpsc::unbounded_channel();
    let options = options(&config)?
        .retry_on_initial_connect()
        .max_reconnects(None)
        .event_callback(move |event| {
            let events = events_tx.clone();
            async move {
                let _ = events.send(event);
            }
        });
    let client = options
        .connect(config.nats.clone())
        .await
        .map_err(|e| Error::Unreachable(e.to_string()))?;
    let core = Arc::new(Core {
        client,
        cluster: config.name.clone(),
        group,
        from: to_router,
        pending: Mutex::new(HashMap::new()),
        next: AtomicU64::new(1),
        shm_threshold,
        default_timeout: config.request_timeout(),
        left: AtomicBool::new(false),
    });
    tracing::info!(cluster = %config.name, servers = ?redacted(&config.nats), group = %core.group, "cluster bridge starting");
    tokio::spawn(run(core, from_router, events));
    Ok(())
}

/// Tells the other groups this group is leaving (a clean stop), so that
/// they forget its routes at once rather than after
/// [`MANIFEST_EXPIRY`](switchyard_proto::remote::MANIFEST_EXPIRY);
/// waits at most a second for it to go out.
async fn leave(core: &Core) {
    core.left.store(true, Ordering::Relaxed);
    if core.client.connection_state() != State::Connected {
        return;
    }
    let subject = format!("{}.goodbye", core.cluster);
    if core
        .client
        .publish(subject, core.group.clone().into())
        .await
        .is_ok()
    {
        let _ = tokio::time::timeout(Duration::from_secs(1), core.client.flush()).await;
    }
}

/// Connects once and disconnects, to tell a configuration the server
/// refuses (wrong credentials: [`Error::Refused`]) from a server that is
/// merely down ([`Error::Unreachable`]), before the group starts.
pub async fn probe(config: &Config) -> Result<(), Error> {
    let client = options(config)?
        .connect(config.nats.clone())
        .await
        .map_err(|e| match e.kind() {
            ConnectErrorKind::Authentication | ConnectErrorKind::AuthorizationViolation => {
                Error::Refused(e.to_string())
            }
            _ => Error::Unreachable(e.to_string()),
        })?;
    // The server answers the CONNECT with -ERR on bad credentials, which
    // a flush surfaces.
    let flushed = client.flush().await;
    drop(client);
    flushed.map_err(|e| Error::Unreachable(e.to_string()))
}

/// The connection options `[cluster]` gives: also what the built-ins' JetStream
/// back end connects with (same servers, credentials and TLS).
pub fn options(config: &Config) -> Result<ConnectOptions, Error> {
    let mut o = ConnectOptions::new()
        .name(format!("switchyard {} pid {}", config.name, std::process::id()))
        // Our own notifications never come back to us.
        .no_echo()
        .connection_timeout(Duration::from_millis(config.connect_timeout_ms))
        .ping_interval(Duration::from_secs(10));
    let cap = Duration::from_millis(config.max_reconnect_delay_ms);
    o = o.reconnect_delay_callback(move |attempts| {
        let exp = attempts.min(16) as u32;
        Duration::from_millis(50).saturating_mul(1 << exp).min(cap)
    });
    if let (Some(user), Some(password)) = (&config.user, &config.password) {
        o = o.user_and_password(user.clone(), password.clone());
    }
    if let Some(token) = &config.token {
        o = o.token(token.clone());
    }
    if let Some(seed) = config.nkey_seed().map_err(Error::Config)? {
        o = o.nkey(seed);
    }
    if let Some(ca) = &config.tls_ca_file {
        o = o.add_root_certificates(ca.clone());
    }
    if config.nats.iter().any(|u| u.starts_with("tls://")) {
        o = o.require_tls(true);
    }
    Ok(o)
}

/// Server URLs for a log line, without credentials.
fn redacted(urls: &[String]) -> Vec<String> {
    urls.iter()
        .map(|u| match (u.split_once("://"), u.rfind('@')) {
            (Some((scheme, _)), Some(at)) => format!("{scheme}://***@{}", &u[at + 1..]),
            _ => u.clone(),
        })
        .collect()
}

/// This router's id in the cluster: unique per process start, so a group
/// restarted is a new origin and nothing it sent before is taken for its own.
fn group_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    format!("{:x}-{:x}", std::process::id(), nanos)
}

/// What every task of the bridge shares.
struct Core {
    client: Client,
    cluster: String,
    group: String,
    /// The router's end of the port.
    from: mpsc::Sender<FromRemote>,
    /// Calls from the cluster being served here, by the correlation id
    /// given them: where to reply, and when to give up on the entry.
    pending: Mutex<HashMap<u64, (Subject, Instant)>>,
    next: AtomicU64,
    shm_threshold: usize,
    default_timeout: Duration,
    /// Set once this group has said goodbye: it publishes no manifest or
    /// hello after it, for a manifest (a heartbeat, or the routes of its
    /// managers stopping one by one) that reached the others after the
    /// goodbye would make them count this group again until it expired.
    left: AtomicBool,
}

impl Core {
    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<u64, (Subject, Instant)>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn max_payload(&self) -> usize {
        match self.client.server_info().max_payload {
            0 => usize::MAX,
            n => n,
        }
    }

    async fn to_router(&self, frame: FromRemote) {
        if self.from.send(frame).await.is_err() {
            tracing::debug!("router gone; frame from the cluster dropped");
        }
    }

    /// A body that came over NATS, as the group carries it.
    fn payload(&self, body: Bytes) -> Result<Payload, switchyard_proto::Error> {
        Payload::for_body(body, self.shm_threshold)
    }
}

/// The bridge's main loop: frames from the router, link events, and the
/// sweep of replies nobody will send.
async fn run(core: Arc<Core>, mut rx: mpsc::Receiver<ToRemote>, mut events: mpsc::UnboundedReceiver<Event>) {
    let (hello_tx, mut hellos) = mpsc::unbounded_channel();
    tokio::spawn(notifications(core.clone()));
    tokio::spawn(manifests(core.clone(), hello_tx));
    let mut serving: HashMap<EventType, JoinHandle<()>> = HashMap::new();
    let mut manifest = Manifest::default();
    let mut status = LinkState::Connecting;
    let mut next_heartbeat = Instant::now() + HEARTBEAT;
    let mut sweep = tokio::time::interval(Duration::from_secs(1));
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            frame = rx.recv() => match frame {
                None => return,
                Some(ToRemote::Request(env)) => {
                    tokio::spawn(call(core.clone(), env));
                }
                Some(ToRemote::Response(env)) => {
                    let reply = core.pending().remove(&env.correlation);
                    match reply {
                        Some((subject, _)) => { tokio::spawn(reply_to(core.clone(), subject, env)); }
                        None => tracing::debug!(request_id = env.context.request_id_field(), "reply to a cluster call that gave up"),
                    }
                }
                Some(ToRemote::Notification(env)) => publish_notification(&core, env).await,
                Some(ToRemote::Leave(done)) => {
                    leave(&core).await;
                    let _ = done.send(());
                }
                Some(ToRemote::Local(next)) => {
                    serve(&core, &mut serving, &next.serves);
                    if next != manifest {
                        manifest = next;
                        publish_manifest(&core, &manifest).await;
                    }
                }
            },
            Some(event) = events.recv() => {
                let state = match event {
                    Event::Connected => {
                        tracing::info!(cluster = %core.cluster, "cluster link up");
                        // Groups that joined while we were away learn our
                        // routes; we learn theirs.
                        publish_manifest(&core, &manifest).await;
                        publish_hello(&core).await;
                        Some(LinkState::Connected)
                    }
                    Event::Disconnected => {
                        tracing::warn!(cluster = %core.cluster, "cluster link lost; reconnecting");
                        Some(LinkState::Disconnected)
                    }
                    Event::ServerError(err) => {
                        tracing::error!(cluster = %core.cluster, %err, "NATS server error");
                        None
                    }
                    other => {
                        tracing::debug!(cluster = %core.cluster, event = %other, "NATS event");
                        None
                    }
                };
                if let Some(state) = state && state != status {
                    status = state;
                    core.to_router(FromRemote::Status(status)).await;
                }
            }
            Some(Hello::Joined) = hellos.recv() => publish_manifest(&core, &manifest).await,
            _ = sweep.tick() => {
                let now = Instant::now();
                core.pending().retain(|_, (_, until)| *until > now);
                // The manifest doubles as a heartbeat: a group that stops
                // sending it is forgotten by the others (MANIFEST_EXPIRY).
                if now >= next_heartbeat {
                    next_heartbeat = now + HEARTBEAT;
                    publish_manifest(&core, &manifest).await;
                }
            }
        }
    }
}

/// Keeps one queue subscription per type this group serves (a shared type
/// too: this group is one of those NATS balances over).
fn serve(core: &Arc<Core>, serving: &mut HashMap<EventType, JoinHandle<()>>, serves: &BTreeSet<EventType>) {
    serving.retain(|ty, task| {
        let keep = serves.contains(ty);
        if !keep {
            // Dropping the subscriber unsubscribes: NATS stops sending
            // this group calls it can no longer serve.
            task.abort();
        }
        keep
    });
    for &ty in serves {
        serving
            .entry(ty)
            .or_insert_with(|| tokio::spawn(serve_type(core.clone(), ty)));
    }
}

async fn serve_type(core: Arc<Core>, ty: EventType) {
    let subject = call_subject(&core.cluster, ty);
    let mut sub = match core
        .client
        .queue_subscribe(subject.clone(), core.cluster.clone())
        .await
    {
        Ok(sub) => sub,
        Err(err) => return tracing::error!(%err, %subject, "cannot subscribe"),
    };
    while let Some(msg) = sub.next().await {
        incoming_call(&core, msg).await;
    }
}

/// A call from another group: into the router, with a correlation id that
/// finds the reply subject again.
async fn incoming_call(core: &Arc<Core>, msg: Message) {
    let Some(reply) = msg.reply.clone() else {
        return tracing::debug!(subject = %msg.subject, "a call without a reply subject ignored");
    };
    let decoded = match wire::decode(msg.headers.as_ref()) {
        Ok(d) => d,
        Err(why) => {
            return tracing::warn!(subject = %msg.subject, why, "malformed call from the cluster dropped");
        }
    };
    let timeout = decoded.timeout.unwrap_or(core.default_timeout);
    let correlation = core.next.fetch_add(1, Ordering::Relaxed);
    let payload = match core.payload(msg.payload) {
        Ok(p) => p,
        Err(err) => {
            let stub = stub(decoded.event_type, Origin::Manager(REMOTE_ID), correlation);
            return reply_to(
                core.clone(),
                reply,
                Refusal::new(Hop::Cluster, 503, err.to_string()).answer(&stub),
            )
            .await;
        }
    };
    let env = Envelope {
        event_type: decoded.event_type,
        kind: Kind::Request,
        correlation,
        origin: Origin::Manager(REMOTE_ID),
        deadline: Deadline::after(timeout),
        status: 0,
        token: 0,
        context: decoded.context,
        meta: decoded.meta,
        payload,
    };
    // The router answers every request, by its deadline at the latest; the
    // entry outlives that a little in case the answer is on its way.
    core.pending().insert(
        correlation,
        (reply, Instant::now() + timeout + Duration::from_secs(5)),
    );
    core.to_router(FromRemote::Request(env)).await;
}

/// Sends a local response back to the group that called.
async fn reply_to(core: Arc<Core>, subject: Subject, env: Envelope) {
    let context = env.context;
    let request_id = context.request_id_field();
    let (status, meta, body) = match body_of(&core, env.payload) {
        Ok(body) => (env.status, env.meta, body),
        Err((status, detail)) => {
            let (meta, body) = Refusal::new(Hop::Cluster, status, format!("the response {detail}")).parts();
            (status, meta, body)
        }
    };
    let headers = wire::headers(env.event_type, &core.group, &meta, &context, Some(status), None);
    if let Err(err) = core.client.publish_with_headers(subject, headers, body).await {
        tracing::warn!(%err, request_id, "reply to the cluster not sent");
    }
}

/// A body's bytes for a NATS message: a shared-memory body is copied in;
/// too large for the server, or a stream, is refused with the status the
/// caller should see.
fn body_of(core: &Core, payload: Payload) -> Result<Bytes, (u16, String)> {
    if matches!(payload, Payload::Stream(_)) {
        return Err((502, "is a stream, which cannot cross groups".to_owned()));
    }
    let body = payload
        .into_bytes()
        .map_err(|e| (500, format!("body could not be read: {e}")))?;
    let max = core.max_payload();
    // Headers take a few hundred bytes of the server's limit.
    if body.len().saturating_add(HEADROOM) > max {
        return Err((
            502,
            format!(
                "body of {} bytes is over the NATS server's max_payload ({max} bytes)",
                body.len()
            ),
        ));
    }
    Ok(body)
}

/// How often a group re-publishes its manifest.
pub const HEARTBEAT: Duration = Duration::from_secs(30);

/// Bytes of `max_payload` kept for the headers.
const HEADROOM: usize = 4096;

/// Calls the cluster for a request no local manager takes; always answers
/// the router.
async fn call(core: Arc<Core>, env: Envelope) {
    let mut stub = stub(env.event_type, env.origin, env.correlation);
    // Answers name the request too, for the lines the router writes.
    stub.context = env.context.clone();
    let answer = |status: u16, detail: &str| {
        let mut refusal = Refusal::new(Hop::Cluster, status, detail.to_owned());
        if status == 503 {
            refusal = refusal.retry_after(1);
        }
        refusal.answer(&stub)
    };
    let request_id = env.context.request_id_field();
    if core.client.connection_state() != State::Connected {
        let e = answer(503, "the cluster link is down; no other group can be reached");
        return core.to_router(FromRemote::Response(e)).await;
    }
    let timeout = env.deadline.remaining().unwrap_or(core.default_timeout);
    if timeout.is_zero() {
        return core
            .to_router(FromRemote::Response(answer(504, "deadline exceeded")))
            .await;
    }
    let body = match body_of(&core, env.payload) {
        Ok(body) => body,
        Err((status, detail)) => {
            // What the caller sent is what does not fit: 413.
            let status = if status == 502 { 413 } else { status };
            let e = answer(
                status,
                &format!("the request {detail}; raise max_payload on the NATS server"),
            );
            return core.to_router(FromRemote::Response(e)).await;
        }
    };
    let headers = wire::headers(
        env.event_type,
        &core.group,
        &env.meta,
        &env.context,
        None,
        Some(timeout),
    );
    let request = async_nats::Request::new()
        .headers(headers)
        .payload(body)
        .timeout(Some(timeout));
    let subject = call_subject(&core.cluster, env.event_type);
    let reply = match core.client.send_request(subject, request).await {
        Ok(msg) => response_from(&core, &stub, msg),
        Err(err) => {
            let (status, detail) = match err.kind() {
                RequestErrorKind::NoResponders => (503, "no group in the cluster serves this event type"),
                RequestErrorKind::TimedOut => (504, "deadline exceeded"),
                RequestErrorKind::MaxPayloadExceeded => {
                    (413, "the request is over the NATS server's max_payload")
                }
                _ => (503, "the call across the cluster failed"),
            };
            tracing::debug!(%err, request_id, status, "call across the cluster failed");
            answer(status, detail)
        }
    };
    core.to_router(FromRemote::Response(reply)).await;
}

/// The response another group sent, as the requester here expects it.
fn response_from(core: &Core, stub: &Envelope, msg: Message) -> Envelope {
    let decoded = match wire::decode(msg.headers.as_ref()) {
        Ok(d) => d,
        Err(why) => {
            return Refusal::new(
                Hop::Cluster,
                502,
                format!("malformed response from the cluster: {why}"),
            )
            .answer(stub);
        }
    };
    let mut env = Envelope::response_to(stub, decoded.status.unwrap_or(200), decoded.meta, Bytes::new());
    match core.payload(msg.payload) {
        Ok(payload) => env.payload = payload,
        Err(err) => return Refusal::new(Hop::Cluster, 503, err.to_string()).answer(stub),
    }
    env
}

fn stub(ty: EventType, origin: Origin, correlation: u64) -> Envelope {
    let mut env = Envelope::request(ty, correlation, Bytes::new());
    env.origin = origin;
    env
}

async fn publish_notification(core: &Core, env: Envelope) {
    if core.client.connection_state() != State::Connected {
        // Not buffered for a reconnection that may be minutes away: the
        // local subscribers have it; the other groups miss it (NATS core is
        // at most once, and so is this bridge: docs/cluster.md).
        return tracing::debug!("cluster link down; notification not sent to other groups");
    }
    let body = match body_of(core, env.payload) {
        Ok(body) => body,
        Err((_, detail)) => return tracing::warn!("notification not sent to other groups: its {detail}"),
    };
    let headers = wire::headers(env.event_type, &core.group, &env.meta, &env.context, None, None);
    let subject = note_subject(&core.cluster, env.event_type);
    if let Err(err) = core.client.publish_with_headers(subject, headers, body).await {
        tracing::warn!(%err, "notification not sent to other groups");
    }
}

/// Every notification of the cluster but our own.
async fn notifications(core: Arc<Core>) {
    let subject = format!("{}.note.>", core.cluster);
    let mut sub = match core.client.subscribe(subject.clone()).await {
        Ok(sub) => sub,
        Err(err) => return tracing::error!(%err, %subject, "cannot subscribe"),
    };
    while let Some(msg) = sub.next().await {
        let decoded = match wire::decode(msg.headers.as_ref()) {
            Ok(d) => d,
            Err(why) => {
                tracing::warn!(subject = %msg.subject, why, "malformed notification from the cluster dropped");
                continue;
            }
        };
        // no_echo keeps our own from coming back; this also covers a
        // server that ignores it. A group never re-publishes what it got
        // from the cluster (the router does not hand it back), so nothing loops.
        if decoded.origin == core.group {
            continue;
        }
        let payload = match core.payload(msg.payload) {
            Ok(p) => p,
            Err(err) => {
                tracing::warn!(%err, "notification from the cluster dropped");
                continue;
            }
        };
        let mut env = Envelope::notification(decoded.event_type, Bytes::new());
        env.meta = decoded.meta;
        env.context = decoded.context;
        env.payload = payload;
        core.to_router(FromRemote::Notification(env)).await;
    }
}

#[derive(Serialize, Deserialize)]
struct ManifestMsg {
    group: String,
    manifest: Manifest,
}

enum Hello {
    /// A group joined: tell it our routes.
    Joined,
}

async fn publish_manifest(core: &Core, manifest: &Manifest) {
    if core.left.load(Ordering::Relaxed) || core.client.connection_state() != State::Connected {
        return;
    }
    let msg = ManifestMsg {
        group: core.group.clone(),
        manifest: manifest.clone(),
    };
    match serde_json::to_vec(&msg) {
        Ok(body) => {
            let subject = format!("{}.manifest", core.cluster);
            if let Err(err) = core.client.publish(subject, body.into()).await {
                tracing::warn!(%err, "routes not published to the cluster");
            }
        }
        Err(err) => tracing::error!(%err, "cannot encode the routes"),
    }
}

async fn publish_hello(core: &Core) {
    if core.left.load(Ordering::Relaxed) {
        return;
    }
    let subject = format!("{}.hello", core.cluster);
    if let Err(err) = core.client.publish(subject, core.group.clone().into()).await {
        tracing::warn!(%err, "hello not published to the cluster");
    }
}

/// Other groups' routes, and their hellos.
async fn manifests(core: Arc<Core>, hellos: mpsc::UnboundedSender<Hello>) {
    let subs = (
        core.client.subscribe(format!("{}.manifest", core.cluster)).await,
        core.client.subscribe(format!("{}.hello", core.cluster)).await,
        core.client.subscribe(format!("{}.goodbye", core.cluster)).await,
    );
    let (mut manifests, mut joined, mut left) = match subs {
        (Ok(m), Ok(h), Ok(g)) => (m, h, g),
        (Err(err), _, _) | (_, Err(err), _) | (_, _, Err(err)) => {
            return tracing::error!(%err, "cannot subscribe to the cluster's routes");
        }
    };
    loop {
        // In order of the subscriptions, not at random: a group publishes
        // its last manifest (its managers stopping) and then its goodbye on
        // one connection, so the server hands us the manifest first and it
        // sits in its channel before the goodbye does. Taken at random, the
        // goodbye could be read first and the manifest after it would count
        // the departed group again until it expired.
        tokio::select! {
            biased;
            Some(msg) = manifests.next() => {
                let Ok(ManifestMsg { group, manifest }) = serde_json::from_slice(&msg.payload) else {
                    tracing::warn!("malformed routes from the cluster dropped");
                    continue;
                };
                if group == core.group {
                    continue;
                }
                core.to_router(FromRemote::Routes { group, manifest }).await;
            }
            Some(msg) = joined.next() => {
                if msg.payload != core.group.as_bytes() {
                    let _ = hellos.send(Hello::Joined);
                }
            }
            Some(msg) = left.next() => {
                match String::from_utf8(msg.payload.to_vec()) {
                    Ok(group) if group != core.group => core.to_router(FromRemote::Left { group }).await,
                    Ok(_) => {}
                    Err(_) => tracing::warn!("malformed goodbye from the cluster dropped"),
                }
            }
            else => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_never_reach_the_log() {
        assert_eq!(
            redacted(&["nats://u:secret@host:4222".to_owned(), "tls://h:1".to_owned()]),
            ["nats://***@host:4222", "tls://h:1"]
        );
    }

    #[test]
    fn group_ids_differ_between_starts() {
        assert_ne!(group_id(), group_id());
    }
}
