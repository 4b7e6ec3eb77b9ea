//! Moving frames over a stream socket: a batched writer and a batch reader.
//!
//! Waking a peer costs far more than the bytes (decision 0040 has the
//! figures), so both directions batch: the writer drains
//! everything queued into one vectored write, and the reader decodes every
//! whole frame a single read brought in.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::ops::Range;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncWrite, AsyncWriteExt, Interest};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::{Envelope, Error, Payload, Result, fdpass, frame};

/// Most frames one writer batch takes from its queue.
const MAX_BATCH: usize = 512;
/// Payloads up to this size are copied next to their header rather than
/// given their own `IoSlice`: a copy is cheaper than a scatter entry.
const COPY_BELOW: usize = 4096;
/// Stay under the kernel's IOV_MAX (1024).
const MAX_IOVECS: usize = 1000;

/// Times a ring reader gives up the CPU before it sleeps (`group.ring_yields`).
static YIELDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(DEFAULT_YIELDS);

/// The default of [`set_yields`]: measured in decision 0040.
pub const DEFAULT_YIELDS: usize = 3;

/// Sets how many times a ring reader that found its ring empty yields the
/// CPU (re-checking in between) before it sleeps and must be woken.
pub fn set_yields(yields: usize) {
    YIELDS.store(yields, Ordering::Relaxed);
}

/// See [`set_yields`].
pub fn yields() -> usize {
    YIELDS.load(Ordering::Relaxed)
}

/// The sending side of a connection: a bounded queue in front of its
/// writer (a task writing to the socket, or a shared-memory ring: the
/// `link` module's [`RingQueue`]). Cheap to clone; the connection's writer ends when
/// every clone is dropped.
#[derive(Clone)]
pub struct FrameSink {
    inner: SinkInner,
}

#[derive(Clone)]
enum SinkInner {
    Socket(mpsc::Sender<Envelope>),
    Ring(Arc<dyn RingQueue>),
}

/// The sending side of a shared-memory ring link, as a [`FrameSink`]
/// drives it. The ring transport (`link`) implements it; this module only
/// knows the shape, so the two do not import each other.
pub(crate) trait RingQueue: Send + Sync {
    /// Queues `env` without waiting; see [`FrameSink::send`].
    fn send(&self, env: Envelope) -> Result<(), Refused>;
    /// Resolves when queued frames have left, so a refused send may be
    /// retried; enable it before the try it follows.
    fn room(&self) -> tokio::sync::futures::Notified<'_>;
    fn is_closed(&self) -> bool;
    fn queued(&self) -> usize;
    fn wait_closed(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>>;
}

impl std::fmt::Debug for FrameSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameSink")
            .field("queued", &self.queued())
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl FrameSink {
    pub(crate) fn ring(sender: impl RingQueue + 'static) -> FrameSink {
        FrameSink {
            inner: SinkInner::Ring(Arc::new(sender)),
        }
    }

    /// Queues `env` without waiting. When refused, the envelope comes back
    /// so the caller can answer it (503 when the queue is full: the peer is
    /// not keeping up; the connection is gone otherwise).
    pub fn send(&self, env: Envelope) -> Result<(), Refused> {
        match &self.inner {
            SinkInner::Socket(tx) => tx.try_send(env).map_err(|e| match e {
                mpsc::error::TrySendError::Full(env) => Refused::full(env),
                mpsc::error::TrySendError::Closed(env) => Refused::closed(env),
            }),
            SinkInner::Ring(ring) => ring.send(env),
        }
    }

    /// Queues `env`, waiting for room (control traffic that must not be lost).
    pub async fn send_wait(&self, env: Envelope) -> Result<()> {
        match &self.inner {
            SinkInner::Socket(tx) => tx.send(env).await.map_err(|_| Error::Closed),
            SinkInner::Ring(ring) => {
                let mut env = env;
                loop {
                    // Registered before the try, so a frame leaving the
                    // queue in between still wakes us.
                    let room = ring.room();
                    tokio::pin!(room);
                    room.as_mut().enable();
                    match ring.send(env) {
                        Ok(()) => return Ok(()),
                        Err(refused) if refused.full => {
                            env = *refused.envelope;
                            room.await;
                        }
                        Err(_) => return Err(Error::Closed),
                    }
                }
            }
        }
    }

    /// Whether the writer has stopped.
    pub fn is_closed(&self) -> bool {
        match &self.inner {
            SinkInner::Socket(tx) => tx.is_closed(),
            SinkInner::Ring(ring) => ring.is_closed(),
        }
    }

    /// Frames queued and not yet written.
    pub fn queued(&self) -> usize {
        match &self.inner {
            SinkInner::Socket(tx) => tx.max_capacity() - tx.capacity(),
            SinkInner::Ring(ring) => ring.queued(),
        }
    }

    /// Resolves when the writer has stopped.
    pub async fn closed(&self) {
        match &self.inner {
            SinkInner::Socket(tx) => tx.closed().await,
            SinkInner::Ring(ring) => ring.wait_closed().await,
        }
    }
}

/// A frame a [`FrameSink`] would not take.
#[derive(Debug)]
pub struct Refused {
    /// The envelope, returned to the caller.
    pub envelope: Box<Envelope>,
    /// `true`: the queue was full; `false`: the connection is closed.
    pub full: bool,
}

impl Refused {
    pub(crate) fn full(env: Envelope) -> Refused {
        Refused {
            envelope: Box::new(env),
            full: true,
        }
    }

    pub(crate) fn closed(env: Envelope) -> Refused {
        Refused {
            envelope: Box::new(env),
            full: false,
        }
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.full {
            "outbound queue full"
        } else {
            "connection closed"
        })
    }
}

/// Starts the writer task of a connection. `capacity` bounds the queue,
/// `max_frame` each frame (an over-size frame is dropped with an error log:
/// producers check sizes before queueing).
pub fn spawn_writer<W>(io: W, capacity: usize, max_frame: usize) -> (FrameSink, JoinHandle<Result<()>>)
where
    W: AsyncWrite + FdSocket + Unpin + Send + 'static,
{
    let (tx, rx) = mpsc::channel(capacity);
    let task = tokio::spawn(write_loop(io, rx, max_frame));
    (
        FrameSink {
            inner: SinkInner::Socket(tx),
        },
        task,
    )
}

/// A stream socket (or half of one) that can carry descriptors.
pub trait FdSocket {
    fn socket(&self) -> &UnixStream;
}

impl FdSocket for UnixStream {
    fn socket(&self) -> &UnixStream {
        self
    }
}

impl FdSocket for OwnedReadHalf {
    fn socket(&self) -> &UnixStream {
        self.as_ref()
    }
}

impl FdSocket for OwnedWriteHalf {
    fn socket(&self) -> &UnixStream {
        self.as_ref()
    }
}

enum Segment {
    Scratch(Range<usize>),
    Payload(Bytes),
}

/// One write's worth of frames: headers and small bodies packed in
/// `scratch`, large bodies as their own slices, shared-memory bodies'
/// descriptors alongside.
struct Batch {
    scratch: BytesMut,
    segments: Vec<Segment>,
    run_start: usize,
    /// Bodies kept alive (and their descriptors open) until sent.
    shm: Vec<Payload>,
    /// Their descriptors, in frame order, as `sendmsg` takes them.
    fds: Vec<RawFd>,
}

impl Batch {
    fn push(&mut self, env: &Envelope, max_frame: usize) {
        let payload = match frame::encode_head(env, &mut self.scratch, max_frame) {
            Ok(payload) => payload,
            Err(err) => {
                return tracing::error!(%err, event_type = ?env.event_type, "dropping unsendable frame");
            }
        };
        match &env.payload {
            Payload::Shm(body) => {
                self.fds.push(body.fd().as_raw_fd());
                self.shm.push(env.payload.clone());
            }
            Payload::Stream(handle) => {
                self.fds.extend(handle.fds().iter().map(|fd| fd.as_raw_fd()));
                self.shm.push(env.payload.clone());
            }
            Payload::Inline(_) if payload.len() < COPY_BELOW => self.scratch.extend_from_slice(payload),
            Payload::Inline(bytes) => {
                self.segments
                    .push(Segment::Scratch(self.run_start..self.scratch.len()));
                self.run_start = self.scratch.len();
                self.segments.push(Segment::Payload(bytes.clone()));
            }
        }
    }

    async fn flush<W: AsyncWrite + FdSocket + Unpin>(&mut self, io: &mut W) -> io::Result<()> {
        if self.run_start < self.scratch.len() {
            self.segments
                .push(Segment::Scratch(self.run_start..self.scratch.len()));
        }
        if !self.fds.is_empty() {
            // The descriptors go with the batch's first byte: its first
            // frame says so, for the reader to pair them (frame::FD_MARK).
            frame::mark_descriptors(&mut self.scratch);
        }
        let mut first = true;
        for chunk in self.segments.chunks(MAX_IOVECS) {
            let mut slices: Vec<IoSlice<'_>> = chunk
                .iter()
                .map(|s| match s {
                    Segment::Scratch(r) => IoSlice::new(&self.scratch[r.clone()]),
                    Segment::Payload(b) => IoSlice::new(b),
                })
                .filter(|s| !s.is_empty())
                .collect();
            let mut slices = &mut slices[..];
            if first && !self.fds.is_empty() {
                // The descriptors ride on the first bytes of the batch, so
                // they reach the reader no later than their frames.
                let fds = &self.fds;
                let socket = io.socket();
                let n = loop {
                    socket.writable().await?;
                    match socket.try_io(Interest::WRITABLE, || {
                        fdpass::send(socket.as_raw_fd(), slices, fds)
                    }) {
                        Ok(n) => break n,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                        Err(e) => return Err(e),
                    }
                };
                IoSlice::advance_slices(&mut slices, n);
            }
            first = false;
            write_all_vectored(io, slices).await?;
        }
        self.scratch.clear();
        self.segments.clear();
        self.run_start = 0;
        self.shm.clear();
        self.fds.clear();
        Ok(())
    }
}

async fn write_loop<W: AsyncWrite + FdSocket + Unpin>(
    mut io: W,
    mut rx: mpsc::Receiver<Envelope>,
    max_frame: usize,
) -> Result<()> {
    let mut queued = Vec::with_capacity(MAX_BATCH);
    let mut batch = Batch {
        scratch: BytesMut::with_capacity(64 * 1024),
        segments: Vec::new(),
        run_start: 0,
        shm: Vec::new(),
        fds: Vec::new(),
    };
    loop {
        if rx.recv_many(&mut queued, MAX_BATCH).await == 0 {
            // Every sender is gone: flush and end cleanly.
            let _ = io.shutdown().await;
            return Ok(());
        }
        for env in queued.drain(..) {
            let fds = env.payload.fd_count();
            if fds > 0 && batch.fds.len() + fds > fdpass::MAX_FDS {
                batch.flush(&mut io).await?;
            }
            batch.push(&env, max_frame);
        }
        batch.flush(&mut io).await?;
    }
}

async fn write_all_vectored<W: AsyncWrite + Unpin>(
    io: &mut W,
    mut slices: &mut [IoSlice<'_>],
) -> io::Result<()> {
    while !slices.is_empty() {
        let n = io.write_vectored(slices).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut slices, n);
    }
    Ok(())
}

/// The receiving side of a connection.
///
/// Descriptors are held to account, so a peer cannot make a process hold
/// descriptors no frame owns: each read's descriptors came with one
/// `sendmsg` whose first byte is in that read, and the frame starting there
/// must carry [`frame::FD_MARK`]; the frames of its batch claim them in
/// order, and the batch must have claimed all of them when the next marked
/// frame comes. A peer that attaches descriptors anywhere else, leaves some
/// unclaimed, or claims more than it sent gets an error, which closes its
/// connection; its descriptors close with the reader.
///
/// A reader that has merely fallen behind is not such a peer, and its
/// backlog stays in the kernel, not here: on a socket link a read brings at
/// most one `sendmsg`'s descriptors (Linux ends a read after a message that
/// carries some) and the whole frames before them are parsed before the
/// next read; on a ring link a frame's descriptor record is taken off the
/// socket only when the reader reaches that frame. So more than
/// [`fdpass::MAX_FDS`] held between reads is a protocol error, never load.
pub struct FrameReader<R> {
    io: R,
    /// A ring link's incoming ring (the `link` module): frame bytes come from
    /// it, and only descriptor records from `io`.
    ring: Option<crate::pipe::AsyncPipe>,
    buf: BytesMut,
    /// Stream offset of `buf[0]`: frames are placed against reads by it.
    consumed: u64,
    /// The descriptors of the batch being parsed, not yet claimed.
    batch: VecDeque<OwnedFd>,
    /// Descriptors received whose marked frame has not been parsed yet.
    arrived: VecDeque<Arrival>,
    max_frame: usize,
}

/// The descriptors one read brought, and the stream offsets of that read's
/// bytes: the marked frame they belong to starts in `start..end`.
struct Arrival {
    fds: Vec<OwnedFd>,
    start: u64,
    end: u64,
}

impl<R: FdSocket> FrameReader<R> {
    /// Wraps a read half; frames over `max_frame` are refused.
    pub fn new(io: R, max_frame: usize) -> Self {
        Self::build(io, None, max_frame)
    }

    /// A reader of a ring link: frames from `ring`, descriptors from `io`.
    pub(crate) fn with_ring(io: R, ring: crate::pipe::AsyncPipe, max_frame: usize) -> Self {
        Self::build(io, Some(ring), max_frame)
    }

    fn build(io: R, ring: Option<crate::pipe::AsyncPipe>, max_frame: usize) -> Self {
        FrameReader {
            io,
            ring,
            buf: BytesMut::with_capacity(64 * 1024),
            consumed: 0,
            batch: VecDeque::new(),
            arrived: VecDeque::new(),
            max_frame,
        }
    }

    /// Reads until at least one whole frame is buffered, then appends every
    /// whole frame to `out`. Returns `Ok(false)` at a clean end of stream.
    ///
    /// Every frame spends one unit of the task's tokio budget (as a socket
    /// read does): a reader whose peer keeps it fed hands the thread to the
    /// process's other tasks after a budget's worth of frames rather than
    /// starving them. The router read requests that way while the frames
    /// that close them waited on another link, and refused requests for
    /// a capacity they did not use.
    pub async fn read_batch(&mut self, out: &mut Vec<Envelope>) -> Result<bool> {
        use std::task::Poll;
        let before = out.len();
        loop {
            std::future::poll_fn(|cx| {
                loop {
                    let Poll::Ready(coop) = tokio::task::coop::poll_proceed(cx) else {
                        // Spent: return what this call has, or yield (the
                        // waker is registered) and go on when polled again.
                        return if out.len() > before {
                            Poll::Ready(Ok(()))
                        } else {
                            Poll::Pending
                        };
                    };
                    match self.next_buffered() {
                        Ok(Some(env)) => {
                            coop.made_progress();
                            out.push(env);
                        }
                        Ok(None) => return Poll::Ready(Ok(())),
                        Err(err) => return Poll::Ready(Err(err)),
                    }
                }
            })
            .await?;
            if out.len() > before {
                return Ok(true);
            }
            if !self.fill().await? {
                return Ok(false);
            }
        }
    }

    /// Reads the next frame; `Ok(None)` at a clean end of stream.
    pub async fn next(&mut self) -> Result<Option<Envelope>> {
        loop {
            if let Some(env) = self.next_buffered()? {
                return Ok(Some(env));
            }
            if !self.fill().await? {
                return Ok(None);
            }
        }
    }

    /// Descriptors received and not claimed by a frame yet.
    pub fn unclaimed_descriptors(&self) -> usize {
        self.batch.len() + self.arrived.iter().map(|a| a.fds.len()).sum::<usize>()
    }

    /// One read into the buffer; `Ok(false)` at a clean end of stream.
    async fn fill(&mut self) -> Result<bool> {
        // Every whole frame buffered has been parsed by now, so a
        // well-behaved writer has at most one batch's descriptors pending.
        let held = self.unclaimed_descriptors();
        if held > fdpass::MAX_FDS {
            return Err(Error::Descriptors(format!(
                "{held} descriptors received and not claimed by any frame"
            )));
        }
        if self.buf.capacity() - self.buf.len() < 16 * 1024 {
            self.buf.reserve(64 * 1024);
        }
        if let Some(ring) = &mut self.ring {
            // Before sleeping, give the CPU up a few times: on a busy
            // machine the process that feeds us is likely runnable, and
            // if it writes meanwhile it need not wake us, and we need not
            // sleep (decision 0040; measured there).
            // A thread that spins before it parks yields there instead,
            // when nothing else can run (crate::park).
            let spinning = crate::park::spinning();
            if !spinning {
                for _ in 0..yields() {
                    if ring.end_mut().has_bytes() {
                        break;
                    }
                    std::thread::yield_now();
                }
            }
            let buf = &mut self.buf;
            let max = buf.capacity() - buf.len();
            let n = match std::future::poll_fn(|cx| {
                let polled = ring.poll_read_into(cx, buf, max);
                if spinning && polled.is_pending() {
                    crate::park::note_waiting(ring.end_mut().probe(), cx.waker());
                }
                polled
            })
            .await
            {
                Ok(n) => n,
                // The writer's process is gone: end of stream, as a
                // socket shows it.
                Err(Error::PipeAborted(_)) => 0,
                Err(err) => return Err(err),
            };
            if n == 0 {
                return if self.buf.is_empty() {
                    Ok(false)
                } else {
                    Err(Error::Truncated(self.buf.len()))
                };
            }
            return Ok(true);
        }
        let start = self.consumed + self.buf.len() as u64;
        let mut fds = Vec::new();
        let FrameReader { io, buf, .. } = self;
        let socket = io.socket();
        let n = loop {
            socket.readable().await?;
            match socket.try_io(Interest::READABLE, || {
                fdpass::recv(socket.as_raw_fd(), buf, &mut fds)
            }) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e.into()),
            }
        };
        if !fds.is_empty() {
            self.arrived.push_back(Arrival {
                fds,
                start,
                end: start + n as u64,
            });
        }
        if n == 0 {
            return if self.buf.is_empty() {
                Ok(false)
            } else {
                Err(Error::Truncated(self.buf.len()))
            };
        }
        Ok(true)
    }

    /// The next whole buffered frame, its descriptors checked and claimed.
    fn next_buffered(&mut self) -> Result<Option<Envelope>> {
        let Some(len) = frame::check(&self.buf, self.max_frame)? else {
            return Ok(None);
        };
        let at = self.consumed;
        // Descriptors whose read ended before this frame begins were
        // attached where no marked frame started: nothing may claim them.
        if let Some(stale) = self.arrived.front()
            && stale.end <= at
        {
            return Err(Error::Descriptors(format!(
                "{} descriptors attached to frames that claim none",
                stale.fds.len()
            )));
        }
        if frame::is_marked(&self.buf) {
            if self.ring.is_some() && !self.arrived.iter().any(|a| a.start == at) {
                // Its descriptors came as a record on the socket, sent
                // before the frame's first byte entered the ring. Records
                // of frames further on are left in the socket: a reader
                // that has fallen behind holds one record, not a backlog.
                if let Some((offset, fds)) = fdpass::receive_record(self.io.socket().as_fd())? {
                    self.arrived.push_back(Arrival {
                        fds,
                        start: offset,
                        end: offset + 1,
                    });
                }
            }
            if !self.batch.is_empty() {
                return Err(Error::Descriptors(format!(
                    "{} descriptors of the previous batch were never claimed",
                    self.batch.len()
                )));
            }
            match self.arrived.pop_front() {
                Some(arrival) if arrival.start <= at && at < arrival.end => self.batch.extend(arrival.fds),
                _ => {
                    return Err(Error::Descriptors(
                        "a frame announces descriptors that did not come with it".into(),
                    ));
                }
            }
        }
        let frame = self.buf.split_to(len).freeze();
        self.consumed += len as u64;
        frame::parse(frame, &mut self.batch).map(Some)
    }
}

/// Who may talk on a group socket.
#[derive(Clone, Copy, Debug)]
pub struct PeerPolicy {
    /// The only uid allowed (ours).
    pub uid: u32,
    /// When set, the peer must be a child of this supervisor pid.
    pub supervisor: Option<u32>,
}

impl PeerPolicy {
    /// Same uid as this process; children of the supervisor named by the
    /// `SWITCHYARD_SUPERVISOR_PID` environment variable, when set.
    pub fn for_group() -> Self {
        PeerPolicy {
            uid: nix::unistd::geteuid().as_raw(),
            supervisor: std::env::var(crate::process::ENV_SUPERVISOR_PID)
                .ok()
                .and_then(|v| v.parse().ok()),
        }
    }

    /// Checks the kernel-reported credentials of a connected peer.
    pub fn check(&self, stream: &UnixStream) -> Result<u32> {
        let cred = stream.peer_cred()?;
        if cred.uid() != self.uid {
            return Err(Error::PeerRefused(format!(
                "uid {} is not {}",
                cred.uid(),
                self.uid
            )));
        }
        let pid = cred.pid().unwrap_or(0) as u32;
        if let Some(supervisor) = self.supervisor {
            let parent = parent_pid(pid);
            if parent != Some(supervisor) {
                return Err(Error::PeerRefused(format!(
                    "pid {pid} (parent {parent:?}) is not in this group"
                )));
            }
        }
        Ok(pid)
    }
}

/// The parent pid of `pid`, from /proc.
pub fn parent_pid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces: skip past it.
    let after = &stat[stat.rfind(')')? + 2..];
    after.split(' ').nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EventType, frame::DEFAULT_MAX_FRAME};

    #[tokio::test]
    async fn batched_round_trip_over_a_socket() {
        let (a, b) = UnixStream::pair().unwrap();
        let (sink, writer) = spawn_writer(a, 1024, DEFAULT_MAX_FRAME);
        let mut reader = FrameReader::new(b, DEFAULT_MAX_FRAME);
        let sizes = [0usize, 1, 100, 4095, 4096, 70_000, 300_000];
        for (i, &n) in sizes.iter().cycle().take(300).enumerate() {
            let body = Bytes::from(vec![(i % 251) as u8; n]);
            sink.send_wait(Envelope::request(EventType::of("t"), i as u64, body))
                .await
                .unwrap();
        }
        drop(sink);
        let mut got = Vec::new();
        while reader.read_batch(&mut got).await.unwrap() {}
        assert_eq!(got.len(), 300);
        for (i, env) in got.iter().enumerate() {
            assert_eq!(env.correlation, i as u64);
            let body = env.payload.inline().unwrap();
            assert_eq!(body.len(), sizes[i % sizes.len()]);
            assert!(body.iter().all(|&b| b == (i % 251) as u8));
        }
        writer.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn shared_memory_bodies_travel_as_descriptors() {
        let (a, b) = UnixStream::pair().unwrap();
        let (_, write) = a.into_split();
        let (sink, writer) = spawn_writer(write, 1024, DEFAULT_MAX_FRAME);
        let mut reader = FrameReader::new(b, DEFAULT_MAX_FRAME);
        // More bodies than one sendmsg carries, interleaved with inline frames.
        for i in 0..100u64 {
            let payload = if i % 3 == 0 {
                Payload::Inline(Bytes::from(vec![i as u8; 10]))
            } else {
                Payload::Shm(crate::ShmBody::create(&vec![i as u8; 70_000 + i as usize]).unwrap())
            };
            let mut env = Envelope::request(EventType::of("t"), i, Bytes::new());
            env.payload = payload;
            sink.send_wait(env).await.unwrap();
        }
        drop(sink);
        let mut got = Vec::new();
        while reader.read_batch(&mut got).await.unwrap() {}
        assert_eq!(got.len(), 100);
        for env in &got {
            let i = env.correlation;
            let bytes = env.payload.clone().into_bytes().unwrap();
            let want = if i % 3 == 0 { 10 } else { 70_000 + i as usize };
            assert_eq!(bytes.len(), want, "frame {i}");
            assert!(bytes.iter().all(|&b| b == i as u8));
            assert_eq!(matches!(env.payload, Payload::Shm(_)), i % 3 != 0);
        }
        assert_eq!(reader.unclaimed_descriptors(), 0, "every descriptor was claimed");
        writer.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn oversized_and_truncated_input_are_errors() {
        let (mut a, b) = UnixStream::pair().unwrap();
        let mut reader = FrameReader::new(b, 1024);
        a.write_all(&(1_000_000u32).to_le_bytes()).await.unwrap();
        assert!(matches!(reader.next().await, Err(Error::FrameTooLarge { .. })));

        let (mut a, b) = UnixStream::pair().unwrap();
        let mut reader = FrameReader::new(b, 1024);
        let bytes = frame::encode(
            &Envelope::request(EventType::of("t"), 1, Bytes::from_static(b"abc")),
            1024,
        )
        .unwrap();
        a.write_all(&bytes[..bytes.len() - 1]).await.unwrap();
        drop(a);
        assert!(matches!(reader.next().await, Err(Error::Truncated(_))));
    }

    #[tokio::test]
    async fn peer_policy_accepts_self_and_refuses_strangers() {
        let (a, _b) = UnixStream::pair().unwrap();
        let me = PeerPolicy {
            uid: nix::unistd::geteuid().as_raw(),
            supervisor: None,
        };
        assert_eq!(me.check(&a).unwrap(), std::process::id());
        let other = PeerPolicy {
            uid: me.uid + 1,
            supervisor: None,
        };
        assert!(matches!(other.check(&a), Err(Error::PeerRefused(_))));
        let not_child = PeerPolicy {
            supervisor: Some(1),
            ..me
        };
        assert!(not_child.check(&a).is_err() || parent_pid(std::process::id()) == Some(1));
    }
}
