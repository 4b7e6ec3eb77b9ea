//! The supervisor's signal contract (docs/operations.md): every signal
//! whose default action would end the supervisor, and with it the whole
//! group, unlogged and with its runtime dir left behind, is caught here and
//! given a meaning. Handlers are installed before the first child starts.

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

/// What the supervisor does with a signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Meaning {
    /// Graceful stop; a second one while stopping hurries it.
    Drain,
    /// Stop at once, without draining (killing every child), then clean up.
    Quit,
    /// Re-read the configuration and apply it (`switchyard reload`).
    Reload,
    /// Logged with this reason and otherwise ignored.
    Ignore(&'static str),
}

/// One caught signal.
#[derive(Clone, Copy, Debug)]
pub(super) struct Caught {
    signal: nix::sys::signal::Signal,
}

impl Caught {
    pub(super) fn name(self) -> &'static str {
        self.signal.as_str()
    }

    pub(super) fn meaning(self) -> Meaning {
        use nix::sys::signal::Signal::*;
        match self.signal {
            SIGTERM | SIGINT => Meaning::Drain,
            SIGQUIT => Meaning::Quit,
            SIGHUP => Meaning::Reload,
            _ => Meaning::Ignore("Switchyard gives this signal no meaning"),
        }
    }
}

/// The signals the supervisor handles; `recv` yields them in arrival order.
pub(super) struct Signals {
    rx: mpsc::UnboundedReceiver<Caught>,
}

impl Signals {
    /// Every asynchronous signal whose default action terminates: the
    /// ones with a meaning, and the rest (alarms, profiling timers, user
    /// signals, resource limits), which are logged instead of killing the
    /// group. SIGKILL and SIGSTOP cannot be caught; fault signals (SIGSEGV,
    /// SIGBUS, ...) are left to their defaults. Broken pipes are already
    /// ignored by the Rust runtime.
    const HANDLED: [nix::sys::signal::Signal; 13] = {
        use nix::sys::signal::Signal::*;
        [
            SIGTERM, SIGINT, SIGQUIT, SIGHUP, SIGUSR1, SIGUSR2, SIGALRM, SIGVTALRM, SIGPROF, SIGIO, SIGPWR,
            SIGXCPU, SIGXFSZ,
        ]
    };

    /// Installs the handlers. Call inside the runtime, before any child
    /// is spawned.
    pub(super) fn install() -> std::io::Result<Signals> {
        let (tx, rx) = mpsc::unbounded_channel();
        for sig in Self::HANDLED {
            let mut stream = signal(SignalKind::from_raw(sig as i32))?;
            let tx = tx.clone();
            tokio::spawn(async move {
                while stream.recv().await.is_some() {
                    if tx.send(Caught { signal: sig }).is_err() {
                        return;
                    }
                }
            });
        }
        Ok(Signals { rx })
    }

    /// The next signal. Never ends while the supervisor runs (the
    /// forwarding tasks live as long as the runtime).
    pub(super) async fn recv(&mut self) -> Caught {
        match self.rx.recv().await {
            Some(caught) => caught,
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::signal::Signal;

    #[test]
    fn hang_up_reloads_and_quit_is_a_fast_stop() {
        let meaning = |signal| Caught { signal }.meaning();
        assert_eq!(meaning(Signal::SIGTERM), Meaning::Drain);
        assert_eq!(meaning(Signal::SIGINT), Meaning::Drain);
        assert_eq!(meaning(Signal::SIGQUIT), Meaning::Quit);
        assert_eq!(meaning(Signal::SIGHUP), Meaning::Reload);
        assert!(matches!(meaning(Signal::SIGUSR1), Meaning::Ignore(_)));
    }
}
