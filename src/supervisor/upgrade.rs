//! `switchyard upgrade`: a new supervisor, started from the binary on
//! disk, takes over the listening sockets while this one drains (the
//! pattern of Envoy's hot restart and Pingora's graceful upgrade;
//! docs/decisions/0052-upgrade.md).
//!
//! ```text
//! old supervisor                               new supervisor (`up --upgrade-fd N`)
//!   unlinks control.sock
//!   spawns ──────────────────────────────────▶ starts
//!   offer + TCP sockets (SCM_RIGHTS) ────────▶ takes them instead of binding
//!                                              starts its group (not the built-ins)
//!   ◀──────────────────────────────────────── "ready" (or "failed": the old one
//!   drains and exits (sockets stay open:           serves on and binds
//!   the new group holds them)                      control.sock again)
//!                                              the handover socket reads EOF:
//!                                              starts the built-ins
//! ```
//!
//! The listening socket is never closed, so a client that connects at any
//! moment is queued in its backlog and accepted by one group or the other:
//! nothing is refused or reset. The built-in managers hold the data
//! directory's lock, so the new group starts them once the old one is gone
//! (their routes answer 503 with `Retry-After` for that moment).

use std::io::{BufRead, BufReader, IoSlice, IoSliceMut, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncBufReadExt;

use super::Source;

/// The group's TCP listening sockets, as the supervisor holds them.
pub(crate) struct Sockets {
    pub(crate) tcp: OwnedFd,
    /// `listener.grpc_bind`'s.
    pub(crate) grpc: Option<OwnedFd>,
    /// HTTP/3's UDP sockets (`[listener.http3]`), one per listener
    /// process, in their steering order.
    pub(crate) quic: Vec<OwnedFd>,
}

/// Old → new, with the sockets attached.
#[derive(Debug, Serialize, Deserialize)]
struct Offer {
    /// The old group made the runtime directory: the new one removes it
    /// when it stops.
    runtime_dir_created: bool,
    /// A gRPC-only socket follows the main one.
    grpc: bool,
    /// This many UDP sockets of HTTP/3 follow (last), in steering order.
    #[serde(default)]
    quic: usize,
}

/// New → old.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Answer {
    /// The new group serves: drain.
    Ready,
    /// The new group did not start: serve on.
    Failed(String),
}

/// The binary to start: the file at the path this one was started from.
/// When that file was replaced (the usual way to install a new build),
/// `/proc/self/exe` names the old one "… (deleted)"; the path is the new
/// one's.
fn binary_on_disk() -> std::io::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let text = exe.to_string_lossy();
    Ok(match text.strip_suffix(" (deleted)") {
        Some(path) => PathBuf::from(path),
        None => exe,
    })
}

/// The old supervisor's side.
pub(crate) struct Sending {
    socket: Option<tokio::net::UnixStream>,
    child: std::process::Child,
}

impl Sending {
    /// Starts the new supervisor and hands it the sockets. `control` (the
    /// control socket's path) is unlinked first, so that the new group can
    /// bind it; the caller binds it again if the upgrade fails.
    pub(crate) fn start(
        source: &Source,
        runtime_dir: &Path,
        runtime_dir_created: bool,
        sockets: &Sockets,
        control: &Path,
    ) -> anyhow::Result<Sending> {
        let exe = binary_on_disk()?;
        let (ours, theirs) = UnixStream::pair()?;
        // The one descriptor the new supervisor inherits: everything else
        // of ours is close-on-exec.
        nix::fcntl::fcntl(
            &theirs,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
        )?;
        let mut cmd = std::process::Command::new(&exe);
        cmd.arg("up").arg("--runtime-dir").arg(runtime_dir);
        if let Some(path) = &source.path {
            cmd.arg("-c").arg(path);
        }
        if let Some(bind) = source.bind {
            cmd.arg("--bind").arg(bind.to_string());
        }
        if let Some(dir) = &source.data_dir {
            cmd.arg("--data-dir").arg(dir);
        }
        // The admin address as bound (a port 0 resolved): the new
        // supervisor binds it beside this one (`SO_REUSEPORT`).
        if let Some(admin) = source.admin_bound {
            cmd.arg("--admin-bind").arg(admin.to_string());
        }
        // The new supervisor announces itself in the same file.
        if let Some(path) = &source.ready_file {
            cmd.arg("--ready-file").arg(path);
        }
        cmd.arg("--upgrade-fd")
            .arg(theirs.as_raw_fd().to_string())
            // systemd's watchdog names the old supervisor; the new one
            // takes it over with MAINPID=.
            .env_remove("WATCHDOG_PID")
            .stdin(std::process::Stdio::null());
        match std::fs::remove_file(control) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => anyhow::bail!(
                "cannot make way for the new control socket {}: {e}",
                control.display()
            ),
        }
        let child = cmd
            .spawn()
            .map_err(|e| anyhow::anyhow!("cannot start {}: {e}", exe.display()))?;
        drop(theirs);
        let offer = Offer {
            runtime_dir_created,
            grpc: sockets.grpc.is_some(),
            quic: sockets.quic.len(),
        };
        let mut line = serde_json::to_vec(&offer)?;
        line.push(b'\n');
        let mut fds: Vec<RawFd> = vec![sockets.tcp.as_raw_fd()];
        fds.extend(sockets.grpc.as_ref().map(|s| s.as_raw_fd()));
        fds.extend(sockets.quic.iter().map(|s| s.as_raw_fd()));
        sendmsg::<()>(
            ours.as_raw_fd(),
            &[IoSlice::new(&line)],
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::empty(),
            None,
        )?;
        ours.set_nonblocking(true)?;
        Ok(Sending {
            socket: Some(tokio::net::UnixStream::from_std(ours)?),
            child,
        })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the new group to serve. Its failure, or its exit before
    /// it was ready, is an error (reaped here). On success the socket
    /// stays open until this process exits: that end-of-file tells the new
    /// group the old one is gone.
    pub(crate) async fn wait_ready(&mut self) -> Result<(), String> {
        let Some(socket) = self.socket.as_mut() else {
            return Err("already waited".to_owned());
        };
        let mut line = String::new();
        let read = tokio::io::BufReader::new(socket).read_line(&mut line).await;
        let answer = match read {
            Ok(n) if n > 0 => serde_json::from_str::<Answer>(&line).map_err(|e| e.to_string()),
            Ok(_) => Err("the new supervisor exited before it was ready".to_owned()),
            Err(err) => Err(format!("lost the new supervisor: {err}")),
        };
        match answer {
            Ok(Answer::Ready) => {
                // Kept open (and the process never waited for): this group
                // exits next, and the new one is re-parented.
                std::mem::forget(self.socket.take());
                Ok(())
            }
            Ok(Answer::Failed(err)) => {
                self.reap();
                Err(err)
            }
            Err(err) => {
                self.reap();
                Err(err)
            }
        }
    }

    /// Collects the new supervisor's exit, giving it a moment to go.
    fn reap(&mut self) {
        for _ in 0..100 {
            if let Ok(Some(status)) = self.child.try_wait() {
                return tracing::warn!(%status, "the new supervisor exited");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The new supervisor's side.
pub(crate) struct Receiving {
    socket: Option<UnixStream>,
    offer: Offer,
    sockets: Option<(std::net::TcpListener, Option<std::net::TcpListener>)>,
    quic: Vec<std::net::UdpSocket>,
}

impl Receiving {
    /// Reads the offer and the sockets from the inherited `fd`.
    pub(crate) fn start(fd: OwnedFd) -> anyhow::Result<Receiving> {
        // Inherited, so not close-on-exec: make it so, or the children
        // would hold it (and the old group would never read end-of-file).
        nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC))?;
        let socket = UnixStream::from(fd);
        socket.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut buf = [0u8; 4096];
        // The TCP sockets and at most one UDP socket per listener process.
        let mut space = nix::cmsg_space!([RawFd; 2 + super::quic_port::MAX_PROCESSES as usize]);
        let (len, fds) = {
            let mut iov = [IoSliceMut::new(&mut buf)];
            let msg = recvmsg::<()>(
                socket.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::MSG_CMSG_CLOEXEC,
            )?;
            let mut fds = Vec::new();
            for cmsg in msg.cmsgs()? {
                if let ControlMessageOwned::ScmRights(received) = cmsg {
                    fds.extend(received);
                }
            }
            (msg.bytes, fds)
        };
        // SAFETY: SCM_RIGHTS just installed these descriptors in this
        // process; nothing else refers to them, and each is adopted once.
        let mut owned: Vec<OwnedFd> = fds
            .into_iter()
            .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
            .collect();
        let text = std::str::from_utf8(&buf[..len])?;
        let offer: Offer = serde_json::from_str(text.trim_end())?;
        let expected = 1 + usize::from(offer.grpc) + offer.quic;
        anyhow::ensure!(
            owned.len() == expected,
            "the old supervisor sent {} sockets, not {expected}",
            owned.len(),
        );
        let quic = owned
            .split_off(owned.len() - offer.quic)
            .into_iter()
            .map(std::net::UdpSocket::from)
            .collect();
        let grpc = offer.grpc.then(|| std::net::TcpListener::from(owned.remove(1)));
        let tcp = std::net::TcpListener::from(owned.remove(0));
        tracing::info!(addr = ?tcp.local_addr().ok(), "upgrade: took over the listening sockets");
        socket.set_read_timeout(None)?;
        Ok(Receiving {
            socket: Some(socket),
            offer,
            sockets: Some((tcp, grpc)),
            quic,
        })
    }

    pub(crate) fn runtime_dir_created(&self) -> bool {
        self.offer.runtime_dir_created
    }

    /// The sockets (once).
    pub(crate) fn take_sockets(&mut self) -> (std::net::TcpListener, Option<std::net::TcpListener>) {
        self.sockets
            .take()
            .expect("the sockets are taken once, at start-up")
    }

    /// HTTP/3's UDP sockets, if the old group served it (once).
    pub(crate) fn take_quic(&mut self) -> Vec<std::net::UdpSocket> {
        std::mem::take(&mut self.quic)
    }

    fn answer(&mut self, answer: &Answer) {
        if let Some(socket) = &mut self.socket {
            let mut line = serde_json::to_vec(answer).unwrap_or_default();
            line.push(b'\n');
            if let Err(err) = socket.write_all(&line) {
                tracing::warn!(%err, "cannot answer the old supervisor");
            }
        }
    }

    /// The new group serves: the old one may drain.
    pub(crate) fn ready(&mut self) {
        self.answer(&Answer::Ready);
    }

    /// The new group did not start: the old one serves on.
    pub(crate) fn failed(&mut self, why: &str) {
        self.answer(&Answer::Failed(why.to_owned()));
    }

    /// Waits until the old supervisor has exited (its end reads EOF).
    pub(crate) async fn wait_old_gone(&mut self, patience: Duration) -> Result<(), String> {
        let Some(socket) = self.socket.take() else {
            return Ok(());
        };
        let gone = tokio::task::spawn_blocking(move || {
            let mut reader = BufReader::new(socket);
            let mut rest = String::new();
            // Nothing more is sent: this returns at end-of-file.
            reader.read_line(&mut rest).map(|_| ())
        });
        match tokio::time::timeout(patience, gone).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(err))) => Err(format!("lost the old supervisor: {err}")),
            Ok(Err(err)) => Err(format!("lost the old supervisor: {err}")),
            Err(_) => Err(format!(
                "the old group has not stopped within {} ms",
                patience.as_millis()
            )),
        }
    }
}
