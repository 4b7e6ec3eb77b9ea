//! The listener: where HTTP requests become events and responses become HTTP.
//!
//! A listener process accepts connections (HTTP/1.1 and h2 on one port, told
//! apart by the connection preface), matches each request against the route
//! table the managers declared, turns it into a request [`Envelope`] and sends
//! it to the broker over one of its pooled return pipes. The response comes
//! back on the same pipe, matched by correlation id, and is written out as
//! the manager produced it. The listener enforces the limits a client can
//! abuse (connections, idle and stalled connections, header size and read
//! time, body size and read time, bytes held for a client, request
//! deadline) and answers `/health` and `/ready` itself. Its built-in
//! middleware (authentication, CORS, rate limits, compression, security
//! headers) runs here too, with no hop. It owns no business logic and no
//! state that outlives a request.
//!
//! # Layout
//! Modules follow a request's path. Front ends are leaves over a shared
//! core: a leaf imports only the core, never another leaf, and the core
//! imports no leaf.
//!
//! This file is the crate's face: its modules and what other crates take
//! from them; nothing is defined here, and no module imports from it
//! (decision 0153).
//!
//! - `config`: [`Config`] and the checks a configuration passes, at start
//!   or on a reload; `error`: [`Error`], the crate's one error type.
//! - `server`: [`run`], the accept loop on every port, one task per
//!   connection, the configuration's generations and live reconfiguration
//!   ([`Update`]), and the graceful drain.
//! - `serve`: one connection's task, TCP or HTTP/3: its TLS handshake, the
//!   middleware's layers around each request, the response bytes it holds
//!   for its client, and its end when the listener drains.
//! - `conn`: admission (`max_connections`), the socket wrapper and body
//!   tracker that stamp progress, and the sweeper that closes idle and
//!   stalled connections.
//! - The built-in middleware is the crate `switchyard_middleware`: CORS,
//!   compression and request decoding around the whole service; rate
//!   limits, authentication and its rules per request; security headers;
//!   which names `[auth] expose` opens; the policy a long-lived session is
//!   held to, which reads the pool (`pipes`) through `SessionHost`, and
//!   the route table (`routes`) as `EventPaths`.
//! - [`tls`]: certificates from PEM files, ALPN, client certificates; the
//!   handshake runs in the connection's task.
//! - `quic`: HTTP/3's UDP endpoint (`[listener.http3]`): QUIC TLS and
//!   transport limits, retry tokens under a flood of Initials.
//! - `http3`: one QUIC connection's requests, fed to the same service as a
//!   TCP connection's; GOAWAY on drain. `incoming`: a request body from
//!   hyper or from an HTTP/3 stream, the one type past the accept.
//! - [`api`]: `switchyard-apidoc` (`apidoc/`), re-exported: `/openapi.json`
//!   and `/docs`, the API described from the event types the plugins
//!   declared (rendered once per generation; `reply::document` answers
//!   with it), and the `.proto` of the typed gRPC services (`api::proto`).
//! - `dispatch`: which front end serves a request (gRPC by content type,
//!   `/health`, `/ready`, WebSocket upgrades, else the route table), once
//!   the middleware has admitted it.
//! - Leaves:
//!   - `http`: a route whose body is taken whole → event → response.
//!   - `upload`: a route whose body is streamed into a pipe as it arrives.
//!   - `static_files`: `[[static]]` mounts, files served with no hop.
//!   - `ws`: WebSocket sessions (`/ws`, `/ws/echo`) by upgrade on the port.
//!   - `grpc`: `switchyard.v1.Events`, health and reflection, by content
//!     type (`application/grpc*`) on the same port; `grpc::typed`, the
//!     typed services made from the event schemas (`api::proto`).
//! - Core:
//!   - `exchange`: a request event out to the broker and its answer back;
//!     as HTTP (`exchange`) or as status and whole body (`call`, for
//!     WebSocket and gRPC); client notifications.
//!   - `reply`: response events made HTTP (whole, ranges, streamed), and
//!     the listener's own problem+json and JSON answers.
//!   - `negotiate`: errors as HTML pages for browsers, problem+json for
//!     the rest.
//!   - `conditional`: 304 and `If-Range` on a manager's answer.
//!   - `body`: response bodies (whole or read from a pipe), `Range` parsing.
//!   - `decoded`: request bodies decoded by `Content-Encoding`, bounded
//!     in expansion.
//!   - `state`: what every request shares; request bodies placed in shared
//!     memory.
//!   - `metrics`: request counters per route for the admin endpoint's
//!     `/metrics` (atomics found with the route, nothing per request).
//!   - `access`: the access log, written by a thread of its own.
//!   - `trace`: W3C `traceparent`, taken or made, carried in the
//!     envelope's typed context (decision 0146).
//!   - `pipes`: the pool of return pipes to the broker, the pending map and
//!     the sessions (WebSocket, gRPC streams) with their subscriptions.
//!   - `routes`: the route table, merged from the router's announcements.
//!   - `public`: which event types a client may name (public, exposed,
//!     declared under that name); the rest are refused as undeclared.
//!
//! [`Envelope`]: switchyard_proto::Envelope

#![forbid(unsafe_code)]

mod access;
/// The API description (`/openapi.json`, `/docs`, the typed services'
/// `.proto`): a crate of its own, off the data path (decision 0153).
pub use switchyard_apidoc as api;
mod body;
mod conditional;
mod config;
mod conn;
mod context;
mod decoded;
mod dispatch;
mod error;
mod exchange;
mod grpc;
mod http;
mod http3;
mod incoming;
mod jobs;
pub mod metrics;
mod negotiate;
mod pipes;
mod public;
pub mod quic;
mod reply;
mod routes;
mod serve;
mod server;
mod state;
mod static_files;
pub mod tls;
mod trace;
mod upload;
mod ws;

pub use access::{AccessLogConfig, AccessTarget};
pub use config::{Config, WsConfig};
pub use context::{ForwardedHeader, RequestIdConfig};
pub use error::Error;
pub use quic::{Http3Config, Retry};
pub use routes::percent_decode;
pub use server::{Update, run};
pub use static_files::StaticMount;
pub use switchyard_middleware::check as check_middleware;
pub use switchyard_middleware::check_notes as middleware_check_notes;
pub use switchyard_middleware::config::{
    ApiKey, ApiKeysConfig, AuthConfig, AuthRule, BasicConfig, BasicUser, CompressionConfig, CorsConfig,
    JwtConfig, MiddlewareConfig, RateKey, RateLimit, RateLimitConfig, Require, SecurityHeadersConfig,
    TokenSource, WsAuthConfig,
};
pub use switchyard_middleware::describe_rules;
pub use tls::TlsConfig;
pub use trace::TracingConfig;
