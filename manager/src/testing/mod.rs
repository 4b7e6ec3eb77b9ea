//! Helpers for testing managers.
//!
//! [`TestManager`] runs a manager in-process, without a group: send it
//! events, stub the managers it calls, look at what it notified. [`Group`]
//! starts a real group (the `switchyard` binary) for integration tests.

mod group;

pub use group::Group;

use std::collections::HashMap;

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;
use switchyard_proto::{EventType, Meta, codec};

use crate::event::Event;
use crate::messages::{CreateArgs, FromPlugin, ToPlugin};
use crate::registry::Manager;
use crate::reply::{BINCODE, Error, JSON};
use crate::runtime::Runtime;

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
/// #     fn register(r: &mut Registry<Self>) { r.request(Self::greet); }
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
    runtime: Runtime<M>,
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
        };
        let (runtime, _) = Runtime::<M>::create(args, None, None)?;
        Ok(TestManager {
            runtime,
            next: 1,
            stubs: HashMap::new(),
            notifications: Vec::new(),
            logs: Vec::new(),
            jobs_run: 0,
        })
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
        let output = crate::runtime::run_job::<M>(EventType::of(J::NAME), &input);
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
        let outputs = self.runtime.step(vec![ToPlugin::Notification {
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
        self.runtime.run_timers(std::time::Instant::now() + elapsed);
        let outputs = self.runtime.step(Vec::new());
        self.drive(outputs, None);
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
        let correlation = self.next;
        self.next += 1;
        let outputs = self.runtime.step(vec![ToPlugin::Request {
            correlation,
            event_type,
            meta,
            body,
            stream: None,
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
                            Some(crate::messages::RawBody::Stream(raw)) => {
                                read_stream(crate::abi::adopt_stream(raw))
                            }
                            Some(pooled) => match crate::abi::adopt_body(pooled).and_then(|p| p.bytes()) {
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
                        let output = crate::runtime::run_job::<M>(job_type, &body);
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
                }
            }
            if inputs.is_empty() {
                return answer;
            }
            outputs = self.runtime.step(inputs);
        }
    }
}
