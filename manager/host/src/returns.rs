//! This instance's return links to listener processes (decision 0143): one
//! per listener process, offered through the router with the first answer
//! to one of its pipes and used for the answers to all of them (the
//! listener says which pipes are its, `Control::ReturnPipes`). The answers
//! that wait for a link being opened go on it once it is open; until then
//! nothing else changes. An answer goes back through the router as before
//! when no link can be had, or a link is full or gone, so the direct path
//! is only ever a shortcut.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use switchyard_proto::control::Control;
use switchyard_proto::transport::{FrameReader, FrameSink};
use switchyard_proto::{Envelope, Kind, Origin, link, returns};
use tokio::net::unix::OwnedReadHalf;

/// How long a pipe whose listener did not take the offer goes without a
/// new one: a listener that refuses links (or is gone) gets one offer per
/// period, not one per answer.
const REOFFER_AFTER: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Inner {
    /// Names this instance in its offers.
    instance: u64,
    next: u64,
    /// Open links, by our number for them.
    links: HashMap<u64, FrameSink>,
    /// Pipe id → the link of the listener process that holds the pipe.
    pipes: HashMap<u64, u64>,
    /// Pipes offered a link not open yet, with the answers waiting for it.
    offers: HashMap<u64, Vec<Envelope>>,
    /// Pipes whose offer failed, and when.
    refused: HashMap<u64, Instant>,
}

/// What became of an answer given to [`Returns::send`].
pub(crate) enum Sent {
    /// Written into the listener's link: the router must be told.
    Direct,
    /// Waiting for the link being opened; whoever sends it tells the
    /// router.
    Held,
}

#[derive(Clone, Default)]
pub(crate) struct Returns {
    inner: Arc<Mutex<Inner>>,
}

impl Returns {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes `answer` (to a request of pipe `pipe`) into its listener's
    /// return link, or holds it for the link being opened; gives it back
    /// when it must go through the router instead, offering a link through
    /// `router` when the pipe's listener has none.
    // The envelope (with its typed request context, decision 0146) is
    // given back by move; boxing it would cost an allocation per answer.
    #[allow(clippy::result_large_err)]
    pub(crate) fn send(
        &self,
        pipe: u64,
        answer: Envelope,
        router: &FrameSink,
        capacity: usize,
        max_frame: usize,
    ) -> Result<Sent, Envelope> {
        let mut inner = self.lock();
        if let Some(&n) = inner.pipes.get(&pipe) {
            let Some(sink) = inner.links.get(&n) else {
                inner.pipes.remove(&pipe);
                return Err(answer);
            };
            return match sink.send(answer) {
                Ok(()) => Ok(Sent::Direct),
                Err(refused) => {
                    if !refused.full {
                        inner.forget(n);
                    }
                    Err(*refused.envelope)
                }
            };
        }
        if let Some(held) = inner.offers.get_mut(&pipe) {
            held.push(answer);
            return Ok(Sent::Held);
        }
        if inner
            .refused
            .get(&pipe)
            .is_some_and(|at| at.elapsed() < REOFFER_AFTER)
        {
            return Err(answer);
        }
        if inner.instance == 0 {
            inner.instance = returns::instance_number();
        }
        let (socket, offer) = match returns::offer(pipe, inner.instance) {
            Ok(made) => made,
            Err(err) => {
                tracing::warn!(%err, pipe, "cannot make a return link");
                inner.refused.insert(pipe, Instant::now());
                return Err(answer);
            }
        };
        if let Err(refused) = router.send(offer) {
            tracing::debug!(%refused, pipe, "return-link offer not sent");
            return Err(answer);
        }
        inner.offers.insert(pipe, vec![answer]);
        tokio::spawn(
            self.clone()
                .open(pipe, socket, router.clone(), capacity, max_frame),
        );
        Ok(Sent::Held)
    }

    /// Opens our end once the listener has taken the link (its first
    /// frame on it names its pipes), sends the answers that waited, and
    /// holds the link until the listener closes it (it exited).
    async fn open(
        self,
        pipe: u64,
        socket: tokio::net::UnixStream,
        router: FrameSink,
        capacity: usize,
        max_frame: usize,
    ) {
        let (mut reader, sink, told) = match accepted(socket, capacity, max_frame).await {
            Ok(link) => link,
            Err(err) => {
                tracing::debug!(%err, pipe, "return link not taken");
                let held = {
                    let mut inner = self.lock();
                    inner.refused.insert(pipe, Instant::now());
                    inner.offers.remove(&pipe).unwrap_or_default()
                };
                // The listener may have told another link of ours that the
                // pipe is its: then they go there.
                let mut done = Vec::new();
                for answer in held {
                    let correlation = answer.correlation;
                    match self.send(pipe, answer, &router, capacity, max_frame) {
                        Ok(Sent::Direct) => done.push((pipe, correlation)),
                        Ok(Sent::Held) => {}
                        Err(answer) => send_or_log(&router, answer),
                    }
                }
                completed(&router, done);
                return;
            }
        };
        let n = {
            let mut inner = self.lock();
            inner.next += 1;
            let n = inner.next;
            inner.links.insert(n, sink.clone());
            inner.pipes.insert(pipe, n);
            for told in told {
                inner.pipes.insert(told, n);
            }
            inner.refused.remove(&pipe);
            let held = inner.offers.remove(&pipe).unwrap_or_default();
            drop(inner);
            let mut done = Vec::new();
            for answer in held {
                let correlation = answer.correlation;
                match sink.send(answer) {
                    Ok(()) => done.push((pipe, correlation)),
                    Err(refused) => send_or_log(&router, *refused.envelope),
                }
            }
            completed(&router, done);
            n
        };
        tracing::debug!(pipe, link = n, "return link open");
        let mut batch = Vec::new();
        loop {
            match reader.read_batch(&mut batch).await {
                Ok(true) => {}
                Ok(false) => break,
                Err(err) => {
                    tracing::warn!(%err, link = n, "bad frame on a return link; closing it");
                    break;
                }
            }
            for env in batch.drain(..) {
                if env.kind == Kind::Control
                    && let Ok(Control::ReturnPipes { pipes }) = env.decode_control()
                {
                    let mut inner = self.lock();
                    inner.pipes.retain(|_, link| *link != n);
                    for pipe in pipes {
                        inner.pipes.insert(pipe, n);
                    }
                }
            }
        }
        tracing::debug!(link = n, "return link closed by the listener");
        self.lock().forget(n);
    }

    /// Waits, at most `within`, until what the links hold is written: an
    /// instance that stops must not take its last answers with it.
    pub(crate) async fn flush(&self, within: Duration) {
        let until = tokio::time::Instant::now() + within;
        loop {
            let busy = {
                let inner = self.lock();
                !inner.offers.is_empty() || inner.links.values().any(|sink| sink.queued() > 0)
            };
            if !busy || tokio::time::Instant::now() >= until {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

impl Inner {
    fn forget(&mut self, n: u64) {
        self.links.remove(&n);
        self.pipes.retain(|_, link| *link != n);
    }
}

/// How long an offered link waits for the listener to take it: as long
/// as a ring link waits for its peer's ring.
const ACCEPT_TIMEOUT: Duration = Duration::from_secs(10);

/// Opens our end of an offered link and waits for the listener's first
/// frame on it, the pipes the link answers for: only then is the link
/// taken. A listener that refuses an offer (it has a link from this
/// instance already, holds the most it may, or answers through the router)
/// closes its end unread; on the socket transport our end opens all the
/// same, so without this word the answers written into it would be lost
/// with it.
async fn accepted(
    socket: tokio::net::UnixStream,
    capacity: usize,
    max_frame: usize,
) -> Result<(FrameReader<OwnedReadHalf>, FrameSink, Vec<u64>), switchyard_proto::Error> {
    let (mut reader, sink) = link::open(socket, capacity, max_frame).await?;
    let first = tokio::time::timeout(ACCEPT_TIMEOUT, reader.next())
        .await
        .map_err(|_| {
            switchyard_proto::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the listener never took the return link",
            ))
        })??;
    match first {
        Some(env) if env.kind == Kind::Control => match env.decode_control()? {
            Control::ReturnPipes { pipes } => Ok((reader, sink, pipes)),
            _ => Err(switchyard_proto::Error::Malformed(
                "a return link's first frame does not name the listener's pipes",
            )),
        },
        Some(_) => Err(switchyard_proto::Error::Malformed(
            "a return link's first frame does not name the listener's pipes",
        )),
        None => Err(switchyard_proto::Error::Closed),
    }
}

fn send_or_log(router: &FrameSink, answer: Envelope) {
    if let Err(refused) = router.send(answer) {
        tracing::warn!(%refused, "answer to the router dropped");
    }
}

/// Tells the router these requests are answered.
pub(crate) fn completed(router: &FrameSink, requests: Vec<(u64, u64)>) {
    if requests.is_empty() {
        return;
    }
    match Envelope::control(&Control::Completed { requests }) {
        Ok(env) => {
            if let Err(refused) = router.send(env) {
                // The router's deadline sweep closes them instead.
                tracing::warn!(%refused, "completions not sent to the router");
            }
        }
        Err(err) => tracing::error!(%err, "cannot encode completions"),
    }
}

/// The pipe a listener's request came on, if it is one.
pub(crate) fn pipe_of(origin: Origin) -> Option<u64> {
    match origin {
        Origin::Pipe(pipe) => Some(pipe),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use switchyard_proto::link::{Transport, set_transport};
    use switchyard_proto::transport::spawn_writer;
    use switchyard_proto::{DEFAULT_MAX_FRAME, EventType, Meta};

    /// The instance's link to the router, and the router's end of it.
    fn router() -> (FrameSink, FrameReader<OwnedReadHalf>) {
        let (ours, theirs) = tokio::net::UnixStream::pair().unwrap();
        let (sink, _writer) = spawn_writer(ours, 64, DEFAULT_MAX_FRAME);
        let (read, _write) = theirs.into_split();
        (sink, FrameReader::new(read, DEFAULT_MAX_FRAME))
    }

    fn answer(pipe: u64, correlation: u64) -> Envelope {
        let mut request = Envelope::request(EventType::of("t"), correlation, Bytes::new());
        request.origin = Origin::Pipe(pipe);
        Envelope::response_to(&request, 200, Meta::default(), Bytes::from_static(b"ok"))
    }

    async fn next(reader: &mut FrameReader<OwnedReadHalf>) -> Envelope {
        tokio::time::timeout(Duration::from_secs(30), reader.next())
            .await
            .expect("a frame in time")
            .unwrap()
            .expect("the link stays open")
    }

    /// A listener refuses an offer by closing its end unread (a second
    /// offer of an instance it has a link from, one over its bound): the
    /// answer that waited for that link comes back through the router, on
    /// either transport. On the socket transport our end opens without the
    /// listener, and the answer used to be written into the closed link.
    async fn a_refused_offer_sends_its_answers_through_the_router() {
        let returns = Returns::default();
        let (sink, mut router) = router();
        let sent = returns.send(7, answer(7, 41), &sink, 64, DEFAULT_MAX_FRAME);
        assert!(matches!(sent, Ok(Sent::Held)), "the answer waits for the link");
        let offer = next(&mut router).await;
        assert!(returns::is_offer(&offer));
        let (socket, _instance) = returns::accept(offer).unwrap();
        drop(socket);
        let back = next(&mut router).await;
        assert_eq!((back.kind, back.correlation), (Kind::Response, 41));
        assert_eq!(back.origin, Origin::Pipe(7));
    }

    /// A listener that takes the offer names its pipes first: the answer
    /// that waited goes on the link, for another pipe it named too, and the
    /// router is told both are done.
    async fn a_taken_offer_carries_the_answers_of_every_pipe_named() {
        let returns = Returns::default();
        let (sink, mut router) = router();
        let sent = returns.send(7, answer(7, 41), &sink, 64, DEFAULT_MAX_FRAME);
        assert!(matches!(sent, Ok(Sent::Held)));
        let (socket, _instance) = returns::accept(next(&mut router).await).unwrap();
        let (mut link, listener) = link::open(socket, 64, DEFAULT_MAX_FRAME).await.unwrap();
        let pipes = Control::ReturnPipes { pipes: vec![7, 8] };
        listener.send(Envelope::control(&pipes).unwrap()).unwrap();
        let first = next(&mut link).await;
        assert_eq!((first.kind, first.correlation), (Kind::Response, 41));
        let told = next(&mut router).await;
        let Ok(Control::Completed { requests }) = told.decode_control() else {
            panic!("expected completions, got {told:?}")
        };
        assert_eq!(requests, vec![(7, 41)]);
        // Pipe 8 was named with the link: its answers go straight there.
        let sent = returns.send(8, answer(8, 42), &sink, 64, DEFAULT_MAX_FRAME);
        assert!(matches!(sent, Ok(Sent::Direct)));
        assert_eq!(next(&mut link).await.correlation, 42);
    }

    /// Both transports in one test: the transport is a process-wide
    /// setting, so they take turns rather than run side by side.
    #[test]
    fn offers_refused_and_taken_on_both_transports() {
        for transport in [Transport::Socket, Transport::Ring] {
            set_transport(transport);
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(a_refused_offer_sends_its_answers_through_the_router());
            runtime.block_on(a_taken_offer_carries_the_answers_of_every_pipe_named());
        }
        set_transport(Transport::default());
    }
}
