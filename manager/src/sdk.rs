//! The types a manager author touches.

use std::collections::HashMap;

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;
use switchyard_proto::control::{HandledType, HttpRoute};
use switchyard_proto::{EventType, Meta};

/// A manager: a type with state that answers events.
///
/// ```
/// use switchyard_manager::{Context, Error, Event, Json, Manager, Registry};
///
/// #[derive(serde::Deserialize, serde::Serialize)]
/// struct Hello { name: String }
/// impl Event for Hello {
///     const NAME: &'static str = "demo.Hello";
///     const ROUTE: Option<(&'static str, &'static str)> = Some(("GET", "/hello/{name}"));
/// }
///
/// #[derive(serde::Serialize)]
/// struct Greeting { message: String }
///
/// #[derive(Default)]
/// struct Greeter { greeted: u64 }
/// impl Manager for Greeter {
///     const NAME: &'static str = "greeter";
///     fn register(r: &mut Registry<Self>) { r.request(Self::greet); }
/// }
/// impl Greeter {
///     fn greet(&mut self, ev: Hello, _cx: &mut Context) -> Result<Json<Greeting>, Error> {
///         self.greeted += 1;
///         Ok(Json(Greeting { message: format!("Hello, {}!", ev.name) }))
///     }
/// }
/// ```
pub trait Manager: Sized + Send + 'static {
    /// The manager's name (its instances share it; config refers to it).
    const NAME: &'static str;
    /// Declares the handlers; runs once when the manager is created.
    fn register(registry: &mut Registry<Self>);
}

/// An event type a manager can receive: its name, optional HTTP route, and
/// how it is built from a request.
pub trait Event: DeserializeOwned + Serialize {
    /// Stable type name, e.g. `shop.Checkout`.
    const NAME: &'static str;
    /// The HTTP route that produces this event: `("GET", "/hello/{name}")`.
    const ROUTE: Option<(&'static str, &'static str)> = None;

    /// Builds the event from a request. The default takes the fields from
    /// the path parameters and the query string when the body is empty, and
    /// from the JSON body otherwise (path parameters must then match by name).
    fn from_request(request: &Request<'_>) -> Result<Self, Error> {
        if request.body.is_empty() {
            // Path parameters win over query keys of the same name: the
            // route, not the client, decides what `{name}` is.
            let pairs: Vec<(&str, &str)> = request
                .query_pairs
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .filter(|(k, _)| request.path_param(k).is_none())
                .chain(request.path_params())
                .collect();
            let encoded =
                serde_urlencoded::to_string(&pairs).map_err(|e| Error::bad_request(e.to_string()))?;
            serde_urlencoded::from_str(&encoded).map_err(|e| Error::unprocessable(e.to_string()))
        } else {
            request.json()
        }
    }
}

/// A request as a handler's extractor sees it.
pub struct Request<'a> {
    pub meta: &'a Meta,
    pub body: &'a [u8],
    query_pairs: Vec<(String, String)>,
}

impl<'a> Request<'a> {
    /// Wraps an event's meta and body.
    pub fn new(meta: &'a Meta, body: &'a [u8]) -> Self {
        let query_pairs = meta
            .get("query")
            .map(|q| serde_urlencoded::from_str::<Vec<(String, String)>>(q).unwrap_or_default())
            .unwrap_or_default();
        Request {
            meta,
            body,
            query_pairs,
        }
    }

    /// The path parameters, `("name", "world")` for `/hello/{name}`.
    pub fn path_params(&self) -> impl Iterator<Item = (&str, &str)> {
        self.meta
            .iter()
            .filter_map(|(k, v)| k.strip_prefix("p.").map(|k| (k, v)))
    }

    /// One path parameter.
    pub fn path_param(&self, name: &str) -> Option<&str> {
        self.path_params().find(|(k, _)| *k == name).map(|(_, v)| v)
    }

    /// The body decoded as JSON: 400 when it is not JSON, 422 when it does
    /// not fit `T` (the message names the field).
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, Error> {
        let value: serde_json::Value = serde_json::from_slice(self.body)
            .map_err(|e| Error::bad_request(format!("body is not valid JSON: {e}")))?;
        serde_json::from_value(value).map_err(|e| Error::unprocessable(format!("body does not match: {e}")))
    }
}

/// What a handler produces on the wire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub meta: Meta,
    pub body: Bytes,
}

impl Response {
    /// A response with a content type.
    pub fn new(status: u16, content_type: &str, body: impl Into<Bytes>) -> Response {
        let mut meta = Meta::default();
        meta.push("content-type", content_type);
        Response {
            status,
            meta,
            body: body.into(),
        }
    }
}

/// Turns a handler's return value into a [`Response`].
pub trait Reply {
    fn into_response(self) -> Result<Response, Error>;
}

/// A JSON reply (200).
pub struct Json<T>(pub T);

impl<T: Serialize> Reply for Json<T> {
    fn into_response(self) -> Result<Response, Error> {
        let body =
            serde_json::to_vec(&self.0).map_err(|e| Error::internal(format!("cannot encode reply: {e}")))?;
        Ok(Response::new(200, "application/json", body))
    }
}

/// A raw bytes reply (200, `application/octet-stream`).
pub struct Binary(pub Bytes);

impl Reply for Binary {
    fn into_response(self) -> Result<Response, Error> {
        Ok(Response::new(200, "application/octet-stream", self.0))
    }
}

impl Reply for Response {
    fn into_response(self) -> Result<Response, Error> {
        Ok(self)
    }
}

/// A handler's error: an HTTP-like status and a message for the client.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct Error {
    pub status: u16,
    pub message: String,
}

impl Error {
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        Error {
            status,
            message: message.into(),
        }
    }
    /// 400: the request is malformed.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Error::new(400, message)
    }
    /// 404: the thing asked for does not exist.
    pub fn not_found(message: impl Into<String>) -> Self {
        Error::new(404, message)
    }
    /// 422: well-formed, but the values are not acceptable.
    pub fn unprocessable(message: impl Into<String>) -> Self {
        Error::new(422, message)
    }
    /// 500: our fault.
    pub fn internal(message: impl Into<String>) -> Self {
        Error::new(500, message)
    }
}

/// Per-request context handed to handlers.
pub struct Context {
    /// The request's correlation id (for logs).
    pub correlation: u64,
}

impl Context {
    /// Logs `message` at info level, tagged with the request's correlation id.
    pub fn log(&self, message: &str) {
        tracing::info!(correlation = self.correlation, "{message}");
    }
}

type Handler<M> = Box<dyn Fn(&mut M, &Request<'_>, &mut Context) -> Result<Response, Error> + Send>;

/// The handlers of a manager, keyed by event type.
pub struct Registry<M> {
    pub(crate) handlers: HashMap<EventType, Handler<M>>,
    pub(crate) handles: Vec<HandledType>,
}

impl<M: Manager> Registry<M> {
    pub(crate) fn new() -> Self {
        Registry {
            handlers: HashMap::new(),
            handles: Vec::new(),
        }
    }

    /// Registers a request handler for the event type `E`.
    pub fn request<E, R>(&mut self, handler: fn(&mut M, E, &mut Context) -> Result<R, Error>) -> &mut Self
    where
        E: Event + 'static,
        R: Reply + 'static,
    {
        let event_type = EventType::of(E::NAME);
        self.handles.push(HandledType {
            name: E::NAME.to_owned(),
            event_type,
            route: E::ROUTE.map(|(method, path)| HttpRoute {
                method: method.to_owned(),
                path: path.to_owned(),
            }),
        });
        self.handlers.insert(
            event_type,
            Box::new(move |manager, request, cx| {
                let event = E::from_request(request)?;
                handler(manager, event, cx)?.into_response()
            }),
        );
        self
    }
}
