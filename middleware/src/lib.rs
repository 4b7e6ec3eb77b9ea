//! Built-in middleware: Switchyard's own code, run in the listener process
//! between the accepted connection and the request's event, with no hop
//! (decision 0046). Configured by the top-level sections of
//! `switchyard.toml` (`config`), built once per listener process. A crate of
//! its own (decision 0153): it knows nothing of sockets, pipes or the
//! listener's route table beyond [`paths::EventPaths`], so its
//! rules, limits and session policy are tested without them.
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
//!   streams are authenticated once, at the upgrade or the call; each
//!   message's or call's event then meets the same limits and rules as
//!   the event's HTTP route would ([`Middleware::admit_event`]), a
//!   subscription every rule that could decide one of its types
//!   ([`Middleware::authorize_subscription`]), and each notification the
//!   rules again before it is pushed (`session`).
//!
//! One policy, decided on the event (decision 0105): a rule's `prefix`
//! covers the paths under it and, through the route table, the event
//! types whose routes lie under it, so the same rule holds for the same
//! event whichever way it comes in.
//!
//! Security headers are added to every HTTP answer that does not set them.
//!
//! # Layout
//! - `config`: the settings, as `switchyard.toml` spells them.
//! - `auth`: credentials (JWT, API keys, Basic) and rules.
//! - `jwt`: bearer token verification.
//! - `rate`: token buckets per client, in bounded memory.
//! - `session`: what a long-lived session (WebSocket, gRPC stream) keeps
//!   of its caller: the credential to check again, the decisions on what
//!   it may receive, its end at the token's `exp`.
//!   It reads the listener's pool of sessions through `SessionHost`.
//! - `paths`: what the rules read of the route table.
//! - `identity`: who sent a request, once authentication has said so.

#![forbid(unsafe_code)]

pub mod config;

mod auth;
pub mod identity;
mod jwt;
pub mod paths;
mod rate;
pub mod session;

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
use self::paths::EventPaths;
use self::rate::{Key, Limiter};
use crate::identity::{AuthMethod, Identity};

/// What a request is, for rules and limits: its path (HTTP requests and
/// WebSocket upgrades) and its event type (a route's, a WebSocket
/// message's, a gRPC call's), or a subscription pattern.
#[derive(Clone, Copy, Default)]
pub struct Scope<'a> {
    pub path: Option<&'a str>,
    pub event: Option<&'a str>,
    /// `event` is a subscription pattern (`shop.*`), not one type.
    pub subscription: bool,
    /// The route table: which paths each event type is routed at, for
    /// the `prefix` of rules and limits on an event.
    pub routes: Option<&'a EventPaths>,
}

impl<'a> Scope<'a> {
    /// An event with no path (a WebSocket message, a gRPC call, a push),
    /// or with `subscription` a subscription pattern, over `routes`.
    fn of_event(event: &'a str, subscription: bool, routes: &'a EventPaths) -> Scope<'a> {
        Scope {
            path: None,
            event: Some(event),
            subscription,
            routes: Some(routes),
        }
    }
}

/// An event type or a prefix of types, as subscriptions spell them:
/// `shop.Checkout`, `shop.*`, `*`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pattern {
    Exact(String),
    Prefix(String),
}

impl Pattern {
    pub fn parse(text: &str) -> Result<Pattern, String> {
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

    /// Whether every event type `other` matches, `self` matches too.
    fn contains(&self, other: &Pattern) -> bool {
        match (self, other) {
            (Pattern::Exact(a), Pattern::Exact(b)) => a == b,
            (Pattern::Exact(_), Pattern::Prefix(_)) => false,
            (Pattern::Prefix(p), Pattern::Exact(e)) => e.starts_with(p.as_str()),
            (Pattern::Prefix(p), Pattern::Prefix(q)) => q.starts_with(p.as_str()),
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

/// Whether some path of route `template` (`/users/{name}`, `/files/{*rest}`)
/// lies under `prefix`: segment by segment, a parameter matches any
/// segment and a catch-all any rest. Over a transport without a path, a
/// rule on `/users/admin` cannot tell `admin` from `bob` in the message,
/// so it covers the whole event of `/users/{name}`.
fn reaches(template: &str, prefix: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    let mut route = template.split('/').skip(1);
    for want in prefix.split('/').skip(1) {
        match route.next() {
            None => return false,
            Some(seg) if seg.starts_with("{*") => return true,
            Some(seg) if seg.contains('{') => {}
            Some(seg) if seg == want => {}
            Some(_) => return false,
        }
    }
    true
}

/// Whether a rule's or limit's `prefix` concerns `scope`: its path is
/// under the prefix, or its event is routed under it (decision 0105). A
/// request with a path (HTTP) is covered through its event when another
/// route of the same event lies wholly under the prefix; one without
/// (WebSocket, gRPC) when some path of one of its routes does; a
/// subscription when some type it matches is.
fn prefix_covers(prefix: &str, scope: &Scope<'_>) -> bool {
    if scope.path.is_some_and(|p| under(p, prefix)) {
        return true;
    }
    let (Some(routes), Some(event)) = (scope.routes, scope.event) else {
        return false;
    };
    if scope.subscription {
        let Ok(pattern) = Pattern::parse(event) else {
            return false;
        };
        return routes
            .typed_paths()
            .any(|(ty, paths)| pattern.covers(ty) && paths.iter().any(|t| reaches(t, prefix)));
    }
    let paths = routes.paths_of(event);
    if scope.path.is_some() {
        // The template starts with the prefix's very text: its literal
        // segments put every path of it under the prefix.
        paths.iter().any(|t| under(t, prefix))
    } else {
        paths.iter().any(|t| reaches(t, prefix))
    }
}

/// Whether `rule` covers an HTTP route, by its path template and event
/// type (the API description says what each route requires).
pub fn rule_covers(rule: &config::AuthRule, path: &str, event: Option<&str>) -> bool {
    let pattern = match rule.event.as_deref().map(Pattern::parse).transpose() {
        Ok(p) => p,
        Err(_) => return false,
    };
    let scope = Scope {
        path: Some(path),
        event,
        subscription: false,
        routes: None,
    };
    matches(rule.prefix.as_deref(), pattern.as_ref(), &scope)
}

/// Whether `rule` reaches some request of the route `template` of `event`
/// without covering its template as a path: a `prefix` that names a
/// value of one of its parameters (`/users/admin` of `/users/{name}`),
/// which covers those paths over HTTP and the whole event over WebSocket
/// and gRPC (decision 0105).
pub fn rule_reaches(rule: &config::AuthRule, template: &str, event: &str) -> bool {
    let event_ok = match rule.event.as_deref().map(Pattern::parse) {
        None => true,
        Some(Ok(pattern)) => pattern.covers(event),
        Some(Err(_)) => false,
    };
    event_ok && rule.prefix.as_deref().is_none_or(|p| reaches(template, p))
}

/// What `rule` requires, in words.
fn requirement(rule: &config::AuthRule) -> String {
    match rule.require {
        config::Require::None => "nothing".to_owned(),
        config::Require::Identity if rule.roles.is_empty() && rule.claims.is_empty() => {
            "an identity".to_owned()
        }
        config::Require::Identity => {
            let mut n = Vec::new();
            if !rule.roles.is_empty() {
                n.push(format!("a role of {}", rule.roles.join(", ")));
            }
            for (k, v) in &rule.claims {
                n.push(format!("{k} = {v}"));
            }
            n.join(" and ")
        }
    }
}

/// What each `[[auth.rules]]` entry covers, given the group's routes
/// (`(method, path template, event type)`): one line per rule, for
/// `switchyard check`. The same derivation the listener makes from its
/// route table.
pub fn describe_rules(auth: &config::AuthConfig, routes: &[(String, String, String)]) -> Vec<String> {
    let mut out = Vec::new();
    for (i, rule) in auth.rules.iter().enumerate() {
        let pattern = rule.event.as_deref().and_then(|e| Pattern::parse(e).ok());
        let mut what = Vec::new();
        if let Some(prefix) = &rule.prefix {
            what.push(format!("prefix {prefix}"));
        }
        if let Some(event) = &rule.event {
            what.push(format!("event {event}"));
        }
        let needs = requirement(rule);
        let mut types: Vec<&str> = routes
            .iter()
            .filter(|(_, path, ty)| {
                let prefix_ok = rule.prefix.as_deref().is_none_or(|p| reaches(path, p));
                let event_ok = pattern.as_ref().is_none_or(|e| e.covers(ty));
                prefix_ok && event_ok
            })
            .map(|(_, _, ty)| ty.as_str())
            .collect();
        types.sort_unstable();
        types.dedup();
        let what = if what.is_empty() {
            "everything".to_owned()
        } else {
            what.join(", ")
        };
        let events = match (&rule.event, types.is_empty()) {
            (Some(e), true) => format!("events {e} (no route yet)"),
            (Some(e), false) => format!("events {e}; routed now: {}", types.join(", ")),
            (None, _) if rule.prefix.is_none() => "every event".to_owned(),
            (None, true) => "no routed event".to_owned(),
            (None, false) => format!("events {}", types.join(", ")),
        };
        out.push(format!(
            "auth.rules[{i}] ({what}) requires {needs}: HTTP paths{} and, on HTTP, HTTP/3, WebSocket, gRPC and subscriptions, {events}",
            rule.prefix.as_deref().map_or_else(|| " of those events".to_owned(), |p| format!(" under {p}"))
        ));
    }
    // Then each route: what its path needs over HTTP (the first rule that
    // covers the template), and what its event needs over WebSocket and
    // gRPC (the first rule that reaches the route, by its event or a path
    // of it).
    let decided = |found: Option<(usize, &config::AuthRule)>| match found {
        Some((i, rule)) => format!("{} (auth.rules[{i}])", requirement(rule)),
        None => "nothing (no rule)".to_owned(),
    };
    for (method, path, ty) in routes {
        let http = auth
            .rules
            .iter()
            .enumerate()
            .find(|(_, r)| rule_covers(r, path, Some(ty)));
        let event = auth
            .rules
            .iter()
            .enumerate()
            .find(|(_, r)| routes.iter().any(|(_, p, t)| t == ty && rule_reaches(r, p, ty)));
        out.push(format!(
            "route {method} {path} ({ty}) requires {} over HTTP, HTTP/3; {} over WebSocket, gRPC and subscriptions",
            decided(http),
            decided(event)
        ));
    }
    out
}

/// Whether a rule or limit on `prefix` and `event` (each optional; neither
/// matches everything) concerns `scope`.
fn matches(prefix: Option<&str>, event: Option<&Pattern>, scope: &Scope<'_>) -> bool {
    if let Some(prefix) = prefix
        && !prefix_covers(prefix, scope)
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
pub enum Refusal {
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
    pub fn status(&self) -> u16 {
        match self {
            Refusal::Unauthenticated(_) => 401,
            Refusal::Forbidden(_) => 403,
            Refusal::TooMany(_) => 429,
            Refusal::BadRequest(_) => 400,
        }
    }

    pub fn detail(&self) -> String {
        match self {
            Refusal::Unauthenticated(None) => "authentication required".to_owned(),
            Refusal::Unauthenticated(Some(why)) => format!("authentication failed: {why}"),
            Refusal::Forbidden(why) => format!("forbidden: {why}"),
            Refusal::TooMany(wait) => format!("rate limit exceeded; retry in {} s", retry_after_secs(*wait)),
            Refusal::BadRequest(why) => (*why).to_owned(),
        }
    }

    /// The gRPC status of this refusal: the one status→code table
    /// (`switchyard_proto::grpc::code_for_status`, docs/grpc.md).
    pub fn grpc(&self) -> tonic::Status {
        tonic::Status::new(
            switchyard_proto::grpc::code_for_status(self.status()),
            self.detail(),
        )
    }
}

/// Whether `origin` (`https://host:port`) is the server's own, reached as
/// `host` (`Host` or `:authority`). With TLS here only `https` is; without
/// (a proxy in front may terminate TLS) either scheme is, with its default
/// port when the host names none. Names compare without case.
fn same_origin(origin: &str, host: &str, tls: bool) -> bool {
    let Some((scheme, rest)) = origin.split_once("://") else {
        return false;
    };
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "https" => 443,
        "http" if !tls => 80,
        _ => return false,
    };
    let split = |hp: &str| -> Option<(String, u16)> {
        let hp = hp.trim();
        // `[v6]:port`, `[v6]`, `name:port`, `name`.
        let (name, port) = match hp.rfind(':') {
            Some(i) if !hp[i..].contains(']') => (&hp[..i], Some(hp[i + 1..].parse::<u16>().ok()?)),
            _ => (hp, None),
        };
        if name.is_empty() || name.contains(['/', '@']) {
            return None;
        }
        Some((name.to_ascii_lowercase(), port.unwrap_or(default_port)))
    };
    match (split(rest), split(host)) {
        (Some(a), Some(b)) => a == b,
        _ => false,
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

/// The credential a session was opened with: the headers a credential can
/// be in, and a token from elsewhere (a WebSocket subprotocol or query).
pub struct Credential {
    pub headers: HeaderMap,
    pub token: Option<String>,
    pub client: IpAddr,
}

/// The per-request middleware of one listener process.
pub struct Middleware {
    /// `None` when no method and no rule is configured: nothing to check.
    auth: Option<Auth>,
    limits: Vec<Limit>,
    security: Vec<(HeaderName, HeaderValue)>,
    ws: WsAuthConfig,
    /// `[cors] allow_origins`: the browser origins, besides the server's
    /// own, that may open a WebSocket (`*`: any).
    origins: Vec<String>,
}

impl Middleware {
    /// The middleware of `config`; an error names the key at fault.
    pub fn new(config: &MiddlewareConfig) -> Result<Middleware, String> {
        let a = &config.auth;
        let max_clients = config.rate_limit.max_clients;
        if max_clients == 0 {
            return Err("rate_limit.max_clients: must be positive".into());
        }
        let ipv6_prefix = config.rate_limit.ipv6_prefix;
        if !(16..=128).contains(&ipv6_prefix) {
            return Err("rate_limit.ipv6_prefix: between 16 and 128".into());
        }
        let auth = if a.any_method() || !a.rules.is_empty() {
            Some(Auth::new(a, max_clients, ipv6_prefix)?)
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
                limiter: Limiter::new(quota, max_clients, ipv6_prefix),
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
            origins: config.cors.allow_origins.clone(),
        })
    }

    /// Whether there is anything to admit at all (else the per-request
    /// path costs nothing).
    pub fn admits(&self) -> bool {
        self.auth.is_some() || !self.limits.is_empty()
    }

    /// Lets a request in `scope` through, or says why not: rate limits by
    /// address, the credential, limits by API key or identity, then the
    /// rules (unless `rules` is false: a gRPC call's event is checked
    /// later, by its message). `token` is a bearer token from outside the
    /// headers (WebSocket). Returns the identity the credential proved,
    /// for the request's extensions.
    pub async fn admit(
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

    /// Lets one event from a session or stream through, as its HTTP route
    /// would be: the rate limits that concern the event (by its type, or
    /// by a `prefix` its routes lie under), then the rules. `identity`,
    /// `client`: the caller the session or call was authenticated as. The
    /// one place a client-supplied event type meets the policy on
    /// WebSocket and gRPC.
    pub fn admit_event(
        &self,
        identity: Option<&Identity>,
        client: Option<IpAddr>,
        event: &str,
        routes: &EventPaths,
    ) -> Result<(), Refusal> {
        self.count_event(identity, client, &Scope::of_event(event, false, routes))?;
        self.authorize_event(identity, event, routes)
    }

    /// Lets one subscription from a session or stream through: the rate
    /// limits whose `prefix` or `event` concern a type the pattern
    /// matches count it like a message, then the rules
    /// ([`authorize_subscription`](Self::authorize_subscription)). A
    /// reload's re-check of open subscriptions counts nothing.
    pub fn admit_subscription(
        &self,
        identity: Option<&Identity>,
        client: Option<IpAddr>,
        pattern: &str,
        routes: &EventPaths,
    ) -> Result<(), Refusal> {
        self.count_event(identity, client, &Scope::of_event(pattern, true, routes))?;
        self.authorize_subscription(identity, pattern, routes)
    }

    /// Counts one event or subscription against the limits that concern
    /// it by `prefix` or `event`, keyed as on HTTP.
    fn count_event(
        &self,
        identity: Option<&Identity>,
        client: Option<IpAddr>,
        scope: &Scope<'_>,
    ) -> Result<(), Refusal> {
        // Limits with neither prefix nor event count requests, upgrades
        // and gRPC calls where they come in (`admit`); counting them per
        // message too would count a unary call twice.
        let client = client.unwrap_or(std::net::Ipv4Addr::UNSPECIFIED.into());
        for limit in self.limits.iter().filter(|l| {
            (l.prefix.is_some() || l.event.is_some()) && matches(l.prefix.as_deref(), l.event.as_ref(), scope)
        }) {
            let key = match (identity, limit.key) {
                (Some(who), RateKey::Identity) => Key::Subject(who.subject.clone()),
                (Some(who), RateKey::ApiKey) if who.method == AuthMethod::ApiKey => {
                    Key::Subject(who.subject.clone())
                }
                _ => Key::Address(client),
            };
            limit.limiter.check(&key).map_err(Refusal::TooMany)?;
        }
        Ok(())
    }

    /// Whether the rules let `identity` have `event`: send it, or receive
    /// it as a notification. No rate limit.
    pub fn authorize_event(
        &self,
        identity: Option<&Identity>,
        event: &str,
        routes: &EventPaths,
    ) -> Result<(), Refusal> {
        let Some(auth) = &self.auth else {
            return Ok(());
        };
        let scope = Scope::of_event(event, false, routes);
        auth.authorize(&scope, identity).map_err(Refusal::from)
    }

    /// Whether `identity` may subscribe to `pattern`: every rule that
    /// could decide one of the types it matches must allow it, up to the
    /// first rule that decides them all (decision 0106).
    pub fn authorize_subscription(
        &self,
        identity: Option<&Identity>,
        pattern: &str,
        routes: &EventPaths,
    ) -> Result<(), Refusal> {
        let Some(auth) = &self.auth else {
            return Ok(());
        };
        let scope = Scope::of_event(pattern, true, routes);
        auth.authorize_every(&scope, identity).map_err(Refusal::from)
    }

    /// Authenticates a session's credential again (after a reload that
    /// may have changed the keys); `Ok(None)`: it had none.
    pub async fn reauthenticate(&self, credential: &Credential) -> Result<Option<Identity>, Refusal> {
        let Some(auth) = &self.auth else {
            return Ok(None);
        };
        Ok(auth
            .authenticate(
                &credential.headers,
                credential.token.as_deref(),
                credential.client,
            )
            .await?)
    }

    /// What a session keeps of the credential it was opened with, to check
    /// again on reload: the headers a credential can be in, and a token
    /// from elsewhere.
    pub fn credential(
        &self,
        headers: &HeaderMap,
        token: Option<String>,
        client: IpAddr,
        ws: bool,
    ) -> Credential {
        let mut kept = HeaderMap::new();
        if !ws || self.ws_header_tokens() {
            let mut names = vec![header::AUTHORIZATION];
            if let Some(auth) = &self.auth {
                names.extend(auth.api_key_header().cloned());
            }
            for name in names {
                for value in headers.get_all(&name) {
                    if let Ok(copy) = HeaderValue::from_bytes(value.as_bytes()) {
                        kept.append(name.clone(), copy);
                    }
                }
            }
        }
        Credential {
            headers: kept,
            token,
            client,
        }
    }

    /// Whether a WebSocket upgrade may come from its `Origin` (decision
    /// 0107): none (not a browser), the server's own (same host and port
    /// as the request's `Host` or `:authority`, and with TLS here, https),
    /// or one of `[cors] allow_origins`. Else 403: a page elsewhere would
    /// drive the session with the user's cookies.
    pub fn check_origin<B>(&self, req: &http::Request<B>, tls: bool) -> Result<(), Refusal> {
        let Some(origin) = req.headers().get(header::ORIGIN) else {
            return Ok(());
        };
        let origin = origin.to_str().unwrap_or("").trim();
        if self
            .origins
            .iter()
            .any(|o| o == "*" || o.eq_ignore_ascii_case(origin))
        {
            return Ok(());
        }
        let host = req.uri().authority().map(|a| a.as_str().to_owned()).or_else(|| {
            req.headers()
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .map(str::to_owned)
        });
        if let Some(host) = host
            && same_origin(origin, &host, tls)
        {
            return Ok(());
        }
        Err(Refusal::Forbidden(format!(
            "a WebSocket from the origin `{}` is refused: it is not this server's, nor in [cors] allow_origins",
            origin.escape_debug()
        )))
    }

    /// A WebSocket upgrade's bearer token from where `[auth.websocket]`
    /// allows other than the headers: a `bearer.<token>` subprotocol, or
    /// the query parameter.
    pub fn ws_token(&self, headers: &HeaderMap, query: Option<&str>) -> Option<String> {
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
    pub fn ws_header_tokens(&self) -> bool {
        self.ws.token_from.contains(&TokenSource::Header)
    }

    /// The HTTP answer to a refusal: 401 with `WWW-Authenticate`, 403, or
    /// 429 with `Retry-After`, on the error answer `error` makes of a status
    /// and a detail (the listener's problem+json).
    pub fn refuse<B>(
        &self,
        refusal: &Refusal,
        error: impl FnOnce(StatusCode, &str) -> http::Response<B>,
    ) -> http::Response<B> {
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
    pub fn secure(&self, headers: &mut HeaderMap) {
        for (name, value) in &self.security {
            if !headers.contains_key(name) {
                headers.insert(name.clone(), value.clone());
            }
        }
    }
}

/// A WebSocket subprotocol that carries a bearer token: `bearer.<token>`.
pub const SUBPROTOCOL_PREFIX: &str = "bearer.";

/// The tower-http layers around the listener's whole service: CORS (when
/// origins are configured), response compression, request decoding.
pub struct Layers {
    pub cors: Option<CorsLayer>,
    pub compression: Compression,
    pub decompression: RequestDecompressionLayer,
    /// How many times its received size a decoded request body may be.
    pub max_decode_ratio: u32,
}

/// Which responses are compressed: at least `min_bytes`, of a configured
/// content type, not a range.
#[derive(Clone)]
pub struct Compressible {
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
pub struct Compression(CompressionLayer<Compressible>);

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
    pub struct Claimed<D>(u64, PhantomData<fn() -> D>);

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
    pub struct Sized<S>(pub S);

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
        pub enum Emptied<B> {
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
    pub struct Bodiless<S>(pub S);

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
pub fn layers(config: &MiddlewareConfig) -> Result<Layers, String> {
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
    config::check_expose(&config.auth.expose)?;
    layers(config)?;
    Ok(())
}

/// What `switchyard check` points out in a valid configuration: settings
/// that weaken a default on purpose, so that the waiver is seen.
pub fn check_notes(config: &MiddlewareConfig) -> Vec<String> {
    let mut notes = Vec::new();
    if let Some(jwt) = &config.auth.jwt
        && (jwt.public_key_file.is_some() || jwt.jwks_file.is_some())
    {
        if jwt.any_issuer {
            notes.push(
                "auth.jwt.any_issuer = true: a token any issuer signed with these keys is accepted"
                    .to_owned(),
            );
        }
        if jwt.any_audience {
            notes.push(
                "auth.jwt.any_audience = true: a token minted for any service of the identity provider \
                 is accepted"
                    .to_owned(),
            );
        }
    }
    notes
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
            routes: None,
        };
        assert!(matches(None, Some(&shop), &sub));
        assert!(!matches(Some("/x"), None, &sub));
        assert!(matches(None, None, &sub));
    }

    #[test]
    fn route_templates_reach_prefixes() {
        assert!(reaches("/me", "/me"));
        assert!(reaches("/me/x", "/me"));
        assert!(!reaches("/mega", "/me"));
        assert!(reaches("/users/{name}", "/users/admin"));
        assert!(reaches("/files/{*rest}", "/files/private/x"));
        assert!(!reaches("/users", "/users/admin"));
        assert!(!reaches("/hello/{name}", "/me"));
        assert!(reaches("/anything", "/"));
    }

    #[test]
    fn a_prefix_covers_the_events_routed_under_it() {
        let mut paths: std::collections::HashMap<String, Vec<String>> = Default::default();
        for (path, name) in [
            ("/me", "demo.Me"),
            ("/api/me", "demo.Me"),
            ("/users/{name}", "demo.User"),
            ("/noop", "demo.Noop"),
        ] {
            paths.entry(name.to_owned()).or_default().push(path.to_owned());
        }
        let routes = EventPaths::new(paths, 1);
        let event = |e: &'static str| Scope {
            path: None,
            event: Some(e),
            subscription: false,
            routes: Some(&routes),
        };
        let http = |p: &'static str, e: &'static str| Scope {
            path: Some(p),
            event: Some(e),
            subscription: false,
            routes: Some(&routes),
        };
        let sub = |p: &'static str| Scope {
            path: None,
            event: Some(p),
            subscription: true,
            routes: Some(&routes),
        };
        assert!(prefix_covers("/me", &event("demo.Me")));
        assert!(!prefix_covers("/me", &event("demo.Noop")));
        // Without a path, a rule on one value of a parameter covers the event.
        assert!(prefix_covers("/users/admin", &event("demo.User")));
        // With one, the path decides...
        assert!(!prefix_covers("/users/admin", &http("/users/bob", "demo.User")));
        assert!(prefix_covers("/users/admin", &http("/users/admin", "demo.User")));
        // ...and another route of the same event wholly under the prefix.
        assert!(prefix_covers("/me", &http("/api/me", "demo.Me")));
        assert!(prefix_covers("/me", &sub("demo.*")));
        assert!(prefix_covers("/me", &sub("*")));
        assert!(!prefix_covers("/me", &sub("shop.*")));
        assert!(!prefix_covers("/me", &sub("demo.Noop")));
    }

    #[test]
    fn origins() {
        assert!(same_origin("http://a.example:8080", "a.example:8080", false));
        assert!(same_origin("https://A.example", "a.example:443", false));
        assert!(same_origin("http://127.0.0.1:80", "127.0.0.1", false));
        assert!(same_origin("http://[::1]:9", "[::1]:9", false));
        assert!(!same_origin("http://a.example", "a.example", true));
        assert!(!same_origin("https://evil.example", "a.example", false));
        assert!(!same_origin("http://a.example:8081", "a.example:8080", false));
        assert!(!same_origin("null", "a.example", false));
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
