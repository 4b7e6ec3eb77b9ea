//! What a plugin calls back into the host for, from any of its threads
//! (`HostApi`): a log line, named by the request it is about, and a
//! wake-up of the host loop. The loader hands these to the plugin; the
//! host loop (`serve`) keeps the request names they read
//! and waits on the wake-ups.

use std::collections::HashMap;

use switchyard_manager_abi::messages::LogLevel;
use switchyard_proto::event::{META_TIMING, META_TRACEPARENT};

/// The request id and trace context of each request in the plugin's hands
/// that has one, by the local id the plugin knows it by: the plugin's log
/// lines name only that, and may come from any of its threads
/// (`HostApi::log`).
static REQUEST_IDS: std::sync::LazyLock<std::sync::Mutex<HashMap<u64, Tags>>> =
    std::sync::LazyLock::new(Default::default);

pub(crate) fn request_ids() -> std::sync::MutexGuard<'static, HashMap<u64, Tags>> {
    REQUEST_IDS.lock().unwrap_or_else(|p| p.into_inner())
}

/// What names a request in log lines and its response's meta.
#[derive(Clone, Debug, Default)]
pub(crate) struct Tags {
    pub(crate) request_id: Option<Box<str>>,
    /// Its W3C `traceparent` (META_TRACEPARENT).
    traceparent: Option<Box<str>>,
    /// When it arrived, if the listener asked for its time
    /// (`[tracing] server_timing`).
    arrived: Option<std::time::Instant>,
}

impl Tags {
    pub(crate) fn of(meta: &switchyard_proto::Meta) -> Option<Tags> {
        let tags = Tags {
            request_id: meta.request_id().map(Into::into),
            traceparent: meta.get(META_TRACEPARENT).map(Into::into),
            arrived: meta.get(META_TIMING).map(|_| std::time::Instant::now()),
        };
        (tags.request_id.is_some() || tags.traceparent.is_some()).then_some(tags)
    }

    pub(crate) fn trace_id(&self) -> Option<&str> {
        self.traceparent.as_deref().and_then(|tp| tp.get(3..35))
    }

    /// Adds the request's id and trace context to `meta`.
    pub(crate) fn name(&self, meta: &mut switchyard_proto::Meta) {
        if let Some(id) = &self.request_id {
            meta.push(switchyard_proto::event::META_REQUEST_ID, &**id);
        }
        if let Some(tp) = &self.traceparent {
            meta.push(META_TRACEPARENT, &**tp);
        }
    }

    /// Names the request in its response's meta too, for the lines the
    /// router and broker may write about it; with its manager time when
    /// asked.
    pub(crate) fn stamp(&self, meta: &mut switchyard_proto::Meta) {
        self.name(meta);
        if let Some(arrived) = self.arrived {
            meta.push(
                switchyard_proto::event::META_MANAGER_MICROS,
                arrived.elapsed().as_micros().to_string(),
            );
        }
    }
}

/// Set by plugin threads (`HostApi::wake`): step the plugin soon.
pub(crate) static WAKE: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// Asks the host loop to step the plugin (from any thread).
pub(crate) fn wake() {
    WAKE.notify_one();
}

/// Logs a plugin's line through this process's `tracing` subscriber,
/// with the request id of the request it is about, if any.
pub(crate) fn log(level: LogLevel, correlation: u64, message: &str) {
    // Copied out: the lock is not held while the line is written.
    let tags = (correlation != 0)
        .then(|| request_ids().get(&correlation).cloned())
        .flatten()
        .unwrap_or_default();
    let request_id = tags.request_id.as_deref();
    let trace_id = tags.trace_id();
    match level {
        LogLevel::Error => tracing::error!(correlation, request_id, trace_id, "{message}"),
        LogLevel::Warn => tracing::warn!(correlation, request_id, trace_id, "{message}"),
        LogLevel::Info => tracing::info!(correlation, request_id, trace_id, "{message}"),
        LogLevel::Debug => tracing::debug!(correlation, request_id, trace_id, "{message}"),
    }
}
