//! What handlers return: replies, responses and errors.

use bytes::Bytes;
use serde::Serialize;
use switchyard_proto::{Hop, Meta, Refusal, StreamHandle, codec, problem};

/// Content type of bincode bodies (manager-to-manager calls, or HTTP clients
/// that ask for it with `Accept`).
pub const BINCODE: &str = "application/x-bincode";
/// Content type of JSON bodies.
pub const JSON: &str = "application/json";

/// How a reply's body is encoded, chosen by the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Json,
    Bincode,
}

impl Format {
    /// The format a request's `accept` meta asks for (JSON unless bincode).
    pub fn from_meta(meta: &Meta) -> Format {
        match meta.get("accept") {
            Some(accept) if accept.contains(BINCODE) => Format::Bincode,
            _ => Format::Json,
        }
    }
}

/// A response as it leaves the manager: status, meta (headers), body, or a
/// stream that follows the headers ([`Streamed`](crate::Streamed)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub meta: Meta,
    pub body: Bytes,
    /// The body comes through this pipe instead (`body` is then empty).
    pub stream: Option<StreamHandle>,
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
            stream: None,
        }
    }

    /// `value` encoded in `format` with `status`.
    pub fn encode<T: Serialize + ?Sized>(status: u16, value: &T, format: Format) -> Result<Response, Error> {
        match format {
            Format::Json => serde_json::to_vec(value)
                .map(|b| Response::new(status, JSON, b))
                .map_err(|e| Error::internal(format!("cannot encode reply as JSON: {e}"))),
            Format::Bincode => codec::encode(value)
                .map(|b| Response::new(status, BINCODE, b))
                .map_err(|e| Error::internal(format!("cannot encode reply as bincode: {e}"))),
        }
    }

    /// Adds a header (another line if the name is there already). A name
    /// that is not an HTTP token, or a value with CR, LF, NUL or another
    /// control character, makes the response a 500 when it leaves the
    /// manager (the handler's bug is logged): nothing can smuggle a header.
    pub fn with_header(mut self, name: &str, value: &str) -> Response {
        self.meta.push(name.to_ascii_lowercase(), value);
        self
    }

    /// Adds a `Set-Cookie` header (one line per cookie, never folded).
    ///
    /// ```
    /// use switchyard_manager::{Response, cookie::Cookie};
    /// let r = Response::empty(204)
    ///     .with_cookie(Cookie::build(("theme", "dark")).path("/").http_only(true).build());
    /// assert_eq!(r.meta.get("set-cookie"), Some("theme=dark; HttpOnly; Path=/"));
    /// ```
    pub fn with_cookie(mut self, cookie: cookie::Cookie<'_>) -> Response {
        self.meta.push("set-cookie", cookie.to_string());
        self
    }

    /// A redirect to `location` (absolute, or relative to the request).
    /// A target with CR, LF or NUL (a header smuggled into `Location`) is
    /// refused with 400: such a target comes from a client.
    pub fn redirect(kind: Redirect, location: &str) -> Result<Response, Error> {
        if location.is_empty() {
            return Err(Error::internal("a redirect needs a target"));
        }
        if location.bytes().any(|b| matches!(b, b'\r' | b'\n' | b'\0')) {
            return Err(Error::bad_request("the redirect target contains CR, LF or NUL"));
        }
        Ok(Response::empty(kind.status()).with_header("location", location))
    }

    /// 204 No Content. Deprecated: a handler returning [`Response`] is
    /// described as "200, any body" (its status is known only when it
    /// runs), so this 204 was documented as 200 in `/openapi.json` and the
    /// typed gRPC service. Return [`NoContent`] instead, described as 204
    /// with no body (an empty message over gRPC); `NoContent.with_cookie(..)`
    /// and `.with_header(..)` keep that description. `Response::empty(204)`
    /// remains for a handler that must build a `Response`.
    ///
    /// ```compile_fail
    /// #![deny(deprecated)]
    /// let _ = switchyard_manager::Response::no_content();
    /// ```
    #[deprecated(
        note = "return `NoContent` (described as 204 with no body); `Response::empty(204)` if you must build a `Response`"
    )]
    pub fn no_content() -> Response {
        Response::empty(204)
    }

    /// 304 Not Modified: the client's cached copy (its `If-None-Match` or
    /// `If-Modified-Since`) is current. No body.
    pub fn not_modified() -> Response {
        Response::empty(304)
    }

    /// `status` with no body.
    pub fn empty(status: u16) -> Response {
        Response {
            status,
            meta: Meta::default(),
            body: Bytes::new(),
            stream: None,
        }
    }
}

/// The redirect statuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Redirect {
    /// 301: moved for good; clients may turn a POST into a GET.
    MovedPermanently,
    /// 302: found elsewhere for now; clients may turn a POST into a GET.
    Found,
    /// 303: see the result there, with a GET (after a form POST).
    SeeOther,
    /// 307: elsewhere for now, same method and body.
    Temporary,
    /// 308: moved for good, same method and body.
    Permanent,
}

impl Redirect {
    /// The HTTP status.
    pub fn status(self) -> u16 {
        match self {
            Redirect::MovedPermanently => 301,
            Redirect::Found => 302,
            Redirect::SeeOther => 303,
            Redirect::Temporary => 307,
            Redirect::Permanent => 308,
        }
    }
}

/// 201 Created: `body` with `Location` naming the new resource.
///
/// ```
/// # use serde::Serialize;
/// # use switchyard_manager::{Created, Format, Reply};
/// #[derive(Serialize, Reply)]
/// struct Order { id: u64 }
/// let r = Created::at("/orders/7", Order { id: 7 }).into_response(Format::Json).unwrap();
/// assert_eq!((r.status, r.meta.get("location")), (201, Some("/orders/7")));
/// ```
pub struct Created<T> {
    pub location: String,
    pub body: T,
}

impl<T: Serialize> Created<T> {
    pub fn at(location: impl Into<String>, body: T) -> Created<T> {
        Created {
            location: location.into(),
            body,
        }
    }
}

/// Described as its body's reply with status 201: the body type's schema
/// (a `#[derive(Reply)]` struct's fields), so that `/openapi.json` and the
/// typed gRPC service see its fields and their types.
impl<T: Serialize + Reply> Reply for Created<T> {
    fn describe(generator: &mut crate::schema::SchemaGenerator) -> Option<switchyard_proto::api::ReplyDoc> {
        let mut doc = T::describe(generator).unwrap_or_else(|| crate::schema::reply(201, "", None));
        doc.status = 201;
        if doc.content_type.is_empty() {
            doc.content_type = crate::JSON.to_owned();
        }
        Some(doc)
    }

    fn into_response(self, format: Format) -> Result<Response, Error> {
        if self.location.bytes().any(|b| matches!(b, b'\r' | b'\n' | b'\0')) {
            return Err(Error::bad_request("the Location contains CR, LF or NUL"));
        }
        Ok(Response::encode(201, &self.body, format)?.with_header("location", &self.location))
    }
}

/// A reply with headers (and cookies) added: [`Reply::with_header`],
/// [`Reply::with_cookie`].
pub struct WithHeaders<R> {
    reply: R,
    headers: Vec<(String, String)>,
}

impl<R: Reply> WithHeaders<R> {
    /// One more header.
    pub fn with_header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_ascii_lowercase(), value.to_owned()));
        self
    }

    /// One more `Set-Cookie`.
    pub fn with_cookie(mut self, cookie: cookie::Cookie<'_>) -> Self {
        self.headers.push(("set-cookie".to_owned(), cookie.to_string()));
        self
    }
}

impl<R: Reply> Reply for WithHeaders<R> {
    fn describe(generator: &mut crate::schema::SchemaGenerator) -> Option<switchyard_proto::api::ReplyDoc> {
        R::describe(generator)
    }

    fn into_response(self, format: Format) -> Result<Response, Error> {
        let mut response = self.reply.into_response(format)?;
        response.meta.0.extend(self.headers);
        Ok(response)
    }
}

/// Why a response's header cannot go out: a name that is not an HTTP
/// token, a value with a control character (CR, LF, NUL...), or a request
/// context key (`:...`).
pub(crate) fn invalid_header(meta: &Meta) -> Option<String> {
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    meta.iter().find_map(|(name, value)| {
        if name.is_empty() || !name.bytes().all(token) {
            return Some(format!("invalid header name {name:?}"));
        }
        if value.bytes().any(|b| (b < 0x20 && b != b'\t') || b == 0x7f) {
            return Some(format!("header `{name}` has a control character in its value"));
        }
        None
    })
}

/// A handler's return value. Derive it (`#[derive(Serialize, Reply)]`) for a
/// struct that is the response body, or use [`Json`], [`Binary`], [`Response`].
pub trait Reply {
    fn into_response(self, format: Format) -> Result<Response, Error>;

    /// The reply described for clients (status, content type, body
    /// schema); `None`: not described. The derive generates it.
    #[doc(hidden)]
    fn describe(generator: &mut crate::schema::SchemaGenerator) -> Option<switchyard_proto::api::ReplyDoc>
    where
        Self: Sized,
    {
        let _ = generator;
        None
    }

    /// This reply with a header added (`Ok(Greeting { .. }.with_header("cache-control", "no-store"))`).
    fn with_header(self, name: &str, value: &str) -> WithHeaders<Self>
    where
        Self: Sized,
    {
        WithHeaders {
            reply: self,
            headers: Vec::new(),
        }
        .with_header(name, value)
    }

    /// This reply with a `Set-Cookie` added.
    fn with_cookie(self, cookie: cookie::Cookie<'_>) -> WithHeaders<Self>
    where
        Self: Sized,
    {
        WithHeaders {
            reply: self,
            headers: Vec::new(),
        }
        .with_cookie(cookie)
    }

    /// This reply with the entity tag `tag` (quoted here if it is not; a
    /// `W/` prefix makes it weak). A `GET` or `HEAD` whose `If-None-Match`
    /// names it is answered 304 by the listener, without the body.
    fn with_etag(self, tag: &str) -> WithHeaders<Self>
    where
        Self: Sized,
    {
        let tag = if tag.starts_with('"') || tag.starts_with("W/\"") {
            tag.to_owned()
        } else {
            format!("\"{tag}\"")
        };
        self.with_header("etag", &tag)
    }

    /// This reply with an entity tag derived from its body's bytes (so
    /// equal bodies share a tag, and any change makes a new one): the
    /// simplest way to let clients revalidate with `If-None-Match`.
    fn with_auto_etag(self) -> AutoEtag<Self>
    where
        Self: Sized,
    {
        AutoEtag(self)
    }

    /// This reply with `Cache-Control: value` (`no-cache`,
    /// `public, max-age=60`...).
    fn with_cache_control(self, value: &str) -> WithHeaders<Self>
    where
        Self: Sized,
    {
        self.with_header("cache-control", value)
    }
}

/// A reply whose entity tag is derived from its body ([`Reply::with_auto_etag`]).
pub struct AutoEtag<R>(R);

impl<R: Reply> Reply for AutoEtag<R> {
    fn describe(generator: &mut crate::schema::SchemaGenerator) -> Option<switchyard_proto::api::ReplyDoc> {
        R::describe(generator)
    }

    fn into_response(self, format: Format) -> Result<Response, Error> {
        let mut response = self.0.into_response(format)?;
        if response.stream.is_none() && (200..300).contains(&response.status) {
            response.meta.0.retain(|(k, _)| k != "etag");
            let tag = etag_of(&response.body);
            response.meta.push("etag", tag);
        }
        Ok(response)
    }
}

/// 204 No Content, described as such in `/openapi.json` and the typed
/// gRPC service (an empty message).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NoContent;

impl Reply for NoContent {
    fn describe(_: &mut crate::schema::SchemaGenerator) -> Option<switchyard_proto::api::ReplyDoc> {
        Some(crate::schema::reply(204, "", None))
    }

    fn into_response(self, _: Format) -> Result<Response, Error> {
        Ok(Response::empty(204))
    }
}

/// A serializable body, 200.
pub struct Json<T>(pub T);

impl<T: Serialize> Reply for Json<T> {
    fn into_response(self, format: Format) -> Result<Response, Error> {
        Response::encode(200, &self.0, format)
    }
}

/// Raw bytes, 200, `application/octet-stream`.
pub struct Binary(pub Bytes);

impl Reply for Binary {
    fn describe(_: &mut crate::schema::SchemaGenerator) -> Option<switchyard_proto::api::ReplyDoc> {
        Some(switchyard_proto::api::ReplyDoc {
            status: 200,
            content_type: "application/octet-stream".to_owned(),
            description: String::new(),
            schema: String::new(),
        })
    }

    fn into_response(self, _: Format) -> Result<Response, Error> {
        Ok(Response::new(200, "application/octet-stream", self.0))
    }
}

/// `bytes` sealed in shared memory once, for a body the manager answers
/// with many times (a cached file, a rendered page, a large constant):
/// every response whose body is these bytes, or a prefix of them
/// (`slice(..n)`), crosses to the listener as the sealed memfd's
/// descriptor, with no copy in the manager or the listener, which keeps
/// the memfd mapped once it has seen it twice (decision 0160). Any other
/// large body is copied into a shared-memory segment per response. Keep
/// the returned bytes (they hold the memory, counted against the
/// process's shared-memory budget) and answer with clones or prefixes:
/// `Binary(shared.slice(..n))`.
///
/// Fails with 503 when the budget cannot take `bytes.len()` more bytes.
pub fn shared_body(bytes: &[u8]) -> Result<Bytes, Error> {
    switchyard_proto::ShmBody::share(bytes)
        .map_err(|err| Error::unavailable(format!("cannot share a body: {err}")))
}

impl Reply for Response {
    fn into_response(self, _: Format) -> Result<Response, Error> {
        Ok(self)
    }
}

/// A value that is not the JSON it should be: 422 when the text came in
/// that way, 500 when the program made or expected something else.
impl From<switchyard_events::JsonError> for Error {
    fn from(e: switchyard_events::JsonError) -> Error {
        match e {
            switchyard_events::JsonError::NotJson(_) => Error::unprocessable(e.to_string()),
            switchyard_events::JsonError::Encode(_) | switchyard_events::JsonError::Mismatch { .. } => {
                Error::internal(e.to_string())
            }
        }
    }
}

impl Reply for () {
    fn describe(_: &mut crate::schema::SchemaGenerator) -> Option<switchyard_proto::api::ReplyDoc> {
        Some(crate::schema::reply(204, "", None))
    }

    fn into_response(self, _: Format) -> Result<Response, Error> {
        Ok(Response {
            status: 204,
            meta: Meta::default(),
            body: Bytes::new(),
            stream: None,
        })
    }
}

/// One invalid input field.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct FieldError {
    /// The field's path (`name`, `items[2].qty`); empty for the whole input.
    pub field: String,
    pub message: String,
}

/// A handler's (or the SDK's) error: an HTTP-like status, a message for the
/// client, and for 422 the invalid fields.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct Error {
    pub status: u16,
    pub message: String,
    pub errors: Vec<FieldError>,
    /// The hop of the group that could not deliver a call this error
    /// forwards (a [`CallError`] turned into an `Error` by `?`); `None` for
    /// a handler's own error. Its response is marked with it
    /// (`switchyard-error`, decision 0116).
    hop: Option<Hop>,
}

impl Error {
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        Error {
            status,
            message: message.into(),
            errors: Vec::new(),
            hop: None,
        }
    }

    /// The hop whose refusal this error forwards, if any.
    pub fn hop(&self) -> Option<Hop> {
        self.hop
    }
    /// 400: the request is malformed.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Error::new(400, message)
    }
    /// 404: the thing asked for does not exist.
    pub fn not_found(message: impl Into<String>) -> Self {
        Error::new(404, message)
    }
    /// 409: conflicts with the current state.
    pub fn conflict(message: impl Into<String>) -> Self {
        Error::new(409, message)
    }
    /// 422: well-formed, but these fields are not acceptable.
    pub fn invalid(errors: Vec<FieldError>) -> Self {
        let message = match errors.as_slice() {
            [one] if one.field.is_empty() => one.message.clone(),
            [one] => format!("invalid field `{}`: {}", one.field, one.message),
            many => format!("{} invalid fields", many.len()),
        };
        Error {
            status: 422,
            message,
            errors,
            hop: None,
        }
    }
    /// 422 with a message only.
    pub fn unprocessable(message: impl Into<String>) -> Self {
        Error::new(422, message)
    }
    /// 500: our fault. The message reaches the client only when the group is
    /// configured to expose error details (`group.expose_errors`).
    pub fn internal(message: impl Into<String>) -> Self {
        Error::new(500, message)
    }
    /// 412: a precondition (`If-Match`) does not hold: the resource has
    /// changed since the client read it.
    pub fn precondition_failed(message: impl Into<String>) -> Self {
        Error::new(412, message)
    }
    /// 503: try again later.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Error::new(503, message)
    }

    /// The problem+json response for this error. A 500's message (a bug's
    /// description, possibly with internals) is replaced by a generic one
    /// unless `expose` is set; other statuses say what the caller can act on
    /// (503 "manager `inventory` is not running"). A 503 carries
    /// `Retry-After: 1`.
    pub fn to_response(&self, expose: bool) -> Response {
        let detail = if self.status == 500 && !expose {
            "internal error"
        } else {
            &self.message
        };
        // "Try again later": say when (a full worker queue, a manager
        // that is restarting).
        let retry_after = (self.status == 503).then_some(1);
        let (meta, body) = match self.hop {
            Some(hop) => Refusal {
                hop,
                status: self.status,
                detail: detail.to_owned().into(),
                retry_after,
            }
            .parts(),
            None => {
                let extra = (!self.errors.is_empty())
                    .then(|| ("errors", serde_json::to_value(&self.errors).unwrap_or_default()));
                let (mut meta, body) = problem::problem_with(self.status, detail, extra);
                if let Some(seconds) = retry_after {
                    meta.push("retry-after", seconds.to_string());
                }
                (meta, body)
            }
        };
        Response {
            status: self.status,
            meta,
            body,
            stream: None,
        }
    }

    /// Reads an error back from a problem+json (or any) response body.
    pub fn from_response(status: u16, body: &[u8]) -> Error {
        let parsed: Option<serde_json::Value> = serde_json::from_slice(body).ok();
        let message = parsed
            .as_ref()
            .and_then(|v| v["detail"].as_str().map(str::to_owned))
            .unwrap_or_else(|| problem::reason(status).to_owned());
        let errors = parsed
            .and_then(|v| serde_json::from_value(v["errors"].clone()).ok())
            .unwrap_or_default();
        Error {
            status,
            message,
            errors,
            hop: None,
        }
    }
}

/// A strong entity tag derived from `bytes` (128 bits of SHA-256, quoted):
/// what [`Reply::with_auto_etag`](crate::Reply::with_auto_etag) sends for
/// a body, for handlers that check `If-Match` against it.
pub fn etag_of(bytes: &[u8]) -> String {
    let digest = <sha2::Sha256 as sha2::Digest>::digest(bytes);
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("\"{hex}\"")
}

/// Why [`Context::call`](crate::Context::call) failed.
///
/// The group's own refusals name managers, queues and links: what an
/// operator needs and an end client must not see. Forwarded with `?`, a
/// refusal becomes a generic 502, 503 or 504 marked with the hop that made
/// it; the callee's own error goes on as it is (decision 0116).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The group could not deliver the call: nobody serves the type, its
    /// manager is not running or is at capacity, a queue is full, the
    /// cluster link is down.
    #[error("the call was not delivered ({hop}, {status}): {detail}")]
    Unroutable {
        hop: Hop,
        status: u16,
        /// The hop's detail, for the log.
        detail: String,
        /// Seconds after which the same call may be delivered.
        retry_after: Option<u32>,
    },
    /// No answer came within the call's deadline.
    #[error("the call timed out ({hop}): {detail}")]
    TimedOut { hop: Hop, detail: String },
    /// The callee answered with an error of its own, or with a reply this
    /// side cannot read (a 500).
    #[error(transparent)]
    Callee(Error),
}

impl CallError {
    /// The answer to a call, read: a response the group marked as its own
    /// is a refusal; any other is the callee's.
    pub(crate) fn from_answer(status: u16, meta: &Meta, body: &[u8]) -> CallError {
        let Some(hop) = Hop::of(meta) else {
            return CallError::Callee(Error::from_response(status, body));
        };
        let detail = Error::from_response(status, body).message;
        if status == 504 {
            return CallError::TimedOut { hop, detail };
        }
        CallError::Unroutable {
            hop,
            status,
            detail,
            retry_after: meta.get("retry-after").and_then(|v| v.parse().ok()),
        }
    }
}

impl From<CallError> for Error {
    /// What the end client gets when a handler forwards a failed call: the
    /// callee's own error, or for the group's refusal a status and the hop,
    /// never the refusal's detail.
    fn from(err: CallError) -> Error {
        let (status, message, hop) = match err {
            CallError::Callee(err) => return err,
            CallError::TimedOut { hop, .. } => {
                (504, "a service this request needs did not answer in time", hop)
            }
            CallError::Unroutable { hop, status: 503, .. } => (
                503,
                "a service this request needs is unavailable; retry later",
                hop,
            ),
            CallError::Unroutable { hop, .. } => (502, "a service this request needs cannot be reached", hop),
        };
        Error {
            hop: Some(hop),
            ..Error::new(status, message)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_groups_refusal_forwarded_by_question_mark_keeps_its_hop_not_its_detail() {
        let (meta, body) = Refusal::unavailable(Hop::Router, "manager `inventory` is not running").parts();
        let err = CallError::from_answer(503, &meta, &body);
        assert!(
            matches!(&err, CallError::Unroutable { hop: Hop::Router, status: 503, retry_after: Some(1), detail }
                if detail.contains("inventory")),
            "{err:?}"
        );
        let forwarded = Error::from(err);
        assert_eq!((forwarded.status, forwarded.hop()), (503, Some(Hop::Router)));
        let response = forwarded.to_response(true);
        let text = String::from_utf8_lossy(&response.body);
        assert!(!text.contains("inventory"), "{text}");
        assert_eq!(
            response.meta.get(switchyard_proto::refusal::HOP_HEADER),
            Some("router")
        );
        assert_eq!(response.meta.get("retry-after"), Some("1"));

        // Nobody declares it: the caller's dependency is missing, a 502.
        let (meta, body) = Refusal::new(Hop::Router, 404, "no manager declares event type `x`").parts();
        assert_eq!(Error::from(CallError::from_answer(404, &meta, &body)).status, 502);
        // Too late: a 504.
        let (meta, body) = Refusal::timed_out(Hop::Cluster, "deadline exceeded").parts();
        let err = CallError::from_answer(504, &meta, &body);
        assert!(
            matches!(
                err,
                CallError::TimedOut {
                    hop: Hop::Cluster,
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(Error::from(err).status, 504);
    }

    #[test]
    fn the_callees_own_error_goes_on_as_it_was() {
        let own = Error::conflict("only 3 of `pear` left").to_response(false);
        let err = CallError::from_answer(409, &own.meta, &own.body);
        assert_eq!(err, CallError::Callee(Error::conflict("only 3 of `pear` left")));
        let forwarded = Error::from(err);
        assert_eq!(forwarded.hop(), None);
        let response = forwarded.to_response(false);
        assert_eq!(response.meta.get(switchyard_proto::refusal::HOP_HEADER), None);
        assert_eq!((response.status, response.meta.get("retry-after")), (409, None));
    }
}
