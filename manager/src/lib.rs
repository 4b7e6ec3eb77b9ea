//! Managers: the SDK that user code is written against, and the host process
//! that serves one manager.
//!
//! A manager is where an event's work happens. Plugin authors implement
//! [`Manager`], declare typed handlers in a [`Registry`] and export the type
//! from a `cdylib` with [`export_manager!`]. The SDK turns an event's bytes
//! into their types and their results back into bytes; between the plugin and
//! the host ([`host::run`]) only a versioned C ABI of bytes crosses ([`abi`]),
//! so a plugin built by another compiler still loads, and a panic in a
//! handler becomes a 500 instead of a dead process.
//!
//! # Layout
//! - [`Event`], [`Request`]: event types and how requests become them
//!   (`extract` does path/query/body merging with coercion).
//! - [`Reply`], [`Response`], [`Error`]: what handlers return.
//! - [`Manager`], [`Registry`], [`State`]: declaring handlers.
//! - [`Context`]: notifications, calls to other managers, config, logs.
//! - [`Streamed`], [`BodyReader`]: bodies streamed through shared-memory
//!   pipes (downloads and uploads of any size, on their own threads).
//! - `runtime`: the plugin side of the boundary, with a small executor.
//! - [`abi`]: the C ABI, the export macros and the loader (all the unsafe code).
//! - [`host`]: the manager host process loop.
//! - [`testing`]: run a manager in-process in unit tests.

pub mod abi;
pub mod host;
pub mod messages;
pub mod testing;

mod context;
mod event;
mod extract;
mod registry;
mod reply;
mod runtime;
mod stream;

pub use context::{Context, DEFAULT_CALL_TIMEOUT};
pub use event::{Event, Invalid, Request, validate};
pub use messages::LogLevel;
pub use registry::{Config, Manager, Registry, State, TICK, TICK_PERIOD};
pub use reply::{BINCODE, Binary, Error, FieldError, Format, JSON, Json, Reply, Response};
pub use runtime::{LogSink, Runtime, WakeHost};
pub use stream::{BodyReader, BodyWriter, MAX_STREAMS, STREAM_IDLE_TIMEOUT, Streamed};
pub use switchyard_manager_macros::{Event, Reply};
pub use switchyard_proto::EventType;
