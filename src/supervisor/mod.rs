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
//! # Layout
//! - `runtime_dir`: the private directory and where `status` finds it.
//! - `child`: spawning one child and watching its pipes and exit.
//! - `signals`: every signal that would otherwise end the group silently.
//! - this module: the event loop, restart policy and shutdown.

mod child;
pub(crate) mod runtime_dir;
mod signals;

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde::Serialize;
use switchyard_proto::supervision::{Load, Phase, ToChild};
use tokio::sync::{mpsc, oneshot};

use crate::config::{Config, RestartConfig, WorkerKind};
use crate::roles::{Role, Spec};
use child::ChildHandle;
use runtime_dir::RuntimeDir;
use signals::{Meaning, Signals};

/// What the supervisor loop reacts to.
pub(crate) enum Event {
    Phase {
        child: usize,
        generation: u64,
        phase: Phase,
    },
    Exited {
        child: usize,
        generation: u64,
        status: String,
    },
    Respawn {
        child: usize,
    },
    Load {
        child: usize,
        generation: u64,
        load: Load,
    },
    Status(oneshot::Sender<Vec<ProcessInfo>>),
}

/// One line of `switchyard status`.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub(crate) struct ProcessInfo {
    pub(crate) role: String,
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) instance: u32,
    pub(crate) pid: Option<u32>,
    pub(crate) state: String,
    pub(crate) restarts: u32,
    /// A manager or worker over its restart intensity: restarted after
    /// `restart.crash_loop_backoff_ms` until it stays up for
    /// `restart.window_s`.
    #[serde(default)]
    pub(crate) crash_looping: bool,
    pub(crate) uptime_ms: u64,
    /// A manager's worker pool: kind and size per instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) workers: Option<PoolInfo>,
    /// Requests in progress and work queued, as the process last reported.
    #[serde(default)]
    pub(crate) load: Load,
}

/// A manager's worker pool as `status` shows it.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub(crate) struct PoolInfo {
    pub(crate) kind: String,
    pub(crate) size: usize,
    /// Jobs that may wait for a worker.
    pub(crate) queue: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Starting,
    Running,
    /// Waiting out its restart delay.
    Backoff,
    Stopping,
    Stopped,
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
}

struct Supervisor {
    config: Config,
    dir: RuntimeDir,
    children: Vec<Child>,
    events: mpsc::UnboundedSender<Event>,
    started: Instant,
}

/// Runs `switchyard up`.
pub(crate) fn main(config: Config, runtime_dir: Option<PathBuf>) -> ExitCode {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env(switchyard_proto::process::ENV_LOG)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stdout)
        .with_ansi(false)
        .without_time()
        .try_init();
    // A current-thread runtime: the spawning thread must outlive the children
    // (PR_SET_PDEATHSIG fires when the thread that forked them exits).
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("switchyard: cannot start the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(up(config, runtime_dir)) {
        Ok(code) => code,
        Err(err) => {
            tracing::error!("{err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn up(config: Config, runtime_dir: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    // First of all: from here on no signal ends the group unlogged.
    let mut signals = Signals::install()?;
    let mut dir = RuntimeDir::prepare(runtime_dir)?;
    let paths = dir.paths();
    // The managers bind their worker sockets; the group removes them.
    for m in config
        .managers
        .iter()
        .filter(|m| m.workers.kind == WorkerKind::Process)
    {
        for instance in 0..m.instances {
            dir.own(m.workers_socket(dir.path(), instance));
        }
    }
    let tcp = std::net::TcpListener::bind(config.listener.bind)
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.listener.bind));
    let tcp = match tcp {
        Ok(t) => t,
        Err(err) => {
            dir.remove();
            return Err(err);
        }
    };
    let addr = tcp.local_addr()?;
    let grpc_tcp = match config
        .listener
        .grpc_bind
        .map(std::net::TcpListener::bind)
        .transpose()
    {
        Ok(t) => t,
        Err(err) => {
            dir.remove();
            let at = config
                .listener
                .grpc_bind
                .map(|a| a.to_string())
                .unwrap_or_default();
            return Err(anyhow::anyhow!("cannot listen for gRPC on {at}: {err}"));
        }
    };
    let grpc_addr = grpc_tcp.as_ref().map(|t| t.local_addr()).transpose()?;
    let broker_sock = runtime_dir::bind_unix(&paths.broker_socket())?;
    let router_sock = runtime_dir::bind_unix(&paths.router_socket())?;
    let control_sock = runtime_dir::bind_unix(&paths.control_socket())?;

    let (events, mut rx) = mpsc::unbounded_channel();
    let mut children = vec![
        Child::new(Role::Broker, "broker", Some(OwnedFd::from(broker_sock))),
        Child::new(Role::Router, "router", Some(OwnedFd::from(router_sock))),
    ];
    for m in &config.managers {
        for instance in 0..m.instances {
            let mut child = Child::new(Role::Manager, &m.name, None);
            child.instance = instance;
            child.pool = Some(PoolInfo {
                kind: m.workers.kind.as_str().to_owned(),
                size: m.workers.size(),
                queue: m.workers.queue,
            });
            children.push(child);
        }
    }
    // Worker processes start once their manager listens for them.
    for m in &config.managers {
        for instance in 0..m.instances {
            for _ in 0..m.workers.processes() {
                let mut child = Child::new(Role::Worker, &m.name, None);
                child.instance = instance;
                children.push(child);
            }
        }
    }
    // Every listener process accepts on the same supervisor-owned socket:
    // the kernel hands each connection to one of them.
    let tcp = OwnedFd::from(tcp);
    let grpc_tcp = grpc_tcp.map(OwnedFd::from);
    for instance in 0..config.listener.workers {
        let mut child = Child::new(Role::Listener, "listener", Some(tcp.try_clone()?));
        child.instance = instance;
        child.grpc_socket = grpc_tcp.as_ref().map(|s| s.try_clone()).transpose()?;
        children.push(child);
    }
    drop(tcp);
    drop(grpc_tcp);
    let mut sup = Supervisor {
        config,
        dir,
        children,
        events,
        started: Instant::now(),
    };

    let control = tokio::spawn(crate::status::serve(control_sock, sup.events.clone()));

    // Start in dependency order, each only once the previous is ready.
    for idx in 0..sup.children.len() {
        let started = {
            let start = sup.start_one(idx, &mut rx);
            tokio::pin!(start);
            loop {
                tokio::select! {
                    r = &mut start => break r,
                    caught = signals.recv() => match caught.meaning() {
                        Meaning::Drain | Meaning::Quit => {
                            break Err(anyhow::anyhow!("{} during start-up", caught.name()));
                        }
                        Meaning::Ignore(why) => tracing::warn!(signal = caught.name(), "{why}; ignored"),
                    },
                }
            }
        };
        if let Err(err) = started {
            tracing::error!("start-up failed: {err:#}");
            sup.shutdown(&mut rx, &mut signals, false).await;
            control.abort();
            sup.dir.remove();
            tracing::info!(cause = "start-up failed", "stopped");
            return Ok(ExitCode::FAILURE);
        }
    }
    tracing::info!(
        processes = sup.children.len(),
        ms = sup.started.elapsed().as_millis() as u64,
        "group ready"
    );
    println!(
        "switchyard listening on http://{addr} (runtime dir {})",
        sup.dir.path().display()
    );
    // After the main line, which scripts wait for.
    if let Some(grpc_addr) = grpc_addr {
        println!("switchyard gRPC (only) listening on http://{grpc_addr}");
    }

    let (code, cause, hurry) = loop {
        tokio::select! {
            caught = signals.recv() => match caught.meaning() {
                Meaning::Drain => {
                    tracing::info!(signal = caught.name(), "draining");
                    break (ExitCode::SUCCESS, caught.name().to_owned(), false);
                }
                Meaning::Quit => {
                    tracing::warn!(signal = caught.name(), "stopping at once, without draining");
                    break (ExitCode::SUCCESS, caught.name().to_owned(), true);
                }
                Meaning::Ignore(why) => tracing::warn!(signal = caught.name(), "{why}; ignored"),
            },
            Some(ev) = rx.recv() => {
                if let Err(err) = sup.handle(ev) {
                    tracing::error!("{err:#}; stopping the group");
                    break (ExitCode::FAILURE, format!("{err:#}"), false);
                }
            }
        }
    };
    sup.shutdown(&mut rx, &mut signals, hurry).await;
    control.abort();
    sup.dir.remove();
    tracing::info!(%cause, "stopped");
    Ok(code)
}

impl Child {
    fn new(role: Role, name: &str, socket: Option<OwnedFd>) -> Child {
        Child {
            role,
            name: name.to_owned(),
            instance: 0,
            socket,
            grpc_socket: None,
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
        }
    }

    /// Still crash-looping: it has not stayed up for the window since.
    fn crash_looping(&self, policy: &RestartConfig) -> bool {
        self.crash_loop
            && !(self.state == State::Running
                && self.started.elapsed() > Duration::from_secs(policy.window_s))
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
                format!("{:?}", self.state).to_lowercase()
            },
            restarts: self.restarts,
            crash_looping,
            uptime_ms: if self.state == State::Running {
                self.started.elapsed().as_millis() as u64
            } else {
                0
            },
            workers: self.pool.clone(),
            load: if self.state == State::Running {
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
        let child = &mut self.children[idx];
        let spec = serde_json::to_vec(&Spec::for_child(
            &self.config,
            self.dir.path(),
            child.role,
            &child.name,
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
            },
            self.events.clone(),
        )?;
        tracing::info!(role = child.role.as_str(), name = %child.name, instance = child.instance, pid = handle.pid, "started");
        child.handle = Some(handle);
        child.state = State::Starting;
        child.started = Instant::now();
        Ok(())
    }

    async fn start_one(&mut self, idx: usize, rx: &mut mpsc::UnboundedReceiver<Event>) -> anyhow::Result<()> {
        self.spawn(idx)?;
        let deadline =
            tokio::time::Instant::now() + Duration::from_millis(self.config.group.start_timeout_ms);
        loop {
            let ev = tokio::time::timeout_at(deadline, rx.recv())
                .await
                .map_err(|_| anyhow::anyhow!("{} did not become ready in time", self.children[idx].name))?
                .ok_or_else(|| anyhow::anyhow!("event channel closed"))?;
            match ev {
                Event::Phase {
                    child,
                    generation,
                    phase: Phase::Ready,
                } if child == idx && generation == self.children[idx].generation => {
                    self.children[idx].state = State::Running;
                    return Ok(());
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
                _ => {}
            }
        }
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
        out.extend(self.children.iter().map(|c| c.info(&self.config.restart)));
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
                    c.state = State::Running;
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
        }
        Ok(())
    }

    /// Stops the group: listeners drain first, then managers, router, broker.
    /// A second SIGTERM or SIGINT (or a SIGQUIT) skips the waiting and kills
    /// what is left; `hurry` starts that way.
    async fn shutdown(
        &mut self,
        rx: &mut mpsc::UnboundedReceiver<Event>,
        signals: &mut Signals,
        mut hurry: bool,
    ) {
        let grace = self.config.shutdown_grace();
        // Our copy of the TCP socket goes first: the listener's close then
        // really stops new connections.
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
                        h.command(command).await;
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
                        Meaning::Ignore(why) => tracing::warn!(signal = caught.name(), "{why}; ignored"),
                    },
                    _ = tokio::time::sleep_until(deadline) => {
                        let told = match command {
                            ToChild::Drain { .. } => "drain",
                            ToChild::Stop => "stop",
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
