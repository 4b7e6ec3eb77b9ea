//! The plugin boundary: bytes in, bytes out.
//!
//! The host never sees a manager's types. It hands a [`Service`] the event
//! type, meta and body of a request and gets back a status, meta and body.
//! A panic inside a handler is caught here and becomes a 500: the manager
//! process keeps serving.

use std::panic::{AssertUnwindSafe, catch_unwind};

use switchyard_proto::control::{HandledType, ManagerDescription};
use switchyard_proto::{EventType, Meta, problem};

use crate::sdk::{Context, Manager, Registry, Request, Response};

/// What a host needs from a manager.
pub trait Service: Send {
    /// The manager's name and the types it serves.
    fn describe(&self) -> ManagerDescription;
    /// Answers one request. Never panics: failures are responses.
    fn handle(&mut self, event_type: EventType, correlation: u64, meta: &Meta, body: &[u8]) -> Response;
}

/// Adapts a [`Manager`] to the [`Service`] boundary.
pub struct Dispatcher<M: Manager> {
    manager: M,
    registry: Registry<M>,
}

impl<M: Manager> Dispatcher<M> {
    pub fn new(manager: M) -> Self {
        let mut registry = Registry::new();
        M::register(&mut registry);
        Dispatcher { manager, registry }
    }

    /// The declared request types (for tests and descriptions).
    pub fn handles(&self) -> &[HandledType] {
        &self.registry.handles
    }
}

impl<M: Manager> Service for Dispatcher<M> {
    fn describe(&self) -> ManagerDescription {
        ManagerDescription {
            name: M::NAME.to_owned(),
            pid: std::process::id(),
            handles: self.registry.handles.clone(),
            subscribes: Vec::new(),
        }
    }

    fn handle(&mut self, event_type: EventType, correlation: u64, meta: &Meta, body: &[u8]) -> Response {
        let Some(handler) = self.registry.handlers.get(&event_type) else {
            return error_response(404, "this manager has no handler for the event type");
        };
        let request = Request::new(meta, body);
        let mut cx = Context { correlation };
        let manager = &mut self.manager;
        match catch_unwind(AssertUnwindSafe(|| handler(manager, &request, &mut cx))) {
            Ok(Ok(response)) => response,
            Ok(Err(err)) => error_response(err.status, &err.message),
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "non-string panic".into());
                tracing::error!(correlation, panic = %what, manager = M::NAME, "handler panicked");
                // The panic message may carry internals: not for the client.
                error_response(500, "the handler failed")
            }
        }
    }
}

fn error_response(status: u16, detail: &str) -> Response {
    let (meta, body) = problem::problem(status, detail);
    Response { status, meta, body }
}
