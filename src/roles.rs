//! The entry of each child process: read the spec, adopt the inherited
//! sockets, run the role's library `run`, and report phases to the
//! supervisor.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;
use std::time::Duration;

use switchyard_proto::process::{CONTROL_FD, RuntimePaths, init_child_logging};
use switchyard_proto::supervision::{ChildChannel, Phase, Stop, stop_requested};
use tokio::sync::oneshot;

use crate::config::{Config, TlsSettings};
use crate::inherit;

/// The roles a child can play.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Role {
    Broker,
    Router,
    Manager,
    /// A worker process of a manager instance's process pool.
    Worker,
    Listener,
}

impl Role {
    /// The processes every request crosses: past its restart intensity, one
    /// of them stops the group. Managers and workers only crash-loop.
    pub(crate) fn is_core(self) -> bool {
        matches!(self, Role::Broker | Role::Router | Role::Listener)
    }

    /// Place in the start order (broker first, listeners last).
    pub(crate) fn rank(self) -> u8 {
        match self {
            Role::Broker => 0,
            Role::Router => 1,
            Role::Manager => 2,
            Role::Worker => 3,
            Role::Listener => 4,
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Role::Broker => "broker",
            Role::Router => "router",
            Role::Manager => "manager",
            Role::Worker => "worker",
            Role::Listener => "listener",
        }
    }
}

/// What a child is told, through a descriptor (never argv, which every
/// local user can read): the group's configuration and runtime directory.
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct Spec {
    pub(crate) config: Config,
    pub(crate) runtime_dir: std::path::PathBuf,
    /// A manager's or worker's epoch: how many reloads replaced the
    /// manager before this instance (its worker socket's name).
    #[serde(default)]
    pub(crate) epoch: u64,
}

impl Spec {
    /// The spec of one child: every manager's `config` table (its secrets)
    /// goes to that manager's own processes only.
    pub(crate) fn for_child(
        config: &Config,
        runtime_dir: &std::path::Path,
        role: Role,
        name: &str,
        epoch: u64,
    ) -> Spec {
        let mut config = config.clone();
        for m in &mut config.managers {
            if !(role == Role::Manager && m.name == name) {
                m.config = toml::Table::new();
            }
        }
        // Secrets of `[auth]` (an HMAC key) are the listener's alone.
        if role != Role::Listener {
            config.auth = Default::default();
        }
        // `[cluster]` (NATS credentials) is the router's alone, and the
        // built-ins', which keep their keys and jobs in JetStream through
        // it (decisions 0135, 0140).
        let jetstream_builtin = role == Role::Manager
            && config
                .managers
                .iter()
                .any(|m| m.name == name && m.builtin.is_some());
        if role != Role::Router && !jetstream_builtin {
            config.cluster = Default::default();
        }
        Spec {
            config,
            runtime_dir: runtime_dir.to_path_buf(),
            epoch,
        }
    }
}

pub(crate) fn main(role: Role, name: String, instance: u32) -> ExitCode {
    init_child_logging();
    // Before the spec is read and any plugin is loaded: no other process
    // of this user (a plugin in another manager) may read this one's
    // memory or descriptors through /proc or ptrace.
    if let Err(err) = crate::hardening::not_dumpable() {
        tracing::error!(%err, "cannot make this process non-dumpable");
        return ExitCode::FAILURE;
    }
    // Inherited from the supervisor already; raised again in case this
    // child was started some other way.
    if let Err(err) = switchyard_proto::accept::raise_nofile_limit() {
        tracing::warn!(%err, "cannot raise the descriptor limit");
    }
    // Read and closed before any plugin code runs, so nothing the plugin
    // starts can inherit it.
    let spec: Spec = match inherit::spec()
        .map_err(anyhow::Error::from)
        .and_then(|text| serde_json::from_slice(&text).map_err(anyhow::Error::from))
    {
        Ok(s) => s,
        Err(err) => {
            tracing::error!(
                "bad role spec on fd {}: {err:#}",
                switchyard_proto::process::SPEC_FD
            );
            return ExitCode::from(crate::EXIT_CONFIG);
        }
    };
    // A listener of one thread runs on the current thread: no second
    // thread for `block_on`'s future to hand work to (decision 0158).
    let runtime = match role {
        Role::Listener if spec.config.threads() > 1 => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(spec.config.threads())
            .enable_all()
            .build(),
        // The park hook does nothing unless the role asks for it
        // (`set_spin`: the listener, decision 0162).
        _ => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .on_thread_park(switchyard_proto::park::before_park)
            .build(),
    };
    let runtime = match runtime {
        Ok(rt) => rt,
        Err(err) => {
            tracing::error!(%err, "cannot start the runtime");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(role, name, instance, spec)) {
        Ok(cause) => {
            tracing::info!("stopped: {cause}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            tracing::error!("stopped: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// What every role's start is given, and given the same way.
struct Setup<'a> {
    spec: &'a Spec,
    paths: RuntimePaths,
    name: &'a str,
    instance: u32,
    control: &'a ChildChannel,
    /// Fired by the role once it serves.
    ready: oneshot::Sender<()>,
    /// Resolves when the supervisor says to stop, and says how
    /// (decision 0117): the one stop every role's `run` awaits.
    stop: Stopping,
}

type Stopping = Pin<Box<dyn Future<Output = Stop>>>;

/// A role started: its work, and what it can change while it runs.
struct Started {
    work: Pin<Box<dyn Future<Output = anyhow::Result<()>>>>,
    /// The live-configuration channel (`switchyard reload`), if the role
    /// has one.
    live: Option<Live>,
}

impl Started {
    fn work(work: impl Future<Output = anyhow::Result<()>> + 'static) -> Started {
        Started {
            work: Box::pin(work),
            live: None,
        }
    }
}

impl Role {
    /// The seam between a child process's entry and its role: each role
    /// wires its library's `run` from the same [`Setup`].
    fn start(self, setup: Setup<'_>) -> anyhow::Result<Started> {
        match self {
            Role::Broker => start_broker(setup),
            Role::Router => start_router(setup),
            Role::Manager => start_manager(setup),
            Role::Worker => start_worker(setup),
            Role::Listener => start_listener(setup),
        }
    }
}

fn start_broker(setup: Setup<'_>) -> anyhow::Result<Started> {
    let listener = inherit::unix_listener()?;
    let group = &setup.spec.config.group;
    let cfg = switchyard_broker::Config {
        max_frame: group.max_frame_bytes,
        queue_capacity: group.queue_capacity,
        roster: Some(setup.control.roster()),
    };
    let (ready, stop) = (setup.ready, setup.stop);
    Ok(Started::work(async move {
        Ok(switchyard_broker::run(listener, cfg, ready, stop).await?)
    }))
}

fn start_router(setup: Setup<'_>) -> anyhow::Result<Started> {
    let config = setup.spec.config.clone();
    let listener = inherit::unix_listener()?;
    let declared_managers: Vec<String> = config.managers.iter().map(|m| m.name.clone()).collect();
    let (declared_tx, declared) = tokio::sync::watch::channel(declared_managers.clone());
    let broker_socket = setup.paths.broker_socket();
    let roster = Some(setup.control.roster());
    let (ready, stop) = (setup.ready, setup.stop);
    Ok(Started {
        work: Box::pin(async move {
            let cfg = switchyard_router::Config {
                broker_socket,
                declared_managers,
                max_frame: config.group.max_frame_bytes,
                queue_capacity: config.group.queue_capacity,
                max_outstanding: config.group.max_outstanding_per_instance,
                remote: cluster_bridge(&config).await,
                roster,
            };
            Ok(switchyard_router::run_declaring(listener, cfg, ready, stop, declared).await?)
        }),
        live: Some(Live::Router(declared_tx)),
    })
}

/// With `[cluster]` on, the router's port to other groups with the NATS
/// bridge at its far end. The bridge connects in the background; one that
/// cannot start at all (a configuration the client refuses, which the
/// supervisor checked before starting the group) leaves the group serving
/// alone rather than not at all.
async fn cluster_bridge(config: &Config) -> Option<switchyard_router::remote::Remote> {
    let cluster = &config.cluster;
    if !cluster.enabled() {
        return None;
    }
    let (port, link) = switchyard_router::remote::port(cluster.queue);
    let threshold = config.group.shm_threshold_bytes;
    match switchyard_cluster::start(cluster.clone(), threshold, link.from_router, link.to_router).await {
        Ok(()) => Some(switchyard_router::remote::Remote {
            port,
            shared: cluster.shared.clone(),
        }),
        Err(err) => {
            tracing::error!(%err, "cluster bridge not started; serving this group alone");
            None
        }
    }
}

fn start_manager(setup: Setup<'_>) -> anyhow::Result<Started> {
    let (config, name, instance) = (&setup.spec.config, setup.name, setup.instance);
    let m = config
        .managers
        .iter()
        .find(|m| m.name == name)
        .ok_or_else(|| anyhow::anyhow!("no manager `{name}` in the configuration"))?;
    let args = switchyard_manager_host::abi::messages::CreateArgs {
        name: name.to_owned(),
        instance,
        // A built-in also gets the data directory.
        config_json: config.manager_config_json(m)?,
        expose_errors: config.group.expose_errors,
        shm_threshold: config.group.shm_threshold_bytes as u64,
        shm_budget: config.group.shm_budget_bytes,
        validation: false,
    };
    let (plugin, description) = m.library()?.instantiate(m.kind(), &args)?;
    let w = &m.workers;
    let cfg = switchyard_manager_host::Config {
        name: name.to_owned(),
        instance,
        router_socket: setup.paths.router_socket(),
        max_frame: config.group.max_frame_bytes,
        queue_capacity: config.group.queue_capacity,
        shm_threshold: config.group.shm_threshold_bytes,
        handler_timeout: Duration::from_millis(config.group.handler_timeout_ms),
        workers: switchyard_manager_host::Workers {
            kind: w.kind,
            size: w.size(),
            queue: w.queue,
            job_timeout: Duration::from_millis(w.job_timeout_ms),
            socket: m.workers_socket(&setup.spec.runtime_dir, instance, setup.spec.epoch),
        },
    };
    // Told to drain, the instance is being replaced: it finishes what it
    // holds. Told to stop, the group is stopping.
    let (ready, stop) = (setup.ready, setup.stop);
    Ok(Started::work(async move {
        Ok(switchyard_manager_host::run(plugin, description, cfg, ready, stop).await?)
    }))
}

fn start_worker(setup: Setup<'_>) -> anyhow::Result<Started> {
    let (config, name, instance) = (&setup.spec.config, setup.name, setup.instance);
    let m = config
        .managers
        .iter()
        .find(|m| m.name == name)
        .ok_or_else(|| anyhow::anyhow!("no manager `{name}` in the configuration"))?;
    let runner = m.library()?.job_runner(m.kind())?;
    let socket = m.workers_socket(&setup.spec.runtime_dir, instance, setup.spec.epoch);
    let max_frame = config.group.max_frame_bytes;
    let (ready, stop) = (setup.ready, setup.stop);
    Ok(Started::work(async move {
        switchyard_worker::process::serve(&socket, max_frame, runner, ready, stop).await;
        Ok(())
    }))
}

fn start_listener(setup: Setup<'_>) -> anyhow::Result<Started> {
    let config = &setup.spec.config;
    let tcp = inherit::tcp_listener()?;
    let grpc_tcp = config
        .listener
        .grpc_bind
        .is_some()
        .then(inherit::grpc_listener)
        .transpose()?;
    // Each listener reads a UDP socket of its own, steered by
    // connection id (docs/decisions/0076-quic-steered-by-connection-id.md).
    let quic = config
        .listener
        .http3
        .enabled
        .then(inherit::quic_socket)
        .transpose()?;
    let mut cfg = listener_config(config, &setup.paths);
    if let Some(http3) = &mut cfg.http3 {
        http3.steering = Some(switchyard_listener::quic::Steering {
            index: setup.instance,
            count: config.listener.workers,
        });
    }
    let (updates_tx, updates) = tokio::sync::mpsc::channel(1);
    let (ready, stop) = (setup.ready, setup.stop);
    Ok(Started {
        work: Box::pin(async move {
            Ok(switchyard_listener::run(tcp, grpc_tcp, quic, cfg, ready, stop, updates).await?)
        }),
        live: Some(Live::Listener(updates_tx)),
    })
}

/// Runs the role until it ends; returns why it stopped.
async fn serve(role: Role, name: String, instance: u32, spec: Spec) -> anyhow::Result<&'static str> {
    // SAFETY: the supervisor placed our end of the control socketpair at
    // CONTROL_FD before exec; nothing else adopts it.
    let control = unsafe { ChildChannel::from_fd(CONTROL_FD) }?;
    control.report(Phase::Starting).await;
    let config = &spec.config;
    let paths = RuntimePaths::new(&spec.runtime_dir);
    switchyard_proto::shm::set_budget(config.group.shm_budget_bytes);
    // Every process of the group speaks the same transport on its links.
    switchyard_proto::link::set_transport(config.group.transport);
    switchyard_proto::link::set_yields(config.group.ring_yields);
    if role == Role::Listener && config.threads() == 1 {
        // This thread is the current-thread runtime's only one (a
        // multi-thread listener's workers keep their readers' yields).
        switchyard_proto::park::set_spin(config.listener.park_spin_us);
    }
    switchyard_proto::returns::set_return_path(config.group.return_path);
    let (ready_tx, ready_rx) = oneshot::channel();
    let Started { work, live } = role.start(Setup {
        spec: &spec,
        paths: paths.clone(),
        name: &name,
        instance,
        control: &control,
        ready: ready_tx,
        stop: Box::pin(stop_requested(control.commands())),
    })?;

    let result = tokio::select! {
        result = work => result,
        never = report(&control, role, ready_rx) => match never {},
        never = reconfigure(&control, live, &paths) => match never {},
    };
    control.report(Phase::Stopped).await;
    let cause = control.commands().borrow().cause();
    result.map(|()| cause)
}

/// Reports readiness once `ready` fires, then the process's load and
/// figures whenever they change, at most once a second; never returns.
async fn report(control: &ChildChannel, role: Role, ready_rx: oneshot::Receiver<()>) -> Infallible {
    const MAPPING_IDLE: Duration = Duration::from_secs(10);
    if ready_rx.await.is_ok() {
        control.report(Phase::Ready).await;
    }
    // Then the load, whenever it changed, at most once a second.
    let mut last = switchyard_proto::supervision::Load::default();
    let mut last_gauges: Vec<(String, u64)> = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        // Housekeeping: shared-memory segments this process mapped and
        // no longer uses go back to the kernel after a while.
        switchyard_proto::pool::trim_mappings(MAPPING_IDLE);
        // A listener's request figures (and its in-flight gauge).
        let routes = if role == Role::Listener {
            switchyard_listener::metrics::changed()
        } else {
            Vec::new()
        };
        let now = switchyard_proto::supervision::GAUGES.read();
        if now != last {
            control.report_load(now).await;
            last = now;
        }
        let mut gauges: Vec<(String, u64)> = switchyard_proto::supervision::GAUGES
            .read_extra()
            .iter()
            .map(|(g, v)| (g.name().to_owned(), *v))
            .collect();
        gauges.push(("shm_bytes".to_owned(), switchyard_proto::shm::in_use()));
        gauges.retain(|g| !last_gauges.contains(g));
        if !gauges.is_empty() || !routes.is_empty() {
            last_gauges.retain(|(name, _)| !gauges.iter().any(|(n, _)| n == name));
            last_gauges.extend(gauges.iter().cloned());
            // Several lines when a listener has many routes: each stays
            // far below the control channel's line limit.
            let mut routes = routes.into_iter().peekable();
            let mut first = true;
            while first || routes.peek().is_some() {
                let figures = switchyard_proto::supervision::Figures {
                    gauges: if first {
                        std::mem::take(&mut gauges)
                    } else {
                        Vec::new()
                    },
                    routes: routes.by_ref().take(8).collect(),
                };
                control.report_figures(&figures).await;
                first = false;
            }
        }
    }
}

/// Applies the specs the supervisor sends (`switchyard reload`) to a role
/// that can change while it runs; never returns.
async fn reconfigure(control: &ChildChannel, live: Option<Live>, paths: &RuntimePaths) -> Infallible {
    let Some(live) = live else {
        return std::future::pending().await;
    };
    let Some(mut specs) = control.reconfigurations() else {
        return std::future::pending().await;
    };
    while let Some(text) = specs.recv().await {
        let error = match live.apply(&text, paths).await {
            Ok(()) => None,
            Err(err) => Some(format!("{err:#}")),
        };
        control.report_reconfigured(error).await;
    }
    std::future::pending().await
}

/// The listener's settings from the group's configuration.
fn listener_config(config: &Config, paths: &RuntimePaths) -> switchyard_listener::Config {
    let l = &config.listener;
    switchyard_listener::Config {
        broker_socket: paths.broker_socket(),
        pipes: config.pipes(),
        max_frame: config.group.max_frame_bytes,
        queue_capacity: config.group.queue_capacity,
        max_header_bytes: l.max_header_bytes,
        max_body_bytes: l.max_body_bytes,
        max_upload_bytes: l.max_upload_bytes,
        header_read_timeout: Duration::from_millis(l.header_read_timeout_ms),
        request_timeout: Duration::from_millis(l.request_timeout_ms),
        shm_threshold: config.group.shm_threshold_bytes,
        max_connections: l.max_connections,
        idle_timeout: Duration::from_millis(l.idle_timeout_ms),
        body_read_timeout: Duration::from_millis(l.body_read_timeout_ms),
        write_stall_timeout: Duration::from_millis(l.write_stall_timeout_ms),
        max_connection_bytes: l.max_connection_bytes,
        ws: l.ws.to_listener(),
        trusted_proxies: l.trusted_proxies.clone(),
        forwarded_header: l.forwarded_header,
        request_id: config.request_id.to_listener(),
        middleware: config.middleware(),
        tls: l.tls.as_ref().map(TlsSettings::to_listener),
        http3: l.http3.to_listener(),
        api: config.api.to_listener(crate::apidoc::read(&paths.dir)),
        tracing: config.tracing.to_listener(),
        metrics: config.metrics.enabled,
        access_log: config.log.to_listener(),
        statics: config.static_mounts(),
    }
}

/// The live-configuration channel of a role that can change settings
/// while it runs: the supervisor sends it the role's new spec on `reload`.
enum Live {
    /// Limits, timeouts and TLS certificates (re-read from their files).
    Listener(tokio::sync::mpsc::Sender<switchyard_listener::Update>),
    /// The managers the group declares.
    Router(tokio::sync::watch::Sender<Vec<String>>),
}

impl Live {
    /// Applies a spec the supervisor sent; `Ok` once the role runs with it.
    async fn apply(&self, text: &str, paths: &RuntimePaths) -> anyhow::Result<()> {
        let spec: Spec = serde_json::from_str(text)?;
        match self {
            Live::Listener(updates) => {
                let (applied, answer) = oneshot::channel();
                let update = switchyard_listener::Update {
                    config: listener_config(&spec.config, paths),
                    applied,
                };
                let stopping = || anyhow::anyhow!("the listener is stopping");
                updates.send(update).await.map_err(|_| stopping())?;
                answer.await.map_err(|_| stopping())??;
            }
            Live::Router(declared) => {
                declared.send_replace(spec.config.managers.iter().map(|m| m.name.clone()).collect());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each role's spec holds its own secrets and no other's (the built-in
    /// Store's and Scheduler's processes: `[cluster]`'s, decisions 0135,
    /// 0140).
    #[test]
    fn each_spec_holds_only_its_own_secrets() {
        let config: Config = toml::from_str(
            r#"
            [auth.jwt]
            algorithms = ["HS256"]
            secret = "jwt-secret-that-is-at-least-32-bytes"
            [cluster]
            nats = "nats://127.0.0.1:4222"
            user = "u"
            password = "nats-password"
            [[managers]]
            name = "a"
            [managers.config]
            token = "a-token"
            [[managers]]
            name = "b"
            [managers.config]
            token = "b-token"
            [[managers]]
            name = "kv"
            builtin = "store"
            [[managers]]
            name = "jobs"
            builtin = "scheduler"
            "#,
        )
        .unwrap();
        let dir = std::path::Path::new("/run/x");
        let spec = |role, name| serde_json::to_string(&Spec::for_child(&config, dir, role, name, 0)).unwrap();
        let cases = [
            (Role::Broker, "broker", &[][..]),
            (Role::Router, "router", &["nats-password"][..]),
            (
                Role::Listener,
                "listener",
                &["jwt-secret-that-is-at-least-32-bytes"][..],
            ),
            (Role::Manager, "a", &["a-token"][..]),
            (Role::Worker, "a", &[][..]),
            (Role::Manager, "b", &["b-token"][..]),
            // The Store reaches JetStream with the cluster's credentials.
            (Role::Manager, "kv", &["nats-password"][..]),
            (Role::Worker, "kv", &[][..]),
            // So does the Scheduler, for its jobs.
            (Role::Manager, "jobs", &["nats-password"][..]),
            (Role::Worker, "jobs", &[][..]),
        ];
        let all = [
            "nats-password",
            "jwt-secret-that-is-at-least-32-bytes",
            "a-token",
            "b-token",
        ];
        for (role, name, own) in cases {
            let text = spec(role, name);
            for secret in all {
                assert_eq!(
                    text.contains(secret),
                    own.contains(&secret),
                    "{role:?} {name}: {secret}"
                );
            }
        }
    }
}
