//! Accepting connections without spinning: the one accept loop of the
//! listener's TCP ports and of the broker's and router's Unix sockets.
//!
//! An accept that fails for want of a resource (`EMFILE`, `ENFILE`,
//! `ENOBUFS`, `ENOMEM`) fails again at once if retried at once, so the loop
//! backs off, doubling from 10 ms up to 250 ms, until an accept succeeds;
//! the waiting connections stay in the kernel's backlog meanwhile. It says
//! so once per burst: a warning at the first failure, a note when accepting
//! works again. A connection its peer aborted before we took it is that
//! connection's failure, not ours: it is skipped at once.
//!
//! On a group socket, [`Acceptor::accept_peer`] also checks the peer's
//! credentials ([`PeerPolicy`]) and closes a stranger's connection.
//!
//! The usual cause of `EMFILE` is the default soft descriptor limit (1024 on
//! most systems), far below what the hard limit allows: every process of
//! the group raises its soft limit to the hard one at start
//! ([`raise_nofile_limit`]), and the listener keeps its own connection
//! limit under what is left ([`nofile_limit`]).

use std::io;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

use crate::transport::PeerPolicy;

/// Raises this process's soft limit on open descriptors (`RLIMIT_NOFILE`)
/// to its hard limit, which needs no privilege; returns the soft limit now
/// in force. Children inherit it.
pub fn raise_nofile_limit() -> io::Result<u64> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft >= hard {
        return Ok(soft);
    }
    match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => Ok(hard),
        // An unlimited hard limit is still capped by `fs.nr_open`.
        Err(_) => {
            let cap = std::fs::read_to_string("/proc/sys/fs/nr_open")
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .unwrap_or(soft)
                .min(hard);
            setrlimit(Resource::RLIMIT_NOFILE, cap, hard)?;
            Ok(cap)
        }
    }
}

/// This process's soft limit on open descriptors.
pub fn nofile_limit() -> io::Result<u64> {
    let (soft, _) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)?;
    Ok(soft)
}

/// A listening socket: TCP or Unix.
pub trait Listen {
    /// A connection taken from it.
    type Stream;

    /// Takes the next connection, as `TcpListener::poll_accept` does.
    fn poll_accept_stream(&self, cx: &mut Context<'_>) -> Poll<io::Result<Self::Stream>>;
}

impl Listen for TcpListener {
    type Stream = TcpStream;

    fn poll_accept_stream(&self, cx: &mut Context<'_>) -> Poll<io::Result<TcpStream>> {
        self.poll_accept(cx).map_ok(|(stream, _)| stream)
    }
}

impl Listen for UnixListener {
    type Stream = UnixStream;

    fn poll_accept_stream(&self, cx: &mut Context<'_>) -> Poll<io::Result<UnixStream>> {
        self.poll_accept(cx).map_ok(|(stream, _)| stream)
    }
}

/// The pause before the first retry of a failing accept.
const FIRST_PAUSE: Duration = Duration::from_millis(10);
/// The longest pause between two failing accepts.
const MAX_PAUSE: Duration = Duration::from_millis(250);

/// The pause after the `failures`-th failed accept in a row (from 1).
fn pause_after(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    FIRST_PAUSE.saturating_mul(1 << doublings).min(MAX_PAUSE)
}

/// Whether an accept failed for that one connection (its peer gave up
/// before we took it) rather than for want of a resource.
fn is_connection_error(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionRefused
    )
}

/// Takes connections from a listening socket, backing off while accepting
/// fails (see the module docs).
pub struct Acceptor<L> {
    listener: L,
    /// Failed accepts in a row: the current burst (0 when there is none).
    failures: u32,
    /// When the current burst began.
    burst_began: Option<Instant>,
}

impl<L: Listen> Acceptor<L> {
    /// Takes connections from `listener`.
    pub fn new(listener: L) -> Self {
        Acceptor {
            listener,
            failures: 0,
            burst_began: None,
        }
    }

    /// The listening socket.
    pub fn get_ref(&self) -> &L {
        &self.listener
    }

    /// The next connection. Cancel-safe: when the future is dropped (a
    /// shutdown won a `select!`), no accepted connection is lost.
    pub async fn accept(&mut self) -> L::Stream {
        loop {
            match std::future::poll_fn(|cx| self.listener.poll_accept_stream(cx)).await {
                Ok(stream) => {
                    self.recovered();
                    return stream;
                }
                Err(err) if is_connection_error(&err) => {
                    tracing::debug!(%err, "a connection was gone before it was accepted");
                }
                Err(err) => {
                    let pause = self.failed(&err);
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }

    /// Counts a failed accept; the pause before the next try.
    fn failed(&mut self, err: &io::Error) -> Duration {
        self.failures += 1;
        if self.failures == 1 {
            self.burst_began = Some(Instant::now());
            tracing::warn!(%err, "accept failed; backing off until it works again");
        } else {
            tracing::debug!(%err, failures = self.failures, "accept failed again");
        }
        pause_after(self.failures)
    }

    /// Ends the burst of failures, if there was one.
    fn recovered(&mut self) {
        if self.failures > 0 {
            let lasted = self.burst_began.map(|began| began.elapsed()).unwrap_or_default();
            tracing::info!(failures = self.failures, ?lasted, "accepting connections again");
            self.failures = 0;
            self.burst_began = None;
        }
    }
}

impl Acceptor<UnixListener> {
    /// The next connection from a peer that `policy` admits; a stranger's
    /// connection is logged and closed. Cancel-safe, like [`accept`].
    ///
    /// [`accept`]: Acceptor::accept
    pub async fn accept_peer(&mut self, policy: &PeerPolicy) -> UnixStream {
        loop {
            let stream = self.accept().await;
            match policy.check(&stream) {
                Ok(_) => return stream,
                Err(err) => tracing::warn!(%err, "refusing connection"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    use tokio::io::AsyncReadExt;

    use super::*;

    /// A listener whose accepts fail with `errors`, in order, then succeed.
    struct Flaky {
        errors: Mutex<VecDeque<io::Error>>,
        attempts: Mutex<u32>,
    }

    impl Flaky {
        fn new(errors: impl IntoIterator<Item = io::Error>) -> Flaky {
            Flaky {
                errors: Mutex::new(errors.into_iter().collect()),
                attempts: Mutex::new(0),
            }
        }

        fn attempts(&self) -> u32 {
            *self.attempts.lock().unwrap()
        }
    }

    impl Listen for Flaky {
        type Stream = ();

        fn poll_accept_stream(&self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            *self.attempts.lock().unwrap() += 1;
            match self.errors.lock().unwrap().pop_front() {
                Some(err) => Poll::Ready(Err(err)),
                None => Poll::Ready(Ok(())),
            }
        }
    }

    fn emfile() -> io::Error {
        io::Error::from_raw_os_error(libc::EMFILE)
    }

    /// Log lines, as the fmt subscriber writes them.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Lines {
        fn count(&self, needle: &str) -> usize {
            String::from_utf8_lossy(&self.0.lock().unwrap())
                .lines()
                .filter(|l| l.contains(needle))
                .count()
        }
    }

    #[test]
    fn pauses_double_up_to_a_bound() {
        let pauses: Vec<u64> = (1..=7).map(|n| pause_after(n).as_millis() as u64).collect();
        assert_eq!(pauses, [10, 20, 40, 80, 160, 250, 250]);
        assert_eq!(pause_after(u32::MAX), MAX_PAUSE);
    }

    #[tokio::test]
    async fn failing_accepts_back_off_and_log_once_per_burst() {
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || writer.clone())
            .finish();
        let _logging = tracing::subscriber::set_default(subscriber);

        let mut acceptor = Acceptor::new(Flaky::new([emfile(), emfile(), emfile()]));
        let began = Instant::now();
        acceptor.accept().await;
        // One try per pause, and every pause waited: no spinning.
        assert_eq!(acceptor.get_ref().attempts(), 4);
        assert!(began.elapsed() >= pause_after(1) + pause_after(2) + pause_after(3));
        assert_eq!(lines.count("accept failed; backing off"), 1);
        assert_eq!(lines.count("accepting connections again"), 1);

        // A success ends the burst: the next failure is a new one, logged
        // again and paused from the start.
        acceptor.listener.errors.lock().unwrap().push_back(emfile());
        acceptor.accept().await;
        assert_eq!(acceptor.failures, 0);
        assert_eq!(lines.count("accept failed; backing off"), 2);
    }

    #[test]
    fn the_soft_descriptor_limit_rises_to_the_hard_one() {
        use nix::sys::resource::{Resource, getrlimit, setrlimit};
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        // Lowered the way a login shell leaves it, then raised again.
        setrlimit(Resource::RLIMIT_NOFILE, 256.min(hard), hard).unwrap();
        assert_eq!(nofile_limit().unwrap(), 256.min(hard));
        assert_eq!(raise_nofile_limit().unwrap(), hard);
        assert_eq!(nofile_limit().unwrap(), hard);
    }

    #[tokio::test]
    async fn a_connection_aborted_before_accept_is_skipped_without_a_pause() {
        let aborted = || io::Error::from(io::ErrorKind::ConnectionAborted);
        let mut acceptor = Acceptor::new(Flaky::new([aborted(), aborted()]));
        acceptor.accept().await;
        assert_eq!(acceptor.get_ref().attempts(), 3);
        assert_eq!(acceptor.failures, 0, "not a failure of ours");
    }

    #[tokio::test]
    async fn strangers_are_closed_and_group_peers_admitted() {
        let dir = std::env::temp_dir().join(format!("switchyard-accept-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("peers.sock");
        let _ = std::fs::remove_file(&path);
        let mut acceptor = Acceptor::new(UnixListener::bind(&path).unwrap());
        let me = PeerPolicy {
            uid: nix::unistd::geteuid().as_raw(),
            supervisor: None,
        };
        let stranger = PeerPolicy {
            uid: me.uid + 1,
            ..me
        };

        // Refused: the server side is closed, so the client reads EOF.
        let mut refused = UnixStream::connect(&path).await.unwrap();
        tokio::select! {
            _ = acceptor.accept_peer(&stranger) => panic!("a stranger was admitted"),
            eof = refused.read_u8() => assert_eq!(eof.unwrap_err().kind(), io::ErrorKind::UnexpectedEof),
        }

        let _admitted = UnixStream::connect(&path).await.unwrap();
        let stream = acceptor.accept_peer(&me).await;
        assert_eq!(stream.peer_cred().unwrap().uid(), me.uid);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
