//! The front door: which front end serves a request. First the HTTP/1
//! framing and `Host` rules hyper leaves to us ([`framing_violation`]);
//! then gRPC by content type (or every request of the gRPC-only port); the
//! listener's own `/health` and `/ready`; WebSocket upgrades of `/ws` and
//! `/ws/echo`; else the route table, whose entry says whether the body is
//! taken whole or streamed. `HEAD` is served by a path's `GET` route
//! (headers, no body) and `OPTIONS` answers `Allow` where no route
//! declares them. Every request first gets its context (client address,
//! request id: `context`), and every answer its `x-request-id`. Each is
//! admitted by the middleware first (rate limits, authentication, rules),
//! except `/health`, `/ready` and gRPC health and reflection, which load
//! balancers and tools reach without credentials. A path under a
//! `[[static]]` mount is a file (`static_files`), never a route. Every
//! path is normalized once, before any of this looks at it
//! (`routes::normalize_path`), and a WebSocket upgrade from a foreign
//! browser origin is refused before its credential is looked at.

use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, Version, header};
use http_body_util::{Either, Full};

use std::time::Instant;

use crate::access;
use crate::body::Body;
use crate::conn::Conn;
use crate::context::Client;
use crate::decoded::RequestBody;
use crate::grpc::{self, Grpc};
use crate::metrics::{self, Fixed};
use crate::reply::{ManagerTime, Reply, error, json};
use crate::routes::Lookup;
use crate::state::State;
use crate::{upload, ws};
use switchyard_middleware::Scope;

/// Serves one request of connection `conn`; `grpc_only` when it came on
/// the gRPC-only port. Counts it (`metrics`), logs it (`access`) and
/// answers with its request id (and, with `[tracing] server_timing`, its
/// `traceparent` and `Server-Timing`).
pub(crate) async fn serve(
    state: &Arc<State>,
    grpc: &Grpc,
    grpc_only: bool,
    conn: &Arc<Conn>,
    peer: Option<std::net::SocketAddr>,
    mut req: Request<RequestBody>,
) -> Response<Either<Body, tonic::body::Body>> {
    let started = Instant::now();
    let _in_flight = metrics::InFlight::start();
    let config = &state.config;
    let client = Client::of(
        peer,
        req.headers(),
        &config.trusted_proxies,
        config.forwarded_header,
        &config.request_id,
        &config.tracing,
    );
    let context = client.context.clone();
    // Rate limits count the client behind a trusted proxy, not the proxy.
    let client_ip = client
        .ip
        .or(peer.map(|p| p.ip()))
        .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED.into());
    // What the access log needs of the request once it is answered.
    let logged = state
        .access
        .as_ref()
        .map(|_| (req.method().clone(), req.uri().clone(), client.ip));
    let mut stats = metrics::fixed(metrics::Fixed::Unmatched, req.method());
    req.extensions_mut().insert(client);
    // Shares the request's bytes; read only if the answer is an error.
    let accept = req.headers().get(header::ACCEPT).cloned();
    // Every line this request causes here names it: the formatter reads
    // the context while the request is polled, and formats it only into a
    // line that is written (decision 0161).
    let reply = switchyard_proto::log_context::in_request(&context, async {
        let reply = serve_request(state, grpc, grpc_only, conn, client_ip, req, &mut stats).await;
        tracing::debug!(status = reply.status().as_u16(), "answered");
        reply
    })
    .await;
    let mut reply = crate::negotiate::error_page(accept.as_ref().and_then(|v| v.to_str().ok()), reply).await;
    let elapsed = started.elapsed();
    let status = reply.status().as_u16();
    if config.metrics {
        stats.record(status, elapsed);
    }
    // Written from the context's bytes into the header value, the one
    // copy a header needs.
    if let Some(id) = &context.request_id
        && let Ok(value) =
            HeaderValue::from_bytes(id.write(&mut [0; switchyard_proto::context::MAX_REQUEST_ID]))
    {
        reply
            .headers_mut()
            .insert(config.request_id.header.clone(), value);
    }
    if config.tracing.server_timing
        && let Some(trace) = &context.trace
    {
        if let Ok(value) =
            HeaderValue::from_str(trace.write(&mut [0; switchyard_proto::TraceContext::TEXT_LEN]))
        {
            reply.headers_mut().insert("traceparent", value);
        }
        let timing = server_timing(elapsed, reply.extensions().get::<ManagerTime>().copied());
        if let Ok(value) = HeaderValue::from_str(&timing) {
            reply.headers_mut().append("server-timing", value);
        }
    }
    if let (Some(log), Some((method, uri, ip))) = (&state.access, logged) {
        let request_id = context.request_id.as_ref().map(ToString::to_string);
        let trace_id = context.trace.map(|t| t.trace_id().to_string());
        let bytes = match reply.body() {
            Either::Left(Either::Left(whole)) => http_body::Body::size_hint(whole).exact(),
            Either::Left(Either::Right(pipe)) => pipe.remaining,
            Either::Right(_) => None,
        };
        log.log(&access::Entry {
            client: ip.or(peer.map(|p| p.ip())),
            method: method.as_str(),
            path: uri.path(),
            status,
            bytes,
            duration: elapsed,
            request_id: request_id.as_deref(),
            trace_id: trace_id.as_deref(),
        });
    }
    reply
}

/// `Server-Timing` of a request that took `total`, of which the manager
/// spent `manager`: the rest is the hops (listener → broker → router →
/// manager and back) and the listener's own work.
fn server_timing(total: std::time::Duration, manager: Option<ManagerTime>) -> String {
    let ms = |us: u64| us as f64 / 1000.0;
    let total_us = u64::try_from(total.as_micros()).unwrap_or(u64::MAX);
    match manager {
        Some(ManagerTime(m)) => format!(
            "total;dur={:.3}, manager;dur={:.3}, hops;dur={:.3}",
            ms(total_us),
            ms(m),
            ms(total_us.saturating_sub(m))
        ),
        None => format!("total;dur={:.3}", ms(total_us)),
    }
}

async fn serve_request(
    state: &Arc<State>,
    grpc: &Grpc,
    grpc_only: bool,
    conn: &Arc<Conn>,
    client: IpAddr,
    mut req: Request<RequestBody>,
    stats: &mut &'static metrics::RouteStats,
) -> Response<Either<Body, tonic::body::Body>> {
    if let Some(violation) = framing_violation(&req) {
        let mut reply = error(StatusCode::BAD_REQUEST, violation);
        // Where this request ends is in doubt, so whatever follows it on
        // the connection is never read as a request.
        reply
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return reply.map(Either::Left);
    }
    if grpc_only || grpc::is_grpc(&req) {
        *stats = metrics::fixed(Fixed::Grpc, req.method());
        // A call's event type is in its message: the rules are applied
        // there (`grpc`); here, the credential and the rate limits.
        if !grpc::is_public(&req)
            && let Err(refusal) = admit(state, client, &mut req, None, Scope::default(), false).await
        {
            return refusal.grpc().into_http().map(Either::Right);
        }
        return grpc.serve(req).await.map(Either::Right);
    }
    // One path for every rule, route and static mount (decision 0104).
    match crate::routes::normalize_path(req.uri().path()) {
        Ok(None) => {}
        Ok(Some(normal)) => {
            let mut parts = req.uri().clone().into_parts();
            let target = match req.uri().query() {
                Some(q) => format!("{normal}?{q}"),
                None => normal,
            };
            match target.parse() {
                Ok(pq) => parts.path_and_query = Some(pq),
                Err(_) => return error(StatusCode::BAD_REQUEST, "malformed request path").map(Either::Left),
            }
            match http::Uri::from_parts(parts) {
                Ok(uri) => *req.uri_mut() = uri,
                Err(_) => return error(StatusCode::BAD_REQUEST, "malformed request path").map(Either::Left),
            }
        }
        Err(bad) => {
            let mut reply = error(StatusCode::BAD_REQUEST, bad.detail());
            state.policy().secure(reply.headers_mut());
            return reply.map(Either::Left);
        }
    }
    if let Some((mount, rest)) = crate::static_files::mount_for(&state.config.statics, req.uri().path()) {
        *stats = metrics::fixed(Fixed::Static, req.method());
        let rest = rest.to_owned();
        let path = req.uri().path().to_owned();
        let scope = Scope {
            path: Some(&path),
            ..Scope::default()
        };
        let mut reply = match admit(state, client, &mut req, None, scope, true).await {
            Ok(()) => crate::static_files::serve(mount, &rest, req.method(), req.headers()).await,
            Err(refusal) => state.policy().refuse(&refusal, error).map(Either::Left),
        };
        state.policy().secure(reply.headers_mut());
        return reply;
    }
    let mut reply = match req.uri().path() {
        "/health" => {
            *stats = metrics::fixed(Fixed::Health, req.method());
            crate::reply::only_get_and_head(req.method())
                .unwrap_or_else(|| json(StatusCode::OK, serde_json::json!({ "status": "alive" })))
        }
        "/ready" => {
            *stats = metrics::fixed(Fixed::Ready, req.method());
            crate::reply::only_get_and_head(req.method()).unwrap_or_else(|| ready(state))
        }
        path if state.config.api.serves(path) => {
            let label = if path == "/docs" {
                Fixed::Docs
            } else {
                Fixed::OpenApi
            };
            *stats = metrics::fixed(label, req.method());
            let path = path.to_owned();
            let scope = Scope {
                path: Some(&path),
                ..Scope::default()
            };
            match admit(state, client, &mut req, None, scope, true).await {
                Ok(()) => crate::reply::document(
                    req.method(),
                    state.config.api.document(&path, &state.config.middleware.auth),
                ),
                Err(refusal) => state.policy().refuse(&refusal, error),
            }
        }
        path @ ("/ws" | "/ws/echo") if ws::is_upgrade(&req) => {
            let echo = path == "/ws/echo";
            *stats = metrics::fixed(if echo { Fixed::WsEcho } else { Fixed::Ws }, req.method());
            let token = state.policy().ws_token(req.headers(), req.uri().query());
            let path = path.to_owned();
            let scope = Scope {
                path: Some(&path),
                ..Scope::default()
            };
            let tls = state.config.tls.is_some();
            let admitted = match state.policy().check_origin(&req, tls) {
                Ok(()) => admit(state, client, &mut req, token.as_deref(), scope, true).await,
                Err(refusal) => Err(refusal),
            };
            match admitted {
                Ok(()) => {
                    let credential = state.policy().credential(req.headers(), token, client, true);
                    ws::upgrade(state.clone(), conn, req, echo, credential)
                }
                Err(refusal) => state.policy().refuse(&refusal, error),
            }
        }
        _ => route(state, client, req, stats).await,
    };
    state.policy().secure(reply.headers_mut());
    reply.map(Either::Left)
}

/// Lets `req` through the middleware (its identity, if any, goes into its
/// extensions) or says why not. `token` is a bearer token found outside
/// the headers (a WebSocket upgrade's subprotocol or query).
async fn admit(
    state: &State,
    client: IpAddr,
    req: &mut Request<RequestBody>,
    token: Option<&str>,
    scope: Scope<'_>,
    rules: bool,
) -> Result<(), switchyard_middleware::Refusal> {
    let mw = state.policy();
    if !mw.admits() {
        return Ok(());
    }
    let ws_upgrade = token.is_some() || (scope.path.is_some() && ws::is_upgrade(req));
    let identity = if ws_upgrade && !mw.ws_header_tokens() {
        // `[auth.websocket] token_from` leaves the headers out: a
        // credential there is not looked at.
        let mut headers = req.headers().clone();
        headers.remove(http::header::AUTHORIZATION);
        mw.admit(&headers, token, client, &scope, rules).await?
    } else {
        mw.admit(req.headers(), token, client, &scope, rules).await?
    };
    if let Some(identity) = identity {
        // The identity contract: whatever comes next reads it from here.
        req.extensions_mut().insert(identity);
    }
    Ok(())
}

/// How an HTTP/1 request breaks the framing or `Host` rules of RFC 9112
/// that hyper does not enforce itself. hyper frames a body as chunked when
/// the last `Transfer-Encoding` value is `chunked`, whatever comes before it
/// or on other lines; a proxy in front may read the same bytes otherwise
/// (request smuggling), so only a single `Transfer-Encoding: chunked` is
/// accepted. An HTTP/1.1 request has exactly one `Host` (§3.2).
fn framing_violation<B>(req: &Request<B>) -> Option<&'static str> {
    if req.version() >= Version::HTTP_2 {
        return None;
    }
    let mut codings = req.headers().get_all(header::TRANSFER_ENCODING).iter();
    match (codings.next(), codings.next()) {
        (None, _) => {}
        (Some(one), None) if one.as_bytes().trim_ascii().eq_ignore_ascii_case(b"chunked") => {}
        (Some(_), None) => return Some("Transfer-Encoding must be exactly `chunked`"),
        (Some(_), Some(_)) => return Some("Transfer-Encoding must appear once"),
    }
    match req.headers().get_all(header::HOST).iter().count() {
        0 if req.version() == Version::HTTP_11 => Some("an HTTP/1.1 request needs a Host header"),
        0 | 1 => None,
        _ => Some("a request has one Host header"),
    }
}

fn ready(state: &State) -> Reply {
    let routes = state.pool.routes();
    let router = state.pool.router_up();
    let ready = state.pool.ready();
    let managers: Vec<_> = routes
        .table
        .managers
        .iter()
        .map(|m| serde_json::json!({ "name": m.name, "instances_up": m.instances_up }))
        .collect();
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut body = serde_json::json!({ "ready": ready, "router": router, "managers": managers });
    // Shown, not required: this group serves its own routes with the
    // cluster link down (docs/cluster.md#health).
    if let Some(link) = routes.table.cluster {
        body["cluster"] = serde_json::json!(link);
    }
    json(status, body)
}

async fn route(
    state: &State,
    client: IpAddr,
    mut req: Request<RequestBody>,
    stats: &mut &'static metrics::RouteStats,
) -> Reply {
    let routes = state.pool.routes();
    let method = req.method().clone();
    let mut lookup = routes.lookup(method.as_str(), req.uri().path());
    // HEAD is GET without the body, wherever no route declares HEAD.
    let head = method == Method::HEAD && matches!(lookup, Lookup::WrongMethod(_) | Lookup::NotFound);
    if head {
        lookup = routes.lookup(Method::GET.as_str(), req.uri().path());
    }
    if let Lookup::Found(m) = &lookup {
        // Refused by the middleware or not, it counts as this route's.
        *stats = m.stats;
    }
    // Admitted before a 404 or 405 too: a client probing paths counts
    // against its limits like any other.
    let event = match &lookup {
        Lookup::Found(m) => Some(m.entry.type_name.as_str()),
        _ => None,
    };
    // A clone of the parsed URI shares its bytes: no copy of the path.
    let uri = req.uri().clone();
    let scope = Scope {
        path: Some(uri.path()),
        event,
        subscription: false,
        routes: Some(routes.event_paths().as_ref()),
    };
    let admitted = admit(state, client, &mut req, None, scope, true).await;
    drop(routes);
    if let Err(refusal) = admitted {
        return state.policy().refuse(&refusal, error);
    }
    let matched = match lookup {
        Lookup::Found(m) => m,
        Lookup::WrongMethod(allowed) if method == Method::OPTIONS => {
            let mut reply = Response::new(Either::Left(Full::new(Bytes::new())));
            *reply.status_mut() = StatusCode::NO_CONTENT;
            insert_allow(&mut reply, allowed);
            return reply;
        }
        Lookup::WrongMethod(allowed) => {
            let mut reply = error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed for this path");
            insert_allow(&mut reply, allowed);
            return reply;
        }
        Lookup::NotFound => return error(StatusCode::NOT_FOUND, "no route matches this path"),
        Lookup::NulInParam(name) => {
            return error(
                StatusCode::BAD_REQUEST,
                &format!("path parameter `{name}` contains a NUL character (%00)"),
            );
        }
    };
    let reply = if matched.entry.route.stream_body {
        upload::upload(state, req, matched).await
    } else {
        crate::http::forward(state, req, matched).await
    };
    if head { without_body(reply) } else { reply }
}

/// `Allow` for a path whose routes take `allowed`: with `HEAD` where there
/// is `GET`, and `OPTIONS` always.
fn insert_allow(reply: &mut Reply, mut allowed: Vec<String>) {
    if allowed.iter().any(|m| m == "GET") && !allowed.iter().any(|m| m == "HEAD") {
        allowed.push("HEAD".to_owned());
    }
    if !allowed.iter().any(|m| m == "OPTIONS") {
        allowed.push("OPTIONS".to_owned());
    }
    allowed.sort();
    if let Ok(v) = HeaderValue::from_str(&allowed.join(", ")) {
        reply.headers_mut().insert(header::ALLOW, v);
    }
}

/// The answer to a `HEAD`: the `GET` answer's status and headers, its
/// length when known, no body (a streamed body's pipe is closed, which
/// stops its producer).
fn without_body(reply: Reply) -> Reply {
    let (mut parts, body) = reply.into_parts();
    let length = match &body {
        Either::Left(whole) => http_body::Body::size_hint(whole).exact(),
        Either::Right(pipe) => pipe.remaining,
    };
    if let Some(length) = length
        && !parts.headers.contains_key(header::CONTENT_LENGTH)
    {
        parts
            .headers
            .insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    }
    drop(body);
    Response::from_parts(parts, Either::Left(Full::new(Bytes::new())))
}

#[cfg(test)]
mod tests {
    use super::framing_violation;
    use http::{Request, Version};

    fn req(version: Version, headers: &[(&str, &str)]) -> Request<()> {
        let mut b = Request::post("/echo").version(version);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap()
    }

    #[test]
    fn framing_and_host_rules() {
        const HTTP_10: Version = Version::HTTP_10;
        const HTTP_11: Version = Version::HTTP_11;
        const HTTP_2: Version = Version::HTTP_2;
        let ok = |v, h: &[(&str, &str)]| assert_eq!(framing_violation(&req(v, h)), None, "{h:?}");
        let bad = |v, h: &[(&str, &str)]| assert!(framing_violation(&req(v, h)).is_some(), "{h:?}");
        ok(HTTP_11, &[("host", "a")]);
        ok(HTTP_11, &[("host", "a"), ("transfer-encoding", "chunked")]);
        ok(HTTP_11, &[("host", "a"), ("transfer-encoding", " Chunked ")]);
        ok(HTTP_10, &[]);
        ok(HTTP_2, &[]);
        bad(
            HTTP_11,
            &[("host", "a"), ("transfer-encoding", "identity, chunked")],
        );
        bad(
            HTTP_11,
            &[("host", "a"), ("transfer-encoding", "chunked, chunked")],
        );
        bad(
            HTTP_11,
            &[
                ("host", "a"),
                ("transfer-encoding", "identity"),
                ("transfer-encoding", "chunked"),
            ],
        );
        bad(HTTP_11, &[]);
        bad(HTTP_11, &[("host", "a"), ("host", "b")]);
        bad(HTTP_10, &[("host", "a"), ("host", "a")]);
    }
}
