//! Event types and how a request becomes one.

use serde::Serialize;
use serde::de::DeserializeOwned;
use switchyard_manager_abi::messages::Caller;
use switchyard_proto::control::RequestNeeds;
use switchyard_proto::event::{
    META_CLIENT, META_COOKIE_PREFIX, META_HEADER_PREFIX, META_IDENTITY, META_METHOD, META_PATH,
    META_SCOPE_PREFIX,
};
use switchyard_proto::{Meta, codec};

use crate::extract;
use crate::reply::{BINCODE, Error, FieldError};

/// Content type of HTML form bodies.
pub const FORM: &str = "application/x-www-form-urlencoded";

/// An event type a manager can receive or send. Derive it:
///
/// ```
/// use serde::{Deserialize, Serialize};
/// use switchyard_manager::Event;
///
/// #[derive(Serialize, Deserialize, Event)]
/// #[event(name = "shop.GetItem", http = "GET /items/{id}")]
/// struct GetItem {
///     #[validate(range(min = 1))]
///     id: u64,
///     #[validate(length(max = 8))]
///     lang: Option<String>,
/// }
/// assert_eq!(GetItem::ROUTE, Some(("GET", "/items/{id}")));
/// ```
pub trait Event: DeserializeOwned + Serialize + 'static {
    /// Stable type name, e.g. `shop.Checkout`; interned to the routing id.
    const NAME: &'static str;
    /// The HTTP route that produces this event: `("GET", "/items/{id}")`.
    const ROUTE: Option<(&'static str, &'static str)> = None;
    /// What the handler reads of its request besides the body, path
    /// parameters and query: `#[event(request(...))]` and the fields bound
    /// with `#[from(...)]` declare it. Only this travels with the event
    /// (docs/http.md).
    const REQUEST: RequestInfo = RequestInfo::NONE;
    /// The template that renders this event's reply as HTML, for clients
    /// whose `Accept` prefers `text/html` (`#[event(template =
    /// "hello.html")]`; docs/web.md). None: JSON and bincode only.
    const TEMPLATE: Option<&'static str> = None;
    /// Whether clients may send this event over WebSocket and gRPC
    /// (`#[event(public)]`). An event with an HTTP [`ROUTE`](Self::ROUTE)
    /// is public anyway; any other is internal: only the group's managers
    /// may send it, and clients get the same 404 as for a type no manager
    /// declares (decision 0108).
    const PUBLIC: bool = false;

    /// Builds the event from a request. From another manager: the bincode
    /// body. From HTTP: the fields of a JSON-object body, the query string
    /// and the path parameters, merged (path wins, then body, then query),
    /// with text coerced to numbers and bools where the field wants them.
    fn from_request(request: &Request<'_>) -> Result<Self, Error> {
        if request.is_bincode() {
            return request.body_as();
        }
        let body = if request.body.is_empty() {
            None
        } else {
            match request.json_value()? {
                serde_json::Value::Object(map) => Some(map),
                _ => return Err(Error::unprocessable("the request body must be a JSON object")),
            }
        };
        let merged = extract::merge(request.query(), body, request.path_params());
        extract::from_value(&merged)
    }

    /// Checks the values after decoding; the derive generates it from
    /// `#[validate(...)]` field attributes.
    fn validate(&self) -> Result<(), Invalid> {
        Ok(())
    }

    /// The type described for clients: its fields' JSON Schema with their
    /// docs and validation rules (`/openapi.json`, `/docs`). The derive
    /// generates it; by default, any JSON value.
    #[doc(hidden)]
    fn schema(generator: &mut crate::schema::SchemaGenerator) -> crate::schema::EventSchema {
        let _ = generator;
        crate::schema::EventSchema::any()
    }
}

/// What an event (or a middleware) declares it reads of its request,
/// besides the body, the path parameters and the query string, which
/// always travel. Built by `#[event(request(...))]` and `#[from(...)]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestInfo {
    /// The method (`Context::method`).
    pub method: bool,
    /// The path as received (`Context::path`).
    pub path: bool,
    /// The client's IP address (`Context::client_ip`).
    pub client: bool,
    /// The whole identity with every claim (`Context::identity`).
    pub identity: bool,
    /// Request headers (lowercase names) (`Context::header`).
    pub headers: &'static [&'static str],
    /// Cookies (`Context::cookie`).
    pub cookies: &'static [&'static str],
    /// Claims of the identity's scope (`Context::scope`).
    pub scope: &'static [&'static str],
}

impl RequestInfo {
    /// Nothing beyond body, path parameters and query.
    pub const NONE: RequestInfo = RequestInfo {
        method: false,
        path: false,
        client: false,
        identity: false,
        headers: &[],
        cookies: &[],
        scope: &[],
    };

    /// The declaration as it travels to the listener.
    pub fn needs(&self) -> RequestNeeds {
        let names = |list: &[&str]| list.iter().map(|n| n.to_ascii_lowercase()).collect::<Vec<_>>();
        RequestNeeds {
            method: self.method,
            path: self.path,
            client: self.client,
            identity: self.identity,
            headers: names(self.headers),
            cookies: self.cookies.iter().map(|n| (*n).to_owned()).collect(),
            scope: self.scope.iter().map(|n| (*n).to_owned()).collect(),
        }
    }
}

/// The reply an event's handler returns and a [`Context::call`] of it
/// gives: `#[event(reply = R)]` implements `Returns<R>` alone, so the call's
/// result type is inferred and [`Registry::handle`] refuses a handler that
/// returns anything else. An event that names no reply implements it for
/// every type (any handler, a call's result as the caller annotates it).
///
/// ```compile_fail,E0277
/// # use serde::{Deserialize, Serialize};
/// # use switchyard_manager::{Config, Context, Error, Event, Manager, Registry, Reply};
/// #[derive(Serialize, Deserialize, Event)]
/// #[event(name = "shop.Reserve", reply = Reserved)]
/// struct Reserve { sku: String }
/// #[derive(Serialize, Deserialize, Reply)]
/// struct Reserved { left: u32 }
/// #[derive(Serialize, Deserialize, Reply)]
/// struct Other { left: u32 }
/// struct Stock;
/// impl Stock {
///     // Returns `Other`, but `Reserve` declares `Reserved`: does not compile.
///     fn reserve(&mut self, _: Reserve, _: &mut Context) -> Result<Other, Error> { Ok(Other { left: 1 }) }
/// }
/// impl Manager for Stock {
///     const NAME: &'static str = "stock";
///     fn create(_: &Config) -> Result<Self, Error> { Ok(Stock) }
///     fn register(r: &mut Registry<Self>) { r.handle(Self::reserve); }
/// }
/// ```
///
/// ```compile_fail,E0277
/// # use serde::{Deserialize, Serialize};
/// # use switchyard_manager::{Context, Error, Event, Reply};
/// # #[derive(Serialize, Deserialize, Event)]
/// # #[event(name = "shop.Reserve", reply = Reserved)]
/// # struct Reserve { sku: String }
/// # #[derive(Serialize, Deserialize, Reply)]
/// # struct Reserved { left: u32 }
/// # #[derive(Serialize, Deserialize)]
/// # struct Other { left: u32 }
/// async fn order(cx: Context) -> Result<(), Error> {
///     // A call of `Reserve` gives `Reserved`, not `Other`: does not compile.
///     let other: Other = cx.call(&Reserve { sku: "a".into() }).await?;
///     Ok(())
/// }
/// ```
///
/// [`Context::call`]: crate::Context::call
/// [`Registry::handle`]: crate::Registry::handle
#[diagnostic::on_unimplemented(
    message = "`{Self}` declares another reply than `{R}`",
    label = "its `#[event(reply = ..)]` names the one type its handler returns and a call of it gives"
)]
pub trait Returns<R>: Event {}

/// Makes the built-in Store's and Scheduler's events (plain serde types of
/// `switchyard-events`, which cannot derive [`Event`] for want of this
/// crate) events as the derive would: named by their `EventName`, any
/// reply a caller annotates, the identity read where the built-in checks
/// it, schemas from `schemars`.
macro_rules! builtin_events {
    (@reads identity) => {
        $crate::event::RequestInfo { identity: true, ..$crate::event::RequestInfo::NONE }
    };
    (@reads notification) => {
        $crate::event::RequestInfo::NONE
    };
    ($($($ty:ident),+ => $reads:ident;)+) => {
        $($(
            impl $crate::event::Event for $ty {
                const NAME: &'static str = <$ty as ::switchyard_events::EventName>::EVENT_NAME;
                const REQUEST: $crate::event::RequestInfo = builtin_events!(@reads $reads);

                fn schema(
                    generator: &mut $crate::schema::SchemaGenerator,
                ) -> $crate::schema::EventSchema {
                    $crate::schema::EventSchema::of::<$ty>(generator)
                }
            }

            impl<R> $crate::event::Returns<R> for $ty {}
        )+)+
    };
}
pub(crate) use builtin_events;

/// Where a field bound with `#[from(...)]` takes its value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Header(&'static str),
    Cookie(&'static str),
    Scope(&'static str),
    /// The request method (`#[from(method)]`).
    Method,
    /// The path as received (`#[from(path)]`).
    Path,
    /// The client's IP address (`#[from(client)]`).
    Client,
    /// The authenticated caller with every claim (`#[from(identity)]`).
    Identity,
}

impl Source {
    fn missing(self) -> Error {
        match self {
            Source::Header(name) => Error::bad_request(format!("missing header `{name}`")),
            Source::Cookie(name) => Error::bad_request(format!("missing cookie `{name}`")),
            Source::Scope(name) => Error::new(
                401,
                format!("authentication required: the request's scope has no `{name}`"),
            ),
            Source::Identity => Error::new(401, "authentication required"),
            Source::Method | Source::Path | Source::Client => {
                Error::bad_request(format!("the request has no {} (not HTTP)", self.describe()))
            }
        }
    }

    fn describe(self) -> String {
        match self {
            Source::Header(name) => format!("header `{name}`"),
            Source::Cookie(name) => format!("cookie `{name}`"),
            Source::Scope(name) => format!("scope `{name}`"),
            Source::Method => "method".to_owned(),
            Source::Path => "path".to_owned(),
            Source::Client => "client address".to_owned(),
            Source::Identity => "identity".to_owned(),
        }
    }
}

/// The authenticated caller, as built-in authentication established it
/// (docs/http.md): `Context::identity`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Identity {
    /// The caller's id: a JWT's `sub`, an API key's name, a Basic user.
    pub sub: String,
    /// How the caller proved it: `jwt`, `api_key` or `basic`.
    pub method: String,
    /// The claims (empty unless the event declares `identity`).
    #[serde(default)]
    pub claims: serde_json::Map<String, serde_json::Value>,
}

/// Read access to a request's context, shared by [`Request`], the
/// [`Context`](crate::Context) and middleware.
pub(crate) fn header<'m>(meta: &'m Meta, name: &str) -> Option<&'m str> {
    prefixed(meta, META_HEADER_PREFIX, name)
}

pub(crate) fn cookie<'m>(meta: &'m Meta, name: &str) -> Option<&'m str> {
    prefixed(meta, META_COOKIE_PREFIX, name)
}

pub(crate) fn scope(meta: &Meta, name: &str) -> Option<serde_json::Value> {
    prefixed(meta, META_SCOPE_PREFIX, name).and_then(|v| serde_json::from_str(v).ok())
}

pub(crate) fn identity(meta: &Meta) -> Option<Identity> {
    meta.get(META_IDENTITY).and_then(|v| serde_json::from_str(v).ok())
}

pub(crate) fn client_ip(meta: &Meta) -> Option<std::net::IpAddr> {
    meta.get(META_CLIENT).and_then(|v| v.parse().ok())
}

pub(crate) fn method(meta: &Meta) -> Option<&str> {
    meta.get(META_METHOD)
}

pub(crate) fn path(meta: &Meta) -> Option<&str> {
    meta.get(META_PATH)
}

fn prefixed<'m>(meta: &'m Meta, prefix: &str, name: &str) -> Option<&'m str> {
    meta.iter()
        .find(|(k, _)| {
            k.strip_prefix(prefix)
                .is_some_and(|k| k.eq_ignore_ascii_case(name))
        })
        .map(|(_, v)| v)
}

/// Sets a scope entry (what middleware adds, e.g. a user id resolved from
/// a session cookie).
pub(crate) fn set_scope(meta: &mut Meta, name: &str, value: &serde_json::Value) {
    let key = format!("{META_SCOPE_PREFIX}{name}");
    meta.0.retain(|(k, _)| *k != key);
    meta.push(key, value.to_string());
}

/// A request as extraction sees it: the event's meta and body.
pub struct Request<'a> {
    pub meta: &'a Meta,
    pub body: &'a [u8],
    query: Vec<(String, String)>,
    caller: Caller,
}

impl<'a> Request<'a> {
    /// A request from a client (the safe default: fields bound to a
    /// header, a cookie or the scope take their value from there only).
    pub fn new(meta: &'a Meta, body: &'a [u8]) -> Self {
        Request::from_caller(meta, body, Caller::Client)
    }

    /// A request from `caller`.
    pub fn from_caller(meta: &'a Meta, body: &'a [u8], caller: Caller) -> Self {
        let query = meta
            .get("query")
            .and_then(|q| serde_urlencoded::from_str::<Vec<(String, String)>>(q).ok())
            .unwrap_or_default();
        Request {
            meta,
            body,
            query,
            caller,
        }
    }

    /// Who sent it.
    pub(crate) fn caller(&self) -> Caller {
        self.caller
    }

    /// Whether a client sent it (through a listener), rather than another
    /// manager of the group.
    pub fn from_client(&self) -> bool {
        self.caller == Caller::Client
    }

    /// The value of a `#[from(...)]` source, if the request has it.
    pub fn source(&self, source: Source) -> Option<serde_json::Value> {
        match source {
            Source::Header(name) => header(self.meta, name).map(|v| serde_json::Value::String(v.to_owned())),
            Source::Cookie(name) => cookie(self.meta, name).map(|v| serde_json::Value::String(v.to_owned())),
            Source::Scope(name) => scope(self.meta, name),
            Source::Method => method(self.meta).map(|v| serde_json::Value::String(v.to_owned())),
            Source::Path => path(self.meta).map(|v| serde_json::Value::String(v.to_owned())),
            Source::Client => client_ip(self.meta).map(|ip| serde_json::Value::String(ip.to_string())),
            Source::Identity => self
                .meta
                .get(META_IDENTITY)
                .and_then(|v| serde_json::from_str(v).ok()),
        }
    }

    /// Whether the body is bincode (a call from another manager).
    pub fn is_bincode(&self) -> bool {
        self.meta.get("content-type") == Some(BINCODE)
    }

    /// The path parameters, `("name", "Ada")` for `/hello/{name}`.
    pub fn path_params(&self) -> impl Iterator<Item = (&str, &str)> {
        self.meta
            .iter()
            .filter_map(|(k, v)| k.strip_prefix("p.").map(|k| (k, v)))
    }

    /// One path parameter.
    pub fn path_param(&self, name: &str) -> Option<&str> {
        self.path_params().find(|(k, _)| *k == name).map(|(_, v)| v)
    }

    /// The decoded query pairs.
    pub fn query(&self) -> impl Iterator<Item = (&str, &str)> {
        self.query.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// A request header: `content-type` and `accept` always, others when
    /// the event declares them.
    pub fn header(&self, name: &str) -> Option<&str> {
        header(self.meta, name).or_else(|| {
            ["content-type", "accept"]
                .iter()
                .find(|n| n.eq_ignore_ascii_case(name))
                .and_then(|n| self.meta.get(n))
        })
    }

    /// A cookie the event declares.
    pub fn cookie(&self, name: &str) -> Option<&str> {
        cookie(self.meta, name)
    }

    /// Whether the body is an HTML form (`application/x-www-form-urlencoded`).
    pub fn is_form(&self) -> bool {
        self.meta.get("content-type").is_some_and(|ct| {
            ct.split(';')
                .next()
                .is_some_and(|t| t.trim().eq_ignore_ascii_case(FORM))
        })
    }

    /// The body as JSON: parsed, or for a form its fields as an object of
    /// strings (a name given several times: an array), which the event's
    /// fields take like a query string's, coerced to numbers and bools.
    fn json_value(&self) -> Result<serde_json::Value, Error> {
        if self.is_form() {
            let pairs: Vec<(String, String)> = serde_urlencoded::from_bytes(self.body)
                .map_err(|e| Error::bad_request(format!("body is not a valid form: {e}")))?;
            let mut object = serde_json::Map::new();
            for (name, value) in pairs {
                match object.get_mut(&name) {
                    None => {
                        object.insert(name, serde_json::Value::String(value));
                    }
                    Some(serde_json::Value::Array(values)) => values.push(value.into()),
                    Some(first) => *first = serde_json::Value::Array(vec![first.take(), value.into()]),
                }
            }
            return Ok(serde_json::Value::Object(object));
        }
        serde_json::from_slice(self.body)
            .map_err(|e| Error::bad_request(format!("body is not valid JSON: {e}")))
    }

    /// The whole body as `T`: bincode from a manager, JSON otherwise. 400 for
    /// malformed bytes, 422 naming the field when they do not fit `T`.
    pub fn body_as<T: DeserializeOwned>(&self) -> Result<T, Error> {
        if self.is_bincode() {
            return codec::decode(self.body)
                .map_err(|e| Error::bad_request(format!("bad bincode body: {e}")));
        }
        extract::from_value(&self.json_value()?)
    }
}

/// What `#[derive(Event)]` expands to for events with `#[from(...)]`
/// fields; not for direct use.
#[doc(hidden)]
pub mod bound {
    use super::*;

    /// Decodes an event whose fields `bound` (serde name, source) take
    /// their values from the request's context. For a client's request,
    /// whatever the body, query or path says for those names is dropped
    /// first, and the sources' values put in their place.
    pub fn decode<E: DeserializeOwned>(
        request: &Request<'_>,
        bound: &[(&str, Source)],
        whole_body: bool,
    ) -> Result<E, Error> {
        if whole_body || request.is_bincode() {
            return request.body_as();
        }
        let body = if request.body.is_empty() {
            None
        } else {
            match request.json_value()? {
                serde_json::Value::Object(map) => Some(map),
                _ => return Err(Error::unprocessable("the request body must be a JSON object")),
            }
        };
        let mut merged = extract::merge(request.query(), body, request.path_params());
        if request.from_client()
            && let serde_json::Value::Object(object) = &mut merged
        {
            for (key, source) in bound {
                object.remove(*key);
                if let Some(value) = request.source(*source) {
                    object.insert((*key).to_owned(), value);
                }
            }
        }
        extract::from_value(&merged)
    }

    /// The value of one bound field of a client's request, from its source
    /// alone: `Option` fields are `None` without it, others answer 400
    /// (a header or cookie) or 401 (the scope).
    pub fn value<T: DeserializeOwned>(request: &Request<'_>, source: Source) -> Result<T, Error> {
        match request.source(source) {
            Some(value) => extract::from_value(&value).map_err(|err| {
                Error::invalid(vec![FieldError {
                    field: String::new(),
                    message: format!("{}: {}", source.describe(), err.message),
                }])
            }),
            None => extract::from_value(&serde_json::Value::Null).map_err(|_| source.missing()),
        }
    }
}

/// Validation failures, collected field by field.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Invalid(pub Vec<FieldError>);

impl Invalid {
    pub fn add(&mut self, field: &str, message: impl Into<String>) {
        self.0.push(FieldError {
            field: field.to_owned(),
            message: message.into(),
        });
    }
    pub fn into_result(self) -> Result<(), Invalid> {
        if self.0.is_empty() { Ok(()) } else { Err(self) }
    }
}

impl From<Invalid> for Error {
    fn from(invalid: Invalid) -> Error {
        Error::invalid(invalid.0)
    }
}

/// The checks `#[validate(...)]` expands to.
pub mod validate {
    use super::Invalid;

    /// Something with a length: strings (in characters), collections.
    pub trait HasLength {
        fn length(&self) -> usize;
        /// What the length counts, singular and plural, for messages.
        const UNIT: (&'static str, &'static str) = ("item", "items");
    }
    impl HasLength for String {
        fn length(&self) -> usize {
            self.chars().count()
        }
        const UNIT: (&'static str, &'static str) = ("character", "characters");
    }
    impl HasLength for str {
        fn length(&self) -> usize {
            self.chars().count()
        }
        const UNIT: (&'static str, &'static str) = ("character", "characters");
    }
    impl<T> HasLength for Vec<T> {
        fn length(&self) -> usize {
            self.len()
        }
    }

    fn count<T: HasLength + ?Sized>(n: usize) -> String {
        let (one, many) = T::UNIT;
        format!("{n} {}", if n == 1 { one } else { many })
    }

    /// A value that may be absent; absent values pass every check.
    pub trait Present<T: ?Sized> {
        fn present(&self) -> Option<&T>;
    }
    impl<T: HasLength + ?Sized> Present<T> for T {
        fn present(&self) -> Option<&T> {
            Some(self)
        }
    }
    impl<T: HasLength> Present<T> for Option<T> {
        fn present(&self) -> Option<&T> {
            self.as_ref()
        }
    }

    pub fn length<T: HasLength + ?Sized, P: Present<T> + ?Sized>(
        invalid: &mut Invalid,
        field: &str,
        value: &P,
        min: Option<usize>,
        max: Option<usize>,
    ) {
        let Some(value) = value.present() else { return };
        let n = value.length();
        if let Some(min) = min.filter(|&m| n < m) {
            if min == 1 {
                invalid.add(field, "must not be empty");
            } else {
                invalid.add(field, format!("must have at least {} (has {n})", count::<T>(min)));
            }
        }
        if let Some(max) = max.filter(|&m| n > m) {
            invalid.add(field, format!("must have at most {} (has {n})", count::<T>(max)));
        }
    }

    /// A number (or an `Option` of one) within bounds.
    pub trait InRange {
        fn as_f64(&self) -> Option<f64>;
    }
    macro_rules! in_range {
        ($($t:ty),*) => {$(
            impl InRange for $t {
                fn as_f64(&self) -> Option<f64> { Some(*self as f64) }
            }
            impl InRange for Option<$t> {
                fn as_f64(&self) -> Option<f64> { self.map(|v| v as f64) }
            }
        )*};
    }
    in_range!(u8, u16, u32, u64, usize, i8, i16, i32, i64, isize, f32, f64);

    pub fn range<T: InRange, B: Into<f64>>(
        invalid: &mut Invalid,
        field: &str,
        value: &T,
        min: Option<B>,
        max: Option<B>,
    ) {
        let Some(v) = value.as_f64() else { return };
        if let Some(min) = min.map(Into::into).filter(|&m| v < m) {
            invalid.add(field, format!("must be at least {min}"));
        }
        if let Some(max) = max.map(Into::into).filter(|&m| v > m) {
            invalid.add(field, format!("must be at most {max}"));
        }
    }
}
