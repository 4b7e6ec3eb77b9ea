//! The channel between the supervisor and each child: phases up, commands
//! down, one JSON line per message over a socketpair the child inherits.
//!
//! The child's lifecycle is a latch the supervisor can wait on instead of
//! sleeping: `Starting → Ready → Draining → Stopped`. When the supervisor
//! goes away the channel reads end-of-file and the child stops.
//!
//! Lines are capped at [`MAX_LINE`] bytes on every reader ([`lines`]): a
//! peer that sends more without a newline has its channel dropped instead
//! of growing the reader's memory without bound.

use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};

use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{Mutex, mpsc, watch};
use tokio_util::codec::{FramedRead, LinesCodec, LinesCodecError};

use crate::Result;

/// Lifecycle phase a child reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Starting,
    Ready,
    Draining,
    Stopped,
}

/// Child → supervisor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub enum ToSupervisor {
    Phase {
        phase: Phase,
    },
    /// The child's load, sent when it changes (at most once a second).
    Load(Load),
    /// What `/metrics` shows of the child beyond its load, sent like the
    /// load: what changed, at most once a second.
    Figures(Figures),
    /// The answer to [`ToChild::Reconfigure`]: applied, or why not (the
    /// child then runs on with its previous configuration).
    Reconfigured {
        error: Option<String>,
    },
}

/// What `switchyard status` shows of a child's load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Load {
    /// Requests this process is handling or waiting on.
    pub in_flight: u64,
    /// Work waiting in this process's bounded queues (e.g. jobs for workers).
    pub queued: u64,
    /// The router's link to the cluster, when `[cluster]` is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<crate::control::ClusterLink>,
}

/// A child's figures for the admin endpoint's `/metrics`, cumulative
/// since the child started (the supervisor adds a restarted child's last
/// figures to the group's totals).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Figures {
    /// The [`Extra`] gauges, by [`Extra::name`], whenever one changed.
    #[serde(default)]
    pub gauges: Vec<(String, u64)>,
    /// A listener's HTTP requests per route: only the routes whose figures
    /// changed since the last report.
    #[serde(default)]
    pub routes: Vec<RouteFigures>,
}

/// The HTTP requests one listener process served on one route.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteFigures {
    /// The route's template (`/hello/{name}`), or one of the listener's
    /// fixed labels (`/health`, `unmatched`, ...): never a raw path.
    pub route: String,
    pub method: String,
    /// Requests answered, by status.
    pub statuses: Vec<(u16, u64)>,
    /// Requests per latency bucket ([`LATENCY_BUCKETS`], then one past the
    /// last bound): not cumulative.
    pub buckets: Vec<u64>,
    /// Sum of the latencies, in microseconds.
    pub sum_us: u64,
}

/// Upper bounds of the request latency histogram, in seconds.
pub const LATENCY_BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The gauges a role may set besides its load (see [`Gauges::set_extra`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Extra {
    /// A listener's open WebSocket sessions.
    WsConnections = 0,
    /// The broker's WebSocket subscriptions.
    WsSubscriptions = 1,
    /// A manager's jobs running on its workers.
    WorkersBusy = 2,
    /// A manager's workers (threads or processes).
    WorkersSize = 3,
    /// A listener's open return links: manager instances that answer it
    /// straight back (decision 0143).
    ReturnLinks = 4,
}

impl Extra {
    pub const ALL: [Extra; 5] = [
        Extra::WsConnections,
        Extra::WsSubscriptions,
        Extra::WorkersBusy,
        Extra::WorkersSize,
        Extra::ReturnLinks,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Extra::WsConnections => "ws_connections",
            Extra::WsSubscriptions => "ws_subscriptions",
            Extra::WorkersBusy => "workers_busy",
            Extra::WorkersSize => "workers_size",
            Extra::ReturnLinks => "return_links",
        }
    }
}

/// This process's load gauges: the role's code sets them, the child's
/// control loop reports them. One role per process, so process-wide.
pub struct Gauges {
    in_flight: AtomicU64,
    queued: AtomicU64,
    /// The cluster link: 0 none, else state (low byte, 1 + the
    /// [`LinkState`](crate::control::LinkState) index) and peers (above).
    cluster: AtomicU64,
    extra: [AtomicU64; 5],
}

/// The gauges of this process.
pub static GAUGES: Gauges = Gauges {
    in_flight: AtomicU64::new(0),
    queued: AtomicU64::new(0),
    cluster: AtomicU64::new(0),
    extra: [const { AtomicU64::new(0) }; 5],
};

impl Gauges {
    pub fn set(&self, in_flight: usize, queued: usize) {
        self.in_flight.store(in_flight as u64, Ordering::Relaxed);
        self.queued.store(queued as u64, Ordering::Relaxed);
    }

    /// Sets the cluster link's state (the router, with `[cluster]` on).
    pub fn set_cluster(&self, link: crate::control::ClusterLink) {
        use crate::control::LinkState;
        let state = match link.state {
            LinkState::Connecting => 1,
            LinkState::Connected => 2,
            LinkState::Disconnected => 3,
        };
        self.cluster
            .store(state | (u64::from(link.peers) << 8), Ordering::Relaxed);
    }

    pub fn read(&self) -> Load {
        use crate::control::{ClusterLink, LinkState};
        let c = self.cluster.load(Ordering::Relaxed);
        let state = match c & 0xff {
            1 => Some(LinkState::Connecting),
            2 => Some(LinkState::Connected),
            3 => Some(LinkState::Disconnected),
            _ => None,
        };
        Load {
            in_flight: self.in_flight.load(Ordering::Relaxed),
            queued: self.queued.load(Ordering::Relaxed),
            cluster: state.map(|state| ClusterLink {
                state,
                peers: (c >> 8) as u32,
            }),
        }
    }

    pub fn set_extra(&self, gauge: Extra, value: u64) {
        self.extra[gauge as usize].store(value, Ordering::Relaxed);
    }

    /// The extra gauges a role has set (never-set ones read 0).
    pub fn read_extra(&self) -> [(Extra, u64); 5] {
        Extra::ALL.map(|g| (g, self.extra[g as usize].load(Ordering::Relaxed)))
    }
}

/// Supervisor → child.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum ToChild {
    /// Stop taking new work, finish what is in flight within `grace_ms`, exit.
    Drain { grace_ms: u64 },
    /// Exit now.
    Stop,
    /// Apply a new configuration while running (`switchyard reload`):
    /// `spec` is the child's spec as its spec descriptor carried it at
    /// start. Answered with [`ToSupervisor::Reconfigured`]. The whole line
    /// must stay under [`MAX_LINE`]; the supervisor checks before sending.
    Reconfigure { spec: String },
    /// Which process holds which role (to the broker and the router, on
    /// every start of a child): what they check hellos against.
    Roster { roster: crate::control::Roster },
}

/// What the child should do, as the supervisor last said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Run,
    Drain {
        grace_ms: u64,
    },
    Stop,
    /// The channel ended (the supervisor is gone, or broke the protocol):
    /// stop, as for [`Command::Stop`].
    SupervisorGone,
}

impl Command {
    /// Why a child stops, for its last log line.
    pub fn cause(self) -> &'static str {
        match self {
            Command::Run => "its work ended on its own",
            Command::Drain { .. } => "the supervisor asked it to drain",
            Command::Stop => "the supervisor asked it to stop",
            Command::SupervisorGone => "its control channel closed (the supervisor is gone)",
        }
    }
}

/// Longest line either side of a control channel (the supervisor's
/// `control.sock` too) accepts, in bytes. Real messages are a few dozen
/// bytes; the cap bounds what a broken or hostile peer can make a reader
/// hold.
pub const MAX_LINE: usize = 64 * 1024;

/// The lines `reader` sends, each at most [`MAX_LINE`] bytes. A longer one
/// yields [`LinesCodecError::MaxLineLengthExceeded`]: drop the channel then.
pub fn lines<R: AsyncRead>(reader: R) -> FramedRead<R, LinesCodec> {
    FramedRead::new(reader, LinesCodec::new_with_max_length(MAX_LINE))
}

/// Why a control line could not be read, for a log line.
pub fn line_error(err: &LinesCodecError) -> String {
    match err {
        LinesCodecError::MaxLineLengthExceeded => format!("a line longer than {MAX_LINE} bytes"),
        LinesCodecError::Io(err) => err.to_string(),
    }
}

/// The child's end of its control channel.
pub struct ChildChannel {
    writer: Mutex<OwnedWriteHalf>,
    commands: watch::Receiver<Command>,
    /// New specs to apply ([`ToChild::Reconfigure`]), taken once by the
    /// role that can apply them.
    reconfigure: std::sync::Mutex<Option<mpsc::UnboundedReceiver<String>>>,
    /// The latest [`ToChild::Roster`] (`None` until the first).
    roster: watch::Receiver<Option<crate::control::Roster>>,
}

impl ChildChannel {
    /// Adopts the inherited socket `fd` and starts reading commands.
    /// End-of-file (the supervisor is gone) reads as
    /// [`Command::SupervisorGone`].
    ///
    /// # Safety
    /// `fd` must be an open socket that this process owns and nothing else uses.
    pub unsafe fn from_fd(fd: RawFd) -> Result<ChildChannel> {
        // SAFETY: the caller guarantees `fd` is an owned, open socket.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        // Inherited across our exec, so close-on-exec is off: set it, or
        // every process this one starts (a plugin may) holds the channel.
        nix::fcntl::fcntl(
            &owned,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )
        .map_err(std::io::Error::from)?;
        let std = std::os::unix::net::UnixStream::from(owned);
        std.set_nonblocking(true)?;
        let (reader, writer) = UnixStream::from_std(std)?.into_split();
        let (tx, commands) = watch::channel(Command::Run);
        let (specs, reconfigure) = mpsc::unbounded_channel();
        let (rosters, roster) = watch::channel(None);
        tokio::spawn(read_commands(reader, tx, specs, rosters));
        Ok(ChildChannel {
            writer: Mutex::new(writer),
            commands,
            reconfigure: std::sync::Mutex::new(Some(reconfigure)),
            roster,
        })
    }

    /// The specs the supervisor sends to reconfigure this process, for the
    /// role that can apply them; `None` after the first call. The
    /// supervisor sends them only to the roles that take them.
    pub fn reconfigurations(&self) -> Option<mpsc::UnboundedReceiver<String>> {
        self.reconfigure.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Answers a [`ToChild::Reconfigure`].
    pub async fn report_reconfigured(&self, error: Option<String>) {
        let mut line = serde_json::to_vec(&ToSupervisor::Reconfigured { error }).unwrap_or_default();
        line.push(b'\n');
        let _ = self.writer.lock().await.write_all(&line).await;
    }

    /// Reports a phase (best effort: a gone supervisor means we stop anyway).
    pub async fn report(&self, phase: Phase) {
        let mut line = serde_json::to_vec(&ToSupervisor::Phase { phase }).unwrap_or_default();
        line.push(b'\n');
        let _ = self.writer.lock().await.write_all(&line).await;
    }

    /// Reports the process's load (best effort, like phases).
    pub async fn report_load(&self, load: Load) {
        let mut line = serde_json::to_vec(&ToSupervisor::Load(load)).unwrap_or_default();
        line.push(b'\n');
        let _ = self.writer.lock().await.write_all(&line).await;
    }

    /// Reports figures for `/metrics` (best effort, like phases).
    pub async fn report_figures(&self, figures: &Figures) {
        let mut line = serde_json::to_vec(&ToSupervisor::Figures(figures.clone())).unwrap_or_default();
        line.push(b'\n');
        let _ = self.writer.lock().await.write_all(&line).await;
    }

    /// The group's roster as the supervisor last sent it, and a way to
    /// wait for the next.
    pub fn roster(&self) -> watch::Receiver<Option<crate::control::Roster>> {
        self.roster.clone()
    }

    /// The latest command and a way to wait for the next.
    pub fn commands(&self) -> watch::Receiver<Command> {
        self.commands.clone()
    }
}

async fn read_commands(
    reader: OwnedReadHalf,
    tx: watch::Sender<Command>,
    specs: mpsc::UnboundedSender<String>,
    rosters: watch::Sender<Option<crate::control::Roster>>,
) {
    let mut lines = lines(reader);
    while let Some(line) = lines.next().await {
        let line = match line {
            Ok(line) => line,
            Err(err) => {
                tracing::error!(err = line_error(&err), "control channel unusable; stopping");
                break;
            }
        };
        match serde_json::from_str::<ToChild>(&line) {
            Ok(ToChild::Drain { grace_ms }) => {
                let _ = tx.send(Command::Drain { grace_ms });
            }
            Ok(ToChild::Stop) => {
                let _ = tx.send(Command::Stop);
            }
            Ok(ToChild::Reconfigure { spec }) => {
                if specs.send(spec).is_err() {
                    tracing::warn!("this process cannot be reconfigured while it runs");
                }
            }
            Ok(ToChild::Roster { roster }) => {
                // Sent in order, but keep the newest whatever the order.
                rosters.send_if_modified(|current| {
                    let newer = current.as_ref().is_none_or(|c| c.version < roster.version);
                    if newer {
                        *current = Some(roster);
                    }
                    newer
                });
            }
            Err(err) => tracing::warn!(%err, "ignoring bad control line"),
        }
    }
    // A stop or drain already given stays the cause; otherwise the
    // supervisor vanished.
    tx.send_if_modified(|c| {
        let gone = *c == Command::Run;
        if gone {
            *c = Command::SupervisorGone;
        }
        gone
    });
}

/// How a role is told to stop: what every role's `run` awaits (the
/// listener, broker, router, manager host and worker alike).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Take nothing new; finish what is in flight within the grace, then
    /// stop (SIGTERM, a manager replaced by a reload, an upgrade).
    Drain(std::time::Duration),
    /// Stop at once (SIGQUIT, the group stopping after the listeners
    /// drained, the supervisor gone).
    Now,
}

impl Stop {
    /// How long what is in flight may take: zero for [`Stop::Now`].
    pub fn grace(self) -> std::time::Duration {
        match self {
            Stop::Drain(grace) => grace,
            Stop::Now => std::time::Duration::ZERO,
        }
    }
}

impl Command {
    /// The stop this command asks for; `None` while the child runs on.
    pub fn stop(self) -> Option<Stop> {
        match self {
            Command::Run => None,
            Command::Drain { grace_ms } => Some(Stop::Drain(std::time::Duration::from_millis(grace_ms))),
            Command::Stop | Command::SupervisorGone => Some(Stop::Now),
        }
    }
}

/// Resolves with the [`Stop`] once the supervisor says to stop (or is
/// gone): the future every role's `run` is given.
pub async fn stop_requested(mut commands: watch::Receiver<Command>) -> Stop {
    wait_stop(&mut commands).await.stop().unwrap_or(Stop::Now)
}

/// Waits until the command is no longer [`Command::Run`] and returns it.
pub async fn wait_stop(commands: &mut watch::Receiver<Command>) -> Command {
    match commands.wait_for(|c| *c != Command::Run).await {
        Ok(c) => *c,
        Err(_) => Command::SupervisorGone,
    }
}

/// The roster a broker or router checks hellos against (`None`: not run
/// by a supervisor, as in a library test, where every peer is trusted).
pub type RosterWatch = watch::Receiver<Option<crate::control::Roster>>;

/// How long a hello from a pid the roster does not list yet waits for the
/// supervisor's next roster: the child may connect before the roster that
/// names it (sent right after its spawn) has arrived.
pub const ROSTER_PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);

/// The member of the group that `pid` is, waiting up to
/// [`ROSTER_PATIENCE`] for a roster that lists it; `None` if none does.
pub async fn member_of(roster: &mut RosterWatch, pid: u32) -> Option<crate::control::Member> {
    let listed = tokio::time::timeout(
        ROSTER_PATIENCE,
        roster.wait_for(|r| r.as_ref().is_some_and(|r| r.member(pid).is_some())),
    )
    .await;
    match listed {
        Ok(Ok(r)) => r.as_ref().and_then(|r| r.member(pid).cloned()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_endless_line_ends_the_channel_instead_of_growing_the_reader() {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        theirs.set_nonblocking(true).unwrap();
        let (read, write) = UnixStream::from_std(theirs).unwrap().into_split();
        drop(write);
        let (tx, mut commands) = watch::channel(Command::Run);
        let (specs, _) = mpsc::unbounded_channel();
        let (rosters, _) = watch::channel(None);
        let reader = tokio::spawn(read_commands(read, tx, specs, rosters));
        // A drain, then 8 MiB without a newline from a broken supervisor.
        let writer = std::thread::spawn(move || {
            use std::io::Write;
            let mut ours = ours;
            ours.write_all(b"{\"cmd\":\"drain\",\"grace_ms\":5}\n").unwrap();
            ours.write_all(&vec![b'x'; 8 << 20])
        });
        assert_eq!(wait_stop(&mut commands).await, Command::Drain { grace_ms: 5 });
        reader.await.unwrap();
        // The command given stays the cause, and the reader closed its end
        // long before the line was over.
        assert_eq!(*commands.borrow(), Command::Drain { grace_ms: 5 });
        assert!(writer.join().unwrap().is_err(), "the reader took the whole line");
    }

    #[tokio::test]
    async fn end_of_file_means_the_supervisor_is_gone() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let (read, _write) = theirs.into_split();
        let (tx, mut commands) = watch::channel(Command::Run);
        drop(ours);
        let (specs, _) = mpsc::unbounded_channel();
        read_commands(read, tx, specs, watch::channel(None).0).await;
        assert_eq!(wait_stop(&mut commands).await, Command::SupervisorGone);
    }

    #[tokio::test]
    async fn lines_are_capped() {
        let (mut ours, theirs) = UnixStream::pair().unwrap();
        let mut lines = lines(theirs);
        let writer = tokio::spawn(async move {
            ours.write_all(b"short\n").await.unwrap();
            let _ = ours.write_all(&vec![b'y'; MAX_LINE + 10]).await;
            ours
        });
        assert_eq!(lines.next().await.unwrap().unwrap(), "short");
        let err = lines.next().await.unwrap().unwrap_err();
        assert!(matches!(err, LinesCodecError::MaxLineLengthExceeded), "{err:?}");
        drop(lines);
        drop(writer.await.unwrap());
    }
}
