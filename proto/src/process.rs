//! What every process of a group shares: its logging set-up, the names of
//! the sockets in the runtime directory, the descriptors and environment it
//! is given, and how one process of the group signals another ([`Pidfd`]).

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

/// Environment variable naming the supervisor's pid (peer checks).
pub const ENV_SUPERVISOR_PID: &str = "SWITCHYARD_SUPERVISOR_PID";
/// Environment variable with the log filter (`tracing` env-filter syntax).
pub const ENV_LOG: &str = "SWITCHYARD_LOG";
/// Environment variable the supervisor sets for its children from
/// `[log] format`: `json` makes every log line a JSON object.
pub const ENV_LOG_FORMAT: &str = "SWITCHYARD_LOG_FORMAT";
/// The fd a child's control channel is inherited on.
pub const CONTROL_FD: i32 = 3;
/// The fd a child's listening socket (if any) is inherited on.
pub const LISTEN_FD: i32 = 4;
/// The fd a listener's gRPC-only socket (`listener.grpc_bind`) is inherited on.
pub const GRPC_LISTEN_FD: i32 = 5;
/// The fd a child reads its spec (the configuration it needs, secrets
/// included) from: a memfd the supervisor wrote, which the child reads and
/// closes before it runs any plugin code. Never argv or the environment,
/// which every local user can read in `/proc`.
pub const SPEC_FD: i32 = 6;
/// The fd the listener that serves HTTP/3 inherits its UDP socket on
/// (`[listener.http3]`; only one listener process reads it).
pub const QUIC_FD: i32 = 7;
/// Exit code of a manager whose watchdog found a handler that did not
/// return in time (`group.handler_timeout_ms`); EX_SOFTWARE.
pub const EXIT_WATCHDOG: u8 = 70;

/// Paths inside a group's runtime directory.
#[derive(Clone, Debug)]
pub struct RuntimePaths {
    pub dir: PathBuf,
}

impl RuntimePaths {
    pub fn new(dir: impl AsRef<Path>) -> Self {
        RuntimePaths {
            dir: dir.as_ref().to_path_buf(),
        }
    }
    /// Listener pipes and the router connect here.
    pub fn broker_socket(&self) -> PathBuf {
        self.dir.join("broker.sock")
    }
    /// Managers connect here.
    pub fn router_socket(&self) -> PathBuf {
        self.dir.join("router.sock")
    }
    /// `switchyard status` talks to the supervisor here.
    pub fn control_socket(&self) -> PathBuf {
        self.dir.join("control.sock")
    }
}

/// Installs the `tracing` subscriber of a child process: compact lines on
/// stderr without timestamps (the supervisor prefixes role and pid), or
/// with `SWITCHYARD_LOG_FORMAT=json` one JSON object per line, with its
/// time and the fields of the span it is in. A line written while a
/// request is served ([`crate::log_context::in_request`]) names its
/// `request_id` and `trace_id`.
pub fn init_child_logging() {
    use crate::log_context::WithRequest;
    use tracing_subscriber::fmt::format;
    log_panics();
    let filter = tracing_subscriber::EnvFilter::try_from_env(ENV_LOG)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    if json_logs() {
        let _ = tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .event_format(WithRequest::json(
                format()
                    .json()
                    .flatten_event(true)
                    .with_current_span(true)
                    .with_span_list(false)
                    .with_target(false),
            ))
            .try_init();
        return;
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .event_format(WithRequest::text(
            format()
                .with_ansi(false)
                .without_time()
                .with_target(false)
                .compact(),
        ))
        .try_init();
}

/// Makes a panic one ERROR record of the process's log, its backtrace (when
/// `RUST_BACKTRACE` asks for one) a field of it, instead of std's lines on
/// stderr that the supervisor would merge one by one, without a level. A
/// plugin has its own copy of std, and the SDK installs the same hook in
/// it (`switchyard_manager`'s `export_managers!`).
pub fn log_panics() {
    std::panic::set_hook(Box::new(|info| {
        let (message, location, backtrace) = describe_panic(info);
        match backtrace {
            Some(backtrace) => tracing::error!(panic.location = %location, %backtrace, "panicked: {message}"),
            None => tracing::error!(panic.location = %location, "panicked: {message}"),
        }
    }));
}

/// What a panic hook reports: the panic's message, where it happened, and
/// the backtrace when `RUST_BACKTRACE` (or `RUST_LIB_BACKTRACE`) enables one.
pub fn describe_panic(info: &std::panic::PanicHookInfo<'_>) -> (String, String, Option<String>) {
    let message = info.payload_as_str().unwrap_or("Box<dyn Any>").to_owned();
    let location = info
        .location()
        .map(|l| format!("{}:{}:{}", l.file(), l.line(), l.column()))
        .unwrap_or_default();
    let backtrace = std::backtrace::Backtrace::capture();
    let backtrace =
        (backtrace.status() == std::backtrace::BacktraceStatus::Captured).then(|| backtrace.to_string());
    (message, location, backtrace)
}

/// Whether this process logs JSON lines (`SWITCHYARD_LOG_FORMAT=json`).
pub fn json_logs() -> bool {
    std::env::var_os(ENV_LOG_FORMAT).is_some_and(|v| v == "json")
}

/// A process of the group as something to signal: a pidfd, which keeps
/// naming the process it was opened for even after that process died and
/// its pid was reused, where `kill(pid)` would hit whatever runs under the
/// pid by then. Linux 5.3 or later.
#[derive(Debug)]
pub struct Pidfd(OwnedFd);

impl Pidfd {
    /// Opens a pidfd for `pid`. Race-free only while `pid` cannot have been
    /// reused: for a child not reaped yet (its parent opens it right after
    /// spawning it).
    pub fn open(pid: u32) -> std::io::Result<Pidfd> {
        let pid = i32::try_from(pid)
            .ok()
            .and_then(rustix::process::Pid::from_raw)
            .ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("no process has pid {pid}"),
                )
            })?;
        let fd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())?;
        Ok(Pidfd(fd))
    }

    /// The process at the other end of a connected Unix socket, as the
    /// kernel recorded it when it connected (`SO_PEERPIDFD`, Linux 6.5).
    /// On older kernels, a pidfd opened for the pid in its credentials
    /// (`SO_PEERCRED`): that pid names the peer unless it died and its pid
    /// was reused between its `connect` and this call.
    pub fn of_peer(socket: &impl AsFd) -> std::io::Result<Pidfd> {
        use nix::sys::socket::{getsockopt, sockopt};
        match getsockopt(socket, sockopt::PeerPidfd) {
            Ok(fd) => Ok(Pidfd(fd)),
            Err(nix::errno::Errno::ENOPROTOOPT | nix::errno::Errno::EINVAL) => {
                let cred = getsockopt(socket, sockopt::PeerCredentials)?;
                Pidfd::open(u32::try_from(cred.pid()).unwrap_or(0))
            }
            Err(err) => Err(err.into()),
        }
    }

    /// Sends SIGKILL. A process that has exited already is not an error: it
    /// is what the caller wanted, and no other process can be hit.
    pub fn kill(&self) -> std::io::Result<()> {
        self.signal(rustix::process::Signal::KILL)
    }

    /// Sends `signal` (`ESRCH`, the process is gone, counts as done).
    pub fn signal(&self, signal: rustix::process::Signal) -> std::io::Result<()> {
        match rustix::process::pidfd_send_signal(&self.0, signal) {
            Ok(()) | Err(rustix::io::Errno::SRCH) => Ok(()),
            Err(err) => Err(err.into()),
        }
    }
}
