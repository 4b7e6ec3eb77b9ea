//! The supervisor: owns the group's runtime directory and listening sockets,
//! starts the children in dependency order, restarts them one-for-one, and
//! stops them in reverse order on SIGTERM/SIGINT.
//!
//! It binds every listening socket itself and hands each child its socket at
//! a fixed fd. A restarted broker, router or listener therefore inherits the
//! same socket: peers that reconnect (and clients that connect) queue in its
//! backlog instead of being refused while the child comes back.
//!
//! Restart intensity applies per child, and only the core processes
//! (broker, router, listener) escalate: a manager or worker that exceeds it
//! is *crash-looping*, restarted after `restart.crash_loop_backoff_ms`
//! while its routes answer 503 and the rest of the group serves on
//! (docs/decisions/0025-crash-loops.md).
//!
//! A reload (`switchyard reload`, SIGHUP) re-reads the configuration and
//! applies it while the group serves (`reload` says what changes how):
//! replacement manager instances start and become ready before the old
//! ones drain. An upgrade (`switchyard upgrade`) hands the listening
//! sockets to a new supervisor started from the binary on disk, then
//! drains this group (`upgrade`).
//!
//! # Layout
//! - `runtime_dir`: the private directory and where `status` finds it.
//! - `child`: spawning one child and watching its pipes and exit.
//! - `signals`: every signal that would otherwise end the group silently.
//! - `reload`: what a new configuration changes.
//! - `upgrade`: handing the listening sockets to a new supervisor.
//! - `quic_port`: HTTP/3's UDP sockets, one per listener process, steered
//!   by connection id.
//! - `systemd`: `sd_notify` readiness, reload, stop and watchdog.
//! - `ready_file`: `--ready-file`, the bound addresses as JSON once ready.
//! - this module: the event loop, restart policy, reload and shutdown.

mod child;
pub(crate) mod events;
mod quic_port;
mod ready_file;
pub(crate) mod reload;
pub(crate) mod runtime_dir;
mod signals;
mod systemd;
pub(crate) mod upgrade;

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use switchyard_proto::supervision::{Load, MAX_LINE, Phase, RouteFigures, Stop, ToChild};
use tokio::sync::mpsc;

use crate::config::{Config, ManagerConfig, RestartConfig, WorkerKind};
use crate::roles::{Role, Spec};
use child::ChildHandle;
pub(crate) use events::{Event, PoolInfo, ProcessInfo, ReloadError, Request};
use reload::{Fingerprint, ReloadReport};
use runtime_dir::RuntimeDir;
use signals::{Caught, Meaning, Signals};
use systemd::Systemd;

/// Where the configuration comes from, so that a reload reads it again the
/// same way: the file, and the command-line flags that override it.
#[derive(Clone, Debug, Default)]
pub(crate) struct Source {
    /// `-c FILE`; none: the built-in demo configuration.
    pub(crate) path: Option<PathBuf>,
    /// `--bind`.
    pub(crate) bind: Option<SocketAddr>,
    /// `--data-dir`.
    pub(crate) data_dir: Option<PathBuf>,
    /// `--admin-bind`.
    pub(crate) admin_bind: Option<SocketAddr>,
    /// The admin endpoint's address as bound (port 0 resolved): what an
    /// upgrade's new supervisor binds beside this one. Not applied by
    /// [`Source::load`].
    pub(crate) admin_bound: Option<SocketAddr>,
    /// `--ready-file`: written once the group serves (`ready_file`).
    pub(crate) ready_file: Option<PathBuf>,
}

impl Source {
    /// Reads and validates the configuration (plugins included, in the
    /// validation child), applies the flags and prepares the data
    /// directory. The error is what `switchyard check` prints.
    pub(crate) fn load(&self) -> Result<Config, SourceError> {
        let mut config = self.load_for_start()?;
        if self.path.is_none() {
            crate::apidoc::gather(&mut config);
        }
        Ok(config)
    }

    /// As [`Source::load`], except that the built-in demo configuration
    /// comes without its API catalog: nothing in it can be invalid, the
    /// catalog only feeds `/openapi.json`, and `up` gathers it while the
    /// group starts (decision 0157). A file's plugins are still checked
    /// before anything starts.
    pub(crate) fn load_for_start(&self) -> Result<Config, SourceError> {
        let mut config = match &self.path {
            Some(path) => crate::validate::load(path).map_err(SourceError::Config)?,
            None => Config::demo().map_err(SourceError::Config)?,
        };
        if let Some(bind) = self.bind {
            config.listener.bind = bind;
        }
        if let Some(admin) = self.admin_bind {
            config.admin.bind = Some(admin);
        }
        config
            .prepare_data_dir(self.data_dir.clone())
            .map_err(SourceError::DataDir)?;
        Ok(config)
    }
}

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SourceError {
    /// Invalid: exit code 64, and a reload refused.
    #[error("configuration error:\n{0}")]
    Config(crate::config::ConfigError),
    #[error("{0}")]
    DataDir(String),
}

/// Why a reload or an upgrade was cut short: the group stops.
enum Interrupted {
    /// A signal that stops the group (SIGTERM, SIGINT, SIGQUIT).
    Signal(Caught),
    /// A core process went past its restart intensity meanwhile.
    Failure(String),
}

/// A child as the supervisor sees it: the [`Phase`] it last reported
/// (starting, ready, stopped), plus what only the supervisor knows (a
/// restart delay, a stop it asked for).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Starting,
    Ready,
    /// Waiting out its restart delay.
    Backoff,
    /// Told to drain or stop, not gone yet.
    Stopping,
    Stopped,
}

impl State {
    /// The word `switchyard status` and `/metrics` show (a ready child is
    /// "running" there, as scripts expect).
    fn name(self) -> &'static str {
        match self {
            State::Starting => "starting",
            State::Ready => "running",
            State::Backoff => "backoff",
            State::Stopping => "stopping",
            State::Stopped => "stopped",
        }
    }
}

struct Child {
    role: Role,
    name: String,
    /// Instance number among the children of the same name.
    instance: u32,
    /// The supervisor-owned listening socket this child serves, if any.
    socket: Option<OwnedFd>,
    /// A listener's gRPC-only socket (`listener.grpc_bind`).
    grpc_socket: Option<OwnedFd>,
    /// The UDP socket of HTTP/3 (`[listener.http3]`): listener 0's alone.
    quic_socket: Option<OwnedFd>,
    generation: u64,
    state: State,
    handle: Option<ChildHandle>,
    restarts: u32,
    started: Instant,
    /// Restart times inside the intensity window.
    recent: VecDeque<Instant>,
    backoff: Duration,
    /// Over its restart intensity (managers and workers only): restarted
    /// after the crash-loop delay until it stays up for the window.
    crash_loop: bool,
    /// A manager's worker pool.
    pool: Option<PoolInfo>,
    /// The load it last reported.
    load: Load,
    /// The figures it last reported for `/metrics` (this generation's).
    figures: ChildFigures,
    /// A manager's or worker's epoch: reloads that replaced the manager
    /// before it (`Spec::epoch`).
    epoch: u64,
    /// Replaced or removed by a reload: draining, and not restarted when
    /// it exits.
    retiring: bool,
    /// Gone for good after a reload; its slot may be reused.
    retired: bool,
}

struct Supervisor {
    /// What the group runs with (a reload replaces it).
    config: Config,
    source: Source,
    /// The plugin files' contents the running managers were started from.
    fingerprints: HashMap<String, Fingerprint>,
    /// Reloads that replaced managers, for the epochs of their successors.
    epochs: u64,
    dir: RuntimeDir,
    children: Vec<Child>,
    events: mpsc::UnboundedSender<Event>,
    started: Instant,
    systemd: Systemd,
    /// The TCP sockets, for an upgrade to hand over; dropped when the
    /// group stops, so that the listeners' close really closes them.
    sockets: Option<upgrade::Sockets>,
    /// The request figures of children that exited: the group's counters
    /// never go back when a listener restarts.
    gone_routes: HashMap<(String, String), RouteFigures>,
    /// The version of the last roster sent to the broker and router.
    roster_version: u64,
    /// The demo's API catalog, gathered while the group starts; taken
    /// before the first listener is spawned (it publishes the catalog).
    gathering: Option<tokio::task::JoinHandle<std::sync::Arc<switchyard_proto::api::Catalog>>>,
}

/// What a child reported for `/metrics`, cumulative since it started.
#[derive(Default)]
struct ChildFigures {
    gauges: HashMap<String, u64>,
    routes: HashMap<(String, String), RouteFigures>,
}

/// Runs `switchyard up`. `handover`: the socket of an upgrading
/// supervisor that hands this one its listening sockets
/// (`switchyard upgrade`).
pub(crate) fn main(
    config: Config,
    source: Source,
    runtime_dir: Option<PathBuf>,
    handover: Option<OwnedFd>,
) -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_env(switchyard_proto::process::ENV_LOG)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let json = config.log.format == crate::config::LogFormat::Json;
    child::set_json_logs(json);
    if json {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stdout)
            .json()
            .flatten_event(true)
            .with_target(false)
            .try_init();
    } else {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stdout)
            .with_ansi(false)
            .without_time()
            .try_init();
    }
    // The supervisor holds every secret of the configuration: no child
    // (a plugin) may read its memory or environment through /proc.
    if let Err(err) = crate::hardening::not_dumpable() {
        tracing::error!(%err, "cannot make the supervisor non-dumpable");
        return ExitCode::FAILURE;
    }
    // A current-thread runtime: the spawning thread must outlive the children
    // (PR_SET_PDEATHSIG fires when the thread that forked them exits).
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("switchyard: cannot start the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let ready_file = source.ready_file.clone();
    // A file left by a group that was killed would read as ready before
    // this one is. In an upgrade the old group's file stays true until
    // this one replaces it.
    if let Some(path) = &ready_file
        && handover.is_none()
    {
        ready_file::remove_stale(path);
    }
    let code = match runtime.block_on(up(config, source, runtime_dir, handover)) {
        Ok(code) => code,
        Err(err) => {
            tracing::error!("{err:#}");
            tracing::info!(cause = "start-up failed", "stopped");
            ExitCode::FAILURE
        }
    };
    if let Some(path) = ready_file {
        ready_file::remove_if_ours(&path);
    }
    code
}

/// The admin endpoint's socket, when `[admin] bind` asks for one. Bound
/// before any child starts: a bad address stops `up` at once. An upgrade's
/// new supervisor binds its own (the old one still holds the port until
/// it is gone: with a fixed port the new one retries for a while).
fn sup_admin_bind(config: &Config) -> anyhow::Result<Option<std::net::TcpListener>> {
    let Some(addr) = config.admin.bind else {
        return Ok(None);
    };
    crate::admin::bind(addr).map(Some)
}

/// HTTP/3's UDP sockets, one per listener process, bound at
/// `listener.http3.bind` or beside `tcp` (same IP, same port number), or
/// taken over from the supervisor that upgrades; none without HTTP/3.
fn quic_sockets(
    config: &Config,
    tcp: std::net::SocketAddr,
    handover: Option<&mut upgrade::Receiving>,
) -> anyhow::Result<Vec<std::net::UdpSocket>> {
    let workers = config.listener.workers;
    let enabled = config.listener.http3.enabled;
    if let Some(handover) = handover {
        // Without HTTP/3 in the new configuration they are closed here.
        let sockets = handover.take_quic();
        if enabled && !sockets.is_empty() {
            // The steering program divides by the number of sockets the
            // old group bound: another number of listeners would misroute.
            anyhow::ensure!(
                sockets.len() == workers as usize,
                "listener.workers: the old group served HTTP/3 with {} listener processes; \
                 changing their number needs a stop and a start",
                sockets.len()
            );
            return Ok(sockets);
        }
    }
    if !enabled {
        return Ok(Vec::new());
    }
    let at = config.listener.http3.bind.unwrap_or(tcp);
    quic_port::bind_steered(at, workers)
}

/// Binds the TCP ports, or takes them from the supervisor that upgrades.
fn tcp_sockets(
    config: &Config,
    handover: Option<&mut upgrade::Receiving>,
) -> anyhow::Result<(std::net::TcpListener, Option<std::net::TcpListener>)> {
    if let Some(handover) = handover {
        return Ok(handover.take_sockets());
    }
    let tcp = std::net::TcpListener::bind(config.listener.bind)
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.listener.bind))?;
    let grpc = config
        .listener
        .grpc_bind
        .map(|at| {
            std::net::TcpListener::bind(at)
                .map_err(|e| anyhow::anyhow!("cannot listen for gRPC on {at}: {e}"))
        })
        .transpose()?;
    Ok((tcp, grpc))
}

/// Wrong NATS credentials are an error at start, not a router retrying
/// forever; a NATS that is down only delays the link (local traffic does
/// not need it), so the group starts anyway.
async fn check_cluster(config: &Config) -> anyhow::Result<()> {
    if !config.cluster.enabled() {
        return Ok(());
    }
    let patience = Duration::from_millis(config.cluster.connect_timeout_ms + 1000);
    match tokio::time::timeout(patience, switchyard_cluster::probe(&config.cluster)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(err @ (switchyard_cluster::Error::Refused(_) | switchyard_cluster::Error::Config(_)))) => {
            Err(anyhow::anyhow!(err))
        }
        Ok(Err(err)) => {
            tracing::warn!(%err, "starting without the cluster link; the router keeps trying");
            Ok(())
        }
        Err(_) => {
            tracing::warn!(
                "NATS did not answer in time; starting without the cluster link, the router keeps trying"
            );
            Ok(())
        }
    }
}

/// The group's ports and directory, made before any child starts
/// (the first phase of `up`).
struct Bound {
    /// Removed when dropped: on every way out of `up` (decision 0117).
    dir: RuntimeDir,
    tcp: std::net::TcpListener,
    grpc_tcp: Option<std::net::TcpListener>,
    quic: Vec<std::net::UdpSocket>,
    admin: Option<std::net::TcpListener>,
    broker: std::os::unix::net::UnixListener,
    router: std::os::unix::net::UnixListener,
    control: std::os::unix::net::UnixListener,
}

/// The addresses the group announces once it is ready.
struct Addresses {
    http: std::net::SocketAddr,
    grpc: Option<std::net::SocketAddr>,
    quic: Option<std::net::SocketAddr>,
}

/// How the serving phase ended.
struct Ending {
    code: ExitCode,
    cause: String,
    /// Drain (SIGTERM, a failure, an upgrade) or stop at once (SIGQUIT).
    stop: Stop,
    /// The sockets and directory went to a new supervisor.
    upgraded: bool,
}

impl Ending {
    fn stop((code, cause, stop): (ExitCode, String, Stop)) -> Ending {
        Ending {
            code,
            cause,
            stop,
            upgraded: false,
        }
    }
}

async fn up(
    config: Config,
    source: Source,
    runtime_dir: Option<PathBuf>,
    handover: Option<OwnedFd>,
) -> anyhow::Result<ExitCode> {
    // First of all: from here on no signal ends the group unlogged.
    let mut signals = Signals::install()?;
    check_cluster(&config).await?;
    let mut handover = handover.map(upgrade::Receiving::start).transpose()?;
    let bound = bind(&config, runtime_dir, handover.as_mut())?;
    let (mut sup, addresses, admin, control_sock, mut rx) = Supervisor::new(config, source, bound)?;
    let control = tokio::spawn(crate::status::serve(control_sock, sup.events.clone()));

    // Starting: in dependency order. An upgrade's new group leaves the
    // managers that hold the data directory's lock until the old group
    // has let go of them.
    let deferred: Vec<usize> = match &handover {
        Some(_) => (0..sup.children.len())
            .filter(|&i| sup.holds_data_lock(i))
            .collect(),
        None => Vec::new(),
    };
    // The demo's catalog (its managers' declarations, for `/openapi.json`)
    // comes from a check child that loads every plugin: run beside the
    // first stages rather than before them (decision 0157).
    if sup.source.path.is_none() && sup.config.api.enabled() && sup.config.catalog.managers.is_empty() {
        let mut config = sup.config.clone();
        sup.gathering = Some(tokio::task::spawn_blocking(move || {
            crate::apidoc::gather(&mut config);
            config.catalog
        }));
    }
    let first: Vec<usize> = (0..sup.children.len())
        .filter(|i| !deferred.contains(i))
        .collect();
    if let Err(err) = sup.start_in_order(&first, &mut rx, &mut signals).await {
        if let Some(handover) = &mut handover {
            handover.failed(&format!("{err:#}"));
            // The old group serves on from it.
            sup.dir.keep();
        }
        return Ok(sup.abandon_start(&err, &mut rx, &mut signals, control).await);
    }
    if let Some(mut receiving) = handover.take() {
        // The old group drains now; the deferred managers start once it is
        // gone.
        receiving.ready();
        sup.systemd.main_pid(std::process::id());
        if !deferred.is_empty() {
            tracing::info!("waiting for the old group to release the data directory");
            let patience =
                Duration::from_millis(sup.config.group.shutdown_grace_ms) + Duration::from_secs(30);
            if let Err(err) = receiving.wait_old_gone(patience).await {
                tracing::warn!("{err}; starting the built-in managers anyway");
            }
            for idx in deferred {
                if let Err(err) = sup.start_one(idx, &mut rx).await {
                    return Ok(sup.abandon_start(&err, &mut rx, &mut signals, control).await);
                }
            }
        }
    }

    // Ready: say where, then serve until told to stop.
    let admin = sup.announce(&addresses, admin);
    let ending = sup.serve(&mut rx, &mut signals).await;

    // Draining, then stopped.
    if !ending.upgraded {
        // After an upgrade systemd follows the new supervisor: this one
        // leaves without a word to it.
        sup.systemd.stopping(&ending.cause);
    }
    if let Some(admin) = admin {
        admin.abort();
    }
    sup.shutdown(&mut rx, &mut signals, ending.stop).await;
    control.abort();
    if ending.upgraded {
        // Its sockets now belong to the new group.
        sup.dir.keep();
    }
    // The runtime directory goes with it, before the last line.
    drop(sup);
    tracing::info!(cause = %ending.cause, "stopped");
    Ok(ending.code)
}

/// The runtime directory and every socket the group serves on, bound here
/// or taken over from the supervisor that upgrades. Nothing is left behind
/// when one cannot be had.
fn bind(
    config: &Config,
    runtime_dir: Option<PathBuf>,
    mut handover: Option<&mut upgrade::Receiving>,
) -> anyhow::Result<Bound> {
    let mut dir = RuntimeDir::prepare(runtime_dir)?;
    if let Some(handover) = &handover
        && handover.runtime_dir_created()
    {
        // The old group made it; this one removes it when it stops.
        dir.adopt();
    }
    // The managers bind their worker sockets; the group removes them.
    for m in config
        .managers
        .iter()
        .filter(|m| m.workers.kind == WorkerKind::Process)
    {
        for instance in 0..m.instances {
            dir.own(m.workers_socket(dir.path(), instance, 0));
        }
    }
    let upgrading = handover.is_some();
    let sockets = (|| {
        let (tcp, grpc_tcp) = tcp_sockets(config, handover.as_deref_mut())?;
        let quic = quic_sockets(config, tcp.local_addr()?, handover.as_deref_mut())?;
        let admin = sup_admin_bind(config)?;
        let paths = dir.paths();
        let broker = runtime_dir::bind_unix(&paths.broker_socket())?;
        let router = runtime_dir::bind_unix(&paths.router_socket())?;
        let control = runtime_dir::bind_unix(&paths.control_socket())?;
        anyhow::Ok((tcp, grpc_tcp, quic, admin, broker, router, control))
    })();
    let (tcp, grpc_tcp, quic, admin, broker, router, control) = match sockets {
        Ok(sockets) => sockets,
        Err(err) => {
            if upgrading {
                // The old group serves on from it.
                dir.keep();
            }
            return Err(err);
        }
    };
    Ok(Bound {
        dir,
        tcp,
        grpc_tcp,
        quic,
        admin,
        broker,
        router,
        control,
    })
}

/// The phases of `up` after binding: the group made, started in order,
/// announced, served.
impl Supervisor {
    /// The group as configured, every child not started yet.
    #[allow(clippy::type_complexity)]
    fn new(
        config: Config,
        source: Source,
        bound: Bound,
    ) -> anyhow::Result<(
        Supervisor,
        Addresses,
        Option<std::net::TcpListener>,
        std::os::unix::net::UnixListener,
        mpsc::UnboundedReceiver<Event>,
    )> {
        let addresses = Addresses {
            http: bound.tcp.local_addr()?,
            grpc: bound.grpc_tcp.as_ref().map(|t| t.local_addr()).transpose()?,
            quic: bound.quic.first().map(|q| q.local_addr()).transpose()?,
        };
        let mut children = vec![
            Child::new(Role::Broker, "broker", Some(OwnedFd::from(bound.broker))),
            Child::new(Role::Router, "router", Some(OwnedFd::from(bound.router))),
        ];
        for m in &config.managers {
            children.extend(Child::manager(m, 0));
        }
        // Worker processes start once their manager listens for them.
        for m in &config.managers {
            children.extend(Child::workers(m, 0));
        }
        // Every listener process accepts on the same supervisor-owned socket:
        // the kernel hands each connection to one of them.
        let sockets = upgrade::Sockets {
            tcp: OwnedFd::from(bound.tcp),
            grpc: bound.grpc_tcp.map(OwnedFd::from),
            quic: bound.quic.into_iter().map(OwnedFd::from).collect(),
        };
        for instance in 0..config.listener.workers {
            let mut child = Child::new(Role::Listener, "listener", Some(sockets.tcp.try_clone()?));
            child.instance = instance;
            child.grpc_socket = sockets.grpc.as_ref().map(|s| s.try_clone()).transpose()?;
            // QUIC has no shared accept queue: each listener reads a socket
            // of its own, and the kernel steers every packet to the socket of
            // the process that issued its connection id (`quic_port`).
            child.quic_socket = sockets
                .quic
                .get(instance as usize)
                .map(|s| s.try_clone())
                .transpose()?;
            children.push(child);
        }
        let (events, rx) = mpsc::unbounded_channel();
        let sup = Supervisor {
            fingerprints: reload::fingerprints(&config),
            config,
            source,
            epochs: 0,
            dir: bound.dir,
            children,
            events,
            started: Instant::now(),
            systemd: Systemd::from_env(),
            sockets: Some(sockets),
            gone_routes: HashMap::new(),
            roster_version: 0,
            gathering: None,
        };
        Ok((sup, addresses, bound.admin, bound.control, rx))
    }

    /// `order` in start stages: each starts once every child of the stage
    /// before it is ready, all of its own children at once.
    ///
    /// The broker, the router and the managers connect only to sockets the
    /// supervisor bound before any child started (`broker.sock`,
    /// `router.sock`): a connection made before its peer serves waits in
    /// the backlog, and the broker and router take a hello only from a pid
    /// of the roster, sent as each child is spawned. They start together,
    /// except the built-in managers that share the data directory's
    /// database: the first of them starts with the others, each further one
    /// only once the one before it is ready (two creating the schema at once
    /// find the database locked). A worker process connects to a socket its
    /// manager binds, and a listener must see every manager's routes when
    /// the group says it is ready: both start last (decision 0157).
    fn stages(&self, order: &[usize]) -> Vec<Vec<usize>> {
        let mut first = Vec::new();
        let mut one_by_one = Vec::new();
        let mut last = Vec::new();
        for &idx in order {
            match self.children[idx].role {
                Role::Worker | Role::Listener => last.push(idx),
                Role::Manager if self.holds_data_lock(idx) && self.holds_data_lock_before(idx, order) => {
                    one_by_one.push(vec![idx])
                }
                Role::Broker | Role::Router | Role::Manager => first.push(idx),
            }
        }
        std::iter::once(first)
            .chain(one_by_one)
            .chain(std::iter::once(last))
            .filter(|stage| !stage.is_empty())
            .collect()
    }

    /// Whether a manager that holds the data directory's lock comes in
    /// `order` before `idx`.
    fn holds_data_lock_before(&self, idx: usize, order: &[usize]) -> bool {
        order
            .iter()
            .take_while(|&&i| i != idx)
            .any(|&i| self.children[i].role == Role::Manager && self.holds_data_lock(i))
    }

    /// Starts `order` stage by stage (`stages`). A signal that stops the
    /// group cuts the start short.
    async fn start_in_order(
        &mut self,
        order: &[usize],
        rx: &mut mpsc::UnboundedReceiver<Event>,
        signals: &mut Signals,
    ) -> anyhow::Result<()> {
        for group in self.stages(order) {
            let group = group.as_slice();
            let start = self.start_stage(group, rx);
            tokio::pin!(start);
            loop {
                tokio::select! {
                    r = &mut start => break r,
                    caught = signals.recv() => match caught.meaning() {
                        Meaning::Drain | Meaning::Quit => {
                            break Err(anyhow::anyhow!("{} during start-up", caught.name()));
                        }
                        Meaning::Reload => tracing::warn!(signal = caught.name(), "the group is starting; reload ignored"),
                        Meaning::Ignore(why) => tracing::warn!(signal = caught.name(), "{why}; ignored"),
                    },
                }
            }?;
        }
        Ok(())
    }

    /// A start that failed: what did start stops again; the runtime
    /// directory goes with the supervisor (unless kept).
    async fn abandon_start(
        mut self,
        err: &anyhow::Error,
        rx: &mut mpsc::UnboundedReceiver<Event>,
        signals: &mut Signals,
        control: tokio::task::JoinHandle<()>,
    ) -> ExitCode {
        tracing::error!("start-up failed: {err:#}");
        let grace = self.config.shutdown_grace();
        self.shutdown(rx, signals, Stop::Drain(grace)).await;
        control.abort();
        drop(self);
        tracing::info!(cause = "start-up failed", "stopped");
        ExitCode::FAILURE
    }

    /// Ready: the lines scripts wait for, the admin endpoint, systemd's
    /// READY=1, and `switchyard dev`'s rebuilds.
    fn announce(
        &mut self,
        at: &Addresses,
        admin: Option<std::net::TcpListener>,
    ) -> Option<tokio::task::JoinHandle<()>> {
        tracing::info!(
            processes = self.children.len(),
            ms = self.started.elapsed().as_millis() as u64,
            "group ready"
        );
        let scheme = if self.config.listener.tls.is_some() {
            "https"
        } else {
            "http"
        };
        println!(
            "switchyard listening on {scheme}://{} (runtime dir {})",
            at.http,
            self.dir.path().display()
        );
        // After the main line, which scripts wait for.
        if let Some(grpc_addr) = at.grpc {
            println!("switchyard gRPC (only) listening on {scheme}://{grpc_addr}");
        }
        if let Some(quic) = at.quic {
            println!("switchyard HTTP/3 listening on udp {quic}");
        }
        let admin = admin.map(|listener| {
            if let Ok(bound) = listener.local_addr() {
                println!("admin on http://{bound}");
                self.source.admin_bound = Some(bound);
            }
            tokio::spawn(crate::admin::serve(
                listener,
                self.config.admin.hosts.clone(),
                self.events.clone(),
            ))
        });
        if let Some(path) = &self.source.ready_file {
            let doors = ready_file::Doors {
                tls: self.config.listener.tls.is_some(),
                http: at.http,
                grpc: at.grpc,
                http3: at.quic,
                admin: self.source.admin_bound,
                runtime_dir: self.dir.path(),
            };
            // A group that serves but cannot say so would leave its
            // waiter hanging: the failure is loud, the group serves on.
            if let Err(err) = ready_file::write(path, &doors) {
                tracing::error!(%err, path = %path.display(), "cannot write the ready file");
            }
        }
        self.systemd.ready(&format!("serving on {}", at.http));
        // What the start allocated and freed (the configuration, the
        // catalog, the spawns) is not needed again.
        crate::give_back_free_memory();
        // `switchyard dev`: rebuilds and reloads from now on.
        crate::dev::start(self.dir.path());
        admin
    }

    /// Serves: restarts children, answers `status`, reloads and upgrades,
    /// until a signal, a failure or an upgrade ends it.
    async fn serve(&mut self, rx: &mut mpsc::UnboundedReceiver<Event>, signals: &mut Signals) -> Ending {
        let mut watchdog = self.systemd.watchdog_period().map(tokio::time::interval);
        loop {
            tokio::select! {
                caught = signals.recv() => match caught.meaning() {
                    Meaning::Drain => {
                        tracing::info!(signal = caught.name(), "draining");
                        return Ending::stop((ExitCode::SUCCESS, caught.name().to_owned(), Stop::Drain(self.config.shutdown_grace())));
                    }
                    Meaning::Quit => {
                        tracing::warn!(signal = caught.name(), "stopping at once, without draining");
                        return Ending::stop((ExitCode::SUCCESS, caught.name().to_owned(), Stop::Now));
                    }
                    Meaning::Reload => {
                        tracing::info!(signal = caught.name(), "reloading the configuration");
                        match self.reload(rx, signals).await {
                            Ok(Ok(report)) => tracing::info!("{}", report.describe()),
                            Ok(Err(err)) => tracing::error!("reload refused; the group runs on unchanged: {err}"),
                            Err(stop) => return Ending::stop(self.interrupted(stop)),
                        }
                    }
                    Meaning::Ignore(why) => tracing::warn!(signal = caught.name(), "{why}; ignored"),
                },
                _ = tick(watchdog.as_mut()) => self.systemd.watchdog(),
                Some(ev) = rx.recv() => match ev {
                    Event::Control(Request::Reload(reply)) => {
                        tracing::info!("reloading the configuration (switchyard reload)");
                        match self.reload(rx, signals).await {
                            Ok(result) => {
                                match &result {
                                    Ok(report) => tracing::info!("{}", report.describe()),
                                    Err(err) => tracing::error!("reload refused; the group runs on unchanged: {err}"),
                                }
                                let _ = reply.send(result);
                            }
                            Err(stop) => {
                                let _ = reply.send(Err(ReloadError::Failed("interrupted: the group stops".to_owned())));
                                return Ending::stop(self.interrupted(stop));
                            }
                        }
                    }
                    Event::Control(Request::Upgrade(reply)) => {
                        match self.upgrade(rx, signals).await {
                            Ok(Ok(pid)) => {
                                let _ = reply.send(Ok(pid));
                                return Ending {
                                    code: ExitCode::SUCCESS,
                                    cause: format!("upgraded (the new supervisor is pid {pid})"),
                                    stop: Stop::Drain(self.config.shutdown_grace()),
                                    upgraded: true,
                                };
                            }
                            Ok(Err(err)) => {
                                tracing::error!("upgrade failed; this group serves on: {err}");
                                let _ = reply.send(Err(err));
                            }
                            Err(stop) => {
                                let _ = reply.send(Err("interrupted: the group stops".to_owned()));
                                return Ending::stop(self.interrupted(stop));
                            }
                        }
                    }
                    ev => {
                        if let Err(err) = self.handle(ev) {
                            tracing::error!("{err:#}; stopping the group");
                            return Ending::stop((ExitCode::FAILURE, format!("{err:#}"), Stop::Drain(self.config.shutdown_grace())));
                        }
                    }
                }
            }
        }
    }
}

/// The next watchdog tick, or never when systemd does not watch.
async fn tick(interval: Option<&mut tokio::time::Interval>) {
    match interval {
        Some(interval) => {
            interval.tick().await;
        }
        None => std::future::pending().await,
    }
}

impl Child {
    fn new(role: Role, name: &str, socket: Option<OwnedFd>) -> Child {
        Child {
            role,
            name: name.to_owned(),
            instance: 0,
            socket,
            grpc_socket: None,
            quic_socket: None,
            generation: 0,
            state: State::Stopped,
            handle: None,
            restarts: 0,
            started: Instant::now(),
            recent: VecDeque::new(),
            backoff: Duration::ZERO,
            crash_loop: false,
            pool: None,
            load: Load::default(),
            figures: ChildFigures::default(),
            epoch: 0,
            retiring: false,
            retired: false,
        }
    }

    /// The instances of manager `m`, of `epoch`.
    fn manager(m: &ManagerConfig, epoch: u64) -> Vec<Child> {
        (0..m.instances)
            .map(|instance| {
                let mut child = Child::new(Role::Manager, &m.name, None);
                child.instance = instance;
                child.epoch = epoch;
                child.pool = Some(PoolInfo {
                    kind: m.workers.kind.as_str().to_owned(),
                    size: m.workers.size(),
                    queue: m.workers.queue,
                });
                child
            })
            .collect()
    }

    /// The worker processes of manager `m`'s instances, of `epoch`.
    fn workers(m: &ManagerConfig, epoch: u64) -> Vec<Child> {
        let mut out = Vec::new();
        for instance in 0..m.instances {
            for _ in 0..m.workers.processes() {
                let mut child = Child::new(Role::Worker, &m.name, None);
                child.instance = instance;
                child.epoch = epoch;
                out.push(child);
            }
        }
        out
    }

    /// Still crash-looping: it has not stayed up for the window since.
    fn crash_looping(&self, policy: &RestartConfig) -> bool {
        self.crash_loop
            && !(self.state == State::Ready && self.started.elapsed() > Duration::from_secs(policy.window_s))
    }

    fn describe(&self) -> String {
        let pid = self
            .handle
            .as_ref()
            .map_or(String::new(), |h| format!(", pid {}", h.pid));
        format!(
            "{} `{}` (instance {}{pid})",
            self.role.as_str(),
            self.name,
            self.instance
        )
    }

    fn info(&self, policy: &RestartConfig) -> ProcessInfo {
        let crash_looping = self.crash_looping(policy);
        ProcessInfo {
            role: self.role.as_str().to_owned(),
            name: self.name.clone(),
            instance: self.instance,
            pid: self.handle.as_ref().map(|h| h.pid),
            state: if crash_looping && self.state == State::Backoff {
                "crash-looping".to_owned()
            } else {
                self.state.name().to_owned()
            },
            restarts: self.restarts,
            crash_looping,
            uptime_ms: if self.state == State::Ready {
                self.started.elapsed().as_millis() as u64
            } else {
                0
            },
            workers: self.pool.clone(),
            load: if self.state == State::Ready {
                self.load
            } else {
                Load::default()
            },
        }
    }
}

impl Supervisor {
    fn spawn(&mut self, idx: usize) -> anyhow::Result<()> {
        let exe = std::env::current_exe()?;
        if self.children[idx].role == Role::Listener {
            let file = crate::apidoc::publish(&self.config, self.dir.path())?;
            self.dir.own(file);
        }
        let child = &mut self.children[idx];
        let spec = serde_json::to_vec(&Spec::for_child(
            &self.config,
            self.dir.path(),
            child.role,
            &child.name,
            child.epoch,
        ))?;
        child.generation += 1;
        let handle = child::spawn(
            &exe,
            child::Launch {
                index: idx,
                generation: child.generation,
                role: child.role,
                name: &child.name,
                instance: child.instance,
                spec: &spec,
                socket: child.socket.as_ref().map(|s| s.as_raw_fd()),
                grpc_socket: child.grpc_socket.as_ref().map(|s| s.as_raw_fd()),
                quic_socket: child.quic_socket.as_ref().map(|s| s.as_raw_fd()),
                pass_env: &self.config.group.pass_env,
            },
            self.events.clone(),
        )?;
        tracing::info!(role = child.role.as_str(), name = %child.name, instance = child.instance, pid = handle.pid, "started");
        child.handle = Some(handle);
        child.state = State::Starting;
        child.started = Instant::now();
        self.send_roster();
        Ok(())
    }

    /// Tells the broker and the router which pid holds which role, once a
    /// child has started: they take a hello only from the process the
    /// supervisor started for that role (decision 0100). A child may
    /// connect before this arrives; they wait for it.
    fn send_roster(&mut self) {
        use switchyard_proto::control::{GroupRole, Member, Roster};
        self.roster_version += 1;
        let members = self
            .children
            .iter()
            .filter_map(|c| {
                let pid = c.handle.as_ref()?.pid;
                let role = match c.role {
                    Role::Broker => GroupRole::Broker,
                    Role::Router => GroupRole::Router,
                    Role::Listener => GroupRole::Listener,
                    Role::Manager => GroupRole::Manager,
                    Role::Worker => GroupRole::Worker,
                };
                // The built-in Scheduler alone fires clients' jobs for a
                // listener to admit (decision 0113); a plugin manager that
                // calls itself `scheduler` is not it.
                let fires_jobs = role == GroupRole::Manager
                    && self
                        .config
                        .managers
                        .iter()
                        .any(|m| m.name == c.name && m.builtin.as_deref() == Some("scheduler"));
                Some(Member {
                    pid,
                    role,
                    name: c.name.clone(),
                    fires_jobs,
                })
            })
            .collect();
        let roster = Roster {
            version: self.roster_version,
            members,
        };
        for c in &self.children {
            if matches!(c.role, Role::Broker | Role::Router)
                && let Some(handle) = &c.handle
            {
                handle.command_detached(switchyard_proto::supervision::ToChild::Roster {
                    roster: roster.clone(),
                });
            }
        }
    }

    /// One stage of `start_in_order`; a listener's stage first takes the
    /// catalog gathered meanwhile.
    async fn start_stage(
        &mut self,
        members: &[usize],
        rx: &mut mpsc::UnboundedReceiver<Event>,
    ) -> anyhow::Result<()> {
        if members.iter().any(|&i| self.children[i].role == Role::Listener) {
            self.take_catalog().await;
        }
        self.start_together(members, rx).await
    }

    async fn take_catalog(&mut self) {
        if let Some(gathering) = self.gathering.take() {
            match gathering.await {
                Ok(catalog) => self.config.catalog = catalog,
                Err(err) => tracing::warn!(%err, "api description: not gathered"),
            }
        }
    }

    async fn start_one(&mut self, idx: usize, rx: &mut mpsc::UnboundedReceiver<Event>) -> anyhow::Result<()> {
        self.start_together(&[idx], rx).await
    }

    /// Spawns every child of `members` and waits until all of them report
    /// ready, each within `group.start_timeout_ms` of the spawns. The first
    /// that exits meanwhile fails the start (what did start is stopped by
    /// the caller, as for one child).
    async fn start_together(
        &mut self,
        members: &[usize],
        rx: &mut mpsc::UnboundedReceiver<Event>,
    ) -> anyhow::Result<()> {
        for &idx in members {
            self.spawn(idx)?;
        }
        let deadline =
            tokio::time::Instant::now() + Duration::from_millis(self.config.group.start_timeout_ms);
        let mut waiting: Vec<usize> = members.to_vec();
        while !waiting.is_empty() {
            let ev = match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(ev) => ev.ok_or_else(|| anyhow::anyhow!("event channel closed"))?,
                Err(_) => {
                    let late: Vec<&str> = waiting.iter().map(|&i| self.children[i].name.as_str()).collect();
                    anyhow::bail!("{} did not become ready in time", late.join(", "));
                }
            };
            match ev {
                Event::Phase {
                    child,
                    generation,
                    phase: Phase::Ready,
                } if waiting.contains(&child) && generation == self.children[child].generation => {
                    self.children[child].state = State::Ready;
                    waiting.retain(|&i| i != child);
                }
                Event::Exited {
                    child,
                    generation,
                    status,
                } if generation == self.children[child].generation => {
                    self.children[child].state = State::Stopped;
                    self.children[child].handle = None;
                    anyhow::bail!("{} exited during start-up ({status})", self.children[child].name);
                }
                Event::Status(reply) => {
                    let _ = reply.send(self.snapshot());
                }
                // Busy: answered at once.
                ev @ (Event::Control(_) | Event::Figures { .. } | Event::Load { .. } | Event::Metrics(_)) => {
                    let _ = self.handle(ev);
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// A child's figures, once it has exited, go to the group's totals.
    fn fold_figures(&mut self, child: usize) {
        let figures = std::mem::take(&mut self.children[child].figures);
        for (key, route) in figures.routes {
            let total = self.gone_routes.entry(key).or_insert_with(|| RouteFigures {
                route: route.route.clone(),
                method: route.method.clone(),
                ..RouteFigures::default()
            });
            crate::admin::add_route(total, &route);
        }
    }

    /// What the admin endpoint shows: every process with its gauges, and
    /// the requests of every listener, those that exited included.
    fn group_figures(&self) -> events::GroupFigures {
        let mut routes = self.gone_routes.clone();
        for c in self.children.iter().filter(|c| !c.retired) {
            for (key, route) in &c.figures.routes {
                let total = routes.entry(key.clone()).or_insert_with(|| RouteFigures {
                    route: route.route.clone(),
                    method: route.method.clone(),
                    ..RouteFigures::default()
                });
                crate::admin::add_route(total, route);
            }
        }
        let mut routes: Vec<RouteFigures> = routes.into_values().collect();
        routes.sort_by(|a, b| (&a.route, &a.method).cmp(&(&b.route, &b.method)));
        let infos = self.snapshot();
        let processes = infos
            .into_iter()
            .map(|info| {
                let gauges = self
                    .children
                    .iter()
                    .find(|c| {
                        !c.retired
                            && c.role.as_str() == info.role
                            && c.name == info.name
                            && c.instance == info.instance
                            && c.handle.as_ref().map(|h| h.pid) == info.pid
                    })
                    .map(|c| {
                        let mut g: Vec<(String, u64)> =
                            c.figures.gauges.iter().map(|(k, v)| (k.clone(), *v)).collect();
                        g.sort();
                        g
                    })
                    .unwrap_or_default();
                events::ProcessFigures { info, gauges }
            })
            .collect();
        events::GroupFigures { processes, routes }
    }

    fn snapshot(&self) -> Vec<ProcessInfo> {
        let mut out = vec![ProcessInfo {
            role: "supervisor".into(),
            name: "supervisor".into(),
            instance: 0,
            pid: Some(std::process::id()),
            state: "running".into(),
            restarts: 0,
            crash_looping: false,
            uptime_ms: self.started.elapsed().as_millis() as u64,
            workers: None,
            load: Load::default(),
        }];
        let mut children: Vec<&Child> = self.children.iter().filter(|c| !c.retired).collect();
        // Start order (managers in the configuration's order); a
        // replacement is listed beside what it replaces.
        let place = |name: &str| self.config.managers.iter().position(|m| m.name == name);
        children.sort_by_key(|c| (c.role.rank(), place(&c.name), c.instance, c.epoch));
        out.extend(children.into_iter().map(|c| c.info(&self.config.restart)));
        out
    }

    /// Reacts to one event while serving. An error stops the group.
    fn handle(&mut self, ev: Event) -> anyhow::Result<()> {
        match ev {
            Event::Phase {
                child,
                generation,
                phase,
            } => {
                let c = &mut self.children[child];
                if generation == c.generation && phase == Phase::Ready && c.state == State::Starting {
                    c.state = State::Ready;
                    tracing::info!(role = c.role.as_str(), name = %c.name, instance = c.instance, restarts = c.restarts, crash_looping = c.crash_loop, "ready again");
                }
            }
            Event::Exited {
                child,
                generation,
                status,
            } => {
                if generation != self.children[child].generation {
                    return Ok(());
                }
                self.fold_figures(child);
                if self.children[child].retiring {
                    let c = &mut self.children[child];
                    tracing::info!(role = c.role.as_str(), name = %c.name, instance = c.instance, %status, "stopped (replaced)");
                    c.handle = None;
                    c.state = State::Stopped;
                    c.retired = true;
                    return Ok(());
                }
                let policy = self.config.restart.clone();
                let c = &mut self.children[child];
                c.handle = None;
                let now = Instant::now();
                let window = Duration::from_secs(policy.window_s);
                while c.recent.front().is_some_and(|t| now.duration_since(*t) > window) {
                    c.recent.pop_front();
                }
                // A child that ran for a while earns a fresh backoff, and is
                // no longer crash-looping.
                if now.duration_since(c.started) > window {
                    c.backoff = Duration::ZERO;
                    c.crash_loop = false;
                }
                if c.crash_loop || c.recent.len() as u32 >= policy.max_restarts {
                    // Intensity is per child; only the core escalates: no
                    // manager or worker, whatever its clients make it do,
                    // may take the others' routes down.
                    if c.role.is_core() {
                        c.state = State::Stopped;
                        anyhow::bail!(
                            "{} {} (instance {}) exited ({status}) after {} restarts within {} s",
                            c.role.as_str(),
                            c.name,
                            c.instance,
                            c.recent.len(),
                            policy.window_s
                        );
                    }
                    if !c.crash_loop {
                        c.crash_loop = true;
                        tracing::error!(
                            role = c.role.as_str(),
                            name = %c.name,
                            instance = c.instance,
                            %status,
                            delay_ms = policy.crash_loop_backoff_ms,
                            "crash-looping: {} restarts within {} s; restarting it after the crash-loop delay, the rest of the group serves on",
                            c.recent.len(),
                            policy.window_s
                        );
                    }
                    c.backoff = Duration::from_millis(policy.crash_loop_backoff_ms);
                } else {
                    c.backoff = if c.backoff.is_zero() {
                        Duration::from_millis(policy.initial_backoff_ms)
                    } else {
                        (c.backoff * 2).min(Duration::from_millis(policy.max_backoff_ms))
                    };
                }
                c.recent.push_back(now);
                c.restarts += 1;
                c.state = State::Backoff;
                tracing::warn!(
                    role = c.role.as_str(),
                    name = %c.name,
                    instance = c.instance,
                    %status,
                    delay_ms = c.backoff.as_millis() as u64,
                    "exited; restarting"
                );
                let events = self.events.clone();
                let delay = c.backoff;
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let _ = events.send(Event::Respawn { child });
                });
            }
            Event::Respawn { child } => {
                if self.children[child].state == State::Backoff
                    && let Err(err) = self.spawn(child)
                {
                    let c = &self.children[child];
                    tracing::error!(role = c.role.as_str(), name = %c.name, instance = c.instance, "cannot restart: {err:#}");
                    let _ = self.events.send(Event::Exited {
                        child,
                        generation: self.children[child].generation,
                        status: "spawn failed".into(),
                    });
                }
            }
            Event::Load {
                child,
                generation,
                load,
            } => {
                if generation == self.children[child].generation {
                    self.children[child].load = load;
                }
            }
            Event::Status(reply) => {
                let _ = reply.send(self.snapshot());
            }
            Event::Figures {
                child,
                generation,
                figures,
            } => {
                let c = &mut self.children[child];
                if generation == c.generation {
                    c.figures.gauges.extend(figures.gauges);
                    for route in figures.routes {
                        c.figures
                            .routes
                            .insert((route.route.clone(), route.method.clone()), route);
                    }
                }
            }
            Event::Metrics(reply) => {
                let _ = reply.send(self.group_figures());
            }
            // Outside a reload: a late answer, already given up on.
            Event::Reconfigured { .. } => {}
            Event::Control(Request::Reload(reply)) => {
                let _ = reply.send(Err(ReloadError::Busy(
                    "a reload or an upgrade is in progress; try again when it is over".to_owned(),
                )));
            }
            Event::Control(Request::Upgrade(reply)) => {
                let _ = reply.send(Err(
                    "a reload or an upgrade is in progress; try again when it is over".to_owned(),
                ));
            }
        }
        Ok(())
    }

    /// Stops the group: listeners drain first, then managers, router, broker.
    /// A second SIGTERM or SIGINT (or a SIGQUIT) skips the waiting and kills
    /// what is left; [`Stop::Now`] starts that way.
    async fn shutdown(&mut self, rx: &mut mpsc::UnboundedReceiver<Event>, signals: &mut Signals, stop: Stop) {
        let mut hurry = stop == Stop::Now;
        let grace = match stop {
            Stop::Drain(grace) => grace,
            Stop::Now => self.config.shutdown_grace(),
        };
        // Our copies of the TCP socket go first: the listener's close then
        // really stops new connections (after an upgrade, the new group
        // holds it open).
        self.sockets = None;
        for listener in self.children.iter_mut().filter(|c| c.role == Role::Listener) {
            listener.socket = None;
        }
        let stages: [(&[Role], ToChild, Duration); 4] = [
            (
                &[Role::Listener],
                ToChild::Drain {
                    grace_ms: grace.as_millis() as u64,
                },
                grace + Duration::from_secs(2),
            ),
            (
                &[Role::Manager, Role::Worker],
                ToChild::Stop,
                Duration::from_secs(3),
            ),
            (&[Role::Router], ToChild::Stop, Duration::from_secs(3)),
            (&[Role::Broker], ToChild::Stop, Duration::from_secs(3)),
        ];
        for (roles, command, patience) in stages {
            let members: Vec<usize> = (0..self.children.len())
                .filter(|&i| roles.contains(&self.children[i].role))
                .collect();
            for &i in &members {
                let c = &mut self.children[i];
                c.state = if c.handle.is_some() {
                    State::Stopping
                } else {
                    State::Stopped
                };
                if let Some(h) = &c.handle {
                    if hurry {
                        tracing::warn!("fast stop: killing {}", c.describe());
                        h.kill();
                    } else {
                        h.command(command.clone()).await;
                    }
                }
            }
            let deadline = tokio::time::Instant::now() + patience;
            while members.iter().any(|&i| self.children[i].handle.is_some()) {
                tokio::select! {
                    ev = rx.recv() => match ev {
                        Some(Event::Exited { child, generation, status }) if generation == self.children[child].generation => {
                            let c = &mut self.children[child];
                            tracing::info!(role = c.role.as_str(), name = %c.name, instance = c.instance, %status, "stopped");
                            c.handle = None;
                            c.state = State::Stopped;
                        }
                        Some(Event::Status(reply)) => { let _ = reply.send(self.snapshot()); }
                        Some(_) => {}
                        None => break,
                    },
                    caught = signals.recv(), if !hurry => match caught.meaning() {
                        Meaning::Drain | Meaning::Quit => {
                            hurry = true;
                            for &i in &members {
                                if self.children[i].handle.is_some() {
                                    tracing::warn!("{}: killing {}", caught.name(), self.children[i].describe());
                                }
                            }
                            self.kill(&members);
                        }
                        Meaning::Reload => tracing::warn!(signal = caught.name(), "the group is stopping; reload ignored"),
                        Meaning::Ignore(why) => tracing::warn!(signal = caught.name(), "{why}; ignored"),
                    },
                    _ = tokio::time::sleep_until(deadline) => {
                        let told = match command {
                            ToChild::Drain { .. } => "drain",
                            ToChild::Stop | ToChild::Reconfigure { .. } | ToChild::Roster { .. } => "stop",
                        };
                        for &i in &members {
                            if self.children[i].handle.is_some() {
                                tracing::warn!(
                                    "{} did not {told} within {} ms; killing it",
                                    self.children[i].describe(),
                                    patience.as_millis()
                                );
                            }
                        }
                        self.kill(&members);
                        // Killed processes are reaped promptly; do not wait forever.
                        let reap = tokio::time::Instant::now() + Duration::from_secs(2);
                        while members.iter().any(|&i| self.children[i].handle.is_some()) {
                            match tokio::time::timeout_at(reap, rx.recv()).await {
                                Ok(Some(Event::Exited { child, generation, .. })) if generation == self.children[child].generation => {
                                    self.children[child].handle = None;
                                    self.children[child].state = State::Stopped;
                                }
                                Ok(Some(_)) => {}
                                _ => break,
                            }
                        }
                        for &i in &members {
                            if self.children[i].handle.is_some() {
                                tracing::error!("{} was killed but has not exited", self.children[i].describe());
                            }
                        }
                        break;
                    }
                }
            }
        }
    }

    fn kill(&self, members: &[usize]) {
        for &i in members {
            if let Some(h) = &self.children[i].handle {
                h.kill();
            }
        }
    }
}

/// Reload and upgrade: the supervisor's loop runs these to the end, while
/// it keeps restarting children and answering `status`. A signal that
/// stops the group cuts them short ([`Interrupted`]).
impl Supervisor {
    /// How the group stops after a reload or upgrade was cut short:
    /// exit code, cause, and how.
    fn interrupted(&self, why: Interrupted) -> (ExitCode, String, Stop) {
        match why {
            Interrupted::Signal(caught) => {
                let stop = match caught.meaning() {
                    Meaning::Quit => Stop::Now,
                    _ => Stop::Drain(self.config.shutdown_grace()),
                };
                tracing::info!(signal = caught.name(), "stopping");
                (ExitCode::SUCCESS, caught.name().to_owned(), stop)
            }
            Interrupted::Failure(err) => {
                tracing::error!("{err}; stopping the group");
                (ExitCode::FAILURE, err, Stop::Drain(self.config.shutdown_grace()))
            }
        }
    }

    /// Whether child `idx` runs a manager that holds the data directory's
    /// lock (a built-in), or is one of its workers.
    fn holds_data_lock(&self, idx: usize) -> bool {
        let c = &self.children[idx];
        matches!(c.role, Role::Manager | Role::Worker)
            && self
                .config
                .managers
                .iter()
                .any(|m| m.name == c.name && reload::exclusive(m))
    }

    /// Adds a child in a free slot (one retired by an earlier reload) or
    /// at the end; its generation goes on from the slot's, so that events
    /// of the slot's former tenant are never taken for its own.
    fn add_child(&mut self, mut child: Child) -> usize {
        match self.children.iter().position(|c| c.retired && c.handle.is_none()) {
            Some(slot) => {
                child.generation = self.children[slot].generation;
                self.children[slot] = child;
                slot
            }
            None => {
                self.children.push(child);
                self.children.len() - 1
            }
        }
    }

    /// Handles one event while a reload waits; a signal that stops the
    /// group interrupts it.
    async fn next_event(
        &mut self,
        rx: &mut mpsc::UnboundedReceiver<Event>,
        signals: &mut Signals,
        deadline: tokio::time::Instant,
    ) -> Result<Option<Event>, Interrupted> {
        loop {
            tokio::select! {
                ev = rx.recv() => return Ok(ev),
                caught = signals.recv() => match caught.meaning() {
                    Meaning::Drain | Meaning::Quit => return Err(Interrupted::Signal(caught)),
                    Meaning::Reload => tracing::warn!(signal = caught.name(), "a reload is in progress; ignored"),
                    Meaning::Ignore(why) => tracing::warn!(signal = caught.name(), "{why}; ignored"),
                },
                _ = tokio::time::sleep_until(deadline) => return Ok(None),
            }
        }
    }

    /// Starts child `idx` and waits for it to be ready, serving the other
    /// children's events meanwhile.
    async fn start_during_reload(
        &mut self,
        idx: usize,
        rx: &mut mpsc::UnboundedReceiver<Event>,
        signals: &mut Signals,
    ) -> Result<Result<(), String>, Interrupted> {
        if let Err(err) = self.spawn(idx) {
            return Ok(Err(format!(
                "cannot start {}: {err:#}",
                self.children[idx].describe()
            )));
        }
        let deadline =
            tokio::time::Instant::now() + Duration::from_millis(self.config.group.start_timeout_ms);
        loop {
            let Some(ev) = self.next_event(rx, signals, deadline).await? else {
                return Ok(Err(format!(
                    "{} did not become ready within {} ms (group.start_timeout_ms)",
                    self.children[idx].describe(),
                    self.config.group.start_timeout_ms
                )));
            };
            match ev {
                Event::Phase {
                    child,
                    generation,
                    phase: Phase::Ready,
                } if child == idx && generation == self.children[idx].generation => {
                    self.children[idx].state = State::Ready;
                    return Ok(Ok(()));
                }
                Event::Exited {
                    child,
                    generation,
                    status,
                } if child == idx && generation == self.children[idx].generation => {
                    let c = &mut self.children[idx];
                    c.handle = None;
                    c.state = State::Stopped;
                    return Ok(Err(format!("{} exited during start-up ({status})", c.describe())));
                }
                ev => self
                    .handle(ev)
                    .map_err(|err| Interrupted::Failure(format!("{err:#}")))?,
            }
        }
    }

    /// Retires a manager's old members: its instances drain (finishing
    /// what they hold within `grace`), then its workers stop.
    async fn retire_manager(
        &mut self,
        instances: &[usize],
        workers: &[usize],
        grace: Duration,
        rx: &mut mpsc::UnboundedReceiver<Event>,
        signals: &mut Signals,
    ) -> Result<(), Interrupted> {
        self.retire(
            instances,
            ToChild::Drain {
                grace_ms: grace.as_millis() as u64,
            },
            grace + Duration::from_secs(2),
            rx,
            signals,
        )
        .await?;
        self.retire(workers, ToChild::Stop, Duration::from_secs(3), rx, signals)
            .await
    }

    /// Tells `members` to stop (`command`) and waits until they have
    /// exited, killing what is left after `patience`.
    async fn retire(
        &mut self,
        members: &[usize],
        command: ToChild,
        patience: Duration,
        rx: &mut mpsc::UnboundedReceiver<Event>,
        signals: &mut Signals,
    ) -> Result<(), Interrupted> {
        for &i in members {
            let c = &mut self.children[i];
            c.retiring = true;
            match &c.handle {
                Some(h) => {
                    c.state = State::Stopping;
                    h.command(command.clone()).await;
                }
                // Waiting out a restart delay: nothing to stop.
                None => {
                    c.state = State::Stopped;
                    c.retired = true;
                }
            }
        }
        let deadline = tokio::time::Instant::now() + patience;
        while members.iter().any(|&i| !self.children[i].retired) {
            match self.next_event(rx, signals, deadline).await? {
                Some(ev) => self
                    .handle(ev)
                    .map_err(|err| Interrupted::Failure(format!("{err:#}")))?,
                None => {
                    for &i in members {
                        if let Some(h) = &self.children[i].handle {
                            tracing::warn!(
                                "{} did not stop within {} ms; killing it",
                                self.children[i].describe(),
                                patience.as_millis()
                            );
                            h.kill();
                        }
                    }
                    // Killed processes are reaped promptly.
                    return self.retire_reaped(members, rx, signals).await;
                }
            }
        }
        Ok(())
    }

    /// Waits (briefly) for killed members to be reaped.
    async fn retire_reaped(
        &mut self,
        members: &[usize],
        rx: &mut mpsc::UnboundedReceiver<Event>,
        signals: &mut Signals,
    ) -> Result<(), Interrupted> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        while members.iter().any(|&i| !self.children[i].retired) {
            match self.next_event(rx, signals, deadline).await? {
                Some(ev) => {
                    let _ = self.handle(ev);
                }
                None => {
                    for &i in members {
                        if !self.children[i].retired {
                            tracing::error!("{} was killed but has not exited", self.children[i].describe());
                        }
                    }
                    break;
                }
            }
        }
        Ok(())
    }

    /// The running children of manager `name` (instances and workers),
    /// not already retiring.
    fn members_of(&self, name: &str) -> (Vec<usize>, Vec<usize>) {
        let of = |role: Role| {
            (0..self.children.len())
                .filter(|&i| {
                    let c = &self.children[i];
                    c.role == role && c.name == name && !c.retiring && !c.retired
                })
                .collect::<Vec<_>>()
        };
        (of(Role::Manager), of(Role::Worker))
    }

    /// Sends `role`'s processes their new spec and waits for their answers.
    /// Returns how many applied it, and the errors of the others.
    async fn reconfigure(
        &mut self,
        role: Role,
        rx: &mut mpsc::UnboundedReceiver<Event>,
        signals: &mut Signals,
    ) -> Result<(usize, Vec<String>), Interrupted> {
        let mut waiting = Vec::new();
        let mut errors = Vec::new();
        if role == Role::Listener {
            match crate::apidoc::publish(&self.config, self.dir.path()) {
                Ok(file) => self.dir.own(file),
                Err(err) => errors.push(format!("the API catalog: {err}")),
            }
        }
        for i in 0..self.children.len() {
            let c = &self.children[i];
            if c.role != role || c.state != State::Ready || c.retired {
                continue;
            }
            let spec = Spec::for_child(&self.config, self.dir.path(), role, &c.name, c.epoch);
            let command = ToChild::Reconfigure {
                spec: serde_json::to_string(&spec).unwrap_or_default(),
            };
            // A line the child's reader would refuse would cost it its
            // control channel: refuse it here instead.
            if serde_json::to_vec(&command).map_or(0, |l| l.len()) + 1 > MAX_LINE {
                errors.push(format!(
                    "{}: the configuration is larger than a control line ({MAX_LINE} bytes); restart to apply it",
                    c.describe()
                ));
                continue;
            }
            if let Some(h) = &c.handle {
                h.command(command).await;
                waiting.push((i, c.generation));
            }
        }
        let mut applied = 0;
        let deadline =
            tokio::time::Instant::now() + Duration::from_millis(self.config.group.start_timeout_ms);
        while !waiting.is_empty() {
            match self.next_event(rx, signals, deadline).await? {
                Some(Event::Reconfigured {
                    child,
                    generation,
                    error,
                }) => {
                    if let Some(at) = waiting.iter().position(|&w| w == (child, generation)) {
                        waiting.swap_remove(at);
                        match error {
                            None => applied += 1,
                            Some(err) => errors.push(format!("{}: {err}", self.children[child].describe())),
                        }
                    }
                }
                Some(ev) => self
                    .handle(ev)
                    .map_err(|err| Interrupted::Failure(format!("{err:#}")))?,
                None => {
                    for (i, _) in waiting.drain(..) {
                        errors.push(format!(
                            "{}: no answer to the new configuration",
                            self.children[i].describe()
                        ));
                    }
                }
            }
        }
        Ok((applied, errors))
    }

    /// `switchyard reload` and SIGHUP: re-reads the configuration and
    /// applies it (module `reload`; docs/operations.md, "Reload").
    async fn reload(
        &mut self,
        rx: &mut mpsc::UnboundedReceiver<Event>,
        signals: &mut Signals,
    ) -> Result<Result<ReloadReport, ReloadError>, Interrupted> {
        self.systemd.reloading();
        let result = self.reload_inner(rx, signals).await;
        self.systemd.ready("serving (reloaded)");
        result
    }

    async fn reload_inner(
        &mut self,
        rx: &mut mpsc::UnboundedReceiver<Event>,
        signals: &mut Signals,
    ) -> Result<Result<ReloadReport, ReloadError>, Interrupted> {
        // Validation runs a child process and waits for it: off the loop's
        // thread, which keeps serving events meanwhile.
        let source = self.source.clone();
        let loading = tokio::task::spawn_blocking(move || source.load());
        tokio::pin!(loading);
        let far = tokio::time::Instant::now() + Duration::from_secs(24 * 3600);
        let loaded = loop {
            tokio::select! {
                done = &mut loading => break done,
                ev = self.next_event(rx, signals, far) => if let Some(ev) = ev? {
                    self.handle(ev).map_err(|err| Interrupted::Failure(format!("{err:#}")))?;
                },
            }
        };
        let new = match loaded {
            Ok(Ok(config)) => config,
            Ok(Err(SourceError::Config(err))) => {
                return Ok(Err(ReloadError::Invalid(format!("configuration error:\n{err}"))));
            }
            Ok(Err(err)) => return Ok(Err(ReloadError::Invalid(err.to_string()))),
            Err(err) => {
                return Ok(Err(ReloadError::Failed(format!(
                    "cannot read the configuration: {err}"
                ))));
            }
        };
        let plan = reload::plan(&self.config, &self.fingerprints, new);
        let mut report = plan.report;
        let old_config = std::mem::replace(&mut self.config, plan.effective);
        let old_prints = std::mem::replace(&mut self.fingerprints, plan.fingerprints);

        // Managers: the replacements and additions start first (all of
        // them, before anything drains), except those that hold the data
        // directory's lock, which stop first.
        let changing: Vec<String> = report.replaced.iter().chain(&report.added).cloned().collect();
        let grace = self.config.shutdown_grace();
        let mut retire_first = Vec::new();
        let mut started = Vec::new();
        self.epochs += 1;
        let epoch = self.epochs;
        for name in &changing {
            let Some(m) = self.config.managers.iter().find(|m| &m.name == name).cloned() else {
                continue;
            };
            if reload::exclusive(&m) && report.replaced.contains(name) {
                retire_first.push(name.clone());
            }
        }
        for name in &retire_first {
            let (instances, workers) = self.members_of(name);
            self.retire_manager(&instances, &workers, grace, rx, signals)
                .await?;
        }
        let mut failure = None;
        'start: for name in &changing {
            let Some(m) = self.config.managers.iter().find(|m| &m.name == name).cloned() else {
                continue;
            };
            let mut new_children: Vec<usize> = Child::manager(&m, epoch)
                .into_iter()
                .map(|c| self.add_child(c))
                .collect();
            new_children.extend(Child::workers(&m, epoch).into_iter().map(|c| self.add_child(c)));
            if m.workers.kind == WorkerKind::Process {
                for instance in 0..m.instances {
                    self.dir.own(m.workers_socket(self.dir.path(), instance, epoch));
                }
            }
            for idx in new_children {
                started.push(idx);
                if let Err(err) = self.start_during_reload(idx, rx, signals).await? {
                    failure = Some(err);
                    break 'start;
                }
            }
        }
        if let Some(err) = failure {
            // Back to how it was: the new instances go, the old ones stay
            // (a data-lock holder stopped first is started again).
            self.retire(&started, ToChild::Stop, Duration::from_secs(3), rx, signals)
                .await?;
            self.config = old_config;
            self.fingerprints = old_prints;
            for name in &retire_first {
                if let Some(m) = self.config.managers.iter().find(|m| &m.name == name).cloned() {
                    let again: Vec<usize> = Child::manager(&m, epoch)
                        .into_iter()
                        .chain(Child::workers(&m, epoch))
                        .map(|c| self.add_child(c))
                        .collect();
                    for idx in again {
                        if let Err(err) = self.start_during_reload(idx, rx, signals).await? {
                            tracing::error!("{err}; it is restarted like any child that exits");
                            let _ = self.events.send(Event::Exited {
                                child: idx,
                                generation: self.children[idx].generation,
                                status: "start-up failed after a refused reload".to_owned(),
                            });
                        }
                    }
                }
            }
            return Ok(Err(ReloadError::Failed(format!(
                "{err}; the reload was undone and the group runs on as before"
            ))));
        }

        // The router learns the managers the group now declares; then the
        // old instances drain (the router sends them nothing new).
        let (_, router_errors) = self.reconfigure(Role::Router, rx, signals).await?;
        for err in router_errors {
            tracing::warn!("{err}");
        }
        let mut old_instances = Vec::new();
        let mut old_workers = Vec::new();
        for name in report.replaced.iter().chain(&report.removed) {
            if retire_first.contains(name) {
                continue;
            }
            let (instances, workers) = self.members_of(name);
            let (instances, workers): (Vec<usize>, Vec<usize>) = (
                instances.into_iter().filter(|i| !started.contains(i)).collect(),
                workers.into_iter().filter(|i| !started.contains(i)).collect(),
            );
            old_instances.extend(instances);
            old_workers.extend(workers);
        }
        self.retire_manager(&old_instances, &old_workers, grace, rx, signals)
            .await?;

        // The listeners: limits, timeouts and certificates, live.
        let (applied, errors) = self.reconfigure(Role::Listener, rx, signals).await?;
        report.listeners = applied;
        if !errors.is_empty() {
            return Ok(Err(ReloadError::Failed(format!(
                "managers reloaded, but the listener kept its previous settings: {}",
                errors.join("; ")
            ))));
        }
        Ok(Ok(report))
    }

    /// `switchyard upgrade`: starts a new supervisor from the binary on
    /// disk and hands it the listening sockets; once it serves, this group
    /// drains and exits (module `upgrade`). On failure this group serves on.
    async fn upgrade(
        &mut self,
        rx: &mut mpsc::UnboundedReceiver<Event>,
        signals: &mut Signals,
    ) -> Result<Result<u32, String>, Interrupted> {
        let Some(sockets) = &self.sockets else {
            return Ok(Err("the group is stopping".to_owned()));
        };
        let control = self.dir.paths().control_socket();
        let mut sending = match upgrade::Sending::start(
            &self.source,
            self.dir.path(),
            self.dir.created(),
            sockets,
            &control,
        ) {
            Ok(s) => s,
            Err(err) => return Ok(Err(format!("{err:#}"))),
        };
        let pid = sending.pid();
        tracing::info!(pid, "upgrade: the new supervisor starts");
        let waiting = sending.wait_ready();
        tokio::pin!(waiting);
        let far = tokio::time::Instant::now() + Duration::from_secs(24 * 3600);
        let outcome = loop {
            tokio::select! {
                done = &mut waiting => break done,
                ev = self.next_event(rx, signals, far) => if let Some(ev) = ev? {
                    self.handle(ev).map_err(|err| Interrupted::Failure(format!("{err:#}")))?;
                },
            }
        };
        match outcome {
            Ok(()) => {
                tracing::info!(pid, "upgrade: the new group serves; this one drains");
                Ok(Ok(pid))
            }
            Err(err) => {
                // Its control socket back where `status` looks.
                match runtime_dir::bind_unix(&control) {
                    Ok(socket) => {
                        tokio::spawn(crate::status::serve(socket, self.events.clone()));
                    }
                    Err(bind) => tracing::error!("{bind:#}; `switchyard status` cannot reach this group"),
                }
                Ok(Err(format!("upgrade failed: {err}")))
            }
        }
    }
}
