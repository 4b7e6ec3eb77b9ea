//! The context a handler gets: who is asking, and how to reach the rest of
//! the group (notifications, calls to other managers, config, logs).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use switchyard_proto::{EventType, Meta, codec};

use crate::event::{Event, Returns};
use crate::reply::{BINCODE, CallError, Error, Format, JSON};
use switchyard_manager_abi::messages::{FromPlugin, LogLevel};

/// Default deadline of a call to another manager.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) struct CallSlot {
    pub(crate) result: Option<(u16, Meta, Bytes)>,
    pub(crate) waker: Option<Waker>,
}

/// Where a manager's log lines go as they are written (the host's log,
/// through the runtime).
pub(crate) type LogSink = std::sync::Arc<dyn Fn(LogLevel, u64, &str) + Send + Sync>;

/// What every context of one manager instance shares: its calls and
/// outputs, config, templates. The middleware chain is the runtime's
/// (`runtime::Hooks`): contexts sit below it.
pub(crate) struct Shared {
    pub(crate) outbox: RefCell<Vec<FromPlugin>>,
    pub(crate) calls: RefCell<HashMap<u64, CallSlot>>,
    pub(crate) next_call: Cell<u64>,
    pub(crate) config: serde_json::Value,
    pub(crate) name: String,
    pub(crate) instance: u32,
    /// Where log lines go at once; without one they are queued as
    /// [`FromPlugin::Log`] outputs (in-process tests).
    pub(crate) log: Option<LogSink>,
    /// Response bodies at least this large go into `segments`.
    pub(crate) shm_threshold: usize,
    pub(crate) segments: RefCell<switchyard_proto::pool::SegmentPool>,
    /// Whether 5xx messages may reach clients.
    pub(crate) expose_errors: bool,
    /// The manager's templates (docs/web.md).
    pub(crate) templates: crate::web::Templates,
    /// Requests in progress of templated events: the template when the
    /// answer is HTML, `None` when it is JSON or bincode.
    pub(crate) html: RefCell<HashMap<u64, Option<&'static str>>>,
    /// Requests in progress that have an id or trace context.
    pub(crate) naming: RefCell<HashMap<u64, Rc<Naming>>>,
}

/// A request's id and trace context (decision 0146): the id's text is
/// made the first time a handler asks for it, never otherwise.
#[derive(Debug)]
pub(crate) struct Naming {
    pub(crate) context: switchyard_proto::RequestContext,
    id_text: std::cell::OnceCell<Box<str>>,
}

impl Naming {
    pub(crate) fn new(context: switchyard_proto::RequestContext) -> Naming {
        Naming {
            context,
            id_text: std::cell::OnceCell::new(),
        }
    }

    pub(crate) fn request_id(&self) -> Option<&str> {
        let id = self.context.request_id.as_ref()?;
        Some(self.id_text.get_or_init(|| id.to_string().into()))
    }
}

impl Shared {
    pub(crate) fn log(&self, level: LogLevel, correlation: u64, message: &str) {
        match &self.log {
            Some(sink) => sink(level, correlation, message),
            None => self.outbox.borrow_mut().push(FromPlugin::Log {
                level,
                correlation,
                message: message.to_owned(),
            }),
        }
    }
}

/// Per-request context handed to handlers. Cheap to clone.
#[derive(Clone)]
pub struct Context {
    pub(crate) shared: Rc<Shared>,
    pub(crate) correlation: u64,
    pub(crate) format: Format,
    /// The request's meta: its context as the listener passed it (empty
    /// outside a request).
    pub(crate) request: Rc<Meta>,
    /// A client sent the request (through a listener), not a manager.
    pub(crate) client: bool,
    /// The request's id and trace context, if it has one.
    pub(crate) naming: Option<Rc<Naming>>,
}

impl Context {
    /// The request's correlation id (0 outside a request).
    pub fn correlation(&self) -> u64 {
        self.correlation
    }

    /// The format the caller asked for (JSON unless bincode).
    pub fn format(&self) -> Format {
        self.format
    }

    /// The request id (`x-request-id`, taken from the client or made by
    /// the listener; `None` when `[request_id]` is off or outside a
    /// request). It is in every log line of the request, this manager's
    /// and the other hops', and calls to other managers carry it on.
    pub fn request_id(&self) -> Option<&str> {
        self.naming.as_deref().and_then(Naming::request_id)
    }

    /// The request method, when the event declares `request(method)`.
    /// `HEAD` on a `GET` route reaches the GET handler as `HEAD`.
    pub fn method(&self) -> Option<&str> {
        crate::event::method(&self.request)
    }

    /// The request path as received (not decoded), when the event
    /// declares `request(path)`.
    pub fn path(&self) -> Option<&str> {
        crate::event::path(&self.request)
    }

    /// The raw query string, if the request had one (always passed on).
    pub fn query(&self) -> Option<&str> {
        self.request.get("query")
    }

    /// The client's IP address, when the event declares `request(client)`:
    /// the peer's, or behind proxies listed in `listener.trusted_proxies`
    /// the one they name in `Forwarded` / `X-Forwarded-For`.
    pub fn client_ip(&self) -> Option<std::net::IpAddr> {
        crate::event::client_ip(&self.request)
    }

    /// A request header the event declares (`request(headers = [..])` or
    /// a `#[from(header)]` field); several lines joined with `, `.
    pub fn header(&self, name: &str) -> Option<&str> {
        crate::event::header(&self.request, name)
    }

    /// Checks the request's `If-Match` (which the listener forwards on
    /// unsafe methods) against `current`, the resource's entity tag now:
    /// `Err(412)` when the client's copy is stale, so a handler refuses
    /// a lost update before changing anything. No `If-Match`: `Ok`.
    ///
    /// ```ignore
    /// cx.if_match(&etag_of_item)?;   // then update the item
    /// ```
    pub fn if_match(&self, current: &str) -> Result<(), Error> {
        match self.request.get("if-match") {
            Some(header) if !switchyard_proto::web::etag_matches(header, current, true) => Err(
                Error::precondition_failed("the resource has changed since it was read (If-Match)"),
            ),
            _ => Ok(()),
        }
    }

    /// A cookie the event declares (`request(cookies = [..])` or a
    /// `#[from(cookie)]` field).
    pub fn cookie(&self, name: &str) -> Option<&str> {
        crate::event::cookie(&self.request, name)
    }

    /// A value of the request's scope: a claim of the authenticated
    /// identity, or what a middleware added, when the event declares it
    /// (`request(scope = [..])` or a `#[from(scope)]` field).
    pub fn scope(&self, name: &str) -> Option<serde_json::Value> {
        crate::event::scope(&self.request, name)
    }

    /// The authenticated caller (built-in authentication, docs/middleware.md),
    /// when the event declares `request(identity)`; `None` for an
    /// anonymous request.
    pub fn identity(&self) -> Option<crate::event::Identity> {
        crate::event::identity(&self.request)
    }

    /// Whether a client sent the request being handled (through a
    /// listener), rather than another manager of the group or nothing
    /// (timers, notifications). The built-in Scheduler keeps a client's
    /// jobs apart from managers' by it.
    pub fn from_client(&self) -> bool {
        self.client
    }

    /// The manager that sent the request being handled, by its
    /// configured name as the router stamped it (a manager cannot name
    /// itself another); `None` for a client's request or outside one.
    /// The built-in Store keeps each manager's keys apart by it.
    pub fn calling_manager(&self) -> Option<&str> {
        if self.client {
            return None;
        }
        self.request.get(switchyard_proto::control::META_MANAGER)
    }

    /// The configured name of this manager.
    pub fn manager_name(&self) -> &str {
        &self.shared.name
    }

    /// Which instance of the manager this is (0-based).
    pub fn instance(&self) -> u32 {
        self.shared.instance
    }

    /// The manager's `config` table from `switchyard.toml`, as `T`.
    pub fn config<T: DeserializeOwned>(&self) -> Result<T, Error> {
        serde_json::from_value(self.shared.config.clone())
            .map_err(|e| Error::internal(format!("manager config does not fit: {e}")))
    }

    /// The raw config table.
    pub fn config_value(&self) -> &serde_json::Value {
        &self.shared.config
    }

    /// Emits a notification to every manager (and WebSocket client)
    /// subscribed to `E`. The body is JSON (`application/json`), so that the
    /// broker can evaluate client filters on its fields and push it as is;
    /// meta `event` carries the type's name for prefix subscriptions.
    pub fn notify<E: Event>(&self, event: &E) -> Result<(), Error> {
        let body = serde_json::to_vec(event)
            .map_err(|e| Error::internal(format!("cannot encode {}: {e}", E::NAME)))?;
        let mut meta = Meta::default();
        meta.push("content-type", JSON);
        meta.push(switchyard_proto::control::META_EVENT, E::NAME);
        self.shared.outbox.borrow_mut().push(FromPlugin::Notify {
            event_type: EventType::of(E::NAME),
            meta,
            body: Bytes::from(body),
        });
        Ok(())
    }

    /// Sends `event` to whichever manager serves it, through the router, and
    /// awaits its reply as `R`: the type the event names with
    /// `#[event(reply = R)]` (inferred: `let r = cx.call(&Reserve { .. }).await?`),
    /// or for an event that names none, whatever the caller annotates.
    /// Fails fast with [`CallError::Unroutable`] when nobody serves it or
    /// its manager cannot take it now, with [`CallError::TimedOut`] after
    /// [`DEFAULT_CALL_TIMEOUT`], and with [`CallError::Callee`] when the
    /// callee answers an error. Forwarded with `?`, the group's refusals
    /// reach the end client as a generic 502/503/504 (decision 0116).
    pub fn call<E: Returns<R>, R: DeserializeOwned>(
        &self,
        event: &E,
    ) -> impl Future<Output = Result<R, CallError>> + use<E, R> {
        self.call_with_timeout(event, DEFAULT_CALL_TIMEOUT)
    }

    /// [`call`](Self::call) for the SDK's typed handles (Store,
    /// Scheduler), whose methods answer an [`Error`] as `?` would make it.
    pub(crate) fn call_for_handle<E: Returns<R>, R: DeserializeOwned>(
        &self,
        event: &E,
    ) -> impl Future<Output = Result<R, Error>> + use<E, R> {
        let call = self.call(event);
        async move { call.await.map_err(Error::from) }
    }

    /// [`call`](Self::call) with an explicit deadline.
    pub fn call_with_timeout<E: Returns<R>, R: DeserializeOwned>(
        &self,
        event: &E,
        timeout: Duration,
    ) -> impl Future<Output = Result<R, CallError>> + use<E, R> {
        let shared = self.shared.clone();
        let encoded = codec::encode(event);
        let call = shared.next_call.get();
        shared.next_call.set(call + 1);
        if let Ok(body) = &encoded {
            let mut meta = Meta::default();
            meta.push("content-type", BINCODE);
            meta.push("accept", BINCODE);
            // The router names the type in its answer when nobody serves it.
            meta.push(switchyard_proto::control::META_EVENT, E::NAME);
            shared.calls.borrow_mut().insert(
                call,
                CallSlot {
                    result: None,
                    waker: None,
                },
            );
            shared.outbox.borrow_mut().push(FromPlugin::Call {
                call,
                event_type: EventType::of(E::NAME),
                meta,
                body: Bytes::from(body.clone()),
                timeout_ms: timeout.as_millis() as u64,
                context: self.request_context(),
            });
        }
        CallFuture {
            shared,
            call,
            encode_error: encoded.err().map(|e| e.to_string()),
            job: false,
            _reply: std::marker::PhantomData,
        }
    }

    /// Submits `job` to this manager's worker pool (`[managers.workers]` in
    /// `switchyard.toml`: threads in this process, or worker processes) and
    /// awaits its result, computed by the function registered with
    /// [`Registry::job`](crate::Registry::job). Use it from `async`
    /// handlers; other requests are served while the job runs.
    ///
    /// Fails with 503 when the pool's queue is full (the HTTP client gets
    /// `Retry-After`), 504 past the pool's `job_timeout_ms`, 502 when the
    /// worker process running it died, 500 when the job panicked, or the
    /// job function's own error.
    pub fn spawn_job<J: Event, R: DeserializeOwned>(
        &self,
        job: &J,
    ) -> impl Future<Output = Result<R, Error>> + use<J, R> {
        self.submit_job(job, 0)
    }

    /// [`spawn_job`](Self::spawn_job) with its own deadline instead of the
    /// pool's `job_timeout_ms`.
    pub fn spawn_job_with_timeout<J: Event, R: DeserializeOwned>(
        &self,
        job: &J,
        timeout: Duration,
    ) -> impl Future<Output = Result<R, Error>> + use<J, R> {
        self.submit_job(job, (timeout.as_millis() as u64).max(1))
    }

    fn submit_job<J: Event, R: DeserializeOwned>(
        &self,
        job: &J,
        timeout_ms: u64,
    ) -> impl Future<Output = Result<R, Error>> + use<J, R> {
        let shared = self.shared.clone();
        let encoded = codec::encode(job);
        let id = shared.next_call.get();
        shared.next_call.set(id + 1);
        if let Ok(body) = &encoded {
            shared.calls.borrow_mut().insert(
                id,
                CallSlot {
                    result: None,
                    waker: None,
                },
            );
            shared.outbox.borrow_mut().push(FromPlugin::Job {
                job: id,
                job_type: EventType::of(J::NAME),
                body: Bytes::from(body.clone()),
                timeout_ms,
                correlation: self.correlation,
            });
        }
        let job = CallFuture::<R> {
            shared,
            call: id,
            encode_error: encoded.err().map(|e| e.to_string()),
            job: true,
            _reply: std::marker::PhantomData,
        };
        async move { job.await.map_err(Error::from) }
    }

    /// Emits a notification of the type named `event_type` with a JSON
    /// `body`, for code that knows the type only at run time (the
    /// Scheduler); [`notify`](Self::notify) is the typed way.
    pub fn notify_json(&self, event_type: &str, body: Vec<u8>) {
        self.notify_json_for(event_type, body, None);
    }

    /// [`notify_json`](Self::notify_json) for a client's scheduled job:
    /// `client` is the job's client as the Scheduler recorded it (meta
    /// `:job`). Only the built-in Scheduler's is honoured: the router sends
    /// it to a listener, which admits it as that client (decision 0113);
    /// from any other manager the key is stripped like all request
    /// context, and the notification goes out as the manager's.
    pub fn notify_json_for(&self, event_type: &str, body: Vec<u8>, client: Option<&str>) {
        let mut meta = Meta::default();
        meta.push("content-type", JSON);
        meta.push(switchyard_proto::control::META_EVENT, event_type);
        if let Some(client) = client {
            meta.push(switchyard_proto::control::META_JOB, client);
        }
        self.shared.outbox.borrow_mut().push(FromPlugin::Notify {
            event_type: EventType::of(event_type),
            meta,
            body: Bytes::from(body),
        });
    }

    /// Sends a request of the type named `event_type` with a JSON `body`
    /// and awaits the reply's status and body, whatever the status: for
    /// code that knows the type only at run time (the Scheduler);
    /// [`call`](Self::call) is the typed way.
    pub fn call_json(
        &self,
        event_type: &str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> impl Future<Output = (u16, Bytes)> + use<> {
        self.call_json_for(event_type, body, timeout, None)
    }

    /// [`call_json`](Self::call_json) for a client's scheduled job, as
    /// [`notify_json_for`](Self::notify_json_for): the answer is the
    /// handler's, or the listener's refusal (401, 403, 404) when the
    /// client may not send `event_type` now.
    pub fn call_json_for(
        &self,
        event_type: &str,
        body: Vec<u8>,
        timeout: Duration,
        client: Option<&str>,
    ) -> impl Future<Output = (u16, Bytes)> + use<> {
        let mut meta = Meta::default();
        meta.push("content-type", JSON);
        meta.push("accept", JSON);
        meta.push(switchyard_proto::control::META_EVENT, event_type);
        if let Some(client) = client {
            meta.push(switchyard_proto::control::META_JOB, client);
        }
        let call = self.call_raw(EventType::of(event_type), meta, Bytes::from(body), timeout);
        async move {
            let (status, _, body) = call.await;
            (status, body)
        }
    }

    /// Sends a request with this meta and body; the answer whole (status,
    /// meta, body), whatever its status.
    pub(crate) fn call_raw(
        &self,
        event_type: EventType,
        meta: Meta,
        body: Bytes,
        timeout: Duration,
    ) -> RawCallFuture {
        let shared = self.shared.clone();
        let call = shared.next_call.get();
        shared.next_call.set(call + 1);
        shared.calls.borrow_mut().insert(
            call,
            CallSlot {
                result: None,
                waker: None,
            },
        );
        shared.outbox.borrow_mut().push(FromPlugin::Call {
            call,
            event_type,
            meta,
            body,
            timeout_ms: timeout.as_millis() as u64,
            context: self.request_context(),
        });
        RawCallFuture { shared, call }
    }

    /// A call made for a request names it: the callee's log lines carry
    /// the same request id and trace id.
    fn request_context(&self) -> switchyard_proto::RequestContext {
        self.naming
            .as_ref()
            .map(|n| n.context.clone())
            .unwrap_or_default()
    }

    /// Logs at info level, tagged with the request's correlation id.
    /// `tracing::info!` in a handler does the same (decision 0125).
    pub fn log(&self, message: &str) {
        self.log_at(LogLevel::Info, message);
    }

    /// Logs at a level, tagged with the request's correlation id.
    pub fn log_at(&self, level: LogLevel, message: &str) {
        self.shared.log(level, self.correlation, message);
    }
}

struct CallFuture<R> {
    shared: Rc<Shared>,
    call: u64,
    encode_error: Option<String>,
    /// A job's result (bincode or a UTF-8 message), not a call's reply.
    job: bool,
    _reply: std::marker::PhantomData<fn() -> R>,
}

impl<R: DeserializeOwned> Future for CallFuture<R> {
    type Output = Result<R, CallError>;

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
        let internal = |message: String| CallError::Callee(Error::internal(message));
        if let Some(err) = &self.encode_error {
            return Poll::Ready(Err(internal(format!("cannot encode the call: {err}"))));
        }
        let mut calls = self.shared.calls.borrow_mut();
        let Some(slot) = calls.get_mut(&self.call) else {
            return Poll::Ready(Err(internal("call polled after completion".to_owned())));
        };
        match slot.result.take() {
            None => {
                slot.waker = Some(cx.waker().clone());
                Poll::Pending
            }
            Some((status, meta, body)) => {
                calls.remove(&self.call);
                if self.job {
                    return Poll::Ready(if status == 200 {
                        codec::decode(&body).map_err(|e| internal(format!("bad result from the job: {e}")))
                    } else {
                        Err(CallError::Callee(Error::new(
                            status,
                            String::from_utf8_lossy(&body),
                        )))
                    });
                }
                Poll::Ready(if (200..300).contains(&status) {
                    if meta.get("content-type") == Some(BINCODE) {
                        codec::decode(&body).map_err(|e| internal(format!("bad reply from the callee: {e}")))
                    } else {
                        serde_json::from_slice(&body)
                            .map_err(|e| internal(format!("bad reply from the callee: {e}")))
                    }
                } else {
                    Err(CallError::from_answer(status, &meta, &body))
                })
            }
        }
    }
}

/// The answer to [`Context::call_raw`], undecoded.
pub(crate) struct RawCallFuture {
    shared: Rc<Shared>,
    call: u64,
}

impl Future for RawCallFuture {
    type Output = (u16, Meta, Bytes);

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
        let mut calls = self.shared.calls.borrow_mut();
        let Some(slot) = calls.get_mut(&self.call) else {
            return Poll::Ready((
                500,
                Meta::default(),
                Bytes::from_static(b"call polled after completion"),
            ));
        };
        match slot.result.take() {
            None => {
                slot.waker = Some(cx.waker().clone());
                Poll::Pending
            }
            Some((status, meta, body)) => {
                calls.remove(&self.call);
                Poll::Ready((status, meta, body))
            }
        }
    }
}

impl Drop for RawCallFuture {
    fn drop(&mut self) {
        give_up(&self.shared, self.call);
    }
}

impl<R> Drop for CallFuture<R> {
    fn drop(&mut self) {
        give_up(&self.shared, self.call);
    }
}

/// A call or job future dropped: its answer is no longer needed. Dropped
/// before the answer came (its handler was cancelled, or raced it against
/// something else), the host is told, so the callee or the worker stops.
fn give_up(shared: &Shared, id: u64) {
    let Ok(mut calls) = shared.calls.try_borrow_mut() else {
        return;
    };
    let slot = calls.remove(&id);
    drop(calls);
    if slot.is_some_and(|slot| slot.result.is_none())
        && let Ok(mut outbox) = shared.outbox.try_borrow_mut()
    {
        outbox.push(FromPlugin::Cancel { id });
    }
}
