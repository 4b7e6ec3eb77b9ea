//! `switchyard.toml`: the group's static configuration.
//!
//! Every key has a default, so no file is needed (`switchyard up` serves the
//! demo). Unknown keys and bad values are errors naming the key, reported
//! before any process starts.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use switchyard_manager_host::{Library, LoadError};
pub(crate) use switchyard_worker::Kind as WorkerKind;

/// The whole group's configuration.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct Config {
    pub(crate) listener: ListenerConfig,
    pub(crate) group: GroupConfig,
    pub(crate) restart: RestartConfig,
    /// The managers to run; the demo's when absent.
    pub(crate) managers: Vec<ManagerConfig>,
}

/// The HTTP front end.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct ListenerConfig {
    /// Address to listen on: an IP address or a host name, and a port.
    /// Port 0 picks a free port (printed at start).
    #[serde(deserialize_with = "bind_address")]
    pub(crate) bind: SocketAddr,
    /// A second address serving gRPC alone (it is also served on `bind`,
    /// by content type). Port 0 picks a free port (printed at start).
    pub(crate) grpc_bind: Option<SocketAddr>,
    /// Listener processes sharing the port (each with its own return pipes).
    pub(crate) workers: u32,
    /// Runtime threads of each listener process (0: one per core).
    pub(crate) threads: usize,
    /// Return pipes to the broker (0: one per thread).
    pub(crate) pipes: usize,
    /// Largest request head in bytes (at least 8192); larger gets 431/400.
    pub(crate) max_header_bytes: usize,
    /// Largest request body in bytes; larger gets 413.
    pub(crate) max_body_bytes: usize,
    /// Largest body of an upload route (streamed, never buffered whole);
    /// larger gets 413.
    pub(crate) max_upload_bytes: u64,
    /// Milliseconds a client has to send its request head.
    pub(crate) header_read_timeout_ms: u64,
    /// Milliseconds from request to response before 504.
    pub(crate) request_timeout_ms: u64,
    /// Connections one listener process keeps open at once; more are
    /// answered 503 and closed. Lowered at start (with a warning) to what
    /// the descriptor limit allows.
    pub(crate) max_connections: usize,
    /// Milliseconds a connection with no request in progress may stay
    /// silent (from accept to its first byte, and between requests)
    /// before it is closed.
    pub(crate) idle_timeout_ms: u64,
    /// Milliseconds a request body may pause between two pieces before the
    /// request gets 408 and the connection is closed (every route).
    pub(crate) body_read_timeout_ms: u64,
    /// Milliseconds a connection with something to send may make no
    /// progress (its client reads nothing, or its h2 window stays shut)
    /// before it is closed and what it held is released.
    pub(crate) write_stall_timeout_ms: u64,
    /// Bytes of responses one connection may hold that its client has not
    /// taken (h2: across its streams); a response that would pass it while
    /// others wait gets 503 with Retry-After.
    pub(crate) max_connection_bytes: u64,
    /// WebSocket limits (`/ws`, `/ws/echo`).
    pub(crate) ws: WsLimits,
}

/// `HOST:PORT` → the first address it resolves to (`localhost:0` works as
/// well as `127.0.0.1:0`).
pub(crate) fn resolve_bind(text: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(addr) = text.parse() {
        return Ok(addr);
    }
    let mut addrs = text
        .to_socket_addrs()
        .map_err(|e| format!("`{text}` is not HOST:PORT with a host that resolves ({e})"))?;
    // IPv4 first: `localhost` should mean 127.0.0.1 where both exist.
    let all: Vec<SocketAddr> = addrs.by_ref().collect();
    all.iter()
        .find(|a| a.is_ipv4())
        .or(all.first())
        .copied()
        .ok_or_else(|| format!("`{text}` resolves to no address"))
}

fn bind_address<'de, D: serde::Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    let text = String::deserialize(d)?;
    resolve_bind(&text).map_err(serde::de::Error::custom)
}

/// `[listener.ws]`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct WsLimits {
    /// Largest message a client may send, in bytes; more closes with 1009.
    pub(crate) max_message_bytes: usize,
    /// Subscriptions one connection may hold; more are refused.
    pub(crate) max_subscriptions: usize,
    /// Messages queued towards one client; a client that lets it fill is
    /// dropped (close 1008 "too slow") so it delays nobody else.
    pub(crate) queue: usize,
    /// Milliseconds between server pings; a client that misses one is closed.
    pub(crate) ping_ms: u64,
    /// Requests of one connection in flight at once.
    pub(crate) max_in_flight: usize,
    /// Whether clients may emit notifications into the group (off: any
    /// client could otherwise reach every subscribed manager).
    pub(crate) notify: bool,
}

impl Default for WsLimits {
    fn default() -> Self {
        let d = switchyard_listener::WsConfig::default();
        WsLimits {
            max_message_bytes: d.max_message_bytes,
            max_subscriptions: d.max_subscriptions,
            queue: d.queue,
            ping_ms: d.ping_interval.as_millis() as u64,
            max_in_flight: d.max_in_flight,
            notify: d.notify,
        }
    }
}

impl WsLimits {
    pub(crate) fn to_listener(&self) -> switchyard_listener::WsConfig {
        switchyard_listener::WsConfig {
            max_message_bytes: self.max_message_bytes,
            max_subscriptions: self.max_subscriptions,
            queue: self.queue,
            ping_interval: Duration::from_millis(self.ping_ms),
            max_in_flight: self.max_in_flight,
            notify: self.notify,
        }
    }
}

impl Default for ListenerConfig {
    fn default() -> Self {
        ListenerConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], 8080)),
            grpc_bind: None,
            workers: 1,
            threads: 0,
            pipes: 0,
            max_header_bytes: 16 * 1024,
            max_body_bytes: 1024 * 1024,
            max_upload_bytes: 4 << 30,
            header_read_timeout_ms: 10_000,
            request_timeout_ms: 30_000,
            max_connections: 10_000,
            idle_timeout_ms: 30_000,
            body_read_timeout_ms: 10_000,
            write_stall_timeout_ms: 30_000,
            max_connection_bytes: 64 << 20,
            ws: WsLimits::default(),
        }
    }
}

/// Settings shared by every process of the group.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct GroupConfig {
    /// Largest frame between processes, in bytes. Bodies up to this size
    /// travel inline (see docs/decisions/0002-frame-limit.md).
    pub(crate) max_frame_bytes: usize,
    /// Frames queued per connection before new requests get 503.
    pub(crate) queue_capacity: usize,
    /// Requests in flight per manager instance before new ones get 503.
    pub(crate) max_outstanding_per_instance: u32,
    /// Milliseconds in-flight requests get to finish on SIGTERM.
    pub(crate) shutdown_grace_ms: u64,
    /// Milliseconds a child gets to report ready before start-up fails.
    pub(crate) start_timeout_ms: u64,
    /// Whether 5xx error messages from handlers reach clients (off by
    /// default: they may carry internals).
    pub(crate) expose_errors: bool,
    /// Bodies of at least this many bytes cross between processes in shared
    /// memory instead of inside frames.
    pub(crate) shm_threshold_bytes: usize,
    /// Shared memory one process may hold (created or mapped) at once, in
    /// bytes; past it, requests get 503.
    pub(crate) shm_budget_bytes: u64,
}

impl Default for GroupConfig {
    fn default() -> Self {
        GroupConfig {
            max_frame_bytes: 1024 * 1024,
            queue_capacity: 16 * 1024,
            max_outstanding_per_instance: 4096,
            shutdown_grace_ms: 10_000,
            start_timeout_ms: 10_000,
            expose_errors: false,
            shm_threshold_bytes: switchyard_proto::shm::DEFAULT_THRESHOLD,
            shm_budget_bytes: 1 << 30,
        }
    }
}

/// One-for-one restart policy.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RestartConfig {
    /// First restart delay in milliseconds; doubles per quick failure.
    pub(crate) initial_backoff_ms: u64,
    /// Largest restart delay in milliseconds.
    pub(crate) max_backoff_ms: u64,
    /// At most this many restarts of one child within `window_s` ...
    pub(crate) max_restarts: u32,
    /// ... seconds; more stops the group with an error.
    pub(crate) window_s: u64,
}

impl Default for RestartConfig {
    fn default() -> Self {
        RestartConfig {
            initial_backoff_ms: 10,
            max_backoff_ms: 5_000,
            max_restarts: 10,
            window_s: 30,
        }
    }
}

/// A manager to run.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ManagerConfig {
    /// The manager's name in this group (routing, logs, status).
    pub(crate) name: String,
    /// The plugin library (`.so`); relative paths are relative to the
    /// configuration file. Absent: the built-in demo plugin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) plugin: Option<PathBuf>,
    /// Which manager type of the plugin to run (default: `name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) manager: Option<String>,
    /// How many processes of this manager to run.
    #[serde(default = "one")]
    pub(crate) instances: u32,
    /// Handed to the manager's `create` as its config.
    #[serde(default)]
    pub(crate) config: toml::Table,
    /// The manager's worker pool, for `cx.spawn_job`.
    #[serde(default)]
    pub(crate) workers: WorkersConfig,
}

fn one() -> u32 {
    1
}

/// A manager's worker pool (`[managers.workers]`, see docs/workers.md).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct WorkersConfig {
    /// `thread`: OS threads in the manager process; `process`: worker
    /// processes, supervised like the other children.
    pub(crate) kind: WorkerKind,
    /// Threads or processes per manager instance (default: 4 threads, or
    /// one process per core).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) size: Option<usize>,
    /// Jobs that may wait for a worker; more get 503 with Retry-After.
    pub(crate) queue: usize,
    /// Milliseconds a job may take (waiting included) before its caller
    /// gets 504; a process worker still running it is killed and replaced.
    pub(crate) job_timeout_ms: u64,
}

impl Default for WorkersConfig {
    fn default() -> Self {
        WorkersConfig {
            kind: WorkerKind::Thread,
            size: None,
            queue: 256,
            job_timeout_ms: 30_000,
        }
    }
}

impl WorkersConfig {
    /// Threads, or worker processes per manager instance.
    pub(crate) fn size(&self) -> usize {
        self.size.unwrap_or(match self.kind {
            WorkerKind::Thread => 4,
            WorkerKind::Process => std::thread::available_parallelism().map_or(1, |n| n.get()),
        })
    }

    /// Worker processes the supervisor runs per manager instance.
    pub(crate) fn processes(&self) -> usize {
        match self.kind {
            WorkerKind::Thread => 0,
            WorkerKind::Process => self.size(),
        }
    }
}

impl ManagerConfig {
    /// The manager type to instantiate.
    pub(crate) fn kind(&self) -> &str {
        self.manager.as_deref().unwrap_or(&self.name)
    }

    /// The socket where worker processes of `instance` connect.
    pub(crate) fn workers_socket(&self, runtime_dir: &Path, instance: u32) -> PathBuf {
        runtime_dir.join(format!("workers-{}-{instance}.sock", self.name))
    }

    /// Opens the plugin library (or the built-in one). Runs the plugin's
    /// code: only in the processes that serve it and in the validation
    /// child (`crate::validate`), never in the supervisor.
    pub(crate) fn library(&self) -> Result<Library, LoadError> {
        open_library(self.plugin.as_deref())
    }
}

/// Opens the plugin at `path`, or the built-in demo plugin.
pub(crate) fn open_library(path: Option<&Path>) -> Result<Library, LoadError> {
    match path {
        Some(path) => Library::open(path),
        None => Ok(Library::linked(switchyard_demo::switchyard_plugin_vtable, "demo")),
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listener: ListenerConfig::default(),
            group: GroupConfig::default(),
            restart: RestartConfig::default(),
            managers: switchyard_demo::MANAGERS
                .iter()
                .map(|name| ManagerConfig {
                    name: (*name).to_owned(),
                    plugin: None,
                    manager: None,
                    instances: 1,
                    config: toml::Table::new(),
                    workers: demo_workers(name),
                })
                .collect(),
        }
    }
}

/// The demo's pools: `compute` runs `/cpu` and `/crash` jobs in two worker
/// processes (few, so that the zero-config group starts quickly); the
/// others use the default thread pool.
fn demo_workers(name: &str) -> WorkersConfig {
    if name == <switchyard_demo::Compute as switchyard_manager::Manager>::NAME {
        WorkersConfig {
            kind: WorkerKind::Process,
            size: Some(2),
            ..WorkersConfig::default()
        }
    } else {
        WorkersConfig::default()
    }
}

/// A configuration error, naming the key.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    #[error("{0}")]
    Invalid(String),
}

impl Config {
    /// Reads and validates `path` (the plugins too, in a child process:
    /// see `crate::validate`), reporting every problem at once.
    pub(crate) fn load(path: &Path) -> Result<Config, ConfigError> {
        let config = Config::read(path)?;
        let mut problems = match config.validate() {
            Ok(()) => Vec::new(),
            Err(ConfigError::Invalid(text)) => text.lines().map(str::to_owned).collect(),
            Err(other) => return Err(other),
        };
        problems.extend(crate::validate::plugins(
            &config,
            Duration::from_millis(config.group.start_timeout_ms),
        ));
        if problems.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError::Invalid(problems.join("\n")))
        }
    }

    /// Reads `path` and resolves its relative plugin paths; checks nothing
    /// serde does not.
    fn read(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let mut config: Config = toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        for m in &mut config.managers {
            if let Some(plugin) = &m.plugin
                && plugin.is_relative()
            {
                m.plugin = Some(base.join(plugin));
            }
        }
        Ok(config)
    }

    /// Checks values serde cannot; reports every problem at once.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        let l = &self.listener;
        if l.max_header_bytes < 8192 {
            problems.push("listener.max_header_bytes: must be at least 8192".to_owned());
        }
        if l.max_body_bytes as u64 > self.group.shm_budget_bytes {
            problems.push(format!(
                "listener.max_body_bytes: must fit in group.shm_budget_bytes ({})",
                self.group.shm_budget_bytes
            ));
        }
        if l.request_timeout_ms == 0 {
            problems.push("listener.request_timeout_ms: must be positive".to_owned());
        }
        if l.workers == 0 || l.workers > 64 {
            problems.push("listener.workers: must be between 1 and 64".to_owned());
        }
        let ws = &l.ws;
        for (key, value) in [
            ("max_message_bytes", ws.max_message_bytes),
            ("max_subscriptions", ws.max_subscriptions),
            ("queue", ws.queue),
            ("ping_ms", ws.ping_ms as usize),
            ("max_in_flight", ws.max_in_flight),
        ] {
            if value == 0 {
                problems.push(format!("listener.ws.{key}: must be positive"));
            }
        }
        for (key, value) in [
            ("header_read_timeout_ms", l.header_read_timeout_ms),
            ("idle_timeout_ms", l.idle_timeout_ms),
            ("body_read_timeout_ms", l.body_read_timeout_ms),
            ("write_stall_timeout_ms", l.write_stall_timeout_ms),
        ] {
            if value == 0 {
                problems.push(format!("listener.{key}: must be positive"));
            }
        }
        if l.max_connections == 0 || l.max_connections > 1_000_000 {
            problems.push("listener.max_connections: must be between 1 and 1000000".to_owned());
        }
        if l.max_connection_bytes == 0 {
            problems.push("listener.max_connection_bytes: must be positive".to_owned());
        }
        if self.group.max_frame_bytes < 64 * 1024 || self.group.max_frame_bytes > u32::MAX as usize {
            problems.push("group.max_frame_bytes: must be between 65536 and 4294967295".to_owned());
        }
        if self.group.queue_capacity == 0 {
            problems.push("group.queue_capacity: must be positive".to_owned());
        }
        if self.group.shm_threshold_bytes + 64 * 1024 > self.group.max_frame_bytes {
            problems.push(format!(
                "group.shm_threshold_bytes: must be at least 64 KiB below group.max_frame_bytes ({})",
                self.group.max_frame_bytes
            ));
        }
        if self.managers.is_empty() {
            problems.push("managers: at least one manager is needed".to_owned());
        }
        let mut seen = std::collections::HashSet::new();
        for (i, m) in self.managers.iter().enumerate() {
            if !seen.insert(&m.name) {
                problems.push(format!("managers[{i}].name: `{}` is listed twice", m.name));
            }
            if m.instances == 0 || m.instances > 64 {
                problems.push(format!("managers[{i}].instances: must be between 1 and 64"));
            }
            let w = &m.workers;
            if w.size.is_some_and(|n| n == 0 || n > 256) {
                problems.push(format!("managers[{i}].workers.size: must be between 1 and 256"));
            }
            if w.queue > 1_000_000 {
                problems.push(format!("managers[{i}].workers.queue: must be at most 1000000"));
            }
            if w.job_timeout_ms == 0 {
                problems.push(format!("managers[{i}].workers.job_timeout_ms: must be positive"));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(problems.join("\n")))
        }
    }

    pub(crate) fn threads(&self) -> usize {
        if self.listener.threads > 0 {
            self.listener.threads
        } else {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        }
    }

    pub(crate) fn pipes(&self) -> usize {
        if self.listener.pipes > 0 {
            self.listener.pipes
        } else {
            self.threads()
        }
    }

    pub(crate) fn shutdown_grace(&self) -> Duration {
        Duration::from_millis(self.group.shutdown_grace_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_round_trip() {
        let config = Config::default();
        config.validate().unwrap();
        let text = toml::to_string(&config).unwrap();
        let back: Config = toml::from_str(&text).unwrap();
        assert_eq!(back.listener.bind, config.listener.bind);
    }

    #[test]
    fn bind_takes_host_names() {
        assert_eq!(
            resolve_bind("localhost:0").unwrap(),
            SocketAddr::from(([127, 0, 0, 1], 0))
        );
        assert_eq!(resolve_bind("127.0.0.1:8080").unwrap().port(), 8080);
        assert!(resolve_bind("localhost").unwrap_err().contains("HOST:PORT"));
        let config: Config = toml::from_str("[listener]\nbind = \"localhost:9000\"\n").unwrap();
        assert_eq!(config.listener.bind, SocketAddr::from(([127, 0, 0, 1], 9000)));
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_key() {
        let err = toml::from_str::<Config>("[listener]\nbnd = \"x\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("bnd"), "{err}");
        let err = toml::from_str::<Config>("[listener]\nbind = \"nope\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("bind"), "{err}");
        let config: Config = toml::from_str(
            "[listener]\nmax_header_bytes = 10\n[[managers]]\nname = \"zzz\"\ninstances = 0\n",
        )
        .unwrap();
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("listener.max_header_bytes"), "{err}");
        assert!(err.contains("managers[0].instances"), "{err}");
        let config: Config = toml::from_str(
            "[listener]\nidle_timeout_ms = 0\nwrite_stall_timeout_ms = 0\nbody_read_timeout_ms = 0\n\
             max_connections = 0\nmax_connection_bytes = 0\n",
        )
        .unwrap();
        let err = config.validate().unwrap_err().to_string();
        for key in [
            "listener.idle_timeout_ms",
            "listener.write_stall_timeout_ms",
            "listener.body_read_timeout_ms",
            "listener.max_connections",
            "listener.max_connection_bytes",
        ] {
            assert!(err.contains(key), "{key} not named in {err}");
        }
        // Plugins are checked by the validation child: tests/validation.rs.
    }
}
