//! The manager SDK: what plugin authors write their managers against.
//!
//! A manager is where an event's work happens. Plugin authors implement
//! [`Manager`], declare typed handlers in a [`Registry`] and export the type
//! from a `cdylib` with [`export_manager!`]. The SDK turns an event's bytes
//! into their types and their results back into bytes. Between the plugin
//! and the manager host (`switchyard-manager-host`, which this crate never
//! links) only the versioned C ABI of [`abi`] crosses, so a plugin built by
//! another compiler still loads, and a panic in a handler becomes a 500
//! instead of a dead process.
//!
//! # Layout
//! - [`Event`], [`Request`]: event types and how requests become them
//!   (`extract` does path/query/body merging with coercion).
//! - [`Reply`], [`Response`], [`Error`]: what handlers return;
//!   [`CallError`]: why a call to another manager failed.
//! - [`Manager`], [`Registry`], [`State`]: declaring handlers.
//! - [`schema`]: the JSON Schemas the derives build of events and replies,
//!   for the API description (made by the validation child only).
//! - [`Context`]: what a handler knows of its request (method, path,
//!   client address, request id, identity, scope, declared headers and
//!   cookies), notifications, calls to other managers, jobs, config, logs.
//! - [`Middleware`]: user code around a manager's handlers (`middleware`).
//! - [`Multipart`]: `multipart/form-data` bodies, fields into the event
//!   and files as streams (`Registry::multipart`).
//! - [`Streamed`], [`BodyReader`]: bodies streamed through shared-memory
//!   pipes (downloads and uploads of any size, on their own threads).
//! - `runtime`: one manager instance and a small executor for async handlers.
//! - `reactor`: the plugin's tokio runtime, entered while handlers run, so
//!   sqlx, reqwest and tokio's own timers and sockets work in them.
//! - `export`: the plugin side of the C ABI and [`export_managers!`] (all
//!   the unsafe code of the SDK).
//! - `web`: the representation a request gets by `Accept` (JSON, HTML
//!   through the event's template, bincode; 406 otherwise) and the
//!   templates (minijinja) that render HTML.
//! - [`store`], [`scheduler`]: the built-in Store's and Scheduler's events
//!   (defined in `switchyard-events`, which `switchyard-client` shares,
//!   and re-exported with [`EventName`] and [`DeclaredReply`]; decision
//!   0144), made events here, and their typed handles (`cx.store()`,
//!   `cx.scheduler()`).
//! - [`testing`]: [`TestManager`](testing::TestManager) drives a manager
//!   through the same ABI functions the host calls, in the test's thread.

// The derives name `::switchyard_manager`; only this crate's tests use
// them inside it.
#[cfg(test)]
extern crate self as switchyard_manager;

pub mod scheduler;
pub mod store;
pub mod testing;

mod context;
mod event;
#[doc(hidden)]
pub mod export;
mod extract;
mod middleware;
mod multipart;
mod reactor;
mod registry;
mod reply;
mod runtime;
pub mod schema;
mod stream;
mod trace;
mod web;

/// The plugin ABI (`switchyard-manager-abi`), re-exported for
/// [`export_managers!`] and for hosts of other kinds.
pub use switchyard_manager_abi as abi;

pub use context::{Context, DEFAULT_CALL_TIMEOUT};
/// The `cookie` crate, for [`Response::with_cookie`] and [`Reply::with_cookie`].
pub use cookie;
pub use event::{Event, FORM, Identity, Invalid, Request, RequestInfo, Returns, Source, bound, validate};
pub use middleware::{Flow, Incoming, Middleware, Replacement, RequestHead};
pub use multipart::{Multipart, MultipartLimits, Part};
pub use registry::{Config, Handler, Manager, Registry, State, TICK_PERIOD, marker};
pub use reply::{
    AutoEtag, BINCODE, Binary, CallError, Created, Error, FieldError, Format, JSON, Json, NoContent,
    Redirect, Reply, Response, WithHeaders, shared_body,
};
pub use schema::JsonSchema;
/// The `schemars` crate, for `#[derive(JsonSchema)]` in a plugin that does
/// not depend on it: the derive's code names `schemars::…`, which
/// `use switchyard_manager::{JsonSchema, schemars};` brings into scope
/// (or `#[schemars(crate = "switchyard_manager::schemars")]` on the type).
pub use schemars;
pub use stream::{BodyReader, BodyWriter, MAX_STREAMS, STREAM_IDLE_TIMEOUT, Streamed};
pub use switchyard_events::{DeclaredReply, EventName};
pub use switchyard_manager_abi::messages::LogLevel;
pub use switchyard_manager_macros::{Event, Reply};
pub use switchyard_proto::{EventType, Hop};
/// The `tracing` the SDK forwards to the host's log (decision 0125), for
/// plugins that do not depend on it themselves.
pub use tracing;
pub use web::{HTML, WEB_CONFIG_KEY, builtin_page, etag_of};
