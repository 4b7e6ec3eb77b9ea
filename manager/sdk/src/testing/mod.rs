//! Helpers for testing managers.
//!
//! [`TestManager`] runs a manager in the test's thread, without a group:
//! send it events, stub the managers it calls, look at what it notified.
//! It calls the manager through the same C ABI functions the manager host
//! calls, with the same bincode messages, so a unit test crosses the real
//! boundary. For a real group in integration tests, see
//! `switchyard_manager_host::testing::Group`.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;
use switchyard_manager_abi::messages::{
    Caller, CreateArgs, Description, FromPlugin, JobOutput, RawBody, ToPlugin,
};
use switchyard_manager_abi::{Buffer, HostApi, ManagerEntry, free_buffer, handover};
use switchyard_proto::event::{META_COOKIE_PREFIX, META_HEADER_PREFIX, META_IDENTITY, META_SCOPE_PREFIX};
use switchyard_proto::{EventType, Meta, codec};

use crate::event::Event;
use crate::registry::Manager;
use crate::reply::{BINCODE, Error, JSON};

thread_local! {
    /// Log lines of the managers this thread drives, until their
    /// `TestManager` collects them.
    static LOGS: RefCell<Vec<(u64, String)>> = const { RefCell::new(Vec::new()) };
}

unsafe extern "C" fn test_log(_level: u32, correlation: u64, message: *const u8, len: usize) {
    // SAFETY: the plugin side passes a readable `len`-byte buffer for the call.
    let message = String::from_utf8_lossy(unsafe { std::slice::from_raw_parts(message, len) }).into_owned();
    LOGS.with(|logs| logs.borrow_mut().push((correlation, message)));
}

/// The host side a `TestManager` offers. No wake-ups: upload handlers run
/// inline, on the test's thread.
static TEST_HOST: HostApi = HostApi {
    log: test_log,
    wake: None,
};

/// Takes a buffer the plugin side wrote. The SDK is both sides here, so its
/// own `free_buffer` is the plugin's.
fn take(out: Buffer) -> Vec<u8> {
    // SAFETY: `out` was written by the call that just returned; copied,
    // then freed once by the allocator that made it.
    let bytes = unsafe { out.bytes() }.to_vec();
    unsafe { free_buffer(out) };
    bytes
}

/// One instance behind the ABI, as the host holds it.
struct Instance {
    entry: ManagerEntry,
    ptr: *mut c_void,
    description: Description,
}

impl Instance {
    fn create(entry: ManagerEntry, args: &CreateArgs) -> Result<Instance, Error> {
        let encoded = codec::encode(args).map_err(|e| Error::internal(e.to_string()))?;
        let mut out = Buffer::empty();
        // SAFETY: valid input slice, host table and out pointer for the call.
        let ptr = unsafe { (entry.create)(encoded.as_ptr(), encoded.len(), &TEST_HOST, &mut out) };
        let bytes = take(out);
        if ptr.is_null() {
            return Err(Error::internal(String::from_utf8_lossy(&bytes)));
        }
        let description = codec::decode_local(&bytes).map_err(|e| Error::internal(e.to_string()))?;
        Ok(Instance {
            entry,
            ptr,
            description,
        })
    }

    fn step(&mut self, inputs: Vec<ToPlugin>) -> Vec<FromPlugin> {
        let encoded = codec::encode(&inputs).expect("test inputs encode");
        let mut out = Buffer::empty();
        // SAFETY: `ptr` is a live instance of this entry, stepped from one
        // thread; valid input slice and out pointer for the call.
        let ok = unsafe { (self.entry.step)(self.ptr, encoded.as_ptr(), encoded.len(), &mut out) };
        let bytes = take(out);
        assert!(
            ok,
            "the plugin refused the step: {}",
            String::from_utf8_lossy(&bytes)
        );
        codec::decode_local(&bytes).expect("the plugin's outputs decode")
    }

    fn run_job(&self, job_type: EventType, input: &[u8]) -> JobOutput {
        let mut out = Buffer::empty();
        // SAFETY: valid input slice and out pointer for the call.
        let ok = unsafe { (self.entry.run_job)(job_type.0, input.as_ptr(), input.len(), &mut out) };
        let bytes = take(out);
        if !ok {
            return JobOutput {
                status: 500,
                body: Bytes::from(bytes),
            };
        }
        codec::decode_local(&bytes).expect("the job's output decodes")
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        // SAFETY: made by this entry's `create`, destroyed once.
        unsafe { (self.entry.destroy)(self.ptr) };
    }
}

/// A response as a test sees it.
#[derive(Clone, Debug)]
pub struct TestResponse {
    pub status: u16,
    pub meta: Meta,
    pub body: Bytes,
    /// A streamed body ended with an error (what a client would see as a
    /// cut connection); `body` holds what arrived before.
    pub aborted: bool,
}

/// Reads a streamed response to its end: the bytes, and whether it broke off.
fn read_stream(handle: switchyard_proto::StreamHandle) -> (Bytes, bool) {
    let Ok(mut end) = handle.open() else {
        return (Bytes::new(), true);
    };
    let mut body = Vec::new();
    loop {
        match end.read_blocking(switchyard_proto::pipe::DEFAULT_CAPACITY) {
            Ok(chunk) if chunk.is_empty() => return (Bytes::from(body), false),
            Ok(chunk) => body.extend_from_slice(&chunk),
            Err(_) => return (Bytes::from(body), true),
        }
    }
}

impl TestResponse {
    /// The JSON body as `T`.
    pub fn json<T: DeserializeOwned>(&self) -> T {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not the expected JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }
    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

type Stub = Box<dyn FnMut(&[u8]) -> (u16, Bytes)>;

/// A manager running in the test's thread.
///
/// ```
/// # use serde::{Deserialize, Serialize};
/// # use switchyard_manager::{Config, Context, Error, Event, Manager, Registry, Reply};
/// # #[derive(Serialize, Deserialize, Event)]
/// # #[event(name = "t.Hello", http = "GET /hello/{name}")]
/// # struct Hello { #[validate(length(min = 1))] name: String }
/// # #[derive(Serialize, Deserialize, Reply)]
/// # struct Greeting { message: String }
/// # struct Greeter;
/// # impl Manager for Greeter {
/// #     const NAME: &'static str = "greeter";
/// #     fn create(_: &Config) -> Result<Self, Error> { Ok(Greeter) }
/// #     fn register(r: &mut Registry<Self>) { r.handle(Self::greet); }
/// # }
/// # impl Greeter {
/// #     fn greet(&mut self, ev: Hello, _: &mut Context) -> Result<Greeting, Error> {
/// #         Ok(Greeting { message: format!("Hello, {}!", ev.name) })
/// #     }
/// # }
/// use switchyard_manager::testing::TestManager;
///
/// let mut greeter = TestManager::<Greeter>::new();
/// let r = greeter.http::<Hello>(&[("name", "Ada")], "", b"");
/// assert_eq!(r.status, 200);
/// assert_eq!(r.json::<serde_json::Value>()["message"], "Hello, Ada!");
/// assert_eq!(greeter.http::<Hello>(&[("name", "")], "", b"").status, 422);
/// ```
pub struct TestManager<M: Manager> {
    instance: Instance,
    _manager: std::marker::PhantomData<M>,
    next: u64,
    stubs: HashMap<EventType, Stub>,
    notifications: Vec<(EventType, Bytes)>,
    /// Log lines the manager wrote, with their correlation ids.
    pub logs: Vec<(u64, String)>,
    /// Jobs the manager submitted (run inline, in submission order).
    pub jobs_run: usize,
}

impl<M: Manager> Default for TestManager<M> {
    fn default() -> Self {
        Self::new()
    }
}

impl<M: Manager> TestManager<M> {
    /// Creates the manager with no config.
    pub fn new() -> Self {
        Self::with_config(serde_json::Value::Null)
    }

    /// Creates the manager with a config table.
    pub fn with_config(config: serde_json::Value) -> Self {
        Self::try_with_config(config).unwrap_or_else(|e| panic!("manager failed to start: {e}"))
    }

    /// Creates the manager, returning its start-up error.
    pub fn try_with_config(config: serde_json::Value) -> Result<Self, Error> {
        let args = CreateArgs {
            name: M::NAME.to_owned(),
            instance: 0,
            config_json: config.to_string(),
            expose_errors: true,
            shm_threshold: u64::MAX,
            shm_budget: 0,
            validation: false,
        };
        let instance = Instance::create(crate::export::entry::<M>(), &args)?;
        Ok(TestManager {
            instance,
            _manager: std::marker::PhantomData,
            next: 1,
            stubs: HashMap::new(),
            notifications: Vec::new(),
            logs: Vec::new(),
            jobs_run: 0,
        })
    }

    /// What the manager declared when it was created (what the router
    /// gets): its request types, routes and what each reads of its request.
    pub fn description(&self) -> &Description {
        &self.instance.description
    }

    /// Answers calls to `E` with `f` (as the manager serving `E` would).
    pub fn stub<E: Event, R: Serialize>(
        &mut self,
        mut f: impl FnMut(E) -> Result<R, Error> + 'static,
    ) -> &mut Self {
        self.stubs.insert(
            EventType::of(E::NAME),
            Box::new(move |body| {
                let result = codec::decode::<E>(body)
                    .map_err(|e| Error::bad_request(e.to_string()))
                    .and_then(&mut f)
                    .and_then(|r| codec::encode(&r).map_err(|e| Error::internal(e.to_string())));
                match result {
                    Ok(bytes) => (200, Bytes::from(bytes)),
                    Err(err) => (err.status, err.to_response(true).body),
                }
            }),
        );
        self
    }

    /// Sends `event` as another manager would (bincode), asking for JSON.
    pub fn request<E: Event>(&mut self, event: &E) -> TestResponse {
        let mut meta = Meta::default();
        meta.push("content-type", BINCODE);
        let body = Bytes::from(codec::encode(event).expect("event encodes"));
        self.send(EventType::of(E::NAME), meta, body)
    }

    /// Sends `E` as the listener would for an HTTP request: path parameters,
    /// a query string and a JSON body (empty for none).
    pub fn http<E: Event>(
        &mut self,
        path_params: &[(&str, &str)],
        query: &str,
        json_body: &[u8],
    ) -> TestResponse {
        let mut meta = Meta::default();
        if !json_body.is_empty() {
            meta.push("content-type", JSON);
        }
        if !query.is_empty() {
            meta.push("query", query);
        }
        for (k, v) in path_params {
            meta.push(format!("p.{k}"), *v);
        }
        self.send(EventType::of(E::NAME), meta, Bytes::copy_from_slice(json_body))
    }

    /// Runs job `job` as the manager's worker pool would (statelessly) and
    /// returns its result.
    pub fn run_job<J: Event, R: DeserializeOwned>(&self, job: &J) -> Result<R, Error> {
        let input = codec::encode(job).map_err(|e| Error::internal(e.to_string()))?;
        let output = self.instance.run_job(EventType::of(J::NAME), &input);
        if output.status == 200 {
            codec::decode(&output.body).map_err(|e| Error::internal(e.to_string()))
        } else {
            Err(Error::new(output.status, String::from_utf8_lossy(&output.body)))
        }
    }

    /// Delivers a notification to the manager, as `Context::notify` sends it (JSON).
    pub fn notify<E: Event>(&mut self, event: &E) {
        let mut meta = Meta::default();
        meta.push("content-type", JSON);
        meta.push(switchyard_proto::control::META_EVENT, E::NAME);
        let body = Bytes::from(serde_json::to_vec(event).expect("event encodes"));
        let outputs = self.step(vec![ToPlugin::Notification {
            event_type: EventType::of(E::NAME),
            meta,
            body,
        }]);
        self.drive(outputs, None);
    }

    /// Runs the manager's timers ([`Registry::every`](crate::Registry::every))
    /// as if `elapsed` had passed since they were last due (at most ten
    /// periods run per timer).
    pub fn advance(&mut self, elapsed: std::time::Duration) {
        let ahead_ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
        let outputs = self.step(vec![ToPlugin::Timers { ahead_ms }]);
        self.drive(outputs, None);
    }

    /// One step through the ABI; the log lines it wrote are collected.
    fn step(&mut self, inputs: Vec<ToPlugin>) -> Vec<FromPlugin> {
        let outputs = self.instance.step(inputs);
        LOGS.with(|logs| self.logs.append(&mut logs.borrow_mut()));
        outputs
    }

    /// Notifications of type `E` the manager emitted so far.
    pub fn notified<E: Event>(&self) -> Vec<E> {
        let ty = EventType::of(E::NAME);
        self.notifications
            .iter()
            .filter(|(t, _)| *t == ty)
            // `Context::notify` sends JSON.
            .map(|(_, body)| serde_json::from_slice(body).expect("notification decodes"))
            .collect()
    }

    fn send(&mut self, event_type: EventType, meta: Meta, body: Bytes) -> TestResponse {
        self.send_from(event_type, meta, body, Caller::Client)
    }

    /// Builds a request to `E` with a request context (headers, cookies,
    /// scope, identity, client address, request id), as the listener
    /// sends it when the event declares them.
    ///
    /// ```
    /// # use serde::{Deserialize, Serialize};
    /// # use switchyard_manager::{Config, Context, Error, Event, Manager, Registry, Json};
    /// #[derive(Serialize, Deserialize, Event)]
    /// #[event(name = "t.Key", http = "GET /key")]
    /// struct Key { #[from(header = "x-api-key")] key: Option<String> }
    /// # struct M;
    /// # impl Manager for M {
    /// #     const NAME: &'static str = "m";
    /// #     fn create(_: &Config) -> Result<Self, Error> { Ok(M) }
    /// #     fn register(r: &mut Registry<Self>) { r.handle(Self::key); }
    /// # }
    /// # impl M { fn key(&mut self, ev: Key, _: &mut Context) -> Result<Json<Option<String>>, Error> { Ok(Json(ev.key)) } }
    /// use switchyard_manager::testing::TestManager;
    /// let mut m = TestManager::<M>::new();
    /// let r = m.build::<Key>().header("x-api-key", "k1").query("key=forged").send();
    /// assert_eq!(r.text(), r#""k1""#);
    /// ```
    pub fn build<E: Event>(&mut self) -> TestRequest<'_, M> {
        TestRequest {
            manager: self,
            event_type: EventType::of(E::NAME),
            meta: Meta::default(),
            body: Bytes::new(),
            caller: Caller::Client,
        }
    }

    fn send_from(
        &mut self,
        event_type: EventType,
        mut meta: Meta,
        body: Bytes,
        caller: Caller,
    ) -> TestResponse {
        let correlation = self.next;
        self.next += 1;
        // The listener sends the request id and trace context as typed
        // fields (decision 0146); a test names them as context keys.
        let mut context = switchyard_proto::RequestContext::default();
        meta.0.retain(|(key, value)| match key.as_str() {
            ":request-id" => {
                context.request_id = switchyard_proto::RequestId::given(value.as_bytes());
                false
            }
            ":traceparent" => {
                context.trace = switchyard_proto::TraceContext::continue_from(value.as_bytes());
                false
            }
            _ => true,
        });
        let outputs = self.step(vec![ToPlugin::Request {
            correlation,
            event_type,
            meta,
            body,
            stream: None,
            caller,
            context,
        }]);
        self.drive(outputs, Some(correlation))
            .expect("the manager answered")
    }

    /// Handles outputs (answering calls from stubs) until `want` is answered
    /// or nothing more happens.
    fn drive(&mut self, mut outputs: Vec<FromPlugin>, want: Option<u64>) -> Option<TestResponse> {
        let mut answer = None;
        loop {
            let mut inputs = Vec::new();
            for output in outputs {
                match output {
                    FromPlugin::Response {
                        correlation,
                        status,
                        meta,
                        body,
                        handle,
                    } if Some(correlation) == want => {
                        let (body, aborted) = match handle {
                            // A streamed body is read whole, as its producer
                            // writes it on its thread.
                            Some(RawBody::Stream(raw)) => read_stream(handover::adopt_stream(raw)),
                            Some(pooled) => match handover::adopt_body(pooled).and_then(|p| p.into_bytes()) {
                                Ok(bytes) => (bytes, false),
                                Err(_) => (Bytes::new(), true),
                            },
                            None => (body, false),
                        };
                        answer = Some(TestResponse {
                            status,
                            meta,
                            body,
                            aborted,
                        });
                    }
                    FromPlugin::Response { .. } => {}
                    FromPlugin::Call {
                        call,
                        event_type,
                        body,
                        ..
                    } => {
                        let (status, body) = match self.stubs.get_mut(&event_type) {
                            Some(stub) => stub(&body),
                            None => (
                                404,
                                Error::not_found("no stub for this call").to_response(true).body,
                            ),
                        };
                        let mut meta = Meta::default();
                        meta.push(
                            "content-type",
                            if status < 300 {
                                BINCODE
                            } else {
                                "application/problem+json"
                            },
                        );
                        inputs.push(ToPlugin::CallResult {
                            call,
                            status,
                            meta,
                            body,
                        });
                    }
                    // Jobs run inline, as a worker would run them.
                    FromPlugin::Job {
                        job, job_type, body, ..
                    } => {
                        let output = self.instance.run_job(job_type, &body);
                        self.jobs_run += 1;
                        inputs.push(ToPlugin::JobResult {
                            job,
                            status: output.status,
                            body: output.body,
                        });
                    }
                    FromPlugin::Notify { event_type, body, .. } => {
                        self.notifications.push((event_type, body))
                    }
                    FromPlugin::Log {
                        correlation, message, ..
                    } => self.logs.push((correlation, message)),
                    // Time moves only when a test says (`advance`).
                    FromPlugin::NextTimer { .. } => {}
                    // Jobs and calls are answered at once here: nothing
                    // is left running to stop.
                    FromPlugin::Cancel { .. } => {}
                }
            }
            if inputs.is_empty() {
                return answer;
            }
            outputs = self.step(inputs);
        }
    }
}

/// A request being built for a [`TestManager`] ([`TestManager::build`]).
pub struct TestRequest<'m, M: Manager> {
    manager: &'m mut TestManager<M>,
    event_type: EventType,
    meta: Meta,
    body: Bytes,
    caller: Caller,
}

impl<M: Manager> TestRequest<'_, M> {
    fn with(mut self, key: String, value: &str) -> Self {
        self.meta.push(key, value);
        self
    }

    /// A path parameter.
    pub fn param(self, name: &str, value: &str) -> Self {
        self.with(format!("p.{name}"), value)
    }

    /// The query string (`a=1&b=2`).
    pub fn query(self, query: &str) -> Self {
        self.with("query".into(), query)
    }

    /// A JSON body.
    pub fn json(mut self, body: &[u8]) -> Self {
        self.body = Bytes::copy_from_slice(body);
        self.with("content-type".into(), JSON)
    }

    /// A body of any type: a multipart form, an upload's bytes.
    pub fn body(mut self, content_type: &str, body: &[u8]) -> Self {
        self.body = Bytes::copy_from_slice(body);
        self.with("content-type".into(), content_type)
    }

    /// A bincode body, as a binary WebSocket or gRPC client may send.
    pub fn bincode<T: Serialize>(mut self, value: &T) -> Self {
        self.body = Bytes::from(codec::encode(value).expect("the body encodes"));
        self.with("content-type".into(), BINCODE)
    }

    /// A request header (as declared).
    pub fn header(self, name: &str, value: &str) -> Self {
        self.with(
            format!("{}{}", META_HEADER_PREFIX, name.to_ascii_lowercase()),
            value,
        )
    }

    /// A cookie (as declared).
    pub fn cookie(self, name: &str, value: &str) -> Self {
        self.with(format!("{META_COOKIE_PREFIX}{name}"), value)
    }

    /// A scope value (as declared).
    pub fn scope(self, name: &str, value: serde_json::Value) -> Self {
        self.with(format!("{META_SCOPE_PREFIX}{name}"), &value.to_string())
    }

    /// The authenticated identity.
    pub fn identity(self, identity: &crate::Identity) -> Self {
        let json = serde_json::to_string(identity).expect("an identity encodes");
        self.with(META_IDENTITY.into(), &json)
    }

    /// The method, path, client address or request id (`:method`,
    /// `:path`, `:client`, `:request-id`).
    pub fn context(self, key: &str, value: &str) -> Self {
        self.with(key.to_owned(), value)
    }

    /// Sent by another manager rather than a client.
    pub fn from_manager(mut self) -> Self {
        self.caller = Caller::Manager;
        self
    }

    /// Sends it; the answer.
    pub fn send(self) -> TestResponse {
        let TestRequest {
            manager,
            event_type,
            meta,
            body,
            caller,
        } = self;
        manager.send_from(event_type, meta, body, caller)
    }
}
