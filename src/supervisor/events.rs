//! What the supervisor's loop reacts to ([`Event`]) and what it tells
//! the control socket (`status`) and the admin endpoint (`admin`) in
//! return: the vocabulary those modules share with the loop, so that they
//! depend on it and not on the loop itself.

use serde::Serialize;
use switchyard_proto::supervision::{Figures, Load, Phase, RouteFigures};
use tokio::sync::oneshot;

use super::reload::ReloadReport;

/// A request on the control socket that the supervisor's loop answers.
pub(crate) enum Request {
    /// `switchyard reload`.
    Reload(oneshot::Sender<Result<ReloadReport, ReloadError>>),
    /// `switchyard upgrade`: answered with the new supervisor's pid.
    Upgrade(oneshot::Sender<Result<u32, String>>),
}

/// Why a reload did not happen; the group runs on as it was.
#[derive(Clone, Debug, thiserror::Error, Serialize, serde::Deserialize)]
pub(crate) enum ReloadError {
    /// The new configuration does not validate (the messages of `check`).
    #[error("{0}")]
    Invalid(String),
    /// It validates but could not be applied (a replacement manager did
    /// not start); nothing was changed.
    #[error("{0}")]
    Failed(String),
    /// Another reload or an upgrade is in progress.
    #[error("{0}")]
    Busy(String),
}

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
    /// A child's figures for `/metrics`.
    Figures {
        child: usize,
        generation: u64,
        figures: Figures,
    },
    /// The admin endpoint asks for the group's figures.
    Metrics(oneshot::Sender<GroupFigures>),
    /// A child's answer to
    /// [`ToChild::Reconfigure`](switchyard_proto::supervision::ToChild::Reconfigure).
    Reconfigured {
        child: usize,
        generation: u64,
        error: Option<String>,
    },
    Control(Request),
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

/// What the supervisor knows of the group for the admin endpoint.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct GroupFigures {
    /// Every process, the supervisor first, in start order.
    pub(crate) processes: Vec<ProcessFigures>,
    /// Requests per (route, method) over every listener process, those
    /// that exited included.
    pub(crate) routes: Vec<RouteFigures>,
}

/// One process and the gauges it reported ([`switchyard_proto::supervision::Extra`]
/// and `shm_bytes`).
#[derive(Clone, Debug, Serialize)]
pub(crate) struct ProcessFigures {
    #[serde(flatten)]
    pub(crate) info: ProcessInfo,
    pub(crate) gauges: Vec<(String, u64)>,
}
