//! The router: event type → manager instances.
//!
//! Managers connect to the router and declare the event types they answer and
//! the notifications they want; the broker connects it to the listeners. A
//! request goes to exactly one instance of its type (least outstanding
//! requests, round-robin on ties), a notification to every subscriber. The
//! router keeps each request in flight until its response comes back, so it
//! can answer for a hop that failed: a request nobody can serve gets its error
//! at once, a manager that disconnects has its requests answered with 503,
//! and a request past its deadline gets 504 — no caller ever waits for a
//! response that cannot come. A request its caller cancels, or one past its
//! deadline, is forgotten here and cancelled at the instance serving it, so
//! its work stops too.
//!
//! Managers are who the supervisor says they are: with a roster
//! ([`Config::roster`]) a manager's hello is taken only from a process the
//! supervisor started as that manager; a type or route another manager
//! declares is refused; a response is taken only from the instance the
//! request was sent to; and the request context only the listener sets
//! (`:identity` and the other `:` keys) is stripped from what managers
//! send (docs/decisions/0100-roles-by-pid.md).
//!
//! With `group.return_path = "direct"` (decision 0143) an instance answers
//! a listener's request straight into its return link to that listener process and
//! tells the router in batches (`Control::Completed`) which requests it
//! answered: the in-flight table, the balancing and the 503/504 answers
//! stay here; the router only passes on each instance's offer of a return
//! link to the broker.
//!
//! Given a port to other groups ([`Config::remote`]; in a group, the NATS
//! bridge of `switchyard-cluster` sits at its far end, docs/cluster.md), a
//! request no local manager takes goes to the other groups, every
//! notification emitted here goes to them, and what they send comes in as
//! if from one more manager. The router does not know what carries it.
//!
//! # Layout
//! - [`run`]: the accept loop for managers and the connection to the broker.
//! - `table`: routing state (instances, in-flight requests, routes).
//! - [`remote`]: the port to other groups, and its frames applied to the
//!   table.

#![forbid(unsafe_code)]

pub mod remote;
mod table;

use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use switchyard_proto::accept::Acceptor;
use switchyard_proto::backoff::Backoff;
use switchyard_proto::control::{Control, GroupRole, META_JOB, META_MANAGER, strip_listener_context};
use switchyard_proto::link;
use switchyard_proto::supervision::{RosterWatch, Stop, member_of};
use switchyard_proto::transport::{FrameReader, FrameSink, PeerPolicy};
use switchyard_proto::{Envelope, Kind, Origin};
use tokio::net::unix::OwnedReadHalf;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{oneshot, watch};

use table::Table;

/// Errors that stop the router.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("router socket: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Wire(#[from] switchyard_proto::Error),
}

/// The router's settings.
#[derive(Debug)]
pub struct Config {
    /// The broker's socket, which the router connects to.
    pub broker_socket: PathBuf,
    /// Managers the group declares: `/ready` waits for all of them.
    pub declared_managers: Vec<String>,
    /// Largest frame accepted or sent, in bytes.
    pub max_frame: usize,
    /// Frames queued per connection before requests to it get 503.
    pub queue_capacity: usize,
    /// Requests in flight per manager instance before new ones get 503.
    pub max_outstanding: u32,
    /// The other groups, through a port whose far end the caller
    /// connects (`[cluster]`: the NATS bridge). `None`: this group alone.
    pub remote: Option<remote::Remote>,
    /// Which pid holds which role, from the supervisor: a manager's hello
    /// is taken only from a manager process of that name. `None` (no
    /// supervisor, as in library tests) trusts every hello.
    pub roster: Option<RosterWatch>,
}

#[derive(Clone)]
struct Shared {
    table: Arc<Mutex<Table>>,
    config: Arc<Config>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Serves the router: managers on `listener`, the broker at
/// `config.broker_socket`. `ready` fires once the broker is connected.
pub async fn run(
    listener: UnixListener,
    config: Config,
    ready: oneshot::Sender<()>,
    shutdown: impl Future<Output = Stop>,
) -> Result<(), Error> {
    let (_keep, declared) = watch::channel(config.declared_managers.clone());
    run_declaring(listener, config, ready, shutdown, declared).await
}

/// [`run`], with the group's declared managers changing while it runs
/// (`switchyard reload`): a manager no longer declared leaves `/ready`,
/// and once its last instance is gone its routes and types are forgotten
/// (404, not 503).
pub async fn run_declaring(
    listener: UnixListener,
    mut config: Config,
    ready: oneshot::Sender<()>,
    shutdown: impl Future<Output = Stop>,
    mut declared: watch::Receiver<Vec<String>>,
) -> Result<(), Error> {
    let remote = config.remote.take();
    let shared = Shared {
        table: Arc::new(Mutex::new(Table::new(
            config.declared_managers.clone(),
            config.max_outstanding,
        ))),
        config: Arc::new(config),
    };
    if let Some(remote) = remote {
        remote::attach(&shared, remote);
    }
    tokio::spawn(broker_link(shared.clone(), ready));
    tokio::spawn(deadline_sweeper(shared.clone()));
    let redeclare = shared.clone();
    tokio::spawn(async move {
        while declared.changed().await.is_ok() {
            let list = declared.borrow_and_update().clone();
            redeclare.lock().set_declared(list);
        }
    });
    let policy = PeerPolicy::for_group();
    let mut acceptor = Acceptor::new(listener);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            stream = acceptor.accept_peer(&policy) => {
                tokio::spawn(manager_connection(shared.clone(), stream));
            }
        }
    }
    // A clean stop: the other groups forget this one's routes now.
    remote::leave(&shared).await;
    Ok(())
}

/// Keeps the connection to the broker up for the life of the router.
async fn broker_link(shared: Shared, ready: oneshot::Sender<()>) {
    let mut ready = Some(ready);
    let mut backoff = Backoff::peer();
    loop {
        match connect_broker(&shared).await {
            Ok((reader, sink)) => {
                backoff.reset();
                shared.lock().set_broker(Some(sink));
                if let Some(ready) = ready.take() {
                    let _ = ready.send(());
                }
                tracing::info!("connected to broker");
                broker_reader(&shared, reader).await;
                shared.lock().set_broker(None);
                tracing::warn!("broker connection lost; reconnecting");
            }
            Err(err) => {
                tracing::debug!(%err, "broker not reachable yet");
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    }
}

async fn connect_broker(shared: &Shared) -> Result<(FrameReader<OwnedReadHalf>, FrameSink), Error> {
    let stream = UnixStream::connect(&shared.config.broker_socket).await?;
    let (reader, sink) = link::open(stream, shared.config.queue_capacity, shared.config.max_frame).await?;
    sink.send_wait(Envelope::control(&Control::HelloRouter {
        pid: std::process::id(),
    })?)
    .await?;
    Ok((reader, sink))
}

async fn broker_reader(shared: &Shared, mut reader: FrameReader<OwnedReadHalf>) {
    let mut batch = Vec::with_capacity(64);
    loop {
        match reader.read_batch(&mut batch).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(err) => return tracing::warn!(%err, "closing broker connection"),
        }
        let mut table = shared.lock();
        for env in batch.drain(..) {
            match env.kind {
                Kind::Request => table.route_request(env),
                Kind::Notification => table.route_notification(env, None),
                // A listener's answer to a client's job it was sent.
                Kind::Response => table.complete(env, table::LISTENERS_ID),
                // The broker stamped the pipe it came from.
                Kind::Control if matches!(env.decode_control(), Ok(Control::Cancel)) => {
                    table.cancel(env.origin, env.correlation);
                }
                other => tracing::debug!(?other, "ignoring frame from broker"),
            }
        }
    }
}

async fn manager_connection(shared: Shared, stream: UnixStream) {
    let max = shared.config.max_frame;
    // The kernel's word for who connected; the hello's own `pid` is a claim.
    let peer = stream.peer_cred().ok().and_then(|c| c.pid()).unwrap_or(0) as u32;
    let (mut reader, sink) = match link::open(stream, shared.config.queue_capacity, max).await {
        Ok(link) => link,
        Err(err) => return tracing::warn!(%err, "manager connection failed to open"),
    };
    let mut description = match tokio::time::timeout(Duration::from_secs(5), reader.next()).await {
        Ok(Ok(Some(env))) if env.kind == Kind::Control => match env.decode_control() {
            Ok(Control::HelloManager(d)) => d,
            other => return tracing::warn!(pid = peer, ?other, "expected a manager hello"),
        },
        other => return tracing::warn!(pid = peer, ?other, "manager sent no hello"),
    };
    // Without a roster (library use) every hello is trusted, this too.
    let mut fires_jobs = shared.config.roster.is_none();
    if let Some(roster) = &shared.config.roster {
        let mut roster = roster.clone();
        let member = member_of(&mut roster, peer).await;
        fires_jobs = member.as_ref().is_some_and(|m| m.fires_jobs);
        let holds = member.as_ref().map(|m| (m.role, m.name.as_str()));
        if holds != Some((GroupRole::Manager, description.name.as_str())) {
            return tracing::warn!(
                pid = peer,
                claimed = %description.name,
                holds = ?holds,
                "refusing manager hello: the supervisor did not start this process as that manager"
            );
        }
        description.pid = peer;
    }
    let name = description.name.clone();
    // Logged by pid, as `switchyard status` lists processes; `router_id` is
    // this router's own registration number.
    let pid = description.pid;
    let id = match shared.lock().add_instance(description, sink.clone()) {
        Ok(id) => id,
        Err(reason) => {
            tracing::warn!(manager = %name, pid, %reason, "refusing manager");
            return;
        }
    };
    if let Ok(welcome) = Envelope::control(&Control::Welcome { id }) {
        let _ = sink.send(welcome);
    }
    tracing::info!(manager = %name, pid, router_id = id, "manager registered");
    let mut batch = Vec::with_capacity(64);
    // Whether the instance said it was draining before it left: a planned
    // stop (a reload, a shutdown), which is no warning.
    let mut drained = false;
    loop {
        match reader.read_batch(&mut batch).await {
            Ok(true) => {}
            Ok(false) => break,
            Err(err) => {
                tracing::warn!(%err, manager = %name, "closing manager connection");
                break;
            }
        }
        let mut table = shared.lock();
        for mut env in batch.drain(..) {
            // A client's job, from the built-in Scheduler only: a listener
            // admits it as that client (decision 0113).
            let mut job = None;
            if matches!(env.kind, Kind::Request | Kind::Notification) {
                job = fires_jobs
                    .then(|| env.meta.get(META_JOB).map(str::to_owned))
                    .flatten();
                let stripped = strip_listener_context(&mut env.meta);
                if job.is_none() && stripped > 0 {
                    table.stripped_context(id, stripped);
                }
            }
            if let Some(job) = job {
                env.meta.push(META_JOB, job);
                env.origin = Origin::Manager(id);
                table.route_job(env);
                continue;
            }
            match env.kind {
                Kind::Response => table.complete(env, id),
                Kind::Request => {
                    env.origin = Origin::Manager(id);
                    // Who sent it, in the router's word (decision 0114).
                    env.meta.push(META_MANAGER, name.as_str());
                    table.route_request(env);
                }
                Kind::Notification => table.route_notification(env, Some(id)),
                // Its return link to a listener pipe (decision 0143): to the
                // broker, which passes it on by its origin.
                Kind::Control if switchyard_proto::returns::is_offer(&env) => table.forward_offer(env),
                Kind::Control => match env.decode_control() {
                    // Requests it answered straight back.
                    Ok(Control::Completed { requests }) => table.completed(id, &requests),
                    // One of its own calls: the handler that made it is gone.
                    Ok(Control::Cancel) => table.cancel(Origin::Manager(id), env.correlation),
                    Ok(Control::Draining) => {
                        // Taken out under the table lock, then acknowledged on
                        // the same queue as the requests routed to it before.
                        table.drain_instance(id);
                        drained = true;
                        if let Ok(ack) = Envelope::control(&Control::Draining) {
                            let _ = sink.send(ack);
                        }
                        tracing::info!(manager = %name, pid, router_id = id, "manager draining; no new requests go to it");
                    }
                    other => tracing::debug!(?other, "ignoring control from manager"),
                },
                other => tracing::debug!(?other, "ignoring frame from manager"),
            }
        }
    }
    let failed = shared.lock().remove_instance(id);
    if drained && failed == 0 {
        tracing::info!(manager = %name, pid, router_id = id, "manager left after draining");
    } else {
        tracing::warn!(manager = %name, pid, router_id = id, failed, "manager disconnected");
    }
}

async fn deadline_sweeper(shared: Shared) {
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let mut table = shared.lock();
        table.expire(switchyard_proto::event::now_micros());
        table.expire_remote(tokio::time::Instant::now());
        // Also the gauges `switchyard status` shows.
        let (in_flight, queued) = table.gauges();
        switchyard_proto::supervision::GAUGES.set(in_flight, queued);
    }
}
