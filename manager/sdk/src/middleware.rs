//! Middleware users write: code that looks at a request before its
//! handler, and at the reply on its way out.
//!
//! A middleware runs in the manager process of the routes it wraps
//! (registered with [`Registry::middleware`](crate::Registry::middleware)),
//! so it costs no hop, a panic in it is caught at the plugin boundary like
//! a handler's (500, the manager keeps serving), and an abort kills only
//! that manager (its requests get 503, the supervisor restarts it); the
//! listener and the broker never run user code (decision 0043).
//!
//! Middleware of a manager form an onion in registration order: every
//! `before` runs, outermost first, until one stops the request; then the
//! handler (or the replacement event); then the `after` of every
//! middleware whose `before` let the request through, innermost first,
//! on whatever answer came back. Every path answers: a middleware that
//! stops a request answers it ([`Flow::Respond`]), an error or a panic is
//! a problem+json answer.

use std::rc::Rc;

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;
use switchyard_manager_abi::messages::Caller;
use switchyard_proto::{EventType, Meta, codec};

use crate::context::Context;
use crate::event::{Event, Identity, Request, RequestInfo};
use crate::reply::{BINCODE, Error, Redirect, Reply, Response};

/// A middleware: hooks around the request handlers of the manager that
/// registers it.
///
/// ```
/// use switchyard_manager::{Context, Error, Flow, Incoming, Middleware, RequestInfo};
///
/// /// Resolves the `session` cookie into a user id in the scope, where a
/// /// `#[from(scope = "user_id")]` field picks it up.
/// struct Sessions;
///
/// impl Middleware for Sessions {
///     const REQUEST: RequestInfo = RequestInfo { cookies: &["session"], ..RequestInfo::NONE };
///     fn before(&mut self, req: &mut Incoming<'_>, _cx: &mut Context) -> Result<Flow, Error> {
///         if let Some(user) = req.cookie("session").and_then(|s| s.strip_prefix("user-")) {
///             let user = user.to_owned();
///             req.set_scope("user_id", user);
///         }
///         Ok(Flow::Continue)
///     }
/// }
/// ```
pub trait Middleware: 'static {
    /// What the middleware reads of every request besides its body, added
    /// to the declaration of every route of the manager (only what some
    /// route or middleware declares travels, docs/http.md).
    const REQUEST: RequestInfo = RequestInfo::NONE;

    /// Runs before the handler, with the request as the listener sent it
    /// (and as earlier middleware left it). [`Flow::Continue`] passes it
    /// on; any other flow, or an error, stops it here and is its answer.
    fn before(&mut self, request: &mut Incoming<'_>, cx: &mut Context) -> Result<Flow, Error> {
        let _ = (request, cx);
        Ok(Flow::Continue)
    }

    /// Runs on the answer on its way out (the handler's, an error's, or a
    /// later middleware's), when this middleware's `before` let the
    /// request through. It may change anything: status, headers, body.
    fn after(&mut self, request: &RequestHead, response: &mut Response, cx: &mut Context) {
        let _ = (request, response, cx);
    }
}

/// What a middleware's `before` decides.
pub enum Flow {
    /// Pass the request on (to the next middleware, then the handler).
    Continue,
    /// Answer it here; the handler does not run.
    Respond(Response),
    /// Handle this event instead: by this manager's handler for its type,
    /// or by whichever manager serves it (through the router). It keeps
    /// the request's context (request id, scope, headers).
    Replace(Replacement),
}

impl Flow {
    /// Answers with `reply` (in the format the caller asked for).
    pub fn respond(reply: impl Reply, cx: &Context) -> Result<Flow, Error> {
        reply.into_response(cx.format()).map(Flow::Respond)
    }

    /// Answers with a redirect; a target with CR, LF or NUL is refused
    /// (400), never written into `Location`.
    pub fn redirect(kind: Redirect, location: &str) -> Result<Flow, Error> {
        Response::redirect(kind, location).map(Flow::Respond)
    }

    /// Replaces the request's event with `event`.
    pub fn replace<E: Event>(event: &E) -> Result<Flow, Error> {
        let body = codec::encode(event)
            .map_err(|e| Error::internal(format!("cannot encode the replacement event: {e}")))?;
        Ok(Flow::Replace(Replacement {
            event_type: EventType::of(E::NAME),
            name: E::NAME,
            body: Bytes::from(body),
        }))
    }
}

/// An event a middleware put in place of the request's (see
/// [`Flow::replace`]).
pub struct Replacement {
    pub(crate) event_type: EventType,
    pub(crate) name: &'static str,
    pub(crate) body: Bytes,
}

/// The request as a middleware's `before` sees it: its event type, its
/// context (what the routes and middleware declare) and its body. The
/// scope may be added to.
pub struct Incoming<'a> {
    pub(crate) event_type: EventType,
    pub(crate) name: Option<&'a str>,
    pub(crate) meta: &'a mut Rc<Meta>,
    pub(crate) body: &'a [u8],
    pub(crate) caller: Caller,
    pub(crate) naming: Option<Rc<crate::context::Naming>>,
}

/// The request as a middleware's `after` sees it: its event type and
/// context, without the body.
pub struct RequestHead {
    pub(crate) event_type: EventType,
    pub(crate) name: Option<String>,
    pub(crate) meta: Rc<Meta>,
    pub(crate) naming: Option<Rc<crate::context::Naming>>,
    pub(crate) caller: Caller,
}

macro_rules! read_access {
    () => {
        /// The event type of the request.
        pub fn event_type(&self) -> EventType {
            self.event_type
        }

        /// Whether the request's event is `E`.
        pub fn is<E: Event>(&self) -> bool {
            self.event_type == EventType::of(E::NAME)
        }

        /// Whether a client sent it (rather than another manager).
        pub fn from_client(&self) -> bool {
            self.caller == Caller::Client
        }

        /// The request id (see [`Context::request_id`]).
        pub fn request_id(&self) -> Option<&str> {
            self.naming
                .as_deref()
                .and_then(crate::context::Naming::request_id)
        }

        /// The method, when declared.
        pub fn method(&self) -> Option<&str> {
            crate::event::method(&self.meta)
        }

        /// The path, when declared.
        pub fn path(&self) -> Option<&str> {
            crate::event::path(&self.meta)
        }

        /// The client's IP address, when declared.
        pub fn client_ip(&self) -> Option<std::net::IpAddr> {
            crate::event::client_ip(&self.meta)
        }

        /// A declared request header.
        pub fn header(&self, name: &str) -> Option<&str> {
            crate::event::header(&self.meta, name)
        }

        /// A declared cookie.
        pub fn cookie(&self, name: &str) -> Option<&str> {
            crate::event::cookie(&self.meta, name)
        }

        /// A value of the scope, when declared (or set by a middleware).
        pub fn scope(&self, name: &str) -> Option<serde_json::Value> {
            crate::event::scope(&self.meta, name)
        }

        /// The authenticated identity, when declared.
        pub fn identity(&self) -> Option<Identity> {
            crate::event::identity(&self.meta)
        }
    };
}

impl Incoming<'_> {
    read_access!();

    /// The event type's name, when this manager serves it.
    pub fn event_name(&self) -> Option<&str> {
        self.name
    }

    /// The raw body (JSON or bincode, as the caller sent it).
    pub fn body(&self) -> &[u8] {
        self.body
    }

    /// The request decoded as `E` (as its handler would see it), or the
    /// 4xx error its handler would get.
    pub fn decode<E: Event>(&self) -> Result<E, Error> {
        let request = Request::from_caller(self.meta, self.body, self.caller);
        E::from_request(&request)
    }

    /// Adds `name` to the request's scope (replacing it if there):
    /// handlers read it with `Context::scope` and `#[from(scope)]` fields.
    /// Only middleware and authentication set the scope; a client cannot.
    pub fn set_scope(&mut self, name: &str, value: impl Serialize) {
        let value = serde_json::to_value(value).unwrap_or(serde_json::Value::Null);
        crate::event::set_scope(Rc::make_mut(self.meta), name, &value);
    }

    /// The scope value `name` as `T`.
    pub fn scope_as<T: DeserializeOwned>(&self, name: &str) -> Option<T> {
        self.scope(name).and_then(|v| serde_json::from_value(v).ok())
    }
}

impl RequestHead {
    read_access!();

    /// The event type's name, when this manager serves it.
    pub fn event_name(&self) -> Option<&str> {
        self.name.as_deref()
    }
}

/// A middleware behind a `dyn`, as the registry keeps it.
pub(crate) trait Erased {
    fn before(&mut self, request: &mut Incoming<'_>, cx: &mut Context) -> Result<Flow, Error>;
    fn after(&mut self, request: &RequestHead, response: &mut Response, cx: &mut Context);
    fn name(&self) -> &'static str;
}

impl<W: Middleware> Erased for W {
    fn before(&mut self, request: &mut Incoming<'_>, cx: &mut Context) -> Result<Flow, Error> {
        Middleware::before(self, request, cx)
    }
    fn after(&mut self, request: &RequestHead, response: &mut Response, cx: &mut Context) {
        Middleware::after(self, request, response, cx)
    }
    fn name(&self) -> &'static str {
        std::any::type_name::<W>()
    }
}

/// The meta a replacement event travels with: the request's context, its
/// body now bincode.
pub(crate) fn replacement_meta(request: &Meta, name: &str) -> Meta {
    let mut meta = Meta(
        request
            .0
            .iter()
            .filter(|(k, _)| k != "content-type" && k != "query" && !k.starts_with("p."))
            .filter(|(k, _)| k != switchyard_proto::control::META_EVENT)
            .cloned()
            .collect(),
    );
    meta.push("content-type", BINCODE);
    meta.push(switchyard_proto::control::META_EVENT, name);
    meta
}
