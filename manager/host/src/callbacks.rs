//! What a plugin calls back into the host for, from any of its threads
//! (`HostApi`): a log line, named by the request it is about, and a
//! wake-up of the host loop. The loader hands these to the plugin; the
//! host loop (`serve`) keeps the request names they read
//! and waits on the wake-ups.

use rustc_hash::FxHashMap;

use switchyard_manager_abi::messages::LogLevel;
use switchyard_proto::RequestContext;
use switchyard_proto::event::META_TIMING;

/// The request id and trace context of each request in the plugin's hands
/// that has one, by the local id the plugin knows it by: the plugin's log
/// lines name only that, and may come from any of its threads
/// (`HostApi::log`). Keyed by the host's own counter, not by anything a
/// client chooses: no SipHash needed against flooding.
static REQUEST_IDS: std::sync::LazyLock<std::sync::Mutex<FxHashMap<u64, Tags>>> =
    std::sync::LazyLock::new(Default::default);

pub(crate) fn request_ids() -> std::sync::MutexGuard<'static, FxHashMap<u64, Tags>> {
    REQUEST_IDS.lock().unwrap_or_else(|p| p.into_inner())
}

/// What names a request in log lines and its response.
#[derive(Clone, Debug, Default)]
pub(crate) struct Tags {
    /// Its id and trace context, as the envelope carried them.
    pub(crate) context: RequestContext,
    /// When it arrived, if the listener asked for its time
    /// (`[tracing] server_timing`).
    arrived: Option<std::time::Instant>,
}

impl Tags {
    pub(crate) fn of(env: &switchyard_proto::Envelope) -> Option<Tags> {
        let arrived = env.meta.get(META_TIMING).map(|_| std::time::Instant::now());
        (!env.context.is_empty() || arrived.is_some()).then(|| Tags {
            context: env.context.clone(),
            arrived,
        })
    }

    /// Names the request in its response too, for the lines the router
    /// and broker may write about it; with its manager time when asked.
    pub(crate) fn stamp(&self, env: &mut switchyard_proto::Envelope) {
        env.context = self.context.clone();
        if let Some(arrived) = self.arrived {
            env.meta.push(
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
    let request_id = tags.context.request_id_field();
    let trace_id = tags.context.trace_id_field();
    match level {
        LogLevel::Error => tracing::error!(correlation, request_id, trace_id, "{message}"),
        LogLevel::Warn => tracing::warn!(correlation, request_id, trace_id, "{message}"),
        LogLevel::Info => tracing::info!(correlation, request_id, trace_id, "{message}"),
        LogLevel::Debug => tracing::debug!(correlation, request_id, trace_id, "{message}"),
    }
}
