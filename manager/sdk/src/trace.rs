//! `tracing` in a plugin: the records a handler makes with `tracing::info!`
//! and its kin go to the manager host's log like [`Context::log`]'s, tagged
//! with the request being handled, so they carry its request id and trace
//! id (decision 0125).
//!
//! A `.so` links its own copy of `tracing`, which the host's subscriber
//! never sees; a plugin linked into the `switchyard` binary (the demo)
//! shares the host's, whose subscriber knows nothing of requests. Either
//! way, a handler registered with [`Registry::handle`](crate::Registry::handle)
//! runs, and each poll of its future is made, inside [`scoped`]: the SDK's
//! subscriber is the thread's default meanwhile, and knows the request.
//! Outside handlers (`create`, timers, jobs) a `.so`'s records go to the
//! host's log without a request: the SDK's subscriber is its global
//! default too.
//!
//! [`Context::log`]: crate::Context::log

use std::cell::RefCell;
use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::Poll;

use switchyard_manager_abi::messages::LogLevel;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Dispatch, Event, Level, Metadata, Subscriber};

use crate::context::{Context, Shared};

thread_local! {
    /// The manager and request whose handler runs on this thread now, and
    /// the dispatcher that was the default before (the host's, when the
    /// plugin shares its `tracing`): the host's log goes through it.
    static CURRENT: RefCell<Option<(Scope, Dispatch)>> = const { RefCell::new(None) };
    /// Lines for a host that shares this `tracing`, held until its
    /// dispatcher is the default again (it cannot be while one of ours
    /// runs: `tracing` does not re-enter).
    static PENDING: RefCell<Vec<(LogLevel, u64, String)>> = const { RefCell::new(Vec::new()) };
}

/// The SDK's subscriber, made once.
fn dispatch() -> &'static Dispatch {
    static DISPATCH: std::sync::OnceLock<Dispatch> = std::sync::OnceLock::new();
    DISPATCH.get_or_init(|| Dispatch::new(HostLog))
}

/// The manager and request of a context.
pub(crate) type Scope = (Rc<Shared>, u64);

pub(crate) fn scope_of(cx: &Context) -> Scope {
    (cx.shared.clone(), cx.correlation)
}

/// Runs `f` with `scope`'s request as the one `tracing` records belong to.
pub(crate) fn scoped<T>(scope: Scope, f: impl FnOnce() -> T) -> T {
    let outer = tracing::dispatcher::get_default(|d| d.clone());
    let previous = CURRENT.with(|c| c.replace(Some((scope.clone(), outer))));
    // Restored by a guard, so a panicking handler does not leave its
    // request current for the next one.
    struct Restore(Option<(Scope, Dispatch)>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0.take();
            CURRENT.with(|c| *c.borrow_mut() = previous);
        }
    }
    // Held lines go to the host once our dispatcher is no longer the
    // default: after `f` returns, and when it panics too (the panic hook's
    // own record, with its backtrace, is one of them).
    struct Flush(Scope);
    impl Drop for Flush {
        fn drop(&mut self) {
            let pending = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut()));
            for (level, correlation, line) in pending {
                self.0.0.log(level, correlation, &line);
            }
        }
    }
    let flush = Flush(scope);
    let restore = Restore(previous);
    let result = tracing::dispatcher::with_default(dispatch(), f);
    drop(restore);
    drop(flush);
    result
}

/// `future`, each of whose polls runs [`scoped`] to `scope`'s request.
pub(crate) fn in_scope<F: Future>(scope: Scope, future: F) -> Scoped<F> {
    Scoped {
        scope,
        future: Box::pin(future),
    }
}

pub(crate) struct Scoped<F> {
    scope: Scope,
    future: Pin<Box<F>>,
}

impl<F: Future> Future for Scoped<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, task: &mut std::task::Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        scoped(this.scope.clone(), || this.future.as_mut().poll(task))
    }
}

/// Where a record made outside any handler goes (in `create`, a timer, a
/// job's thread): the host's log without a request.
type Fallback = crate::context::LogSink;

static FALLBACK: std::sync::OnceLock<Fallback> = std::sync::OnceLock::new();

/// Makes the SDK's subscriber the plugin's global default, unless the
/// plugin set one of its own first. Called once the host's log is known.
pub(crate) fn install(fallback: Fallback) {
    let _ = FALLBACK.set(fallback);
    // An error here means another default is set already: the plugin's
    // own choice, which stands.
    let _ = tracing::dispatcher::set_global_default(dispatch().clone());
}

/// The subscriber: events become host log lines; spans are not kept (the
/// request's ids already say which request a line is about).
struct HostLog;

fn level_of(level: &Level) -> LogLevel {
    match *level {
        Level::ERROR => LogLevel::Error,
        Level::WARN => LogLevel::Warn,
        Level::INFO => LogLevel::Info,
        _ => LogLevel::Debug,
    }
}

/// An event's message, then its other fields as `name=value`.
#[derive(Default)]
struct Line {
    message: String,
    fields: String,
}

impl Visit for Line {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }
}

/// Formats an event as the line the host logs.
pub(crate) fn format(event: &Event<'_>) -> String {
    let mut line = Line::default();
    event.record(&mut line);
    line.message.push_str(&line.fields);
    line.message
}

impl Subscriber for HostLog {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        // The host filters by its own level; trace is below anything it logs.
        *metadata.level() <= Level::DEBUG
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::DEBUG)
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let level = level_of(event.metadata().level());
        let line = format(event);
        let current = CURRENT.with(|c| c.borrow().clone());
        match current {
            Some(((shared, correlation), outer)) => {
                if outer.is::<HostLog>() || outer.is::<tracing::subscriber::NoSubscriber>() {
                    // A host of its own `tracing` (a `.so`): at once.
                    shared.log(level, correlation, &line);
                } else {
                    // The host's records go to its subscriber, which is
                    // this thread's default again once the handler
                    // returns (or its future's poll does).
                    PENDING.with(|p| p.borrow_mut().push((level, correlation, line)));
                }
            }
            None => {
                if let Some(fallback) = FALLBACK.get() {
                    fallback(level, 0, &line);
                }
            }
        }
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}
