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
use switchyard_proto::transport::FrameSink;
use switchyard_proto::{Envelope, Kind, Origin, link, returns};

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

    /// Opens our end once the listener opens its, sends the answers that
    /// waited, and holds the link until the listener closes it (it
    /// exited) or already had one from us.
    async fn open(
        self,
        pipe: u64,
        socket: tokio::net::UnixStream,
        router: FrameSink,
        capacity: usize,
        max_frame: usize,
    ) {
        let (mut reader, sink) = match link::open(socket, capacity, max_frame).await {
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
