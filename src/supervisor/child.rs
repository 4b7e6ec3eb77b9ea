//! Spawning one child: the re-executed binary with its control socketpair at
//! fd 3, its listening socket (if any) at fd 4 and its spec in a memfd at
//! fd 6, its output merged into ours with a name prefix, and its phases and
//! exit turned into events.

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};

use futures_util::StreamExt;
use nix::fcntl::{FcntlArg, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};
use switchyard_proto::process::{
    CONTROL_FD, ENV_LOG_FORMAT, ENV_SUPERVISOR_PID, EXIT_WATCHDOG, GRPC_LISTEN_FD, LISTEN_FD, Pidfd, QUIC_FD,
    SPEC_FD,
};
use switchyard_proto::supervision::{ToChild, ToSupervisor, line_error, lines};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{Mutex, mpsc};

use super::Event;
use crate::roles::Role;

/// A running child as the supervisor holds it.
pub(crate) struct ChildHandle {
    pub(crate) pid: u32,
    /// Signals go through it, never through `pid`: once the child is reaped
    /// its pid may name an unrelated process.
    pidfd: Pidfd,
    control: std::sync::Arc<Mutex<OwnedWriteHalf>>,
}

impl ChildHandle {
    /// Sends a command; a dead child's channel just fails silently (its exit
    /// event is on its way).
    pub(crate) async fn command(&self, command: ToChild) {
        let mut line = serde_json::to_vec(&command).unwrap_or_default();
        line.push(b'\n');
        let _ = self.control.lock().await.write_all(&line).await;
    }

    /// [`ChildHandle::command`] from code that cannot wait: sent by a task
    /// of its own (a roster carries its version, so the order two of them
    /// arrive in does not matter).
    pub(crate) fn command_detached(&self, command: ToChild) {
        let control = self.control.clone();
        tokio::spawn(async move {
            let mut line = serde_json::to_vec(&command).unwrap_or_default();
            line.push(b'\n');
            let _ = control.lock().await.write_all(&line).await;
        });
    }

    pub(crate) fn kill(&self) {
        if let Err(err) = self.pidfd.kill() {
            tracing::error!(pid = self.pid, %err, "cannot kill a child");
        }
    }
}

pub(crate) struct Launch<'a> {
    pub(crate) index: usize,
    pub(crate) generation: u64,
    pub(crate) role: Role,
    pub(crate) name: &'a str,
    pub(crate) instance: u32,
    /// What the child reads from [`SPEC_FD`] (JSON; may hold secrets).
    pub(crate) spec: &'a [u8],
    pub(crate) socket: Option<RawFd>,
    /// A listener's gRPC-only socket, inherited on fd 5.
    pub(crate) grpc_socket: Option<RawFd>,
    /// The HTTP/3 listener's UDP socket, inherited on [`QUIC_FD`].
    pub(crate) quic_socket: Option<RawFd>,
    /// The variables the child's environment may take from ours besides
    /// the fixed list (`group.pass_env`).
    pub(crate) pass_env: &'a [String],
}

/// A memfd holding `spec`, for the child to read at [`SPEC_FD`]. Only
/// processes of the same user that may ptrace the child can open it.
fn spec_memfd(spec: &[u8]) -> std::io::Result<OwnedFd> {
    let fd = memfd_create(c"switchyard-spec", MFdFlags::MFD_CLOEXEC).map_err(std::io::Error::from)?;
    let mut file = std::fs::File::from(fd);
    file.write_all(spec)?;
    Ok(OwnedFd::from(file))
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
    let quic_socket = launch.quic_socket.map(high_dup).transpose()?;
    let spec = high_dup(spec_memfd(launch.spec)?.as_raw_fd())?;
    let control_src = theirs.as_raw_fd();
    let socket_src = socket.as_ref().map(|s| s.as_raw_fd());
    let grpc_src = grpc_socket.as_ref().map(|s| s.as_raw_fd());
    let quic_src = quic_socket.as_ref().map(|s| s.as_raw_fd());
    let spec_src = spec.as_raw_fd();
    let supervisor = std::process::id();

    // Nothing secret on the command line or in the environment: both are
    // readable by every local user in /proc. The spec goes by descriptor.
    let mut cmd = tokio::process::Command::new(exe);
    // An allow-listed environment: ours holds the operator's secrets
    // (`SWITCHYARD_AUTH__JWT__SECRET`, ...), which reach each role through
    // its spec, and only the role they are for.
    cmd.env_clear()
        .envs(crate::hardening::child_env(std::env::vars_os(), launch.pass_env));
    cmd.arg("__role")
        .arg(launch.role.as_str())
        .arg("--name")
        .arg(launch.name)
        .arg("--instance")
        .arg(launch.instance.to_string())
        .env(ENV_SUPERVISOR_PID, supervisor.to_string())
        .env(ENV_LOG_FORMAT, if json_logs() { "json" } else { "text" })
        // systemd talks to the supervisor alone: a child (a plugin) must
        // not be able to say READY or STOPPING for the service.
        // (not in the allow-list either; said again in case it grows)
        .env_remove("NOTIFY_SOCKET")
        .env_remove("WATCHDOG_USEC")
        .env_remove("WATCHDOG_PID")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(false);
    // SAFETY: the closure runs between fork and exec and calls only
    // async-signal-safe functions (dup2, signal, setpgid, prctl, getppid,
    // _exit).
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(control_src, CONTROL_FD) < 0 || libc::dup2(spec_src, SPEC_FD) < 0 {
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
            if let Some(src) = quic_src
                && libc::dup2(src, QUIC_FD) < 0
            {
                return Err(std::io::Error::last_os_error());
            }
            // Own process group: a terminal's Ctrl-C and hang-up reach
            // only the supervisor, which stops the children in order.
            libc::setpgid(0, 0);
            // Reload is the supervisor's business: a SIGHUP sent to a child
            // (`kill -HUP`, or to its process group) must not kill it. The
            // disposition survives exec.
            libc::signal(libc::SIGHUP, libc::SIG_IGN);
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
    drop(quic_socket);
    drop(spec);
    // Not reaped before `wait` below runs, so the pid is still this child's
    // and the pidfd names it for good.
    let pid = proc
        .id()
        .ok_or_else(|| anyhow::anyhow!("the child exited before it could be watched"))?;
    let pidfd = match Pidfd::open(pid) {
        Ok(fd) => fd,
        Err(err) => {
            let _ = proc.start_kill();
            anyhow::bail!("cannot open a pidfd for child {pid} (Linux 5.3 or later is needed): {err}");
        }
    };

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
    tokio::spawn(read_reports(read, index, generation, pid, events.clone()));
    tokio::spawn(async move {
        let status = match proc.wait().await {
            Ok(s) => match (s.code(), s.signal()) {
                (Some(code), _) if code == i32::from(EXIT_WATCHDOG) => {
                    format!("exit code {code}: its watchdog found a handler that did not return")
                }
                (Some(code), _) => format!("exit code {code}"),
                (None, Some(sig)) => format!("killed by signal {sig} ({})", signal_name(sig)),
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
        pidfd,
        control: std::sync::Arc::new(Mutex::new(write)),
    })
}

/// Turns a child's control lines into events. A child that breaks the
/// protocol with an over-long line loses its channel, both ways: it reads
/// end-of-file, stops, and is restarted like any child that exits.
async fn read_reports(
    read: OwnedReadHalf,
    child: usize,
    generation: u64,
    pid: u32,
    events: mpsc::UnboundedSender<Event>,
) {
    let mut lines = lines(read);
    while let Some(line) = lines.next().await {
        let line = match line {
            Ok(line) => line,
            Err(err) => {
                tracing::error!(pid, err = line_error(&err), "dropping a child's control channel");
                let socket = lines.get_ref().as_ref();
                let _ = nix::sys::socket::shutdown(socket.as_raw_fd(), nix::sys::socket::Shutdown::Both);
                return;
            }
        };
        match serde_json::from_str::<ToSupervisor>(&line) {
            Ok(ToSupervisor::Phase { phase }) => {
                let _ = events.send(Event::Phase {
                    child,
                    generation,
                    phase,
                });
            }
            Ok(ToSupervisor::Load(load)) => {
                let _ = events.send(Event::Load {
                    child,
                    generation,
                    load,
                });
            }
            Ok(ToSupervisor::Figures(figures)) => {
                let _ = events.send(Event::Figures {
                    child,
                    generation,
                    figures,
                });
            }
            Ok(ToSupervisor::Reconfigured { error }) => {
                let _ = events.send(Event::Reconfigured {
                    child,
                    generation,
                    error,
                });
            }
            Err(err) => tracing::warn!(pid, %err, "bad line on a child's control channel"),
        }
    }
}

/// `SIGKILL` for 9, for exit statuses a person reads.
fn signal_name(signal: i32) -> &'static str {
    nix::sys::signal::Signal::try_from(signal).map_or("unknown signal", |s| s.as_str())
}

/// Longest piece of a child's output printed as one line; a longer line is
/// printed in pieces of this size. Bounds what a child that prints without
/// newlines makes us hold, and never stops reading (a child blocked on a
/// full stdout pipe would hang).
const MAX_OUTPUT_LINE: usize = 64 * 1024;

async fn forward_lines(stream: impl AsyncRead + Unpin, prefix: String) {
    let mut reader = BufReader::new(stream);
    let mut line = Vec::new();
    loop {
        let chunk = match reader.fill_buf().await {
            Ok([]) | Err(_) => break,
            Ok(chunk) => chunk,
        };
        let room = MAX_OUTPUT_LINE - line.len();
        let (take, complete) = match chunk.iter().take(room).position(|&b| b == b'\n') {
            Some(at) => (at + 1, true),
            None => (chunk.len().min(room), line.len() + chunk.len() >= MAX_OUTPUT_LINE),
        };
        line.extend_from_slice(&chunk[..take]);
        reader.consume(take);
        if complete {
            print_line(&prefix, &line);
            line.clear();
        }
    }
    if !line.is_empty() {
        print_line(&prefix, &line);
    }
}

/// `[log] format = "json"`, as the group started (a reload keeps it).
static JSON_LOGS: AtomicBool = AtomicBool::new(false);

/// Sets the format of the merged log, before the first child starts.
pub(crate) fn set_json_logs(json: bool) {
    JSON_LOGS.store(json, Ordering::Relaxed);
}

fn json_logs() -> bool {
    JSON_LOGS.load(Ordering::Relaxed)
}

/// Writes one line of a child's output on ours. A failing stdout (a closed
/// pipe, a full disk) loses the line but never panics the supervisor.
fn print_line(prefix: &str, line: &[u8]) {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = String::from_utf8_lossy(line);
    let _ = writeln!(
        std::io::stdout().lock(),
        "{}",
        merged_line(prefix, &line, json_logs())
    );
}

/// A child's line as the merged log shows it: `prefix | line`, or in JSON
/// the child's object with `"process"` added first (a line that is not a
/// JSON object, such as a plugin's own print, becomes its `message`).
fn merged_line(prefix: &str, line: &str, json: bool) -> String {
    if !json {
        return format!("{prefix} | {line}");
    }
    let process = serde_json::Value::from(prefix).to_string();
    let trimmed = line.trim();
    if trimmed.starts_with('{')
        && trimmed.ends_with('}')
        && serde_json::from_str::<serde::de::IgnoredAny>(trimmed).is_ok()
    {
        let rest = trimmed[1..].trim_start();
        let sep = if rest.starts_with('}') { "" } else { "," };
        return format!("{{\"process\":{process}{sep}{rest}");
    }
    serde_json::json!({ "process": prefix, "message": line }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn merged_lines() {
        assert_eq!(merged_line("router[7]", "hello", false), "router[7] | hello");
        let j: serde_json::Value = serde_json::from_str(&merged_line(
            "router[7]",
            r#"{"level":"INFO","message":"x"}"#,
            true,
        ))
        .unwrap();
        assert_eq!(j["process"], "router[7]");
        assert_eq!(j["message"], "x");
        let j: serde_json::Value = serde_json::from_str(&merged_line("p", "{not json", true)).unwrap();
        assert_eq!(j["message"], "{not json");
        let j: serde_json::Value = serde_json::from_str(&merged_line("p", "{}", true)).unwrap();
        assert_eq!(j["process"], "p");
    }

    #[tokio::test]
    async fn a_child_that_sends_an_endless_line_loses_its_channel() {
        let (child_end, ours) = std::os::unix::net::UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        let (read, _write) = tokio::net::UnixStream::from_std(ours).unwrap().into_split();
        let (events, mut rx) = mpsc::unbounded_channel();
        let reader = tokio::spawn(read_reports(read, 0, 1, 42, events));
        // A phase, then 8 MiB without a newline from a broken child.
        let child = std::thread::spawn(move || {
            let mut child_end = child_end;
            child_end
                .write_all(b"{\"msg\":\"phase\",\"phase\":\"ready\"}\n")
                .unwrap();
            let flood = child_end.write_all(&vec![b'x'; 8 << 20]);
            // The channel is closed both ways: the child reads end-of-file.
            let mut rest = Vec::new();
            let eof = child_end.read_to_end(&mut rest).map(|_| rest.len());
            (flood, eof)
        });
        assert!(matches!(
            rx.recv().await,
            Some(Event::Phase {
                phase: switchyard_proto::supervision::Phase::Ready,
                ..
            })
        ));
        reader.await.unwrap();
        let (flood, eof) = child.join().unwrap();
        assert!(flood.is_err(), "the supervisor took the whole line");
        assert_eq!(eof.unwrap(), 0);
    }
}
