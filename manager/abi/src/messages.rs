//! What crosses the plugin boundary, encoded with the wire codec (bincode).
//! The host and the plugin may be built by different compilers; these types
//! and [`ABI_VERSION`](crate::ABI_VERSION) are the whole contract.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use switchyard_proto::api::TypeDoc;
use switchyard_proto::control::{DeclaredType, HandledType, ManagerDescription};
use switchyard_proto::{EventType, Meta, RequestContext};

/// Given to the plugin when an instance is created.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CreateArgs {
    /// The manager's configured name.
    pub name: String,
    /// Instance number among the manager's instances (0-based).
    pub instance: u32,
    /// The manager's `config` table from `switchyard.toml`, as JSON text.
    pub config_json: String,
    /// Whether 5xx error messages may reach clients.
    pub expose_errors: bool,
    /// Response bodies this large or larger leave the plugin in shared
    /// memory (`u64::MAX`: never, as in in-process tests).
    pub shm_threshold: u64,
    /// The process's shared-memory budget (a plugin library has its own
    /// copy of the accounting).
    pub shm_budget: u64,
    /// The instance is made only to check the configuration (by
    /// `switchyard check` and before `up` starts the group) and is
    /// destroyed at once: it will serve nothing.
    pub validation: bool,
}

/// What the plugin declares once created.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Description {
    /// The manager type's own name (`Manager::NAME`).
    pub kind: String,
    pub handles: Vec<HandledType>,
    pub subscribes: Vec<EventType>,
    /// The manager has timers: the host sends [`ToPlugin::Timers`] when
    /// the plugin says the next one is due ([`FromPlugin::NextTimer`]),
    /// at most every [`TICK_PERIOD`](crate::TICK_PERIOD) until it has.
    pub timers: bool,
    /// Every type the manager handles, subscribes to or emits, described
    /// for clients (`/openapi.json`, `/docs`, typed gRPC). Filled only for
    /// a validation instance ([`CreateArgs::validation`]): the validation
    /// child is the one that reads it, so a serving instance neither
    /// builds nor sends it.
    pub types: Vec<TypeDoc>,
    /// The notification types the manager subscribes to or emits, by
    /// name, with whether clients may send them (decision 0108).
    pub notifications: Vec<DeclaredType>,
}

impl Description {
    /// The declaration the router receives for the configured `name`.
    pub fn for_router(&self, name: &str) -> ManagerDescription {
        ManagerDescription {
            name: name.to_owned(),
            pid: std::process::id(),
            handles: self.handles.clone(),
            subscribes: self.subscribes.clone(),
            notifications: self.notifications.clone(),
        }
    }
}

/// A streaming pipe's end handed across the boundary: descriptor numbers of
/// this process, whose ownership moves with the message (the receiving side
/// adopts them exactly once; see [`crate::handover`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RawStream {
    pub ring: i32,
    pub wake: i32,
    pub length: Option<u64>,
}

/// A response body handed across the boundary as descriptors (ownership
/// moves with the message, as for [`RawStream`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RawBody {
    /// A streaming pipe.
    Stream(RawStream),
    /// `len` bytes in a reusable pool segment (`switchyard_proto::pool`).
    Pooled { fd: i32, len: u64 },
    /// The first `len` bytes of a sealed memfd the plugin keeps and answers
    /// with again (`ShmBody::share`).
    Sealed { fd: i32, len: u64 },
}

/// Host → plugin.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum ToPlugin {
    /// A request to answer with exactly one [`FromPlugin::Response`].
    /// `stream`: the body arrives through a pipe (an upload route); `body`
    /// is then empty.
    Request {
        correlation: u64,
        event_type: EventType,
        meta: Meta,
        body: Bytes,
        stream: Option<RawStream>,
        /// Who sent it, as the hops that stamped its return address know:
        /// a client's request never sets an event field bound to a
        /// header, a cookie or the scope from its body (docs/http.md).
        caller: Caller,
        /// Its id and trace context (decision 0146), printed only if the
        /// plugin asks.
        context: RequestContext,
    },
    /// A notification the manager subscribed to.
    Notification {
        event_type: EventType,
        meta: Meta,
        body: Bytes,
    },
    /// The answer to a [`FromPlugin::Call`].
    CallResult {
        call: u64,
        status: u16,
        meta: Meta,
        body: Bytes,
    },
    /// The result of a [`FromPlugin::Job`]: status 200 and the bincode
    /// result, or an error status and a UTF-8 message.
    JobResult { job: u64, status: u16, body: Bytes },
    /// Nothing new from the host: a plugin thread asked to be stepped
    /// (`HostApi::wake`), e.g. because an upload handler finished, or the
    /// host's periodic idle step, when the plugin does its housekeeping.
    Wake,
    /// Run the timers due by now plus `ahead_ms` (the host sends 0 when
    /// the plugin's [`FromPlugin::NextTimer`] is due; tests move time
    /// forward).
    Timers { ahead_ms: u64 },
    /// Request `correlation` is no longer wanted (its client went away or
    /// its deadline passed): drop its handler, answer nothing. The jobs
    /// and calls the handler was awaiting are given up with it
    /// ([`FromPlugin::Cancel`]). A request already answered is ignored.
    Cancel { correlation: u64 },
}

/// Who sent a request, as the host knows it from the envelope's return
/// address (stamped by the broker and the router, never by a client).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Caller {
    /// A client, through a listener (HTTP, WebSocket, gRPC): untrusted.
    Client,
    /// Another manager of the group (`cx.call`): trusted code, whose event
    /// fields stand as it set them.
    Manager,
}

/// Plugin → host.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum FromPlugin {
    /// `handle`: the body is in shared memory instead — a pool segment the
    /// plugin wrote (no copy across the boundary), or a pipe whose producer
    /// runs on a plugin thread; `body` is then empty.
    Response {
        correlation: u64,
        status: u16,
        meta: Meta,
        body: Bytes,
        handle: Option<RawBody>,
    },
    /// A request to another manager; its answer comes back as a CallResult.
    Call {
        call: u64,
        event_type: EventType,
        meta: Meta,
        body: Bytes,
        timeout_ms: u64,
        /// The request the call is made for: the callee's lines name it.
        context: RequestContext,
    },
    Notify {
        event_type: EventType,
        meta: Meta,
        body: Bytes,
    },
    /// A job for the manager's worker pool; its result comes back as a
    /// JobResult. `timeout_ms` 0: the pool's configured deadline.
    Job {
        job: u64,
        job_type: EventType,
        body: Bytes,
        timeout_ms: u64,
        /// The request the job serves (its correlation, as in
        /// [`FromPlugin::Log`]), 0 outside one: the host tags the job's
        /// log lines with that request's id and trace id.
        correlation: u64,
    },
    Log {
        level: LogLevel,
        correlation: u64,
        message: String,
    },
    /// The manager's earliest timer is due in `in_ms` milliseconds: the
    /// host sends [`ToPlugin::Timers`] then, and not before, so an idle
    /// manager with a timer a second apart wakes once a second, not every
    /// [`TICK_PERIOD`](crate::TICK_PERIOD). Sent after any step that moved
    /// the earliest deadline.
    NextTimer { in_ms: u64 },
    /// The job or call `id` ([`FromPlugin::Job::job`],
    /// [`FromPlugin::Call::call`]) is no longer awaited: the host takes a
    /// queued job out of its pool's queue, stops a running process job
    /// (its worker is killed, as past a deadline), and cancels a call at
    /// the manager serving it. Its result, if one still comes, is not
    /// sent to the plugin.
    Cancel { id: u64 },
}

/// Log levels a plugin can log at through the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
}

impl LogLevel {
    /// The level's number in the C ABI.
    pub fn code(self) -> u32 {
        match self {
            LogLevel::Error => 0,
            LogLevel::Warn => 1,
            LogLevel::Info => 2,
            LogLevel::Debug => 3,
        }
    }

    /// The level of an ABI number (unknown numbers log at debug).
    pub fn from_code(code: u32) -> LogLevel {
        match code {
            0 => LogLevel::Error,
            1 => LogLevel::Warn,
            2 => LogLevel::Info,
            _ => LogLevel::Debug,
        }
    }
}

/// What the `run_job` entry writes: status 200 and the bincode result, or an
/// error status and a UTF-8 message.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct JobOutput {
    pub status: u16,
    pub body: Bytes,
}
