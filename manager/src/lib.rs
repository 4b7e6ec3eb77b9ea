//! Managers: the SDK that user code is written against, and the host process
//! that serves one manager.
//!
//! A manager is where an event's work happens. Plugin authors implement
//! [`Manager`] and register typed handlers in a [`Registry`]; the SDK turns
//! the event's bytes into their types and their results back into bytes. The
//! host ([`host::run`]) connects to the router, declares what the manager
//! serves, and feeds it requests. Between the two sits the plugin boundary,
//! [`Service`]: bytes in, bytes out, panics caught. Today managers are linked
//! statically into the binary; the dynamic-plugin issue puts a versioned C ABI
//! on exactly that boundary.
//!
//! # Layout
//! - [`sdk`]: `Manager`, `Event`, `Registry`, `Context`, replies and errors.
//! - [`service`]: the byte boundary and the dispatcher that implements it.
//! - [`host`]: the manager host process loop.

#![forbid(unsafe_code)]

pub mod host;
pub mod sdk;
pub mod service;

pub use sdk::{Binary, Context, Error, Event, Json, Manager, Registry, Reply, Request, Response};
pub use service::{Dispatcher, Service};
pub use switchyard_proto::EventType;
