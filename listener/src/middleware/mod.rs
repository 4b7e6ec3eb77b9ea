//! Built-in middleware: Switchyard's own code, in the listener, with no hop
//! (decision 0046). Configured by the top-level sections of
//! `switchyard.toml` (`config`), built once per listener process.
//!
//! Two parts, by what they need to see:
//! - Around the whole service (tower-http layers, [`layers`]): CORS
//!   (preflights answered here, headers on every answer), response
//!   compression, and request bodies decoded by `Content-Encoding` before
//!   anything reads them, so every body limit counts decoded bytes.
//! - Per request, once the route is known ([`Middleware::admit`]): rate
//!   limits by address, authentication (the [`Identity`] goes into the
//!   request's extensions), rate limits by API key or identity, then the
//!   first matching `[[auth.rules]]` entry. WebSocket sessions and gRPC
//!   streams are admitted once, at the upgrade or the call; each message's
//!   event type is then checked against the rules
//!   ([`Middleware::authorize_event`]).
//!
//! Security headers are added to every HTTP answer that does not set them.
//!
//! # Layout
//! - `config`: the settings, as `switchyard.toml` spells them.
//! - `auth`: credentials (JWT, API keys, Basic) and rules.
//! - `jwt`: bearer token verification.
//! - `rate`: token buckets per client, in bounded memory.

pub(crate) mod config;

mod auth;
mod jwt;
mod rate;

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use tower_http::compression::predicate::{Predicate, SizeAbove};
use tower_http::compression::{CompressionLayer, CompressionLevel};
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::decompression::RequestDecompressionLayer;

use self::auth::{Auth, Denied};
use self::config::{DEFAULT_SECURITY_HEADERS, MiddlewareConfig, RateKey, TokenSource, WsAuthConfig};
use self::rate::{Key, Limiter};
use crate::identity::{AuthMethod, Identity};
use crate::reply::{Reply, error};

/// What a request is, for rules and limits: its path (HTTP requests and
/// WebSocket upgrades) and its event type (a route's, a WebSocket
/// message's, a gRPC call's), or a subscription pattern.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Scope<'a> {
    pub(crate) path: Option<&'a str>,
    pub(crate) event: Option<&'a str>,
    /// `event` is a subscription pattern (`shop.*`), not one type.
    pub(crate) subscription: bool,
}

/// An event type or a prefix of types, as subscriptions spell them:
/// `shop.Checkout`, `shop.*`, `*`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Pattern {
    Exact(String),
    Prefix(String),
}

impl Pattern {
    pub(crate) fn parse(text: &str) -> Result<Pattern, String> {
        Ok(match switchyard_proto::control::pattern_prefix(text)? {
            Some(prefix) => Pattern::Prefix(prefix.to_owned()),
            None => Pattern::Exact(text.to_owned()),
        })
    }

    fn covers(&self, event: &str) -> bool {
        match self {
            Pattern::Exact(e) => e == event,
            Pattern::Prefix(p) => event.starts_with(p.as_str()),
        }
    }

    /// Whether some event type matches both `self` and `other`: a rule on
    /// `shop.*` concerns a subscription to `*` as much as one to `shop.X`.
    fn overlaps(&self, other: &Pattern) -> bool {
        match (self, other) {
            (Pattern::Exact(a), Pattern::Exact(b)) => a == b,
            (Pattern::Exact(e), Pattern::Prefix(p)) | (Pattern::Prefix(p), Pattern::Exact(e)) => {
                e.starts_with(p.as_str())
            }
            (Pattern::Prefix(a), Pattern::Prefix(b)) => {
                a.starts_with(b.as_str()) || b.starts_with(a.as_str())
            }
        }
    }
}

/// Whether `path` is `prefix` or below it, segment by segment.
fn under(path: &str, prefix: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/') || prefix.is_empty(),
        None => false,
    }
}

/// Whether `rule` covers an HTTP route, by its path template and event
/// type (the API description says what each route requires).
pub(crate) fn rule_covers(rule: &config::AuthRule, path: &str, event: Option<&str>) -> bool {
    let pattern = match rule.event.as_deref().map(Pattern::parse).transpose() {
        Ok(p) => p,
        Err(_) => return false,
    };
    let scope = Scope {
        path: Some(path),
        event,
        subscription: false,
    };
    matches(rule.prefix.as_deref(), pattern.as_ref(), &scope)
}

/// Whether a rule or limit on `prefix` and `event` (each optional; neither
/// matches everything) concerns `scope`.
fn matches(prefix: Option<&str>, event: Option<&Pattern>, scope: &Scope<'_>) -> bool {
    if let Some(prefix) = prefix
        && !scope.path.is_some_and(|p| under(p, prefix))
    {
        return false;
    }
    if let Some(want) = event {
        let Some(have) = scope.event else {
            return false;
        };
        let hit = if scope.subscription {
            Pattern::parse(have).is_ok_and(|p| want.overlaps(&p))
        } else {
            want.covers(have)
        };
        if !hit {
            return false;
        }
    }
    true
}

/// Why a request is not let through.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// 401 / `UNAUTHENTICATED`: no credential, or a bad one (and why).
    Unauthenticated(Option<&'static str>),
    /// 403 / `PERMISSION_DENIED`.
    Forbidden(String),
    /// 429 / `RESOURCE_EXHAUSTED`, with how long to wait.
    TooMany(Duration),
    /// 400 / `INVALID_ARGUMENT`: the request is malformed in a way that
    /// leaves its caller unclear (two credentials), and how.
    BadRequest(&'static str),
}

impl From<Denied> for Refusal {
    fn from(d: Denied) -> Refusal {
        match d {
            Denied::Missing => Refusal::Unauthenticated(None),
            Denied::Invalid(why) => Refusal::Unauthenticated(Some(why)),
            Denied::Forbidden(why) => Refusal::Forbidden(why),
            Denied::Throttled(wait) => Refusal::TooMany(wait),
            Denied::Ambiguous(why) => Refusal::BadRequest(why),
        }
    }
}

impl Refusal {
    /// The event status a WebSocket message's error carries.
    pub(crate) fn status(&self) -> u16 {
        match self {
            Refusal::Unauthenticated(_) => 401,
            Refusal::Forbidden(_) => 403,
            Refusal::TooMany(_) => 429,
            Refusal::BadRequest(_) => 400,
        }
    }

    pub(crate) fn detail(&self) -> String {
        match self {
            Refusal::Unauthenticated(None) => "authentication required".to_owned(),
            Refusal::Unauthenticated(Some(why)) => format!("authentication failed: {why}"),
            Refusal::Forbidden(why) => format!("forbidden: {why}"),
            Refusal::TooMany(wait) => format!("rate limit exceeded; retry in {} s", retry_after_secs(*wait)),
            Refusal::BadRequest(why) => (*why).to_owned(),
        }
    }

    /// The gRPC status of this refusal.
    pub(crate) fn grpc(&self) -> tonic::Status {
        let detail = self.detail();
        match self {
            Refusal::Unauthenticated(_) => tonic::Status::unauthenticated(detail),
            Refusal::Forbidden(_) => tonic::Status::permission_denied(detail),
            Refusal::TooMany(_) => tonic::Status::resource_exhausted(detail),
            Refusal::BadRequest(_) => tonic::Status::invalid_argument(detail),
        }
    }
}

/// Whole seconds to wait, at least 1 (`Retry-After` has no fractions).
fn retry_after_secs(wait: Duration) -> u64 {
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
}

/// One `[[rate_limit.limits]]` entry, with its buckets.
struct Limit {
    prefix: Option<String>,
    event: Option<Pattern>,
    key: RateKey,
    limiter: Limiter,
}

/// The per-request middleware of one listener process.
pub(crate) struct Middleware {
    /// `None` when no method and no rule is configured: nothing to check.
    auth: Option<Auth>,
    limits: Vec<Limit>,
    security: Vec<(HeaderName, HeaderValue)>,
    ws: WsAuthConfig,
}

impl Middleware {
    /// The middleware of `config`; an error names the key at fault.
    pub(crate) fn new(config: &MiddlewareConfig) -> Result<Middleware, String> {
        let a = &config.auth;
        let max_clients = config.rate_limit.max_clients;
        if max_clients == 0 {
            return Err("rate_limit.max_clients: must be positive".into());
        }
        let auth = if a.any_method() || !a.rules.is_empty() {
            Some(Auth::new(a, max_clients)?)
        } else {
            None
        };
        if a.websocket.token_from.contains(&TokenSource::Query) && a.websocket.query_param.is_empty() {
            return Err("auth.websocket.query_param: must not be empty".into());
        }
        let mut limits = Vec::new();
        for (i, l) in config.rate_limit.limits.iter().enumerate() {
            let requests = NonZeroU32::new(l.requests)
                .ok_or_else(|| format!("rate_limit.limits[{i}].requests: must be positive"))?;
            if l.per_s == 0 || l.per_s > 86_400 {
                return Err(format!("rate_limit.limits[{i}].per_s: between 1 and 86400"));
            }
            let burst = match l.burst {
                None => requests,
                Some(b) => NonZeroU32::new(b)
                    .ok_or_else(|| format!("rate_limit.limits[{i}].burst: must be positive"))?,
            };
            let period = Duration::from_secs(l.per_s) / requests.get();
            let quota = governor::Quota::with_period(period)
                .ok_or_else(|| format!("rate_limit.limits[{i}].requests: too many per `per_s`"))?
                .allow_burst(burst);
            if let Some(prefix) = &l.prefix
                && !prefix.starts_with('/')
            {
                return Err(format!(
                    "rate_limit.limits[{i}].prefix: a path prefix starts with `/`"
                ));
            }
            let event = l
                .event
                .as_deref()
                .map(|e| Pattern::parse(e).map_err(|why| format!("rate_limit.limits[{i}].event: {why}")))
                .transpose()?;
            if l.key != RateKey::Address && auth.is_none() {
                return Err(format!(
                    "rate_limit.limits[{i}].key: counting by API key or identity needs [auth]"
                ));
            }
            limits.push(Limit {
                prefix: l.prefix.clone(),
                event,
                key: l.key,
                limiter: Limiter::new(quota, max_clients),
            });
        }
        let mut security = Vec::new();
        if config.security_headers.enabled {
            let mut named: std::collections::BTreeMap<String, String> = DEFAULT_SECURITY_HEADERS
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            for (k, v) in &config.security_headers.headers {
                named.insert(k.to_ascii_lowercase(), v.clone());
            }
            for (k, v) in named {
                if v.is_empty() {
                    continue;
                }
                let name = HeaderName::from_bytes(k.as_bytes())
                    .map_err(|_| format!("security_headers.headers: `{k}` is not a header name"))?;
                let value = HeaderValue::from_str(&v)
                    .map_err(|_| format!("security_headers.headers.{k}: not a valid header value"))?;
                security.push((name, value));
            }
        }
        Ok(Middleware {
            auth,
            limits,
            security,
            ws: a.websocket.clone(),
        })
    }

    /// Whether there is anything to admit at all (else the per-request
    /// path costs nothing).
    pub(crate) fn admits(&self) -> bool {
        self.auth.is_some() || !self.limits.is_empty()
    }

    /// Lets a request in `scope` through, or says why not: rate limits by
    /// address, the credential, limits by API key or identity, then the
    /// rules (unless `rules` is false: a gRPC call's event is checked
    /// later, by its message). `token` is a bearer token from outside the
    /// headers (WebSocket). Returns the identity the credential proved,
    /// for the request's extensions.
    pub(crate) async fn admit(
        &self,
        headers: &HeaderMap,
        token: Option<&str>,
        client: IpAddr,
        scope: &Scope<'_>,
        rules: bool,
    ) -> Result<Option<Identity>, Refusal> {
        let applying = || {
            self.limits
                .iter()
                .filter(|l| matches(l.prefix.as_deref(), l.event.as_ref(), scope))
        };
        for limit in applying().filter(|l| l.key == RateKey::Address) {
            limit
                .limiter
                .check(&Key::Address(client))
                .map_err(Refusal::TooMany)?;
        }
        let Some(auth) = &self.auth else {
            return Ok(None);
        };
        let identity = auth.authenticate(headers, token, client).await?;
        for limit in applying().filter(|l| l.key != RateKey::Address) {
            let key = match (&identity, limit.key) {
                (Some(who), RateKey::Identity) => Key::Subject(who.subject.clone()),
                (Some(who), RateKey::ApiKey) if who.method == AuthMethod::ApiKey => {
                    Key::Subject(who.subject.clone())
                }
                _ => Key::Address(client),
            };
            limit.limiter.check(&key).map_err(Refusal::TooMany)?;
        }
        if rules {
            auth.authorize(scope, identity.as_ref())?;
        }
        Ok(identity)
    }

    /// Whether `identity` (a session's, a stream's) may send `event` (or,
    /// with `subscription`, subscribe to that pattern).
    pub(crate) fn authorize_event(
        &self,
        identity: Option<&Identity>,
        event: &str,
        subscription: bool,
    ) -> Result<(), Refusal> {
        let Some(auth) = &self.auth else {
            return Ok(());
        };
        let scope = Scope {
            path: None,
            event: Some(event),
            subscription,
        };
        auth.authorize(&scope, identity).map_err(Refusal::from)
    }

    /// A WebSocket upgrade's bearer token from where `[auth.websocket]`
    /// allows other than the headers: a `bearer.<token>` subprotocol, or
    /// the query parameter.
    pub(crate) fn ws_token(&self, headers: &HeaderMap, query: Option<&str>) -> Option<String> {
        for source in &self.ws.token_from {
            match source {
                TokenSource::Header => {}
                TokenSource::Subprotocol => {
                    let found = headers
                        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
                        .iter()
                        .filter_map(|v| v.to_str().ok())
                        .flat_map(|v| v.split(','))
                        .find_map(|p| p.trim().strip_prefix(SUBPROTOCOL_PREFIX).map(str::to_owned));
                    if found.is_some() {
                        return found;
                    }
                }
                TokenSource::Query => {
                    let found = query.and_then(|q| {
                        serde_urlencoded::from_str::<Vec<(String, String)>>(q)
                            .ok()?
                            .into_iter()
                            .find(|(k, _)| *k == self.ws.query_param)
                            .map(|(_, v)| v)
                    });
                    if found.is_some() {
                        return found;
                    }
                }
            }
        }
        None
    }

    /// Whether `[auth.websocket]` takes the token from the headers.
    pub(crate) fn ws_header_tokens(&self) -> bool {
        self.ws.token_from.contains(&TokenSource::Header)
    }

    /// The HTTP answer to a refusal: 401 with `WWW-Authenticate`, 403, or
    /// 429 with `Retry-After`.
    pub(crate) fn refuse(&self, refusal: &Refusal) -> Reply {
        let status = match refusal {
            Refusal::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            Refusal::Forbidden(_) => StatusCode::FORBIDDEN,
            Refusal::TooMany(_) => StatusCode::TOO_MANY_REQUESTS,
            Refusal::BadRequest(_) => StatusCode::BAD_REQUEST,
        };
        let mut reply = error(status, &refusal.detail());
        let headers = reply.headers_mut();
        match refusal {
            Refusal::Unauthenticated(why) => {
                for challenge in self.challenges(*why) {
                    if let Ok(v) = HeaderValue::from_str(&challenge) {
                        headers.append(header::WWW_AUTHENTICATE, v);
                    }
                }
            }
            Refusal::TooMany(wait) => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs(*wait)));
            }
            Refusal::Forbidden(_) | Refusal::BadRequest(_) => {}
        }
        reply
    }

    /// The `WWW-Authenticate` challenges (RFC 9110 §11.6.1, RFC 6750 §3):
    /// one per accepted scheme.
    fn challenges(&self, why: Option<&str>) -> Vec<String> {
        let Some(auth) = &self.auth else {
            return Vec::new();
        };
        let realm = auth.realm.replace(['"', '\\'], "");
        let mut out = Vec::new();
        if auth.offers_bearer() {
            out.push(match why {
                Some(why) => {
                    format!("Bearer realm=\"{realm}\", error=\"invalid_token\", error_description=\"{why}\"")
                }
                None => format!("Bearer realm=\"{realm}\""),
            });
        }
        if auth.offers_basic() {
            out.push(format!("Basic realm=\"{realm}\", charset=\"UTF-8\""));
        }
        if out.is_empty() {
            // API keys only: no registered scheme says how; name the realm.
            out.push(format!("ApiKey realm=\"{realm}\""));
        }
        out
    }

    /// Adds the security headers `headers` does not have yet.
    pub(crate) fn secure(&self, headers: &mut HeaderMap) {
        for (name, value) in &self.security {
            if !headers.contains_key(name) {
                headers.insert(name.clone(), value.clone());
            }
        }
    }
}

/// A WebSocket subprotocol that carries a bearer token: `bearer.<token>`.
pub(crate) const SUBPROTOCOL_PREFIX: &str = "bearer.";

/// The tower-http layers around the listener's whole service: CORS (when
/// origins are configured), response compression, request decoding.
pub(crate) struct Layers {
    pub(crate) cors: Option<CorsLayer>,
    pub(crate) compression: Compression,
    pub(crate) decompression: RequestDecompressionLayer,
    /// How many times its received size a decoded request body may be.
    pub(crate) max_decode_ratio: u32,
}

/// Which responses are compressed: at least `min_bytes`, of a configured
/// content type, not a range.
#[derive(Clone)]
pub(crate) struct Compressible {
    size: SizeAbove,
    types: Arc<Vec<String>>,
}

impl Predicate for Compressible {
    fn should_compress<B: http_body::Body>(&self, response: &http::Response<B>) -> bool {
        let headers = response.headers();
        if headers.contains_key(header::CONTENT_RANGE) {
            return false;
        }
        let Some(ct) = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
            return false;
        };
        let ct = ct.split(';').next().unwrap_or("").trim();
        let typed = self.types.iter().any(|t| {
            if t.ends_with('/') {
                ct.starts_with(t.as_str())
            } else {
                ct.eq_ignore_ascii_case(t)
            }
        });
        typed && self.size.should_compress(response)
    }
}

/// Response compression (tower-http's), with a `HEAD` answered as its
/// `GET` would be (RFC 9110 §9.3.2): a `HEAD`'s body is empty, so on its
/// own the compressor would leave it alone and the client would see an
/// identity `Content-Length` where the `GET` has `Content-Encoding`,
/// `Vary` and no length. Inside, a `HEAD`'s empty body is made to claim
/// the length its `Content-Length` says, so the compressor decides
/// exactly as for the `GET` (same predicate, same negotiation); outside,
/// whatever the compressor made of it is dropped.
#[derive(Clone)]
pub(crate) struct Compression(CompressionLayer<Compressible>);

impl<S> tower::Layer<S> for Compression {
    type Service = head::Bodiless<tower_http::compression::Compression<head::Sized<S>, Compressible>>;
    fn layer(&self, inner: S) -> Self::Service {
        head::Bodiless(tower::Layer::layer(&self.0, head::Sized(inner)))
    }
}

/// The two halves of [`Compression`]'s handling of `HEAD`.
mod head {
    use std::marker::PhantomData;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use bytes::Buf;
    use futures_util::TryFutureExt;
    use futures_util::future::MapOk;
    use http::{Method, Request, Response, header};
    use http_body::{Body, Frame, SizeHint};
    use http_body_util::Either;

    /// An empty body that claims a length: what a `HEAD`'s `GET` would
    /// send, for the compressor to decide on. It yields nothing.
    pub(crate) struct Claimed<D>(u64, PhantomData<fn() -> D>);

    impl<D: Buf> Body for Claimed<D> {
        type Data = D;
        type Error = std::convert::Infallible;
        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<D>, Self::Error>>> {
            Poll::Ready(None)
        }
        fn size_hint(&self) -> SizeHint {
            SizeHint::with_exact(self.0)
        }
    }

    type Claiming<B> = Either<B, Claimed<<B as Body>::Data>>;

    /// Inside the compressor: a `HEAD`'s empty body claims its length.
    #[derive(Clone)]
    pub(crate) struct Sized<S>(pub(crate) S);

    fn claim<B: Body>(response: Response<B>) -> Response<Claiming<B>> {
        let (parts, body) = response.into_parts();
        let length = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|&n| n > 0 && body.size_hint().exact() == Some(0));
        match length {
            // The empty body is dropped: it held nothing.
            Some(n) => Response::from_parts(parts, Either::Right(Claimed(n, PhantomData))),
            None => Response::from_parts(parts, Either::Left(body)),
        }
    }

    fn pass<B: Body>(response: Response<B>) -> Response<Claiming<B>> {
        response.map(Either::Left)
    }

    impl<S, R, B> tower::Service<Request<R>> for Sized<S>
    where
        S: tower::Service<Request<R>, Response = Response<B>>,
        B: Body,
    {
        type Response = Response<Claiming<B>>;
        type Error = S::Error;
        // Fn pointers, not closures: see `conditional::Weaken`.
        type Future = MapOk<S::Future, fn(Response<B>) -> Response<Claiming<B>>>;

        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
            self.0.poll_ready(cx)
        }

        fn call(&mut self, req: Request<R>) -> Self::Future {
            let then: fn(Response<B>) -> Response<Claiming<B>> = if req.method() == Method::HEAD {
                claim::<B>
            } else {
                pass::<B>
            };
            self.0.call(req).map_ok(then)
        }
    }

    pin_project_lite::pin_project! {
        /// A body, or none at all: a `HEAD`'s answer loses its body.
        #[project = EmptiedProj]
        pub(crate) enum Emptied<B> {
            Sent { #[pin] body: B },
            Dropped,
        }
    }

    // What CORS answers a preflight with. By hand: a `#[default]` variant
    // inside `pin_project!` is not something the macro promises to keep.
    #[allow(clippy::derivable_impls)]
    impl<B> Default for Emptied<B> {
        fn default() -> Self {
            Emptied::Dropped
        }
    }

    impl<B: Body> Body for Emptied<B> {
        type Data = B::Data;
        type Error = B::Error;
        fn poll_frame(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
            match self.project() {
                EmptiedProj::Sent { body } => body.poll_frame(cx),
                EmptiedProj::Dropped => Poll::Ready(None),
            }
        }
        fn is_end_stream(&self) -> bool {
            match self {
                Emptied::Sent { body } => body.is_end_stream(),
                Emptied::Dropped => true,
            }
        }
        fn size_hint(&self) -> SizeHint {
            match self {
                Emptied::Sent { body } => body.size_hint(),
                Emptied::Dropped => SizeHint::with_exact(0),
            }
        }
    }

    /// Outside the compressor: a `HEAD`'s answer keeps its headers and
    /// loses whatever body it has.
    #[derive(Clone)]
    pub(crate) struct Bodiless<S>(pub(crate) S);

    fn empty<B: Body>(response: Response<B>) -> Response<Emptied<B>> {
        response.map(|_| Emptied::Dropped)
    }

    fn keep<B: Body>(response: Response<B>) -> Response<Emptied<B>> {
        response.map(|body| Emptied::Sent { body })
    }

    impl<S, R, B> tower::Service<Request<R>> for Bodiless<S>
    where
        S: tower::Service<Request<R>, Response = Response<B>>,
        B: Body,
    {
        type Response = Response<Emptied<B>>;
        type Error = S::Error;
        type Future = MapOk<S::Future, fn(Response<B>) -> Response<Emptied<B>>>;

        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
            self.0.poll_ready(cx)
        }

        fn call(&mut self, req: Request<R>) -> Self::Future {
            let then: fn(Response<B>) -> Response<Emptied<B>> = if req.method() == Method::HEAD {
                empty::<B>
            } else {
                keep::<B>
            };
            self.0.call(req).map_ok(then)
        }
    }
}

/// The layers of `config`; an error names the key at fault.
pub(crate) fn layers(config: &MiddlewareConfig) -> Result<Layers, String> {
    let c = &config.compression;
    let mut gzip = false;
    let mut br = false;
    let mut zstd = false;
    for name in &c.algorithms {
        match name.as_str() {
            "gzip" => gzip = true,
            "br" => br = true,
            "zstd" => zstd = true,
            other => {
                return Err(format!(
                    "compression.algorithms: `{other}` is not one of zstd, br, gzip"
                ));
            }
        }
    }
    let on = c.enabled;
    let compression = Compression(
        CompressionLayer::new()
            .gzip(on && gzip)
            .br(on && br)
            .zstd(on && zstd)
            .quality(CompressionLevel::Default)
            .compress_when(Compressible {
                size: SizeAbove::new(c.min_bytes),
                types: Arc::new(c.content_types.clone()),
            }),
    );
    let decode = c.decode_requests;
    let decompression = RequestDecompressionLayer::new()
        .gzip(decode)
        .deflate(decode)
        .br(decode)
        .zstd(decode)
        // Off, an encoded body reaches its handler as it came, as before.
        .pass_through_unaccepted(!decode);
    if c.max_decode_ratio == 0 {
        return Err("compression.max_decode_ratio: must be at least 1".into());
    }
    Ok(Layers {
        cors: cors(config)?,
        compression,
        decompression,
        max_decode_ratio: c.max_decode_ratio,
    })
}

fn cors(config: &MiddlewareConfig) -> Result<Option<CorsLayer>, String> {
    let c = &config.cors;
    if c.allow_origins.is_empty() {
        return Ok(None);
    }
    let any = c.allow_origins.iter().any(|o| o == "*");
    if any && c.allow_origins.len() > 1 {
        return Err("cors.allow_origins: `*` stands alone".into());
    }
    if any && c.allow_credentials {
        // The Fetch standard forbids it, and tower-http would panic.
        return Err("cors.allow_credentials: not with the `*` origin; list the origins".into());
    }
    let origin = if any {
        AllowOrigin::any()
    } else {
        let mut list = Vec::new();
        for o in &c.allow_origins {
            let parsed: http::Uri = o
                .parse()
                .map_err(|_| format!("cors.allow_origins: `{o}` is not an origin"))?;
            if parsed.scheme().is_none() || parsed.authority().is_none() || o.ends_with('/') {
                return Err(format!(
                    "cors.allow_origins: `{o}` is not an origin (scheme://host[:port], no path)"
                ));
            }
            list.push(HeaderValue::from_str(o).map_err(|_| format!("cors.allow_origins: `{o}`"))?);
        }
        AllowOrigin::list(list)
    };
    let mut methods = Vec::new();
    for m in &c.allow_methods {
        methods.push(
            http::Method::from_bytes(m.as_bytes())
                .map_err(|_| format!("cors.allow_methods: `{m}` is not a method"))?,
        );
    }
    let names = |key: &str, list: &[String]| -> Result<Vec<HeaderName>, String> {
        list.iter()
            .map(|h| {
                HeaderName::from_bytes(h.as_bytes())
                    .map_err(|_| format!("cors.{key}: `{h}` is not a header name"))
            })
            .collect()
    };
    Ok(Some(
        CorsLayer::new()
            .allow_origin(origin)
            .allow_methods(methods)
            .allow_headers(names("allow_headers", &c.allow_headers)?)
            .expose_headers(names("expose_headers", &c.expose_headers)?)
            .allow_credentials(c.allow_credentials)
            .max_age(Duration::from_secs(c.max_age_s)),
    ))
}

/// Builds everything `config` asks for, as the listener will at start:
/// how the supervisor checks the middleware sections before any process
/// starts. The error names the key at fault.
pub fn check(config: &MiddlewareConfig) -> Result<(), String> {
    Middleware::new(config)?;
    crate::public::check_expose(&config.auth.expose)?;
    layers(config)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_match_by_segment() {
        assert!(under("/admin", "/admin"));
        assert!(under("/admin/x", "/admin"));
        assert!(under("/admin/x", "/admin/"));
        assert!(!under("/administrator", "/admin"));
        assert!(under("/anything", "/"));
    }

    #[test]
    fn patterns_and_subscriptions() {
        let shop = Pattern::parse("shop.*").unwrap();
        assert!(shop.covers("shop.Buy"));
        assert!(!shop.covers("shopping.Buy"));
        assert!(shop.overlaps(&Pattern::parse("*").unwrap()));
        assert!(shop.overlaps(&Pattern::parse("shop.Buy").unwrap()));
        assert!(!shop.overlaps(&Pattern::parse("demo.*").unwrap()));
        assert!(Pattern::parse("shop*").is_err());
        let sub = Scope {
            path: None,
            event: Some("*"),
            subscription: true,
        };
        assert!(matches(None, Some(&shop), &sub));
        assert!(!matches(Some("/x"), None, &sub));
        assert!(matches(None, None, &sub));
    }

    #[test]
    fn retry_after_rounds_up() {
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(2)), 2);
        assert_eq!(retry_after_secs(Duration::from_millis(2001)), 3);
    }

    #[test]
    fn bad_settings_name_their_key() {
        let mut c = MiddlewareConfig::default();
        c.cors.allow_origins = vec!["*".into()];
        c.cors.allow_credentials = true;
        assert!(check(&c).unwrap_err().starts_with("cors.allow_credentials"));
        let mut c = MiddlewareConfig::default();
        c.cors.allow_origins = vec!["https://a.example/path/".into()];
        assert!(check(&c).unwrap_err().starts_with("cors.allow_origins"));
        let mut c = MiddlewareConfig::default();
        c.compression.algorithms = vec!["lzma".into()];
        assert!(check(&c).unwrap_err().starts_with("compression.algorithms"));
        let mut c = MiddlewareConfig::default();
        c.compression.max_decode_ratio = 0;
        assert!(check(&c).unwrap_err().starts_with("compression.max_decode_ratio"));
        let mut c = MiddlewareConfig::default();
        c.rate_limit.limits = vec![config::RateLimit::default()];
        assert!(
            check(&c)
                .unwrap_err()
                .starts_with("rate_limit.limits[0].requests")
        );
        let mut c = MiddlewareConfig::default();
        c.rate_limit.limits = vec![config::RateLimit {
            requests: 5,
            key: RateKey::Identity,
            ..config::RateLimit::default()
        }];
        assert!(check(&c).unwrap_err().starts_with("rate_limit.limits[0].key"));
        let mut c = MiddlewareConfig::default();
        c.security_headers.headers.insert("bad header".into(), "x".into());
        assert!(check(&c).unwrap_err().starts_with("security_headers.headers"));
        assert!(check(&MiddlewareConfig::default()).is_ok());
    }
}
