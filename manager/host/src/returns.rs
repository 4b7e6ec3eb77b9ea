//! This instance's return links to listener pipes (decision 0143): one per
//! pipe that sent it a request, offered through the router on the first
//! answer for that pipe and used for every answer once the listener has
//! opened it. Until then, and whenever a link is full or gone, an answer
//! goes back through the router as before, so the direct path is only ever
//! a shortcut.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use switchyard_proto::transport::FrameSink;
use switchyard_proto::{Envelope, link, returns};

/// How long a pipe whose listener did not take the offer goes without a
/// new one: a listener that refuses links (or is gone) gets one offer per
/// period, not one per answer.
const REOFFER_AFTER: Duration = Duration::from_secs(10);

enum State {
    /// Offered; the listener has not opened its end yet.
    Opening,
    Open(FrameSink),
    /// The offer failed at this instant.
    Refused(Instant),
}

/// The links by the broker's id of their pipe.
#[derive(Clone, Default)]
pub(crate) struct Returns {
    links: Arc<Mutex<HashMap<u64, State>>>,
}

impl Returns {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, State>> {
        self.links.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes `answer` into pipe `pipe`'s return link; gives it back when
    /// it must go through the router instead (no link open yet, full, or
    /// gone), offering a link through `router` when there is none.
    pub(crate) fn send(
        &self,
        pipe: u64,
        answer: Envelope,
        router: &FrameSink,
        capacity: usize,
        max_frame: usize,
    ) -> Result<(), Envelope> {
        let mut links = self.lock();
        match links.get(&pipe) {
            Some(State::Open(sink)) => match sink.send(answer) {
                Ok(()) => Ok(()),
                Err(refused) => {
                    if !refused.full {
                        links.remove(&pipe);
                    }
                    Err(*refused.envelope)
                }
            },
            Some(State::Opening) => Err(answer),
            Some(State::Refused(at)) if at.elapsed() < REOFFER_AFTER => Err(answer),
            _ => {
                match returns::offer(pipe) {
                    Ok((socket, offer)) => match router.send(offer) {
                        Ok(()) => {
                            links.insert(pipe, State::Opening);
                            tokio::spawn(self.clone().open(pipe, socket, capacity, max_frame));
                        }
                        Err(refused) => tracing::debug!(%refused, pipe, "return-link offer not sent"),
                    },
                    Err(err) => {
                        tracing::warn!(%err, pipe, "cannot make a return link");
                        links.insert(pipe, State::Refused(Instant::now()));
                    }
                }
                Err(answer)
            }
        }
    }

    /// Opens our end once the listener opens its; holds the link until the
    /// listener closes it (its pipe reconnected, or it exited).
    async fn open(self, pipe: u64, socket: tokio::net::UnixStream, capacity: usize, max_frame: usize) {
        match link::open(socket, capacity, max_frame).await {
            Ok((mut reader, sink)) => {
                tracing::debug!(pipe, "return link open");
                self.lock().insert(pipe, State::Open(sink));
                // Nothing comes this way; the read ends when the listener's
                // end closes.
                let mut batch = Vec::new();
                while let Ok(true) = reader.read_batch(&mut batch).await {
                    batch.clear();
                }
                tracing::debug!(pipe, "return link closed by the listener");
                self.lock().remove(&pipe);
            }
            Err(err) => {
                tracing::debug!(%err, pipe, "return link not taken");
                self.lock().insert(pipe, State::Refused(Instant::now()));
            }
        }
    }

    /// Waits, at most `within`, until what the links hold is written: an
    /// instance that stops must not take its last answers with it.
    pub(crate) async fn flush(&self, within: Duration) {
        let until = tokio::time::Instant::now() + within;
        loop {
            let queued: usize = self
                .lock()
                .values()
                .map(|s| match s {
                    State::Open(sink) => sink.queued(),
                    _ => 0,
                })
                .sum();
            if queued == 0 || tokio::time::Instant::now() >= until {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}
