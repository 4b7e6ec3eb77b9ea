//! The shared-memory ring transport between two processes of the group.
//!
//! A link is the Unix stream socket two processes already share, plus one
//! shared-memory ring per direction ([`crate::pipe`]: a sealed memfd, and a
//! socket pair used only for wake-ups). Frames travel through the rings, so
//! under load a hop costs a copy into shared memory and no system call: a
//! writer wakes its reader only when the reader said it sleeps (its ring was
//! empty), and a reader drains everything there is per wake-up. The main
//! socket carries what shared memory cannot: descriptors (shared-memory
//! bodies, streams), announced by [`Record`]s, and the ring hand-over when
//! the link opens. The death of either process closes its ends, and the
//! other side sees end-of-stream (NGINX Unit's "ports" work the same way;
//! decision 0040).
//!
//! The peer's memory is not trusted further than its frames: ring positions
//! are checked, bytes are copied out with atomic loads before anything is
//! decided on them (`pipe`), and every frame is then parsed as it would be
//! from a socket.
//!
//! [`open`] sets a link up on a connected socket and returns the same
//! [`FrameReader`] and [`FrameSink`] the socket transport gives, so the
//! roles do not care which one runs ([`Transport`]).

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{Notify, watch};

use crate::fdpass::{RECORD_LEN, Record};
use crate::pipe::{AsyncPipe, Progress, StreamHandle};
pub use crate::transport::{DEFAULT_YIELDS, set_yields, yields};
use crate::transport::{FrameReader, FrameSink, Refused, RingQueue, spawn_writer};
use crate::{Envelope, Error, Payload, Result, fdpass, frame};

/// How the frames of a link travel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum Transport {
    /// Through a shared-memory ring per direction; the socket carries
    /// descriptors and death (this module).
    #[default]
    Ring = 0,
    /// Through the socket: batched vectored writes, one read per wake-up.
    Socket = 1,
}

/// Bytes of each direction's ring: a reader takes up to this much per
/// wake-up; larger frames stream through it.
pub const RING_CAPACITY: usize = 256 * 1024;

/// How long a link waits for its peer's half of the hand-over.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// This process's transport (`group.transport`): every process of a group
/// uses the same, set once at start by the role's entry.
static TRANSPORT: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Sets the transport [`open`] uses in this process.
pub fn set_transport(transport: Transport) {
    TRANSPORT.store(transport as u8, Ordering::Relaxed);
}

/// The transport [`open`] uses in this process (the default until set).
pub fn transport() -> Transport {
    match TRANSPORT.load(Ordering::Relaxed) {
        0 => Transport::Ring,
        _ => Transport::Socket,
    }
}

/// Sets up a link on a connected socket with this process's [`transport`]
/// (see [`open_with`]).
pub async fn open(
    stream: UnixStream,
    capacity: usize,
    max_frame: usize,
) -> Result<(FrameReader<OwnedReadHalf>, FrameSink)> {
    open_with(stream, transport(), capacity, max_frame).await
}

/// Sets up a link on a connected socket: with [`Transport::Ring`] both
/// sides hand each other their outgoing ring first (both must use the same
/// transport). `capacity` bounds the frames queued towards the peer,
/// `max_frame` each frame, as for [`spawn_writer`].
pub async fn open_with(
    stream: UnixStream,
    transport: Transport,
    capacity: usize,
    max_frame: usize,
) -> Result<(FrameReader<OwnedReadHalf>, FrameSink)> {
    let (reader, sink, _writer) = open_flushed(stream, transport, capacity, max_frame).await?;
    Ok((reader, sink))
}

/// The task that writes a link's frames: it ends once every frame sent
/// before the last sender was dropped is written (`Ok`), or the link broke.
pub type Writer = tokio::task::JoinHandle<Result<()>>;

/// [`open_with`], also returning the writer task, for a process that must
/// know its last frames are out before it exits (a draining manager).
pub async fn open_flushed(
    stream: UnixStream,
    transport: Transport,
    capacity: usize,
    max_frame: usize,
) -> Result<(FrameReader<OwnedReadHalf>, FrameSink, Writer)> {
    let (read, write) = stream.into_split();
    match transport {
        Transport::Socket => {
            let (sink, writer) = spawn_writer(write, capacity, max_frame);
            Ok((FrameReader::new(read, max_frame), sink, writer))
        }
        Transport::Ring => {
            let (outgoing, incoming) = tokio::time::timeout(HANDSHAKE_TIMEOUT, hand_over(&read, &write))
                .await
                .map_err(|_| {
                    Error::Io(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the peer never handed over its ring",
                    ))
                })??;
            let reader = FrameReader::with_ring(read, incoming, max_frame);
            let (sink, writer) = RingWriter::start(write, outgoing, capacity, max_frame);
            Ok((reader, sink, writer))
        }
    }
}

/// Sends our outgoing ring, receives the peer's: (ours to write, theirs to
/// read).
async fn hand_over(read: &OwnedReadHalf, write: &OwnedWriteHalf) -> Result<(AsyncPipe, AsyncPipe)> {
    let (producer, handle) = crate::pipe::link_pipe(RING_CAPACITY)?;
    let (ring, wake, _) = handle.into_parts()?;
    let hello = Record::Hello {
        capacity: RING_CAPACITY as u64,
    };
    send_record(write.as_ref(), hello, &[ring.as_raw_fd(), wake.as_raw_fd()]).await?;
    // The peer holds them now; our copies must close, or its death would
    // not show as end-of-stream here.
    drop((ring, wake));

    let socket = read.as_ref();
    let mut buf = BytesMut::with_capacity(RECORD_LEN);
    let mut fds = Vec::new();
    while buf.len() < RECORD_LEN {
        socket.readable().await?;
        let got = socket.try_io(tokio::io::Interest::READABLE, || {
            fdpass::recv(socket.as_raw_fd(), &mut buf, &mut fds)
        });
        match got {
            Ok(0) => return Err(Error::Closed),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e.into()),
        }
        if buf.len() > RECORD_LEN {
            return Err(Error::Malformed("the peer sent frames before its ring"));
        }
    }
    let Record::Hello { capacity } = Record::decode(&buf)? else {
        return Err(Error::Malformed("the peer's first record is not its ring"));
    };
    let mut fds = fds.into_iter();
    let (Some(ring), Some(wake), None) = (fds.next(), fds.next(), fds.next()) else {
        return Err(Error::Malformed(
            "the peer's ring came without its two descriptors",
        ));
    };
    let incoming = StreamHandle::from_parts(ring, wake, None).open_link()?;
    if incoming.capacity() as u64 != capacity {
        return Err(Error::Malformed("the peer's ring is not the size it says"));
    }
    Ok((producer.into_async()?, incoming.into_async()?))
}

/// Sends one record with `fds` attached, waiting for room in the socket.
async fn send_record(socket: &UnixStream, record: Record, fds: &[RawFd]) -> Result<()> {
    let bytes = record.encode();
    loop {
        socket.writable().await?;
        match socket.try_io(tokio::io::Interest::WRITABLE, || {
            fdpass::send(socket.as_raw_fd(), &[IoSlice::new(&bytes)], fds)
        }) {
            Ok(RECORD_LEN) => return Ok(()),
            // A 16-byte message with descriptors goes whole or not at all.
            Ok(_) => return Err(Error::Malformed("a link record was cut")),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// A frame on its way into the ring.
struct Pending {
    /// Prefix and header, then the inline payload.
    head: Bytes,
    body: Bytes,
    /// Bytes of `head` + `body` already in the ring.
    written: usize,
    /// The frame's descriptors (kept open until their record is sent).
    fds: Option<Envelope>,
}

impl Pending {
    fn len(&self) -> usize {
        self.head.len() + self.body.len()
    }

    fn rest(&self) -> [&[u8]; 2] {
        let in_head = self.written.min(self.head.len());
        let in_body = self.written - in_head;
        [&self.head[in_head..], &self.body[in_body..]]
    }
}

/// The descriptors a payload travels with, in the order its frame claims them.
fn raw_fds(payload: &Payload) -> Vec<RawFd> {
    match payload {
        Payload::Inline(_) => Vec::new(),
        Payload::Shm(body) => vec![body.fd().as_raw_fd()],
        Payload::Stream(handle) => handle.fds().iter().map(|fd| fd.as_raw_fd()).collect(),
    }
}

/// What stops the writer from moving more frames into the ring.
enum Blocked {
    /// Nothing left to write.
    Idle,
    /// The ring is full: wait for the reader's wake-up.
    Ring,
    /// The socket will not take a descriptor record now.
    Socket,
}

struct TxState {
    pipe: AsyncPipe,
    pending: VecDeque<Pending>,
    /// Stream bytes moved into the ring so far: the offset of the next
    /// frame's first byte.
    offset: u64,
    scratch: BytesMut,
}

/// The writing half of a ring link, shared by every clone of its
/// [`FrameSink`]. Frames go straight into the ring from `send` when they
/// fit; the rest wait in `pending` for the writer task, in order.
pub(crate) struct RingWriter {
    state: Mutex<TxState>,
    socket: OwnedWriteHalf,
    /// Frames wait in `pending` (or the last sender is gone).
    kick: Notify,
    /// `pending` shrank: `send_wait` may retry.
    room: Notify,
    /// True once the link is unusable (the peer went away).
    closed: watch::Sender<bool>,
    senders_gone: AtomicBool,
    capacity: usize,
    max_frame: usize,
}

/// What [`FrameSink`] holds: when the last clone drops, the writer task
/// flushes what is pending, ends the ring and closes its socket half.
pub(crate) struct RingSender(pub(crate) Arc<RingWriter>);

impl RingQueue for RingSender {
    fn send(&self, env: Envelope) -> std::result::Result<(), Refused> {
        self.0.send(env)
    }

    fn room(&self) -> tokio::sync::futures::Notified<'_> {
        self.0.room()
    }

    fn is_closed(&self) -> bool {
        self.0.is_closed()
    }

    fn queued(&self) -> usize {
        self.0.queued()
    }

    fn wait_closed(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        Box::pin(self.0.wait_closed())
    }
}

impl Drop for RingSender {
    fn drop(&mut self) {
        self.0.senders_gone.store(true, Ordering::Release);
        self.0.kick.notify_one();
    }
}

impl RingWriter {
    fn start(
        socket: OwnedWriteHalf,
        pipe: AsyncPipe,
        capacity: usize,
        max_frame: usize,
    ) -> (FrameSink, Writer) {
        let writer = Arc::new(RingWriter {
            state: Mutex::new(TxState {
                pipe,
                pending: VecDeque::new(),
                offset: 0,
                scratch: BytesMut::with_capacity(4096),
            }),
            socket,
            kick: Notify::new(),
            room: Notify::new(),
            closed: watch::Sender::new(false),
            senders_gone: AtomicBool::new(false),
            capacity,
            max_frame,
        });
        let task = tokio::spawn(write_task(writer.clone()));
        (FrameSink::ring(RingSender(writer)), task)
    }

    fn lock(&self) -> MutexGuard<'_, TxState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn is_closed(&self) -> bool {
        *self.closed.borrow()
    }

    pub(crate) fn queued(&self) -> usize {
        self.lock().pending.len()
    }

    pub(crate) async fn wait_closed(&self) {
        let mut closed = self.closed.subscribe();
        let _ = closed.wait_for(|c| *c).await;
    }

    /// A future that resolves when `pending` shrinks.
    pub(crate) fn room(&self) -> tokio::sync::futures::Notified<'_> {
        self.room.notified()
    }

    fn close(&self, why: &Error) {
        if !self.closed.send_replace(true) {
            tracing::debug!(%why, "ring link closed");
        }
        self.room.notify_waiters();
    }

    /// Queues `env`: straight into the ring when it fits and nothing waits
    /// before it, else behind the pending frames (refused when `capacity`
    /// frames already wait, or the link is closed).
    pub(crate) fn send(&self, env: Envelope) -> Result<(), Refused> {
        if self.is_closed() {
            return Err(Refused::closed(env));
        }
        let mut st = self.lock();
        if st.pending.len() >= self.capacity {
            return Err(Refused::full(env));
        }
        let st = &mut *st;
        st.scratch.clear();
        let body = match frame::encode_head(&env, &mut st.scratch, self.max_frame) {
            // The inline payload itself (shared, not copied); empty otherwise.
            Ok(_) => match &env.payload {
                Payload::Inline(bytes) => bytes.clone(),
                _ => Bytes::new(),
            },
            Err(err) => {
                // As the socket writer does: producers check sizes first.
                tracing::error!(%err, event_type = ?env.event_type, "dropping unsendable frame");
                return Ok(());
            }
        };
        let has_fds = env.payload.fd_count() > 0;
        if has_fds {
            frame::mark_descriptors(&mut st.scratch);
        }
        if st.pending.is_empty() && !has_fds {
            // The common case: the whole frame fits, no copy but the ring's.
            match st.pipe.end_mut().try_write_slices(&[&st.scratch, &body]) {
                Ok(Progress::Moved(n)) => {
                    st.offset += n as u64;
                    let total = st.scratch.len() + body.len();
                    if n < total {
                        st.pending.push_back(Pending {
                            head: Bytes::copy_from_slice(&st.scratch),
                            body,
                            written: n,
                            fds: None,
                        });
                        self.kick.notify_one();
                    }
                    return Ok(());
                }
                Ok(Progress::Wait) => {}
                Err(err) => {
                    self.close(&err);
                    return Err(Refused::closed(env));
                }
            }
        }
        st.pending.push_back(Pending {
            head: Bytes::copy_from_slice(&st.scratch),
            body,
            written: 0,
            fds: has_fds.then_some(env),
        });
        if st.pending.len() == 1 {
            // Try at once (a descriptor record, room freed meanwhile).
            match self.pump(st) {
                Ok(Blocked::Idle) => return Ok(()),
                Ok(_) => {}
                Err(err) => self.close(&err),
            }
        }
        self.kick.notify_one();
        Ok(())
    }

    /// Moves pending frames into the ring until one does not fit.
    fn pump(&self, st: &mut TxState) -> Result<Blocked> {
        let before = st.pending.len();
        let result = loop {
            let Some(frame) = st.pending.front_mut() else {
                break Ok(Blocked::Idle);
            };
            if frame.written == 0
                && let Some(env) = &frame.fds
            {
                let fds = raw_fds(&env.payload);
                let record = Record::Descriptors {
                    offset: st.offset,
                    count: u8::try_from(fds.len()).map_err(|_| Error::Malformed("too many descriptors"))?,
                };
                // Through `try_io`, so a full socket clears its readiness
                // and the writer task sleeps until the reader takes
                // records, instead of finding it "writable" again at once
                // and spinning.
                let socket = self.socket.as_ref();
                match socket.try_io(tokio::io::Interest::WRITABLE, || {
                    fdpass::send(socket.as_raw_fd(), &[IoSlice::new(&record.encode())], &fds)
                }) {
                    Ok(RECORD_LEN) => {}
                    Ok(_) => break Err(Error::Malformed("a link record was cut")),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break Ok(Blocked::Socket),
                    Err(e) => break Err(e.into()),
                }
                // Sent: the kernel holds the descriptors for the peer.
                frame.fds = None;
            }
            let rest = frame.rest();
            match st.pipe.end_mut().try_write_slices(&rest) {
                Ok(Progress::Moved(n)) => {
                    st.offset += n as u64;
                    frame.written += n;
                    if frame.written == frame.len() {
                        st.pending.pop_front();
                    }
                    // Else the ring is full now: the next try says `Wait`
                    // with the waiting flag raised, so the reader wakes us.
                }
                Ok(Progress::Wait) => break Ok(Blocked::Ring),
                Err(err) => break Err(err),
            }
        };
        if st.pending.len() < before {
            self.room.notify_waiters();
        }
        result
    }
}

/// Moves frames that did not fit at `send` into the ring as the reader
/// frees room; at the last sender's drop, flushes, ends the ring and
/// closes the socket half.
async fn write_task(writer: Arc<RingWriter>) -> Result<()> {
    loop {
        let blocked = {
            let mut st = writer.lock();
            writer.pump(&mut st)
        };
        let waited = match blocked {
            Ok(Blocked::Idle) if writer.senders_gone.load(Ordering::Acquire) => break,
            Ok(Blocked::Idle) => {
                writer.kick.notified().await;
                Ok(())
            }
            Ok(Blocked::Ring) => {
                std::future::poll_fn(|cx| {
                    let mut st = writer.lock();
                    st.pipe.poll_wake(cx)
                })
                .await
            }
            Ok(Blocked::Socket) => writer.socket.as_ref().writable().await.map_err(Error::from),
            Err(err) => Err(err),
        };
        if let Err(err) = waited {
            writer.close(&err);
            return Err(err);
        }
    }
    // Every frame is in the ring: the reader takes them, then sees the end.
    writer.lock().pipe.finish();
    let _ = nix::sys::socket::shutdown(
        writer.socket.as_ref().as_raw_fd(),
        nix::sys::socket::Shutdown::Write,
    );
    writer.close(&Error::Closed);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EventType;
    use crate::fdpass::{TAG_DESCRIPTORS, TAG_HELLO};
    use crate::frame::DEFAULT_MAX_FRAME;

    async fn pair(
        capacity: usize,
    ) -> (
        (FrameReader<OwnedReadHalf>, FrameSink),
        (FrameReader<OwnedReadHalf>, FrameSink),
    ) {
        let (a, b) = UnixStream::pair().unwrap();
        let (a, b) = tokio::join!(
            open_with(a, Transport::Ring, capacity, DEFAULT_MAX_FRAME),
            open_with(b, Transport::Ring, capacity, DEFAULT_MAX_FRAME)
        );
        (a.unwrap(), b.unwrap())
    }

    fn request(i: u64, body: Payload) -> Envelope {
        let mut env = Envelope::request(EventType::of("t"), i, Bytes::new());
        env.payload = body;
        env
    }

    #[tokio::test]
    async fn frames_of_every_size_and_descriptors_cross_in_order() {
        let ((_, sink), (mut reader, _keep)) = pair(64).await;
        // Inline frames from empty to larger than the ring itself, shared
        // memory bodies and streams between them: more than fits at once,
        // so some wait for the writer task.
        let sizes = [0usize, 1, 100, 4095, 70_000, RING_CAPACITY + 12_345];
        let sender = tokio::spawn(async move {
            let mut streams = Vec::new();
            for i in 0..200u64 {
                let payload = match i % 5 {
                    3 => Payload::Shm(crate::ShmBody::create(&vec![i as u8; 70_000]).unwrap()),
                    4 => {
                        let (producer, handle) = crate::pipe::pipe(4096, Some(3)).unwrap();
                        streams.push(producer);
                        Payload::Stream(handle)
                    }
                    _ => Payload::Inline(Bytes::from(vec![i as u8; sizes[i as usize % sizes.len()]])),
                };
                sink.send_wait(request(i, payload)).await.unwrap();
            }
            streams
        });
        let mut got = Vec::new();
        while reader.read_batch(&mut got).await.unwrap() {}
        let _streams = sender.await.unwrap();
        assert_eq!(got.len(), 200);
        for (i, env) in got.into_iter().enumerate() {
            let i = i as u64;
            assert_eq!(env.correlation, i);
            match (i % 5, env.payload) {
                (3, Payload::Shm(body)) => assert_eq!(body.map().unwrap().len(), 70_000),
                (4, Payload::Stream(handle)) => assert_eq!(handle.length(), Some(3)),
                (_, Payload::Inline(bytes)) => {
                    assert_eq!(bytes.len(), sizes[i as usize % sizes.len()]);
                    assert!(bytes.iter().all(|&b| b == i as u8));
                }
                (_, other) => panic!("frame {i}: {other:?}"),
            }
        }
        assert_eq!(reader.unclaimed_descriptors(), 0);
    }

    /// A reader whose ring always holds frames gives the thread up after a
    /// budget's worth of them: the process's other tasks (the router's
    /// other links) run before its backlog is read, not after.
    #[tokio::test]
    async fn a_reader_with_frames_waiting_lets_other_tasks_run() {
        const FRAMES: usize = 2000;
        let ((_, sink), (mut reader, _keep)) = pair(FRAMES).await;
        for i in 0..FRAMES as u64 {
            sink.send(request(i, Payload::Inline(Bytes::new()))).unwrap();
        }
        let other_ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = other_ran.clone();
        tokio::spawn(async move { flag.store(true, Ordering::Relaxed) });
        let mut got = Vec::new();
        let mut read_before_other = None;
        while got.len() < FRAMES {
            assert!(reader.read_batch(&mut got).await.unwrap());
            if read_before_other.is_none() && other_ran.load(Ordering::Relaxed) {
                read_before_other = Some(got.len());
            }
        }
        let before = read_before_other.unwrap_or(FRAMES);
        assert!(
            before < FRAMES / 4,
            "the other task ran after {before} of {FRAMES} frames"
        );
        for (i, env) in got.iter().enumerate() {
            assert_eq!(env.correlation, i as u64);
        }
    }

    /// A reader that falls behind a writer of shared-memory bodies holds
    /// its backlog in the kernel and reads it whole once it catches up:
    /// descriptors ahead of their frames are load, not a broken peer.
    async fn a_reader_behind_many_descriptor_frames_catches_up(transport: Transport) {
        const FRAMES: u64 = 600;
        let (a, b) = UnixStream::pair().unwrap();
        let (a, b) = tokio::join!(
            open_with(a, transport, 4096, DEFAULT_MAX_FRAME),
            open_with(b, transport, 4096, DEFAULT_MAX_FRAME)
        );
        let ((_, sink), (mut reader, _keep)) = (a.unwrap(), b.unwrap());
        let bodies: Vec<_> = (0..FRAMES)
            .map(|i| crate::ShmBody::create(&vec![i as u8; 64 * 1024]).unwrap())
            .collect();
        let sender = tokio::spawn(async move {
            for (i, body) in bodies.into_iter().enumerate() {
                sink.send_wait(request(i as u64, Payload::Shm(body)))
                    .await
                    .unwrap();
            }
            // Let the writer move all it can before the reader starts.
            for _ in 0..10_000 {
                if sink.queued() == 0 {
                    break;
                }
                tokio::task::yield_now().await;
            }
            sink
        });
        let _sink = sender.await.unwrap();
        let mut got = Vec::new();
        while (got.len() as u64) < FRAMES {
            assert!(reader.read_batch(&mut got).await.unwrap(), "the link ended early");
        }
        for (i, env) in got.into_iter().enumerate() {
            assert_eq!(env.correlation, i as u64);
            let Payload::Shm(body) = env.payload else {
                panic!("frame {i} lost its body")
            };
            assert_eq!(body.map().unwrap()[0], i as u8);
        }
        assert_eq!(reader.unclaimed_descriptors(), 0);
    }

    #[tokio::test]
    async fn a_ring_reader_behind_many_descriptor_frames_catches_up() {
        a_reader_behind_many_descriptor_frames_catches_up(Transport::Ring).await;
    }

    #[tokio::test]
    async fn a_socket_reader_behind_many_descriptor_frames_catches_up() {
        a_reader_behind_many_descriptor_frames_catches_up(Transport::Socket).await;
    }

    #[tokio::test]
    async fn both_directions_at_once() {
        let ((mut ra, sa), (mut rb, sb)) = pair(1024).await;
        let send = |sink: FrameSink| async move {
            for i in 0..5000u64 {
                sink.send_wait(request(i, Payload::Inline(Bytes::from(i.to_le_bytes().to_vec()))))
                    .await
                    .unwrap();
            }
        };
        let read = |mut reader: FrameReader<OwnedReadHalf>| async move {
            let mut got = Vec::new();
            while got.len() < 5000 {
                assert!(reader.read_batch(&mut got).await.unwrap());
            }
            got.iter().enumerate().all(|(i, e)| e.correlation == i as u64)
        };
        let (_, _, a_ok, b_ok) =
            tokio::join!(send(sa), send(sb), read(ra_take(&mut ra)), read(ra_take(&mut rb)));
        assert!(a_ok && b_ok);
    }

    fn ra_take(reader: &mut FrameReader<OwnedReadHalf>) -> FrameReader<OwnedReadHalf> {
        // Swap a finished placeholder in: the test owns both ends anyway.
        let (x, _y) = std::os::unix::net::UnixStream::pair().unwrap();
        x.set_nonblocking(true).unwrap();
        let (read, _) = UnixStream::from_std(x).unwrap().into_split();
        std::mem::replace(reader, FrameReader::new(read, DEFAULT_MAX_FRAME))
    }

    #[tokio::test]
    async fn a_full_queue_is_refused_and_a_dead_peer_closes_the_link() {
        let ((_, sink), (reader, _their_sink)) = pair(4).await;
        // Nobody reads: the ring fills, then the queue of 4, then refusals.
        let big = Bytes::from(vec![0u8; 100_000]);
        let mut refused = None;
        for i in 0..100u64 {
            if let Err(r) = sink.send(request(i, Payload::Inline(big.clone()))) {
                refused = Some(r);
                break;
            }
        }
        assert!(refused.expect("the queue filled").full);
        // The reader's side goes away: the writer sees the link closed.
        drop(reader);
        drop(_their_sink);
        tokio::time::timeout(Duration::from_secs(10), sink.closed())
            .await
            .expect("the link closed");
        assert!(
            !sink
                .send(request(0, Payload::Inline(Bytes::new())))
                .unwrap_err()
                .full
        );
    }

    #[tokio::test]
    async fn a_peer_that_sends_frames_instead_of_its_ring_is_refused() {
        let (a, b) = UnixStream::pair().unwrap();
        let (sink, _w) = spawn_writer(b, 16, DEFAULT_MAX_FRAME);
        sink.send_wait(request(1, Payload::Inline(Bytes::from_static(b"not a ring"))))
            .await
            .unwrap();
        let err = open_with(a, Transport::Ring, 16, DEFAULT_MAX_FRAME)
            .await
            .err()
            .expect("refused");
        assert!(matches!(err, Error::Malformed(_)), "{err}");
    }

    #[test]
    fn records_round_trip_and_garbage_is_refused() {
        for r in [
            Record::Hello { capacity: 1 << 18 },
            Record::Descriptors {
                offset: 123_456,
                count: 2,
            },
        ] {
            assert_eq!(Record::decode(&r.encode()).unwrap(), r);
        }
        assert!(Record::decode(&[0u8; 16]).is_err());
        assert!(Record::decode(&[TAG_DESCRIPTORS, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]).is_err());
        let mut odd = Record::Hello { capacity: 1 }.encode();
        odd[3] = 1;
        assert!(Record::decode(&odd).is_err());
        assert!(Record::decode(&[TAG_HELLO; 15]).is_err());
    }
}

/// The reader of a ring link against a peer that writes anything at all
/// into the ring and its positions: it answers frames or an error, never a
/// panic, a hang or an allocation the bytes did not pay for.
#[cfg(test)]
mod hostile_ring {
    use super::*;
    use crate::frame::DEFAULT_MAX_FRAME;
    use proptest::prelude::*;

    async fn read_all(bytes: Vec<u8>, lie: Option<u64>, finish: bool) -> usize {
        let (mut producer, handle) = crate::pipe::link_pipe(4096).unwrap();
        let consumer = handle.open_link().unwrap().into_async().unwrap();
        let (socket, _peer) = UnixStream::pair().unwrap();
        let (read, _write) = socket.into_split();
        let mut reader = FrameReader::with_ring(read, consumer, 64 * 1024);
        let mut frames = 0;
        let mut rest = &bytes[..];
        loop {
            // Writes what fits, reads what came, until the bytes are out.
            if let Ok(Progress::Moved(n)) = producer.try_write(rest) {
                rest = &rest[n..];
            }
            if rest.is_empty() {
                if let Some(at) = lie {
                    producer.written().store(at, Ordering::Release);
                }
                if finish {
                    producer.finish();
                } else {
                    producer.abort();
                }
            }
            let mut got = Vec::new();
            match tokio::time::timeout(Duration::from_secs(5), reader.read_batch(&mut got)).await {
                Ok(Ok(true)) => frames += got.len(),
                Ok(Ok(false)) | Ok(Err(_)) => return frames,
                Err(_) => panic!("the reader hung on {} hostile bytes", bytes.len()),
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn any_ring_contents_end_in_frames_or_an_error(
            bytes in proptest::collection::vec(any::<u8>(), 0..12_000),
            lie in proptest::option::of(any::<u64>()),
            finish in any::<bool>(),
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(read_all(bytes, lie, finish));
        }

        #[test]
        fn frame_like_contents_with_huge_lengths_are_refused(
            len in any::<u32>(),
            header in any::<u32>(),
            tail in proptest::collection::vec(any::<u8>(), 0..256),
        ) {
            let mut bytes = len.to_le_bytes().to_vec();
            bytes.extend_from_slice(&header.to_le_bytes());
            bytes.extend_from_slice(&tail);
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(read_all(bytes, None, true));
        }
    }

    #[test]
    fn max_frame_bounds_what_a_hostile_length_can_make_the_reader_buffer() {
        // A frame announced at max_frame is read; one byte more is refused
        // before anything is buffered for it.
        let over = (DEFAULT_MAX_FRAME as u32).to_le_bytes();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        assert_eq!(runtime.block_on(read_all([over, [0; 4]].concat(), None, true)), 0);
    }
}
