//! What every request of this process shares: the return pipes to the
//! broker, the configuration, and the shared memory kept for request bodies.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use switchyard_proto::Payload;
use switchyard_proto::pool::SegmentPool;

use crate::access::AccessLog;
use crate::config::Config;
use crate::pipes::Pool;
use switchyard_middleware::Middleware;

pub(crate) struct State {
    /// The return pipes: every request and session goes through them.
    pub(crate) pool: Arc<Pool>,
    pub(crate) config: Arc<Config>,
    /// Rate limits, authentication and security headers (built once per
    /// generation of the configuration); requests use the newest one
    /// ([`State::policy`]), which the pool holds.
    pub(crate) middleware: Arc<Middleware>,
    /// Reusable shared memory for large request bodies (decision 0011);
    /// shared by every generation of the configuration.
    pub(crate) segments: Arc<Mutex<SegmentPool>>,
    /// The access log, opened (a file: reopened) per generation; `None`
    /// when off.
    pub(crate) access: Option<AccessLog>,
}

/// Shared memory a listener process keeps for reuse by request bodies.
const SEGMENT_POOL_BYTES: usize = 64 * 1024 * 1024;
/// A pooled body not released by its manager within this long is taken for
/// lost (its segment is replaced, never rewritten under a reader).
const SEGMENT_LEASE: Duration = Duration::from_secs(120);
/// A free segment unused this long is released.
const SEGMENT_IDLE: Duration = Duration::from_secs(10);

impl State {
    /// The state of a listener process whose pipes are `pool`; idle request
    /// segments go back to the kernel after a while, for as long as the
    /// state lives.
    pub(crate) fn start(
        pool: Arc<Pool>,
        config: Arc<Config>,
        middleware: Arc<Middleware>,
        access: Option<AccessLog>,
    ) -> Arc<State> {
        let segments = Arc::new(Mutex::new(SegmentPool::new(SEGMENT_POOL_BYTES, SEGMENT_LEASE)));
        // A weak reference: the task must not keep the segments alive.
        let trimmed = Arc::downgrade(&segments);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(2));
            loop {
                tick.tick().await;
                let Some(segments) = trimmed.upgrade() else { return };
                segments
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .trim(SEGMENT_IDLE);
            }
        });
        Arc::new(State {
            pool,
            config,
            middleware,
            segments,
            access,
        })
    }

    /// The state of a reloaded configuration: the same pipes and request
    /// body memory, the new settings (see [`crate::server::Update`]).
    pub(crate) fn reconfigured(
        &self,
        config: Arc<Config>,
        middleware: Arc<Middleware>,
        access: Option<AccessLog>,
    ) -> Arc<State> {
        Arc::new(State {
            pool: self.pool.clone(),
            config,
            middleware,
            segments: self.segments.clone(),
            access,
        })
    }

    /// The middleware requests are admitted by: the newest configuration's,
    /// also for connections accepted under an older one, so that a reload
    /// that removes a key or tightens a rule holds at once on kept-alive
    /// connections and long-lived gRPC channels too.
    pub(crate) fn policy(&self) -> Arc<Middleware> {
        self.pool.policy().middleware
    }

    /// A request body as the event carries it: inline below the threshold,
    /// else written once into a reusable segment (a request has one
    /// consumer, the manager that serves it), else a one-shot memfd.
    pub(crate) fn request_payload(&self, body: Bytes) -> switchyard_proto::Result<Payload> {
        if body.len() >= self.config.shm_threshold {
            let placed = self
                .segments
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .place(&body)?;
            if let Some(pooled) = placed {
                return Ok(Payload::Shm(pooled));
            }
        }
        Payload::for_body(body, self.config.shm_threshold)
    }
}
