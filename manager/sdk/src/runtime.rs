//! The plugin side of the boundary: one manager instance, its handlers, and
//! a small single-threaded executor for async handlers.
//!
//! The host drives it with [`Runtime::step`]: a batch of inputs in, then
//! every task that can make progress runs, then the outputs (responses,
//! calls, notifications, logs) come back out. Nothing here blocks or spawns
//! threads; a panic in a handler becomes that request's 500.

use std::any::TypeId;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::rc::Rc;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context as TaskContext, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use switchyard_manager_abi::handover;
use switchyard_proto::{EventType, Meta};

use crate::context::{Context, DEFAULT_CALL_TIMEOUT, Shared};
use crate::event::Request;
use crate::middleware::{Erased, Flow, Incoming, Replacement, RequestHead, replacement_meta};
use crate::registry::{Config, JobFn, LocalFuture, Manager, Registry, RequestHandler, State};
use crate::reply::{Error, Format, Response, invalid_header};
use switchyard_manager_abi::messages::{
    Caller, CreateArgs, Description, FromPlugin, JobOutput, LogLevel, RawBody, ToPlugin,
};

/// Where a plugin's log lines go (the host's logger, across the ABI).
pub(crate) use crate::context::LogSink;

/// Asks the host to step the runtime soon (from any thread).
pub(crate) type WakeHost = Arc<dyn Fn() + Send + Sync>;

/// Shared memory a plugin keeps for reuse by large response bodies.
const SEGMENT_POOL_BYTES: usize = 64 * 1024 * 1024;
/// A pooled body not released by its consumer within this long is taken
/// for lost (its segment is replaced, never rewritten under a reader).
const SEGMENT_LEASE: Duration = Duration::from_secs(120);

/// A free segment not used for this long is released, at the next
/// `ToPlugin::Wake` (the host sends one every few seconds),
/// so memory goes back down after a burst of large responses.
const SEGMENT_IDLE: Duration = Duration::from_secs(10);

/// Upload handlers that finished on their threads, waiting to be answered.
type Finished = Arc<Mutex<Vec<(u64, Result<Response, Error>)>>>;

struct Task {
    future: LocalFuture<()>,
    correlation: u64,
}

/// Task ids whose futures were woken, and how to get the host to step us
/// when the waking happens outside a step (on another thread).
#[derive(Default)]
struct ReadyQueue {
    ids: Mutex<Vec<u64>>,
    host: Option<WakeHost>,
}

thread_local! {
    /// Set while this thread runs `Runtime::step`: a task woken then runs
    /// before the step returns, so the host need not be asked.
    static IN_STEP: Cell<bool> = const { Cell::new(false) };
}

struct TaskWaker {
    id: u64,
    queue: Arc<ReadyQueue>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.queue
            .ids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(self.id);
        // Woken from elsewhere (a thread of the plugin's, a timer): ask
        // the host for a step now, not at its next input or idle tick.
        if !IN_STEP.with(Cell::get)
            && let Some(host) = &self.queue.host
        {
            host();
        }
    }
}

/// Marks this thread as inside a step until dropped.
struct Stepping;

impl Stepping {
    fn enter() -> Stepping {
        IN_STEP.with(|s| s.set(true));
        Stepping
    }
}

impl Drop for Stepping {
    fn drop(&mut self) {
        IN_STEP.with(|s| s.set(false));
    }
}

/// A request some middleware let through: whose `after` runs on its answer.
pub(crate) struct After {
    /// The first `through` middleware of the chain.
    through: usize,
    head: RequestHead,
    format: Format,
}

/// The manager's middleware and the requests whose answer still goes
/// through their `after` hooks: the runtime's alone (a [`Context`] never
/// runs middleware), handed to the tasks that answer requests.
struct Hooks {
    /// The middleware, outermost first.
    chain: RefCell<Vec<Box<dyn Erased>>>,
    after: RefCell<HashMap<u64, After>>,
}

/// How a request's `before` hooks ended, when not by passing it on.
enum Stopped {
    Answer(Result<Response, Error>),
    Replace(Replacement),
}

/// One manager instance and its executor.
pub(crate) struct Runtime<M: Manager> {
    state: Rc<RefCell<M>>,
    registry: Registry<M>,
    /// The names of the request types this manager serves.
    names: HashMap<EventType, String>,
    /// The context of work that is not a request (timers, notifications).
    no_request: Rc<Meta>,
    shared: Rc<Shared>,
    hooks: Rc<Hooks>,
    tasks: HashMap<u64, Task>,
    next_task: u64,
    ready: Arc<ReadyQueue>,
    /// Per timer of the registry: its interval and when it is next due.
    timers: Vec<(Duration, Instant)>,
    /// The earliest of `timers` as last told to the host
    /// (`FromPlugin::NextTimer`).
    told_next: Option<Instant>,
    /// Without one (in-process tests) upload handlers run inline.
    wake: Option<WakeHost>,
    finished: Finished,
    /// Uploads whose handler runs on its thread: a cancel cannot stop the
    /// thread, so it marks them `abandoned` and their answer is dropped.
    uploading: HashSet<u64>,
    abandoned: HashSet<u64>,
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into())
}

impl<M: Manager> Runtime<M> {
    /// Creates the manager with its config. An error is the reason the
    /// manager cannot start.
    pub(crate) fn create(
        args: CreateArgs,
        log: Option<LogSink>,
        wake: Option<WakeHost>,
    ) -> Result<(Self, Description), Error> {
        let mut value: serde_json::Value = if args.config_json.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_str(&args.config_json)
                .map_err(|e| Error::internal(format!("manager config is not JSON: {e}")))?
        };
        // The supervisor's web settings are the SDK's, not the manager's.
        let web = match &mut value {
            serde_json::Value::Object(map) => map.remove(crate::web::WEB_CONFIG_KEY),
            _ => None,
        };
        let config = Config {
            name: args.name.clone(),
            instance: args.instance,
            value: value.clone(),
            validation: args.validation,
        };
        if args.shm_budget > 0 {
            // A plugin library has its own copy of the accounting.
            switchyard_proto::shm::set_budget(args.shm_budget);
        }
        let manager = M::create(&config)?;
        let mut registry = Registry::new();
        M::register(&mut registry);
        let description = Description {
            kind: M::NAME.to_owned(),
            handles: registry.handled(),
            subscribes: registry.subscribes.clone(),
            notifications: registry.notification_types.clone(),
            timers: !registry.timers.is_empty(),
            types: if args.validation {
                registry.described()
            } else {
                Vec::new()
            },
        };
        let shared = Rc::new(Shared {
            outbox: RefCell::new(Vec::new()),
            calls: RefCell::new(HashMap::new()),
            next_call: Cell::new(1),
            config: value,
            name: args.name,
            instance: args.instance,
            log,
            shm_threshold: usize::try_from(args.shm_threshold).unwrap_or(usize::MAX),
            segments: RefCell::new(switchyard_proto::pool::SegmentPool::new(
                SEGMENT_POOL_BYTES,
                SEGMENT_LEASE,
            )),
            expose_errors: args.expose_errors,
            templates: crate::web::Templates::new(web.as_ref(), registry.routes()),
            html: RefCell::new(HashMap::new()),
            naming: RefCell::new(HashMap::new()),
        });
        let hooks = Rc::new(Hooks {
            chain: RefCell::new(std::mem::take(&mut registry.middleware)),
            after: RefCell::new(HashMap::new()),
        });
        let names = registry
            .handles
            .iter()
            .map(|h| (h.event_type, h.name.clone()))
            .collect();
        let now = Instant::now();
        let timers = registry
            .timers
            .iter()
            .map(|t| {
                let every = (t.interval)(&manager).max(Duration::from_millis(1));
                (every, now + every)
            })
            .collect();
        let runtime = Runtime {
            timers,
            told_next: None,
            state: Rc::new(RefCell::new(manager)),
            registry,
            names,
            no_request: Rc::new(Meta::default()),
            shared,
            hooks,
            tasks: HashMap::new(),
            next_task: 0,
            ready: Arc::new(ReadyQueue {
                ids: Mutex::default(),
                host: wake.clone(),
            }),
            wake,
            finished: Arc::default(),
            uploading: HashSet::new(),
            abandoned: HashSet::new(),
        };
        Ok((runtime, description))
    }

    /// Feeds `inputs`, runs every task that can progress, returns the outputs.
    pub(crate) fn step(&mut self, inputs: Vec<ToPlugin>) -> Vec<FromPlugin> {
        let _stepping = Stepping::enter();
        for input in inputs {
            match input {
                ToPlugin::Request {
                    correlation,
                    event_type,
                    meta,
                    body,
                    stream,
                    caller,
                    context,
                } => {
                    if !context.is_empty() {
                        self.shared
                            .naming
                            .borrow_mut()
                            .insert(correlation, Rc::new(crate::context::Naming::new(context)));
                    }
                    let stream = stream.map(handover::adopt_stream);
                    self.on_request(correlation, event_type, meta, body, stream, caller)
                }
                // Also the host's idle tick: housekeeping goes here, off
                // the path of requests.
                ToPlugin::Wake => self.shared.segments.borrow_mut().trim(SEGMENT_IDLE),
                ToPlugin::Timers { ahead_ms } => {
                    self.run_timers(Instant::now() + Duration::from_millis(ahead_ms));
                    // The host forgets when we said once it steps the
                    // timers: it is told again after this step.
                    self.told_next = None;
                }
                ToPlugin::Notification {
                    event_type,
                    meta,
                    body,
                } => self.on_notification(event_type, &meta, &body),
                ToPlugin::CallResult {
                    call,
                    status,
                    meta,
                    body,
                } => {
                    if let Some(slot) = self.shared.calls.borrow_mut().get_mut(&call) {
                        slot.result = Some((status, meta, body));
                        if let Some(waker) = slot.waker.take() {
                            waker.wake();
                        }
                    }
                }
                ToPlugin::JobResult { job, status, body } => {
                    if let Some(slot) = self.shared.calls.borrow_mut().get_mut(&job) {
                        slot.result = Some((status, Meta::default(), body));
                        if let Some(waker) = slot.waker.take() {
                            waker.wake();
                        }
                    }
                }
                ToPlugin::Cancel { correlation } => self.cancel(correlation),
            }
        }
        self.run_ready();
        let finished = std::mem::take(&mut *self.finished.lock().unwrap_or_else(|p| p.into_inner()));
        for (correlation, result) in finished {
            self.uploading.remove(&correlation);
            if self.abandoned.remove(&correlation) {
                continue;
            }
            self.respond(correlation, result);
        }
        self.tell_next_timer();
        std::mem::take(&mut *self.shared.outbox.borrow_mut())
    }

    /// Tells the host when the earliest timer is due, if that moved, so
    /// that it steps an idle manager then instead of every `TICK_PERIOD`.
    fn tell_next_timer(&mut self) {
        let Some(next) = self.timers.iter().map(|&(_, next)| next).min() else {
            return;
        };
        if self.told_next == Some(next) {
            return;
        }
        self.told_next = Some(next);
        // Rounded up, so that the host's step finds the timer due.
        let wait = next.saturating_duration_since(Instant::now());
        let in_ms = u64::try_from(wait.as_micros().div_ceil(1000)).unwrap_or(u64::MAX);
        self.shared
            .outbox
            .borrow_mut()
            .push(FromPlugin::NextTimer { in_ms });
    }

    fn context(&self, correlation: u64, format: Format, request: Rc<Meta>, caller: Caller) -> Context {
        let naming = (correlation != 0)
            .then(|| self.shared.naming.borrow().get(&correlation).cloned())
            .flatten();
        Context {
            shared: self.shared.clone(),
            correlation,
            format,
            request,
            client: caller == Caller::Client,
            naming,
        }
    }

    /// A context outside any request.
    fn background(&self, format: Format) -> Context {
        self.context(0, format, self.no_request.clone(), Caller::Manager)
    }

    fn respond(&self, correlation: u64, result: Result<Response, Error>) {
        respond(&self.shared, &self.hooks, correlation, result);
    }

    fn on_request(
        &mut self,
        correlation: u64,
        event_type: EventType,
        meta: Meta,
        body: Bytes,
        stream: Option<switchyard_proto::StreamHandle>,
        caller: Caller,
    ) {
        if self.registry.uploads.contains_key(&event_type) {
            return self.on_upload(correlation, event_type, &meta, body, stream, caller);
        }
        if stream.is_some() {
            return self.respond(
                correlation,
                Err(Error::internal(
                    "a streamed body reached a handler that is not an upload",
                )),
            );
        }
        if !self.registry.requests.contains_key(&event_type) {
            return self.respond(
                correlation,
                Err(Error::not_found("this manager has no handler for the event type")),
            );
        }
        let template = self
            .registry
            .templates
            .get(&event_type)
            .copied()
            .filter(|_| self.shared.templates.available());
        let format = match crate::web::choose(meta.get("accept"), template) {
            Ok(crate::web::Choice::Encoded(format)) => {
                if template.is_some() {
                    self.shared.html.borrow_mut().insert(correlation, None);
                }
                format
            }
            Ok(crate::web::Choice::Html(template)) => {
                // The handler encodes JSON; `respond` renders it.
                self.shared.html.borrow_mut().insert(correlation, Some(template));
                Format::Json
            }
            Err(not_acceptable) => return self.respond(correlation, Ok(not_acceptable)),
        };
        let mut meta = Rc::new(meta);
        if !self.hooks.chain.borrow().is_empty() {
            match self.before(correlation, event_type, &mut meta, &body, caller, format) {
                None => {}
                Some(Stopped::Answer(answer)) => return self.respond(correlation, answer),
                Some(Stopped::Replace(replacement)) => {
                    return self.replace(correlation, replacement, &meta, format);
                }
            }
        }
        self.run_handler(correlation, event_type, meta, body, caller, format);
    }

    /// Runs the middleware's `before` hooks; `None` when every one passed
    /// the request on. Remembers which let it through, for their `after`.
    fn before(
        &mut self,
        correlation: u64,
        event_type: EventType,
        meta: &mut Rc<Meta>,
        body: &[u8],
        caller: Caller,
        format: Format,
    ) -> Option<Stopped> {
        let mut cx = self.context(correlation, format, meta.clone(), caller);
        let name = self.names.get(&event_type).map(String::as_str);
        let mut through = 0;
        let mut stopped = None;
        {
            let mut chain = self.hooks.chain.borrow_mut();
            for middleware in chain.iter_mut() {
                let mut incoming = Incoming {
                    event_type,
                    name,
                    meta: &mut *meta,
                    body,
                    caller,
                    naming: cx.naming.clone(),
                };
                let flow = catch_unwind(AssertUnwindSafe(|| middleware.before(&mut incoming, &mut cx)));
                match flow {
                    Ok(Ok(Flow::Continue)) => through += 1,
                    Ok(Ok(Flow::Respond(response))) => stopped = Some(Stopped::Answer(Ok(response))),
                    Ok(Ok(Flow::Replace(replacement))) => {
                        through += 1;
                        stopped = Some(Stopped::Replace(replacement));
                    }
                    Ok(Err(err)) => stopped = Some(Stopped::Answer(Err(err))),
                    Err(panic) => {
                        let message = format!(
                            "middleware {} panicked: {}",
                            middleware.name(),
                            panic_message(&*panic)
                        );
                        self.shared.log(LogLevel::Error, correlation, &message);
                        stopped = Some(Stopped::Answer(Err(Error::internal("a middleware panicked"))));
                    }
                }
                if stopped.is_some() {
                    break;
                }
            }
        }
        if through > 0 {
            self.hooks.after.borrow_mut().insert(
                correlation,
                After {
                    through,
                    head: RequestHead {
                        event_type,
                        name: name.map(str::to_owned),
                        meta: meta.clone(),
                        caller,
                        naming: cx.naming.clone(),
                    },
                    format,
                },
            );
        }
        stopped
    }

    /// Handles a middleware's replacement event: here when this manager
    /// serves its type (as trusted input: a middleware built it), else by
    /// whichever manager does, through the router.
    fn replace(&mut self, correlation: u64, replacement: Replacement, request: &Meta, format: Format) {
        let meta = replacement_meta(request, replacement.name);
        if self.registry.requests.contains_key(&replacement.event_type) {
            return self.run_handler(
                correlation,
                replacement.event_type,
                Rc::new(meta),
                replacement.body,
                Caller::Manager,
                format,
            );
        }
        let cx = self.context(correlation, format, Rc::new(request.clone()), Caller::Manager);
        let call = cx.call_raw(
            replacement.event_type,
            meta,
            replacement.body,
            DEFAULT_CALL_TIMEOUT,
        );
        let (shared, hooks) = (self.shared.clone(), self.hooks.clone());
        self.spawn(
            correlation,
            Box::pin(async move {
                let (status, meta, body) = call.await;
                let meta = Meta(
                    meta.0
                        .into_iter()
                        .filter(|(k, _)| !switchyard_proto::event::is_context_key(k))
                        .collect(),
                );
                let response = Response {
                    status,
                    meta,
                    body,
                    stream: None,
                };
                respond(&shared, &hooks, correlation, Ok(response));
            }),
        );
    }

    /// Decodes the event and runs its handler (inline, or as a task).
    fn run_handler(
        &mut self,
        correlation: u64,
        event_type: EventType,
        meta: Rc<Meta>,
        body: Bytes,
        caller: Caller,
        format: Format,
    ) {
        let Some(handler) = self.registry.requests.get(&event_type) else {
            return self.respond(
                correlation,
                Err(Error::not_found("this manager has no handler for the event type")),
            );
        };
        let request = Request::from_caller(&meta, &body, caller);
        let mut cx = self.context(correlation, format, meta.clone(), caller);
        match handler {
            RequestHandler::Sync(handler) => {
                let state = &self.state;
                let result = catch_unwind(AssertUnwindSafe(|| {
                    handler(&mut state.borrow_mut(), &request, &mut cx)
                }));
                let result = result.unwrap_or_else(|panic| Err(self.panicked(correlation, &*panic)));
                self.respond(correlation, result);
            }
            RequestHandler::Async(handler) => {
                let state = State(self.state.clone());
                match catch_unwind(AssertUnwindSafe(|| handler(state, &request, cx))) {
                    Ok(Ok(future)) => {
                        let (shared, hooks) = (self.shared.clone(), self.hooks.clone());
                        self.spawn(
                            correlation,
                            Box::pin(async move {
                                let result = future.await;
                                respond(&shared, &hooks, correlation, result);
                            }),
                        );
                    }
                    Ok(Err(err)) => self.respond(correlation, Err(err)),
                    Err(panic) => {
                        let err = self.panicked(correlation, &*panic);
                        self.respond(correlation, Err(err));
                    }
                }
            }
        }
    }

    /// Decodes an upload's event here, then reads its body and runs the
    /// handler on a stream thread; the answer comes back through
    /// `finished` and a wake-up of the host.
    fn on_upload(
        &mut self,
        correlation: u64,
        event_type: EventType,
        meta: &Meta,
        body: Bytes,
        stream: Option<switchyard_proto::StreamHandle>,
        caller: Caller,
    ) {
        let handler = &self.registry.uploads[&event_type];
        let reader = match stream {
            Some(handle) => crate::stream::BodyReader::pipe(handle),
            None => Ok(crate::stream::BodyReader::whole(body)),
        };
        let request = Request::from_caller(meta, &[], caller);
        let prepared = catch_unwind(AssertUnwindSafe(|| {
            reader.and_then(|reader| handler(&request, reader, Format::from_meta(meta)))
        }));
        let work = match prepared {
            Ok(Ok(work)) => work,
            Ok(Err(err)) => return self.respond(correlation, Err(err)),
            Err(panic) => {
                let err = self.panicked(correlation, &*panic);
                return self.respond(correlation, Err(err));
            }
        };
        let run = move || {
            catch_unwind(AssertUnwindSafe(work)).unwrap_or_else(|panic| {
                Err(Error::internal(format!(
                    "the upload handler panicked: {}",
                    panic_message(&*panic)
                )))
            })
        };
        let Some(wake) = self.wake.clone() else {
            // In-process tests: the body is already whole, run it here.
            let result = run();
            return self.respond(correlation, result);
        };
        let (finished, log) = (self.finished.clone(), self.shared.log.clone());
        let spawned = crate::stream::spawn_stream_thread(move |slot| {
            let result = run();
            if let (Err(err), Some(log)) = (&result, &log)
                && err.status == 500
            {
                log(LogLevel::Error, correlation, &err.message);
            }
            drop(slot);
            finished
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((correlation, result));
            wake();
        });
        match spawned {
            Ok(()) => {
                self.uploading.insert(correlation);
            }
            Err(err) => self.respond(correlation, Err(err)),
        }
    }

    fn on_notification(&mut self, event_type: EventType, meta: &Meta, body: &[u8]) {
        let Some(handler) = self.registry.notifications.get(&event_type) else {
            return;
        };
        let request = Request::new(meta, body);
        let mut cx = self.background(Format::Bincode);
        let state = &self.state;
        match catch_unwind(AssertUnwindSafe(|| {
            handler(&mut state.borrow_mut(), &request, &mut cx)
        })) {
            Ok(Ok(())) => {}
            Ok(Err(err)) => cx.log_at(LogLevel::Warn, &format!("notification handler failed: {err}")),
            Err(panic) => {
                let _ = self.panicked(0, &*panic);
            }
        }
    }

    /// Runs every timer that is due at `now` (several times if it fell a
    /// little behind; a timer more than ten periods late skips ahead).
    fn run_timers(&mut self, now: Instant) {
        for i in 0..self.timers.len() {
            let (every, mut next) = self.timers[i];
            if now.saturating_duration_since(next) > every * 10 {
                next = now;
            }
            while next <= now {
                next += every;
                let handler = self.registry.timers[i].handler;
                let mut cx = self.background(Format::Json);
                let state = &self.state;
                match catch_unwind(AssertUnwindSafe(|| handler(&mut state.borrow_mut(), &mut cx))) {
                    Ok(Ok(())) => {}
                    Ok(Err(err)) => cx.log_at(LogLevel::Warn, &format!("timer failed: {err}")),
                    Err(panic) => {
                        let _ = self.panicked(0, &*panic);
                    }
                }
            }
            self.timers[i].1 = next;
        }
    }

    fn panicked(&self, correlation: u64, panic: &(dyn std::any::Any + Send)) -> Error {
        self.shared.log(
            LogLevel::Error,
            correlation,
            &format!("handler panicked: {}", panic_message(panic)),
        );
        Error::internal("the handler panicked")
    }

    /// Request `correlation` is no longer wanted: its tasks are dropped
    /// (which gives up the jobs and calls they await: `FromPlugin::Cancel`),
    /// an upload still running on its thread is answered into the void,
    /// and nothing about it stays. Only on a cancel: the scan costs the
    /// requests in progress, and nothing is kept per request for it.
    fn cancel(&mut self, correlation: u64) {
        let ids: Vec<u64> = self
            .tasks
            .iter()
            .filter(|(_, task)| task.correlation == correlation)
            .map(|(&id, _)| id)
            .collect();
        for id in ids {
            if let Some(task) = self.tasks.remove(&id) {
                // A future's drop runs the handler's own code (its locals'
                // destructors): a panic there must not end the step.
                if let Err(panic) = catch_unwind(AssertUnwindSafe(move || drop(task))) {
                    let message = format!(
                        "a cancelled handler panicked as it was dropped: {}",
                        panic_message(&*panic)
                    );
                    self.shared.log(LogLevel::Error, correlation, &message);
                }
            }
        }
        if self.uploading.contains(&correlation) {
            self.abandoned.insert(correlation);
        }
        self.hooks.after.borrow_mut().remove(&correlation);
        self.shared.html.borrow_mut().remove(&correlation);
        self.shared.naming.borrow_mut().remove(&correlation);
    }

    fn spawn(&mut self, correlation: u64, future: LocalFuture<()>) {
        let id = self.next_task;
        self.next_task += 1;
        self.tasks.insert(id, Task { future, correlation });
        self.ready.ids.lock().unwrap_or_else(|p| p.into_inner()).push(id);
    }

    fn run_ready(&mut self) {
        loop {
            let ready = std::mem::take(&mut *self.ready.ids.lock().unwrap_or_else(|p| p.into_inner()));
            if ready.is_empty() {
                return;
            }
            for id in ready {
                let Some(task) = self.tasks.get_mut(&id) else {
                    continue;
                };
                let waker = Waker::from(Arc::new(TaskWaker {
                    id,
                    queue: self.ready.clone(),
                }));
                let mut cx = TaskContext::from_waker(&waker);
                match catch_unwind(AssertUnwindSafe(|| task.future.as_mut().poll(&mut cx))) {
                    Ok(Poll::Pending) => {}
                    Ok(Poll::Ready(())) => {
                        self.tasks.remove(&id);
                    }
                    Err(panic) => {
                        let correlation = task.correlation;
                        self.tasks.remove(&id);
                        let err = self.panicked(correlation, &*panic);
                        self.respond(correlation, Err(err));
                    }
                }
            }
        }
    }
}

type JobTable = Arc<HashMap<EventType, JobFn>>;

/// The job functions of manager type `M`, built once per process.
fn job_table<M: Manager>() -> JobTable {
    static TABLES: OnceLock<Mutex<HashMap<TypeId, JobTable>>> = OnceLock::new();
    let mut tables = TABLES
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    tables
        .entry(TypeId::of::<M>())
        .or_insert_with(|| {
            let mut registry = Registry::<M>::new();
            M::register(&mut registry);
            Arc::new(registry.jobs)
        })
        .clone()
}

/// Runs a job of manager type `M` statelessly, on the calling thread: no
/// instance needed, so worker threads and worker processes can call it. A
/// panic becomes a 500 result.
pub(crate) fn run_job<M: Manager>(job_type: EventType, input: &[u8]) -> JobOutput {
    let Some(f) = job_table::<M>().get(&job_type).cloned() else {
        return JobOutput {
            status: 404,
            body: Bytes::from_static(b"this manager has no job function of this type"),
        };
    };
    let result = catch_unwind(AssertUnwindSafe(|| f(input))).unwrap_or_else(|panic| {
        Err(Error::internal(format!(
            "the job panicked: {}",
            panic_message(&*panic)
        )))
    });
    match result {
        Ok(bytes) => JobOutput {
            status: 200,
            body: Bytes::from(bytes),
        },
        Err(err) => JobOutput {
            status: err.status,
            body: Bytes::from(err.message.into_bytes()),
        },
    }
}

/// Runs the `after` hooks of the middleware that let the request
/// through, innermost first; a panicking one turns the answer into a 500
/// and the rest still run.
fn after(shared: &Rc<Shared>, hooks: &Hooks, correlation: u64, response: &mut Response) {
    let Some(after) = hooks.after.borrow_mut().remove(&correlation) else {
        return;
    };
    let mut cx = Context {
        shared: shared.clone(),
        correlation,
        format: after.format,
        request: after.head.meta.clone(),
        client: false,
        naming: after.head.naming.clone(),
    };
    let mut chain = hooks.chain.borrow_mut();
    let through = after.through.min(chain.len());
    for middleware in chain[..through].iter_mut().rev() {
        let ran = catch_unwind(AssertUnwindSafe(|| {
            middleware.after(&after.head, response, &mut cx)
        }));
        if let Err(panic) = ran {
            let message = format!(
                "middleware {} panicked after the handler: {}",
                middleware.name(),
                panic_message(&*panic)
            );
            shared.log(LogLevel::Error, correlation, &message);
            *response = Error::internal("a middleware panicked").to_response(shared.expose_errors);
        }
    }
}

fn respond(shared: &Rc<Shared>, hooks: &Hooks, correlation: u64, result: Result<Response, Error>) {
    let expose_errors = shared.expose_errors;
    let mut response = result.unwrap_or_else(|err| err.to_response(expose_errors));
    after(shared, hooks, correlation, &mut response);
    let templated = shared.html.borrow_mut().remove(&correlation);
    shared.naming.borrow_mut().remove(&correlation);
    if let Some(template) = templated {
        if let Some(template) = template {
            response = shared.templates.html(template, response, |message| {
                shared.log(LogLevel::Error, correlation, message);
            });
        }
        crate::web::Templates::vary(&mut response);
    }
    if let Some(problem) = invalid_header(&response.meta) {
        // A handler's (or middleware's) bug: answered, never written out.
        shared.log(
            LogLevel::Error,
            correlation,
            &format!("the response is refused: {problem}"),
        );
        response = Error::internal("the handler set an invalid header").to_response(expose_errors);
    }
    let mut handle = match response.stream.take().map(handover::release_stream) {
        None => None,
        Some(Ok(raw)) => Some(RawBody::Stream(raw)),
        Some(Err(err)) => {
            response =
                Error::unavailable(format!("cannot hand over a stream: {err}")).to_response(expose_errors);
            None
        }
    };
    // A large body is written once, here, into a segment (a reusable one,
    // else one of its own): it crosses the boundary and the hops after it
    // as a descriptor. Passed inline instead, it would be copied twice more
    // (encoded for the boundary, decoded by the host) before the host wrote
    // it to shared memory anyway: 32 MiB of heap per 16 MiB reply, held
    // for a whole step's replies at once and kept by the allocator after.
    // Bytes the plugin sealed already (`shared_body`) go as they are.
    if handle.is_none() && response.body.len() >= shared.shm_threshold {
        let placed = if let Some(sealed) = switchyard_proto::ShmBody::of_shared(&response.body) {
            Ok(sealed)
        } else {
            let mut segments = shared.segments.borrow_mut();
            match segments.place(&response.body) {
                Ok(Some(pooled)) => Ok(pooled),
                Ok(None) => segments.place_once(&response.body),
                Err(err) => Err(err),
            }
        };
        match placed {
            // The process's shared memory is spoken for: as the host does.
            Err(switchyard_proto::Error::ShmBudget { .. }) => {
                let (meta, body) = switchyard_proto::Refusal::unavailable(
                    switchyard_proto::Hop::ManagerHost,
                    "response body unavailable; retry later",
                )
                .parts();
                response = Response {
                    status: 503,
                    meta,
                    body,
                    stream: None,
                };
            }
            placed => {
                let released = placed
                    .map_err(|err| err.to_string())
                    .and_then(|body| handover::release_body(&body).map_err(|err| err.to_string()));
                match released {
                    Ok(raw) => {
                        handle = Some(raw);
                        response.body = Bytes::new();
                    }
                    Err(err) => shared.log(
                        LogLevel::Warn,
                        correlation,
                        &format!("a large body goes inline: {err}"),
                    ),
                }
            }
        }
    }
    shared.outbox.borrow_mut().push(FromPlugin::Response {
        correlation,
        status: response.status,
        meta: response.meta,
        body: response.body,
        handle,
    });
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use serde::{Deserialize, Serialize};

    use super::*;
    use crate::{Config, Event, Manager, Registry, Reply};

    #[derive(Serialize, Deserialize, Event)]
    #[event(name = "t.Later")]
    struct Later {}

    #[derive(Serialize, Deserialize, Reply)]
    struct Done {
        ok: bool,
    }

    /// Completed, and woken, by another thread.
    #[derive(Clone, Default)]
    struct Remote(Arc<Mutex<(bool, Option<Waker>)>>);

    impl Future for Remote {
        type Output = ();
        fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<()> {
            let mut slot = self.0.lock().unwrap();
            if slot.0 {
                return Poll::Ready(());
            }
            slot.1 = Some(cx.waker().clone());
            Poll::Pending
        }
    }

    static REMOTE: Mutex<Option<Remote>> = Mutex::new(None);

    struct Waits;

    impl Manager for Waits {
        const NAME: &'static str = "waits";
        fn create(_: &Config) -> Result<Self, Error> {
            Ok(Waits)
        }
        #[allow(deprecated)] // the closure form `handle` cannot infer
        fn register(r: &mut Registry<Self>) {
            r.request_async(|_, _: Later, _| async {
                let remote = REMOTE.lock().unwrap().clone().expect("the test set it");
                remote.await;
                Ok(Done { ok: true })
            });
        }
    }

    #[derive(Serialize, Deserialize, Event)]
    #[event(name = "t.Work")]
    struct Work {}

    fn work(_: Work) -> Result<Done, Error> {
        Ok(Done { ok: true })
    }

    /// Awaits a job, the way `/cpu` does.
    struct Jobs;

    impl Manager for Jobs {
        const NAME: &'static str = "jobs";
        fn create(_: &Config) -> Result<Self, Error> {
            Ok(Jobs)
        }
        #[allow(deprecated)] // the closure form `handle` cannot infer
        fn register(r: &mut Registry<Self>) {
            r.request_async(|_, _: Later, cx| async move { cx.spawn_job::<Work, Done>(&Work {}).await })
                .job(work);
        }
    }

    fn later(correlation: u64) -> ToPlugin {
        let mut meta = Meta::default();
        meta.push("content-type", crate::BINCODE);
        ToPlugin::Request {
            correlation,
            event_type: EventType::of("t.Later"),
            meta,
            body: Bytes::from(switchyard_proto::codec::encode(&Later {}).unwrap()),
            stream: None,
            caller: switchyard_manager_abi::messages::Caller::Manager,
            context: Default::default(),
        }
    }

    #[test]
    fn a_cancelled_request_drops_its_handler_and_gives_up_its_job() {
        let (mut runtime, _) = Runtime::<Jobs>::create(args("jobs"), None, None).unwrap();
        let out = runtime.step(vec![later(3), later(4)]);
        let jobs: Vec<u64> = out
            .iter()
            .filter_map(|o| match o {
                FromPlugin::Job { job, correlation, .. } => Some((*correlation, *job)),
                _ => None,
            })
            .map(|(_, job)| job)
            .collect();
        assert_eq!(jobs.len(), 2, "each handler submits its job");

        let out = runtime.step(vec![ToPlugin::Cancel { correlation: 3 }]);
        assert!(
            matches!(out.as_slice(), [FromPlugin::Cancel { id }] if *id == jobs[0]),
            "the cancelled handler's job is given up, nothing answers: {out:?}"
        );
        assert_eq!(runtime.tasks.len(), 1, "its task is gone");

        // Its job's result, if it still comes, answers nobody; the other
        // request is served as ever.
        let result = |job| ToPlugin::JobResult {
            job,
            status: 200,
            body: Bytes::from(switchyard_proto::codec::encode(&Done { ok: true }).unwrap()),
        };
        let out = runtime.step(vec![result(jobs[0]), result(jobs[1])]);
        assert!(
            matches!(
                out.as_slice(),
                [FromPlugin::Response {
                    correlation: 4,
                    status: 200,
                    ..
                }]
            ),
            "{out:?}"
        );
        // A cancel of an answered request is nothing.
        assert!(runtime.step(vec![ToPlugin::Cancel { correlation: 4 }]).is_empty());
    }

    /// A timer two seconds apart, counting its runs.
    struct Ticks(u32);

    impl Manager for Ticks {
        const NAME: &'static str = "ticks";
        fn create(_: &Config) -> Result<Self, Error> {
            Ok(Ticks(0))
        }
        fn register(r: &mut Registry<Self>) {
            r.every(
                |_| Duration::from_secs(2),
                |t, _| {
                    t.0 += 1;
                    Ok(())
                },
            );
        }
    }

    fn args(name: &str) -> CreateArgs {
        CreateArgs {
            name: name.into(),
            instance: 0,
            config_json: String::new(),
            expose_errors: true,
            shm_threshold: u64::MAX,
            shm_budget: 0,
            validation: false,
        }
    }

    fn next_timers(out: &[FromPlugin]) -> Vec<u64> {
        out.iter()
            .filter_map(|o| match o {
                FromPlugin::NextTimer { in_ms } => Some(*in_ms),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn the_host_is_told_when_the_next_timer_is_due() {
        let (mut runtime, description) = Runtime::<Ticks>::create(args("ticks"), None, None).unwrap();
        assert!(description.timers);
        // The first step says when: about two seconds from creation.
        let first = next_timers(&runtime.step(vec![ToPlugin::Wake]));
        assert!(
            matches!(first.as_slice(), [ms] if (1_000..=2_000).contains(ms)),
            "{first:?}"
        );
        // Steps that do not move it say nothing more.
        assert!(next_timers(&runtime.step(vec![ToPlugin::Wake])).is_empty());
        // A timer step says again, even when nothing was due (the host
        // forgets the deadline once it steps the timers).
        let early = next_timers(&runtime.step(vec![ToPlugin::Timers { ahead_ms: 0 }]));
        assert!(
            matches!(early.as_slice(), [ms] if (1_000..=2_000).contains(ms)),
            "{early:?}"
        );
        assert_eq!(runtime.state.borrow().0, 0, "not due yet");
        // Two seconds on: the timer runs, and the next one is two seconds
        // after that, about four from now.
        let later = next_timers(&runtime.step(vec![ToPlugin::Timers { ahead_ms: 2_000 }]));
        assert_eq!(runtime.state.borrow().0, 1, "ran once");
        assert!(
            matches!(later.as_slice(), [ms] if (3_000..=4_000).contains(ms)),
            "{later:?}"
        );
    }

    #[test]
    fn a_manager_without_timers_says_nothing_of_them() {
        let (mut runtime, description) = Runtime::<Waits>::create(args("waits"), None, None).unwrap();
        assert!(!description.timers);
        assert!(next_timers(&runtime.step(vec![ToPlugin::Timers { ahead_ms: 0 }])).is_empty());
    }

    #[test]
    fn a_task_woken_from_another_thread_asks_the_host_for_a_step() {
        let remote = Remote::default();
        *REMOTE.lock().unwrap() = Some(remote.clone());
        let asked = Arc::new(AtomicUsize::new(0));
        let counter = asked.clone();
        let wake: WakeHost = Arc::new(move || {
            counter.fetch_add(1, Ordering::SeqCst);
        });
        let (mut runtime, _) = Runtime::<Waits>::create(args("waits"), None, Some(wake)).unwrap();
        let mut meta = Meta::default();
        meta.push("content-type", crate::BINCODE);
        let request = ToPlugin::Request {
            correlation: 7,
            event_type: EventType::of("t.Later"),
            meta,
            body: Bytes::from(switchyard_proto::codec::encode(&Later {}).unwrap()),
            stream: None,
            caller: switchyard_manager_abi::messages::Caller::Manager,
            context: Default::default(),
        };
        assert!(runtime.step(vec![request]).is_empty(), "the handler waits");
        assert_eq!(asked.load(Ordering::SeqCst), 0, "nothing woke it yet");

        std::thread::spawn(move || {
            let waker = {
                let mut slot = remote.0.lock().unwrap();
                slot.0 = true;
                slot.1.take()
            };
            waker.expect("the task waits on it").wake();
        })
        .join()
        .unwrap();
        assert_eq!(asked.load(Ordering::SeqCst), 1, "the host was asked for a step");

        let out = runtime.step(vec![ToPlugin::Wake]);
        assert!(
            matches!(
                out.as_slice(),
                [FromPlugin::Response {
                    correlation: 7,
                    status: 200,
                    ..
                }]
            ),
            "the step answers the request"
        );
    }
}
