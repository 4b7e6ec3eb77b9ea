//! The channel between the supervisor and each child: phases up, commands
//! down, one JSON line per message over a socketpair the child inherits.
//!
//! The child's lifecycle is a latch the supervisor can wait on instead of
//! sleeping: `Starting → Ready → Draining → Stopped`. When the supervisor
//! goes away the channel reads end-of-file and the child stops.

use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{Mutex, watch};

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
}

/// What `switchyard status` shows of a child's load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Load {
    /// Requests this process is handling or waiting on.
    pub in_flight: u64,
    /// Work waiting in this process's bounded queues (e.g. jobs for workers).
    pub queued: u64,
}

/// This process's load gauges: the role's code sets them, the child's
/// control loop reports them. One role per process, so process-wide.
pub struct Gauges {
    in_flight: AtomicU64,
    queued: AtomicU64,
}

/// The gauges of this process.
pub static GAUGES: Gauges = Gauges {
    in_flight: AtomicU64::new(0),
    queued: AtomicU64::new(0),
};

impl Gauges {
    pub fn set(&self, in_flight: usize, queued: usize) {
        self.in_flight.store(in_flight as u64, Ordering::Relaxed);
        self.queued.store(queued as u64, Ordering::Relaxed);
    }

    pub fn read(&self) -> Load {
        Load {
            in_flight: self.in_flight.load(Ordering::Relaxed),
            queued: self.queued.load(Ordering::Relaxed),
        }
    }
}

/// Supervisor → child.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum ToChild {
    /// Stop taking new work, finish what is in flight within `grace_ms`, exit.
    Drain { grace_ms: u64 },
    /// Exit now.
    Stop,
}

/// What the child should do, as the supervisor last said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Run,
    Drain { grace_ms: u64 },
    Stop,
}

/// The child's end of its control channel.
pub struct ChildChannel {
    writer: Mutex<OwnedWriteHalf>,
    commands: watch::Receiver<Command>,
}

impl ChildChannel {
    /// Adopts the inherited socket `fd` and starts reading commands.
    /// End-of-file (the supervisor is gone) reads as [`Command::Stop`].
    ///
    /// # Safety
    /// `fd` must be an open socket that this process owns and nothing else uses.
    pub unsafe fn from_fd(fd: RawFd) -> Result<ChildChannel> {
        // SAFETY: the caller guarantees `fd` is an owned, open socket.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        let std = std::os::unix::net::UnixStream::from(owned);
        std.set_nonblocking(true)?;
        let (reader, writer) = UnixStream::from_std(std)?.into_split();
        let (tx, commands) = watch::channel(Command::Run);
        tokio::spawn(read_commands(reader, tx));
        Ok(ChildChannel {
            writer: Mutex::new(writer),
            commands,
        })
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

    /// The latest command and a way to wait for the next.
    pub fn commands(&self) -> watch::Receiver<Command> {
        self.commands.clone()
    }
}

async fn read_commands(reader: OwnedReadHalf, tx: watch::Sender<Command>) {
    let mut lines = BufReader::new(reader).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        match serde_json::from_str::<ToChild>(&line) {
            Ok(ToChild::Drain { grace_ms }) => {
                let _ = tx.send(Command::Drain { grace_ms });
            }
            Ok(ToChild::Stop) => {
                let _ = tx.send(Command::Stop);
            }
            Err(err) => tracing::warn!(%err, "ignoring bad control line"),
        }
    }
    let _ = tx.send(Command::Stop);
}

/// Waits until the command is no longer [`Command::Run`] and returns it.
pub async fn wait_stop(commands: &mut watch::Receiver<Command>) -> Command {
    match commands.wait_for(|c| *c != Command::Run).await {
        Ok(c) => *c,
        Err(_) => Command::Stop,
    }
}
