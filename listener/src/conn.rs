//! Connections as resources a client can hold: how many there are, and
//! whether each one still earns its place.
//!
//! Every accepted socket is admitted here ([`Connections::admit`], refused
//! past `max_connections`) and wrapped in an [`Io`] that stamps each read
//! and each write on its [`Conn`]; response bodies stamp it too
//! ([`Tracked`]). One sweeper task per process reads those stamps every
//! tick and closes the connections that hold resources without moving:
//!
//! - **idle**: no request in progress and nothing received for
//!   `idle_timeout` (from accept to the first byte, and between requests);
//! - **first request**: no whole request head within `idle_timeout +
//!   header_read_timeout` of connecting (a client dripping the h2 preface
//!   or a request line byte by byte);
//! - **write stall**: something to send (a socket write that would block,
//!   or a response body whose bytes hyper has not taken, as under h2 flow
//!   control) and no progress for `write_stall_timeout`.
//!
//! The sweeper only flags a connection and wakes whoever serves it (the
//! connection task, or the WebSocket session after an upgrade); dropping
//! the connection releases everything it held, shared memory included.
//! Stamps are a coarse clock the sweeper advances, so a request costs a
//! few atomic stores and no timer, and the connection task checks its flag
//! with one load per wake-up ([`Conn::poll_signal`]) rather than a
//! `Notify` (whose every poll takes a lock).

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

// The runtime's clock, so that a test with paused time moves it
// (docs/decisions/0151-which-clock.md).
use tokio::time::Instant;

use bytes::{Buf, Bytes};
use futures_util::task::AtomicWaker;
use http_body::{Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Notify;

/// Why the listener closed a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Close {
    /// No request in progress and nothing received for `idle_timeout`.
    Idle,
    /// No whole request head within `idle_timeout + header_read_timeout`.
    NoRequest,
    /// Something to send and no progress for `write_stall_timeout`.
    Stalled,
}

impl Close {
    fn code(self) -> u8 {
        match self {
            Close::Idle => 1,
            Close::NoRequest => 2,
            Close::Stalled => 3,
        }
    }

    fn from_code(code: u8) -> Option<Close> {
        match code {
            1 => Some(Close::Idle),
            2 => Some(Close::NoRequest),
            3 => Some(Close::Stalled),
            _ => None,
        }
    }

    pub(crate) fn describe(self) -> &'static str {
        match self {
            Close::Idle => "idle",
            Close::NoRequest => "no request head in time",
            Close::Stalled => "the client stopped reading",
        }
    }
}

/// The limits the sweeper enforces.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub(crate) max_connections: usize,
    pub(crate) idle: Duration,
    pub(crate) first_request: Duration,
    pub(crate) write_stall: Duration,
}

/// The coarse clock: milliseconds since the first listener of this process
/// started, advanced by the sweepers.
static CLOCK: AtomicU64 = AtomicU64::new(0);
static EPOCH: OnceLock<Instant> = OnceLock::new();

fn tick_clock() -> u64 {
    let now = EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64;
    CLOCK.fetch_max(now, Ordering::Relaxed).max(now)
}

fn now() -> u64 {
    CLOCK.load(Ordering::Relaxed)
}

/// What the listener knows of one connection, from accept until its socket
/// is dropped (an upgraded WebSocket keeps it until the session ends).
pub(crate) struct Conn {
    /// When it was accepted (coarse clock).
    accepted: u64,
    /// The last byte received, request started or response finished.
    last_activity: AtomicU64,
    /// The last byte sent or body chunk taken, or when the connection
    /// started waiting for its client (whichever came last).
    last_progress: AtomicU64,
    /// The last socket write would have blocked.
    write_blocked: AtomicBool,
    /// Response bodies with bytes ready that hyper has not taken yet.
    waiting_bodies: AtomicUsize,
    /// Bytes of response bodies not yet handed to hyper.
    held_bytes: AtomicU64,
    /// Requests whose response body is still alive.
    active: AtomicUsize,
    /// A request has been received.
    served: AtomicBool,
    /// WebSocket sessions it carries (an HTTP/1.1 upgrade, or h2 streams
    /// opened by extended CONNECT): their pings keep it alive.
    upgraded: AtomicUsize,
    /// Why the sweeper wants it closed (a [`Close`] code; 0 while it may stay).
    close: AtomicU8,
    /// The listener drains: finish what is in flight, take nothing new.
    drain: AtomicBool,
    /// Wakes the connection task (see [`Conn::poll_signal`]).
    task: AtomicWaker,
    /// Wakes a WebSocket session ([`Conn::closing`]).
    closing: Notify,
}

/// What the connection task is told between two polls of its connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Signal {
    /// Nothing: go on serving.
    None,
    /// The listener drains.
    Drain,
    /// The sweeper wants the connection closed.
    Close(Close),
}

impl Conn {
    fn new() -> Conn {
        let t = now();
        Conn {
            accepted: t,
            last_activity: AtomicU64::new(t),
            last_progress: AtomicU64::new(t),
            write_blocked: AtomicBool::new(false),
            waiting_bodies: AtomicUsize::new(0),
            held_bytes: AtomicU64::new(0),
            active: AtomicUsize::new(0),
            served: AtomicBool::new(false),
            upgraded: AtomicUsize::new(0),
            close: AtomicU8::new(0),
            drain: AtomicBool::new(false),
            task: AtomicWaker::new(),
            closing: Notify::new(),
        }
    }

    /// A request head arrived; its response body ends it ([`Tracked`]).
    pub(crate) fn request_started(&self) {
        if !self.served.load(Ordering::Relaxed) {
            self.served.store(true, Ordering::Relaxed);
        }
        self.active.fetch_add(1, Ordering::Relaxed);
        self.last_activity.store(now(), Ordering::Relaxed);
    }

    /// Whether a request has been received on it.
    pub(crate) fn has_served(&self) -> bool {
        self.served.load(Ordering::Relaxed)
    }

    /// The connection now carries a WebSocket session, whose own pings say
    /// whether the client is alive.
    /// Until the returned guard is dropped (the session ends). An h2
    /// connection is then an ordinary connection again, idle or not.
    pub(crate) fn upgraded(self: &Arc<Self>) -> Session {
        self.upgraded.fetch_add(1, Ordering::Relaxed);
        Session(self.clone())
    }

    /// Bytes of response bodies this connection holds for its client.
    pub(crate) fn held_bytes(&self) -> u64 {
        self.held_bytes.load(Ordering::Relaxed)
    }

    /// Why the connection must close, once the sweeper said so.
    pub(crate) fn close_reason(&self) -> Option<Close> {
        Close::from_code(self.close.load(Ordering::Acquire))
    }

    /// For the connection task, polled before its connection: what it is
    /// told, the task woken when that changes. One load when nothing is.
    pub(crate) fn poll_signal(&self, cx: &mut Context<'_>) -> Signal {
        self.task.register(cx.waker());
        if let Some(reason) = self.close_reason() {
            return Signal::Close(reason);
        }
        if self.drain.load(Ordering::Acquire) {
            return Signal::Drain;
        }
        Signal::None
    }

    /// Resolves when the sweeper wants the connection closed (for a
    /// WebSocket session, whose wake-ups are few).
    pub(crate) async fn closing(&self) -> Close {
        loop {
            let notified = self.closing.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(reason) = self.close_reason() {
                return reason;
            }
            notified.await;
        }
    }

    fn flag(&self, reason: Close) {
        if self
            .close
            .compare_exchange(0, reason.code(), Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            self.task.wake();
            self.closing.notify_waiters();
        }
    }

    /// Whether, at `now`, the connection breaks one of `limits`.
    fn verdict(&self, now: u64, limits: &Limits) -> Option<Close> {
        let since =
            |stamp: &AtomicU64| Duration::from_millis(now.saturating_sub(stamp.load(Ordering::Relaxed)));
        let waiting =
            self.write_blocked.load(Ordering::Relaxed) || self.waiting_bodies.load(Ordering::Relaxed) > 0;
        if waiting && since(&self.last_progress) >= limits.write_stall {
            return Some(Close::Stalled);
        }
        if self.upgraded.load(Ordering::Relaxed) > 0 || self.active.load(Ordering::Relaxed) > 0 {
            return None;
        }
        if !self.served.load(Ordering::Relaxed)
            && Duration::from_millis(now.saturating_sub(self.accepted)) >= limits.first_request
        {
            return Some(Close::NoRequest);
        }
        (since(&self.last_activity) >= limits.idle).then_some(Close::Idle)
    }

    fn wrote(&self, progressed: bool) {
        if progressed {
            if self.write_blocked.load(Ordering::Relaxed) {
                self.write_blocked.store(false, Ordering::Relaxed);
            }
            self.last_progress.store(now(), Ordering::Relaxed);
        } else if !self.write_blocked.swap(true, Ordering::Relaxed) {
            // The stall is counted from when the wait began.
            self.last_progress.store(now(), Ordering::Relaxed);
        }
    }

    fn body_waiting(&self, waiting: bool) {
        if waiting {
            if self.waiting_bodies.fetch_add(1, Ordering::Relaxed) == 0 {
                self.last_progress.store(now(), Ordering::Relaxed);
            }
        } else {
            self.waiting_bodies.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// A WebSocket session on a connection ([`Conn::upgraded`]).
pub(crate) struct Session(Arc<Conn>);

impl Drop for Session {
    fn drop(&mut self) {
        self.0.upgraded.fetch_sub(1, Ordering::Relaxed);
        self.0.last_activity.store(now(), Ordering::Relaxed);
    }
}

/// The connections of one listener process.
pub(crate) struct Connections {
    /// Replaced whole by a reload ([`Connections::set_limits`]); read once
    /// per admission and once per sweep.
    limits: Mutex<Limits>,
    open: Mutex<HashMap<u64, Arc<Conn>>>,
    next_id: AtomicU64,
    /// Connections refused in the current burst (0: none).
    refused: AtomicU64,
}

/// A connection's place in [`Connections`]; dropping it frees the place.
pub(crate) struct Admission {
    connections: Arc<Connections>,
    id: u64,
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.connections.lock().remove(&self.id);
    }
}

impl Connections {
    /// The connections of a listener that enforces `limits`; the sweeper
    /// runs for as long as they are referenced.
    pub(crate) fn start(limits: Limits) -> Arc<Connections> {
        tick_clock();
        let connections = Arc::new(Connections {
            limits: Mutex::new(limits),
            open: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        });
        tokio::spawn(sweep(Arc::downgrade(&connections)));
        connections
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Conn>>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The limits in force.
    pub(crate) fn limits(&self) -> Limits {
        *self.limits.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// New limits (a reload), for every connection from the next admission
    /// and the next sweep on; the sweep's period stays what it was.
    pub(crate) fn set_limits(&self, limits: Limits) {
        *self.limits.lock().unwrap_or_else(|p| p.into_inner()) = limits;
    }

    /// Connections open now.
    pub(crate) fn count(&self) -> usize {
        self.lock().len()
    }

    /// Tells every connection task that the listener drains.
    pub(crate) fn drain(&self) {
        for conn in self.lock().values() {
            conn.drain.store(true, Ordering::Release);
            conn.task.wake();
        }
    }

    /// Admits a new connection, or `None` when `max_connections` are open
    /// (the caller refuses it).
    pub(crate) fn admit(self: &Arc<Self>) -> Option<(Arc<Conn>, Admission)> {
        let max_connections = self.limits().max_connections;
        let mut open = self.lock();
        if open.len() >= max_connections {
            drop(open);
            if self.refused.fetch_add(1, Ordering::Relaxed) == 0 {
                tracing::warn!(
                    max_connections,
                    "connection limit reached; refusing new connections with 503 until some close"
                );
            }
            return None;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn::new());
        open.insert(id, conn.clone());
        drop(open);
        let refused = self.refused.swap(0, Ordering::Relaxed);
        if refused > 0 {
            tracing::info!(refused, "accepting connections again");
        }
        let admission = Admission {
            connections: self.clone(),
            id,
        };
        Some((conn, admission))
    }
}

/// Flags the connections that break a limit, every tick, for as long as
/// the listener's [`Connections`] live.
async fn sweep(connections: Weak<Connections>) {
    let tick = match connections.upgrade() {
        Some(c) => {
            let l = c.limits();
            (l.idle.min(l.write_stall).min(l.first_request) / 4)
                .clamp(Duration::from_millis(50), Duration::from_secs(1))
        }
        None => return,
    };
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let now = tick_clock();
        let Some(connections) = connections.upgrade() else {
            return;
        };
        let limits = connections.limits();
        let flagged: Vec<(Arc<Conn>, Close)> = connections
            .lock()
            .values()
            .filter(|c| c.close_reason().is_none())
            .filter_map(|c| c.verdict(now, &limits).map(|r| (c.clone(), r)))
            .collect();
        for (conn, reason) in flagged {
            tracing::debug!(reason = reason.describe(), "closing a connection");
            conn.flag(reason);
        }
    }
}

/// An accepted socket that stamps its [`Conn`] on every read and write,
/// and frees its place when dropped.
pub(crate) struct Io {
    stream: TcpStream,
    conn: Arc<Conn>,
    _admission: Admission,
}

impl Io {
    pub(crate) fn new(stream: TcpStream, conn: Arc<Conn>, admission: Admission) -> Io {
        Io {
            stream,
            conn,
            _admission: admission,
        }
    }
}

impl AsyncRead for Io {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.conn.last_activity.store(now(), Ordering::Relaxed);
        }
        polled
    }
}

impl AsyncWrite for Io {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.conn.wrote(!polled.is_pending());
        polled
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.conn.wrote(!polled.is_pending());
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// The largest piece of a response body handed to an h2 stream at once:
/// h2 buffers what it is given past the client's window, so smaller
/// pieces keep the rest countable (and releasable) here.
pub(crate) const H2_PIECE: usize = 64 * 1024;

/// A response body that tells its [`Conn`] whether it waits for the client
/// (bytes ready, not taken) or for its producer, and how many bytes it
/// still holds. The request it answers ends when it is dropped.
pub(crate) struct Tracked<B> {
    inner: B,
    conn: Arc<Conn>,
    /// Counted in `waiting_bodies`.
    waiting: bool,
    /// Counted in `held_bytes`.
    held: u64,
    /// The rest of a data frame larger than `piece`.
    rest: Option<Bytes>,
    /// Largest data frame handed on (h2), or none.
    piece: Option<usize>,
}

impl<B: http_body::Body<Data = Bytes> + Unpin> Tracked<B> {
    /// Tracks `inner`, the response to a request counted by
    /// [`Conn::request_started`], which holds `held` bytes in memory (a
    /// whole body; 0 for a stream); `piece` cuts its data frames (h2).
    pub(crate) fn new(inner: B, conn: Arc<Conn>, piece: Option<usize>, held: u64) -> Tracked<B> {
        if held > 0 {
            conn.held_bytes.fetch_add(held, Ordering::Relaxed);
        }
        let waiting = !inner.is_end_stream();
        if waiting {
            conn.body_waiting(true);
        }
        Tracked {
            inner,
            conn,
            waiting,
            held,
            rest: None,
            piece,
        }
    }

    fn set_waiting(&mut self, waiting: bool) {
        if self.waiting != waiting {
            self.waiting = waiting;
            self.conn.body_waiting(waiting);
        }
    }

    /// Hands on `data`, or its first piece (keeping the rest).
    fn hand_on(&mut self, mut data: Bytes) -> Bytes {
        if let Some(piece) = self.piece
            && data.len() > piece
        {
            self.rest = Some(data.split_off(piece));
        }
        let n = (data.len() as u64).min(self.held);
        if n > 0 {
            self.held -= n;
            self.conn.held_bytes.fetch_sub(n, Ordering::Relaxed);
        }
        self.conn.last_progress.store(now(), Ordering::Relaxed);
        // Until hyper polls again, the bytes are the client's to take.
        self.set_waiting(true);
        data
    }
}

impl<B> http_body::Body for Tracked<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        if let Some(rest) = this.rest.take() {
            return Poll::Ready(Some(Ok(Frame::data(this.hand_on(rest)))));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Pending => {
                // Waiting for the producer, not for the client.
                this.set_waiting(false);
                Poll::Pending
            }
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => Poll::Ready(Some(Ok(Frame::data(this.hand_on(data))))),
                Err(frame) => Poll::Ready(Some(Ok(frame))),
            },
            Poll::Ready(other) => {
                this.set_waiting(false);
                Poll::Ready(other)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let rest = self.rest.as_ref().map_or(0, |r| r.remaining() as u64);
        let inner = self.inner.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower() + rest);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + rest);
        }
        hint
    }
}

impl<B> Drop for Tracked<B> {
    fn drop(&mut self) {
        if self.waiting {
            self.conn.body_waiting(false);
        }
        if self.held > 0 {
            self.conn.held_bytes.fetch_sub(self.held, Ordering::Relaxed);
        }
        self.conn.active.fetch_sub(1, Ordering::Relaxed);
        self.conn.last_activity.store(now(), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full};

    fn limits() -> Limits {
        Limits {
            max_connections: 2,
            idle: Duration::from_millis(1000),
            first_request: Duration::from_millis(3000),
            write_stall: Duration::from_millis(2000),
        }
    }

    #[test]
    fn verdicts() {
        let l = limits();
        let conn = Conn::new();
        let t = conn.accepted;
        // Silent from accept: idle.
        assert_eq!(conn.verdict(t + 999, &l), None);
        assert_eq!(conn.verdict(t + 1000, &l), Some(Close::Idle));
        // Bytes keep it, but not past the first-request bound.
        conn.last_activity.store(t + 2500, Ordering::Relaxed);
        assert_eq!(conn.verdict(t + 2600, &l), None);
        assert_eq!(conn.verdict(t + 3000, &l), Some(Close::NoRequest));
        // A request in progress is neither idle nor late.
        conn.request_started();
        assert_eq!(conn.verdict(t + 60_000, &l), None);
        // Blocked writes with no progress are a stall, counted from when
        // the wait began.
        conn.write_blocked.store(true, Ordering::Relaxed);
        conn.last_progress.store(t + 10_000, Ordering::Relaxed);
        assert_eq!(conn.verdict(t + 11_999, &l), None);
        assert_eq!(conn.verdict(t + 12_000, &l), Some(Close::Stalled));
        // An upgraded connection is kept alive by its own pings, yet a
        // stall still counts.
        let ws = Arc::new(Conn::new());
        let session = ws.upgraded();
        assert_eq!(ws.verdict(ws.accepted + 60_000, &l), None);
        ws.waiting_bodies.store(1, Ordering::Relaxed);
        assert_eq!(ws.verdict(ws.accepted + 60_000, &l), Some(Close::Stalled));
        // Once its session ends, an h2 connection idles like any other.
        ws.waiting_bodies.store(0, Ordering::Relaxed);
        drop(session);
        let ended = ws.last_activity.load(Ordering::Relaxed);
        assert_eq!(ws.verdict(ended + 999, &l), None);
        assert_eq!(ws.verdict(ended + 1000, &l), Some(Close::Idle));
    }

    /// The sweeper itself, on paused time: each limit closes its
    /// connection within a sweep of being reached, not before.
    #[tokio::test(start_paused = true)]
    async fn the_sweeper_closes_idle_silent_and_stalled_connections_on_time() {
        let ms = Duration::from_millis;
        let connections = Connections::start(Limits {
            max_connections: 8,
            ..limits()
        });
        // The sweep interval: a quarter of the shortest limit (250 ms).
        let sweep = ms(250);
        // Let the sweeper start its clock.
        tokio::time::sleep(ms(1)).await;
        let (silent, _silent) = connections.admit().unwrap();
        let (served, _served) = connections.admit().unwrap();
        // As a read and a finished response body stamp them.
        let received = |conn: &Conn| conn.last_activity.store(now(), Ordering::Relaxed);
        served.request_started();
        served.active.fetch_sub(1, Ordering::Relaxed);
        received(&served);
        let (slow_reader, _slow) = connections.admit().unwrap();
        slow_reader.request_started();
        slow_reader.wrote(false);
        let (trickling, _trickling) = connections.admit().unwrap();

        // Just short of idle (1 s): all stay.
        tokio::time::sleep(ms(1000) - sweep).await;
        for conn in [&silent, &served, &slow_reader, &trickling] {
            assert_eq!(conn.close_reason(), None);
        }
        received(&trickling);
        tokio::time::sleep(sweep * 2).await;
        assert_eq!(silent.close_reason(), Some(Close::Idle));
        assert_eq!(served.close_reason(), Some(Close::Idle));
        // Bytes every half second keep a connection from idling ...
        for _ in 0..4 {
            assert_eq!(trickling.close_reason(), None);
            received(&trickling);
            tokio::time::sleep(ms(500)).await;
        }
        // ... but not past the first-request bound (3 s) without a whole
        // request head.
        assert_eq!(trickling.close_reason(), Some(Close::NoRequest));
        // A request in progress whose writes block with no progress is a
        // stall after 2 s, however busy it is otherwise.
        assert_eq!(slow_reader.close_reason(), Some(Close::Stalled));
    }

    #[tokio::test]
    async fn admission_is_bounded_and_freed_on_drop() {
        let connections = Connections::start(limits());
        let a = connections.admit().expect("first");
        let _b = connections.admit().expect("second");
        assert!(connections.admit().is_none(), "over the limit");
        drop(a);
        assert!(connections.admit().is_some(), "a place was freed");
    }

    #[tokio::test]
    async fn tracked_bodies_count_held_bytes_and_waiting() {
        let conn = Arc::new(Conn::new());
        conn.request_started();
        let body = Tracked::new(
            Full::new(Bytes::from(vec![7u8; 150_000])),
            conn.clone(),
            Some(H2_PIECE),
            150_000,
        );
        assert_eq!(conn.held_bytes(), 150_000);
        assert_eq!(conn.waiting_bodies.load(Ordering::Relaxed), 1);
        let mut body = body;
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first.len(), H2_PIECE);
        assert_eq!(conn.held_bytes(), 150_000 - H2_PIECE as u64);
        let collected = body.collect().await.unwrap().to_bytes();
        assert_eq!(collected.len(), 150_000 - H2_PIECE);
        assert_eq!(conn.held_bytes(), 0);
        assert_eq!(
            conn.active.load(Ordering::Relaxed),
            0,
            "dropped: the request ended"
        );
        assert_eq!(conn.waiting_bodies.load(Ordering::Relaxed), 0);
    }
}
