//! The manager's watchdog: a thread beside the host loop that kills the
//! process when one call into the plugin ([`Plugin::step`]) has not
//! returned within `group.handler_timeout_ms`.
//!
//! The host loop runs the plugin on its own thread, so a handler stuck in a
//! loop or on a lock stops the whole manager: every request to it would
//! wait for its deadline while the process still looks alive. Only a thread
//! that does not depend on the loop can notice. It logs the event types the
//! step carried and exits with [`EXIT_WATCHDOG`]; the router answers the
//! requests in flight with 503 when the connection drops, and the
//! supervisor restarts the manager (decision 0026).
//!
//! The cost on the data path is two uncontended lock round trips per step;
//! the thread wakes a few times per limit (at most once a second), never
//! per request.
//!
//! [`Plugin::step`]: crate::Plugin::step

use std::collections::HashMap;
use std::fmt::Write;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use switchyard_manager_abi::messages::{Description, ToPlugin};
use switchyard_proto::EventType;
use switchyard_proto::process::EXIT_WATCHDOG;

/// Inputs of a step named in the log line; the rest are counted.
const NAMED: usize = 8;

/// One input of a step, as the log line names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Input {
    Request(EventType),
    Notification(EventType),
    CallResult,
    JobResult,
    Wake,
    Timers,
    Cancel,
}

impl Input {
    fn of(input: &ToPlugin) -> Input {
        match input {
            ToPlugin::Request { event_type, .. } => Input::Request(*event_type),
            ToPlugin::Notification { event_type, .. } => Input::Notification(*event_type),
            ToPlugin::CallResult { .. } => Input::CallResult,
            ToPlugin::JobResult { .. } => Input::JobResult,
            ToPlugin::Wake => Input::Wake,
            ToPlugin::Timers { .. } => Input::Timers,
            ToPlugin::Cancel { .. } => Input::Cancel,
        }
    }
}

/// The step in progress, if any.
#[derive(Default)]
struct Step {
    since: Option<Instant>,
    /// Its first [`NAMED`] inputs.
    inputs: Vec<Input>,
    /// How many inputs it has in all.
    count: usize,
}

struct Shared {
    step: Mutex<Step>,
    /// Event type names the manager declared, for the log line.
    names: HashMap<EventType, String>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Step> {
        self.step.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn name(&self, ty: EventType) -> String {
        self.names
            .get(&ty)
            .cloned()
            .unwrap_or_else(|| format!("{:#x}", ty.0))
    }

    /// What the stuck step carries: `request stuck.Hang, timers (+3 more)`.
    fn describe(&self, step: &Step) -> String {
        let mut out = String::new();
        for (i, input) in step.inputs.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            let _ = match *input {
                Input::Request(ty) => write!(out, "request {}", self.name(ty)),
                Input::Notification(ty) => write!(out, "notification {}", self.name(ty)),
                Input::CallResult => write!(out, "the result of a call (an async handler)"),
                Input::JobResult => write!(out, "a job result (an async handler)"),
                Input::Wake => write!(out, "a wake-up (async handlers, housekeeping)"),
                Input::Timers => write!(out, "timers"),
                Input::Cancel => write!(out, "a cancelled request (its handler is dropped)"),
            };
        }
        if step.count > step.inputs.len() {
            let _ = write!(out, " (+{} more)", step.count - step.inputs.len());
        }
        out
    }
}

/// The host loop's side of the watchdog.
pub(crate) struct Watchdog {
    shared: Arc<Shared>,
}

/// A step in progress; dropping it says the step returned.
pub(crate) struct Stepping<'a> {
    shared: &'a Shared,
}

impl Drop for Stepping<'_> {
    fn drop(&mut self) {
        self.shared.lock().since = None;
    }
}

impl Watchdog {
    /// Starts the watchdog thread for steps of at most `limit`.
    pub(crate) fn start(limit: Duration, description: &Description) -> std::io::Result<Watchdog> {
        let shared = Arc::new(Shared {
            step: Mutex::default(),
            names: description
                .handles
                .iter()
                .map(|h| (h.event_type, h.name.clone()))
                .collect(),
        });
        let watched = shared.clone();
        std::thread::Builder::new()
            .name("watchdog".into())
            .spawn(move || watch(&watched, limit))?;
        Ok(Watchdog { shared })
    }

    /// Marks the start of a step over `inputs`, until the guard drops.
    pub(crate) fn step(&self, inputs: &[ToPlugin]) -> Stepping<'_> {
        let mut step = self.shared.lock();
        step.since = Some(Instant::now());
        step.inputs.clear();
        step.inputs.extend(inputs.iter().take(NAMED).map(Input::of));
        step.count = inputs.len();
        Stepping { shared: &self.shared }
    }
}

fn watch(shared: &Shared, limit: Duration) {
    // Late by at most a tenth of the limit.
    let tick = (limit / 10).clamp(Duration::from_millis(10), Duration::from_secs(1));
    loop {
        std::thread::sleep(tick);
        let step = shared.lock();
        let Some(since) = step.since else { continue };
        let stuck = since.elapsed();
        if stuck <= limit {
            continue;
        }
        tracing::error!(
            handler = %shared.describe(&step),
            stuck_ms = stuck.as_millis() as u64,
            "watchdog: the manager has not come back from its handler within group.handler_timeout_ms ({} ms); \
             killing this process (exit code {EXIT_WATCHDOG}) so that the supervisor restarts it",
            limit.as_millis()
        );
        // Not `exit`: its atexit handlers could wait on what the stuck
        // handler holds. Nothing of this process is worth saving.
        // SAFETY: `_exit` has no preconditions; it ends the process at once.
        unsafe { libc::_exit(i32::from(EXIT_WATCHDOG)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_proto::control::HandledType;

    #[test]
    fn the_log_line_names_the_event_types_of_the_stuck_step() {
        let description = Description {
            handles: vec![HandledType {
                name: "stuck.Hang".into(),
                event_type: EventType::of("stuck.Hang"),
                route: None,
                needs: Default::default(),
                public: false,
            }],
            ..Description::default()
        };
        // Long enough never to fire in this test.
        let dog = Watchdog::start(Duration::from_secs(3600), &description).unwrap();
        let request = |name: &str| ToPlugin::Request {
            correlation: 1,
            event_type: EventType::of(name),
            meta: Default::default(),
            body: Default::default(),
            stream: None,
            caller: switchyard_manager_abi::messages::Caller::Client,
            context: Default::default(),
        };
        let mut inputs = vec![request("stuck.Hang"), ToPlugin::Timers { ahead_ms: 0 }];
        inputs.extend((0..10).map(|_| ToPlugin::Wake));
        let guard = dog.step(&inputs);
        let text = dog.shared.describe(&dog.shared.lock());
        assert!(
            text.starts_with("request stuck.Hang, timers, a wake-up"),
            "{text}"
        );
        assert!(text.ends_with("(+4 more)"), "{text}");
        drop(guard);
        assert!(dog.shared.lock().since.is_none());
    }
}
