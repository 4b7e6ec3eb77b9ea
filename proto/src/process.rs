//! What every process of a group shares: its logging set-up, the names of
//! the sockets in the runtime directory, and the environment it is given.

use std::path::{Path, PathBuf};

/// Environment variable naming the supervisor's pid (peer checks).
pub const ENV_SUPERVISOR_PID: &str = "SWITCHYARD_SUPERVISOR_PID";
/// Environment variable with the log filter (`tracing` env-filter syntax).
pub const ENV_LOG: &str = "SWITCHYARD_LOG";
/// The fd a child's control channel is inherited on.
pub const CONTROL_FD: i32 = 3;
/// The fd a child's listening socket (if any) is inherited on.
pub const LISTEN_FD: i32 = 4;
/// The fd a listener's gRPC-only socket (`listener.grpc_bind`) is inherited on.
pub const GRPC_LISTEN_FD: i32 = 5;

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
/// stderr without timestamps (the supervisor prefixes role and pid).
pub fn init_child_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env(ENV_LOG)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .without_time()
        .with_target(false)
        .compact()
        .try_init();
}
