//! What systemd is told (`Type=notify-reload`, or `Type=notify`): `READY=1`
//! once the group serves, `RELOADING=1` and `READY=1` around a reload,
//! `STOPPING=1` when the group drains, `MAINPID=` when an upgrade hands the
//! group to a new supervisor, and `WATCHDOG=1` at half the `WatchdogSec=`
//! period while the supervisor's loop turns.
//!
//! Outside systemd (`NOTIFY_SOCKET` unset) every call does nothing. A
//! notification that cannot be sent is logged once and never stops the
//! group.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sd_notify::NotifyState;

/// The supervisor's link to systemd.
pub(crate) struct Systemd {
    /// Half the watchdog period systemd expects pings within, if it set one.
    watchdog: Option<Duration>,
    warned: AtomicBool,
}

impl Systemd {
    /// Reads `WATCHDOG_USEC` (and `WATCHDOG_PID`, which must be ours if
    /// set: as `sd_watchdog_enabled(3)`, an absent one means this
    /// process). The variables stay in the environment, so that a
    /// supervisor started by `switchyard upgrade` can notify too (it is
    /// started without `WATCHDOG_PID`, which names the old one); the
    /// children's environments are cleared of them (`child::spawn`).
    pub(crate) fn from_env() -> Systemd {
        let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
        let ours = var("WATCHDOG_PID").is_none_or(|pid| pid == u64::from(std::process::id()));
        let watchdog = var("WATCHDOG_USEC")
            .filter(|_| ours)
            .map(|usec| Duration::from_micros(usec) / 2)
            .filter(|d| !d.is_zero());
        Systemd {
            watchdog,
            warned: AtomicBool::new(false),
        }
    }

    /// How often to send `WATCHDOG=1`, if systemd watches.
    pub(crate) fn watchdog_period(&self) -> Option<Duration> {
        self.watchdog
    }

    fn send(&self, states: &[NotifyState<'_>]) {
        if let Err(err) = sd_notify::notify(false, states)
            && !self.warned.swap(true, Ordering::Relaxed)
        {
            tracing::warn!(%err, "cannot notify systemd (NOTIFY_SOCKET)");
        }
    }

    /// The group serves.
    pub(crate) fn ready(&self, status: &str) {
        self.send(&[NotifyState::Ready, NotifyState::Status(status)]);
    }

    /// A reload starts (`Type=notify-reload` needs the monotonic time).
    pub(crate) fn reloading(&self) {
        match NotifyState::monotonic_usec_now() {
            Ok(now) => self.send(&[NotifyState::Reloading, now, NotifyState::Status("reloading")]),
            Err(_) => self.send(&[NotifyState::Reloading, NotifyState::Status("reloading")]),
        }
    }

    /// The group drains and stops.
    pub(crate) fn stopping(&self, cause: &str) {
        self.send(&[NotifyState::Stopping, NotifyState::Status(cause)]);
    }

    /// The service's main process is now `pid` (an upgrade's new supervisor).
    pub(crate) fn main_pid(&self, pid: u32) {
        self.send(&[NotifyState::MainPid(pid)]);
    }

    /// Alive: the supervisor's loop is turning.
    pub(crate) fn watchdog(&self) {
        self.send(&[NotifyState::Watchdog]);
    }
}
