//! Spawning one child: the re-executed binary with its control socketpair at
//! fd 3 and its listening socket (if any) at fd 4, its output merged into
//! ours with a name prefix, and its phases and exit turned into events.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Stdio;

use nix::fcntl::{FcntlArg, fcntl};
use switchyard_proto::process::{CONTROL_FD, ENV_SUPERVISOR_PID, GRPC_LISTEN_FD, LISTEN_FD};
use switchyard_proto::supervision::{ToChild, ToSupervisor};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::{Mutex, mpsc};

use super::Event;
use crate::roles::Role;

/// A running child as the supervisor holds it.
pub(crate) struct ChildHandle {
    pub(crate) pid: u32,
    control: Mutex<OwnedWriteHalf>,
}

impl ChildHandle {
    /// Sends a command; a dead child's channel just fails silently (its exit
    /// event is on its way).
    pub(crate) async fn command(&self, command: ToChild) {
        let mut line = serde_json::to_vec(&command).unwrap_or_default();
        line.push(b'\n');
        let _ = self.control.lock().await.write_all(&line).await;
    }

    pub(crate) fn kill(&self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

pub(crate) struct Launch<'a> {
    pub(crate) index: usize,
    pub(crate) generation: u64,
    pub(crate) role: Role,
    pub(crate) name: &'a str,
    pub(crate) instance: u32,
    pub(crate) spec_json: &'a str,
    pub(crate) socket: Option<RawFd>,
    /// A listener's gRPC-only socket, inherited on fd 5.
    pub(crate) grpc_socket: Option<RawFd>,
}

/// A CLOEXEC duplicate of `fd` numbered at least 10, so that the dup2 calls
/// onto 3, 4 and 5 in the child can never clobber one another's source.
fn high_dup(fd: RawFd) -> std::io::Result<OwnedFd> {
    // SAFETY: `fd` is open for the duration of this call (owned by the caller).
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let new = fcntl(borrowed, FcntlArg::F_DUPFD_CLOEXEC(10)).map_err(std::io::Error::from)?;
    // SAFETY: F_DUPFD_CLOEXEC returned a fresh fd that nothing else owns.
    Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(new) })
}

pub(crate) fn spawn(
    exe: &Path,
    launch: Launch<'_>,
    events: mpsc::UnboundedSender<Event>,
) -> anyhow::Result<ChildHandle> {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    let theirs = high_dup(theirs.as_raw_fd())?;
    let socket = launch.socket.map(high_dup).transpose()?;
    let grpc_socket = launch.grpc_socket.map(high_dup).transpose()?;
    let control_src = theirs.as_raw_fd();
    let socket_src = socket.as_ref().map(|s| s.as_raw_fd());
    let grpc_src = grpc_socket.as_ref().map(|s| s.as_raw_fd());
    let supervisor = std::process::id();

    let mut cmd = tokio::process::Command::new(exe);
    cmd.arg("__role")
        .arg(launch.role.as_str())
        .arg("--name")
        .arg(launch.name)
        .arg("--instance")
        .arg(launch.instance.to_string())
        .arg("--spec")
        .arg(launch.spec_json)
        .env(ENV_SUPERVISOR_PID, supervisor.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(false);
    // SAFETY: the closure runs between fork and exec and calls only
    // async-signal-safe functions (dup2, setpgid, prctl, getppid, _exit).
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(control_src, CONTROL_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(src) = socket_src
                && libc::dup2(src, LISTEN_FD) < 0
            {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(src) = grpc_src
                && libc::dup2(src, GRPC_LISTEN_FD) < 0
            {
                return Err(std::io::Error::last_os_error());
            }
            // Own process group: a terminal's Ctrl-C reaches only the
            // supervisor, which stops the children in order.
            libc::setpgid(0, 0);
            // Die with the supervisor, even if it is killed with SIGKILL.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            if libc::getppid() as u32 != supervisor {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    let mut proc = cmd.spawn()?;
    drop(theirs);
    drop(socket);
    drop(grpc_socket);
    let pid = proc.id().unwrap_or(0);

    let prefix = if launch.instance > 0 {
        format!("{}#{}[{pid}]", launch.name, launch.instance)
    } else {
        format!("{}[{pid}]", launch.name)
    };
    if let Some(out) = proc.stdout.take() {
        tokio::spawn(forward_lines(out, prefix.clone()));
    }
    if let Some(err) = proc.stderr.take() {
        tokio::spawn(forward_lines(err, prefix));
    }

    ours.set_nonblocking(true)?;
    let (read, write) = tokio::net::UnixStream::from_std(ours)?.into_split();
    let (index, generation) = (launch.index, launch.generation);
    let phase_events = events.clone();
    tokio::spawn(async move {
        let mut lines = BufReader::new(read).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            match serde_json::from_str::<ToSupervisor>(&line) {
                Ok(ToSupervisor::Phase { phase }) => {
                    let _ = phase_events.send(Event::Phase {
                        child: index,
                        generation,
                        phase,
                    });
                }
                Ok(ToSupervisor::Load(load)) => {
                    let _ = phase_events.send(Event::Load {
                        child: index,
                        generation,
                        load,
                    });
                }
                Err(err) => tracing::warn!(%err, "bad line on a child's control channel"),
            }
        }
    });
    tokio::spawn(async move {
        let status = match proc.wait().await {
            Ok(s) => match (s.code(), s.signal()) {
                (Some(code), _) => format!("exit code {code}"),
                (None, Some(sig)) => format!("killed by signal {sig}"),
                _ => "unknown status".to_owned(),
            },
            Err(err) => format!("wait failed: {err}"),
        };
        let _ = events.send(Event::Exited {
            child: index,
            generation,
            status,
        });
    });
    Ok(ChildHandle {
        pid,
        control: Mutex::new(write),
    })
}

async fn forward_lines(stream: impl AsyncRead + Unpin, prefix: String) {
    let mut lines = BufReader::new(stream).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        println!("{prefix} | {line}");
    }
}
