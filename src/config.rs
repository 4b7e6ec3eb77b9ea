//! `switchyard.toml`: the group's static configuration.
//!
//! Every key has a default, so no file is needed (`switchyard up` serves the
//! demo). Unknown keys and bad values are errors naming the key, reported
//! before any process starts.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use switchyard_manager_host::{Library, LoadError};
pub(crate) use switchyard_worker::Kind as WorkerKind;

/// The whole group's configuration.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct Config {
    pub(crate) listener: ListenerConfig,
    pub(crate) group: GroupConfig,
    pub(crate) restart: RestartConfig,
    /// The managers to run; the demo's when absent.
    pub(crate) managers: Vec<ManagerConfig>,
    /// Where the built-in Store and Scheduler keep their database.
    pub(crate) data: DataConfig,
    /// Request ids: taken or made per request, in every log line and the reply.
    pub(crate) request_id: RequestIdConfig,
    // ---- The built-in middleware (docs/middleware.md), run by the
    // listener. `[auth]` defaults to nothing in a file, whatever the demo
    // group has: a file never inherits the demo's development key.
    /// `[auth]`: JWT, API keys, Basic, and the rules per route prefix or
    /// event type.
    #[serde(default)]
    pub(crate) auth: switchyard_listener::AuthConfig,
    /// `[cors]`: allowed origins, methods, headers, credentials, max-age.
    pub(crate) cors: switchyard_listener::CorsConfig,
    /// `[rate_limit]`: token buckets per address, API key or identity.
    pub(crate) rate_limit: switchyard_listener::RateLimitConfig,
    /// `[compression]`: responses by `Accept-Encoding`, request bodies by
    /// `Content-Encoding`.
    pub(crate) compression: switchyard_listener::CompressionConfig,
    /// `[security_headers]`: added to every HTTP response.
    pub(crate) security_headers: switchyard_listener::SecurityHeadersConfig,
    /// `[api]`: `/openapi.json` and `/docs` (docs/api.md).
    pub(crate) api: ApiSettings,
    /// What the plugins declared, gathered by the validation child when
    /// the configuration is loaded; never read from the file.
    #[serde(skip)]
    pub(crate) catalog: std::sync::Arc<switchyard_proto::api::Catalog>,
    /// `[cluster]`: other groups joined through NATS (docs/cluster.md);
    /// off unless `cluster.nats` names a server.
    pub(crate) cluster: switchyard_cluster::Config,
    // ---- Operations (docs/operations.md) ----
    /// `[admin]`: `/metrics` and the dashboard, off the public port.
    pub(crate) admin: AdminConfig,
    /// `[log]`: log format and the access log.
    pub(crate) log: LogConfig,
    /// `[tracing]`: W3C trace context and `Server-Timing`.
    pub(crate) tracing: TracingSettings,
    /// `[metrics]`: the listener's request counters.
    pub(crate) metrics: MetricsConfig,
    // ---- The web side (docs/web.md). A file never inherits the demo's
    // static mount.
    /// `[[static]]`: URL prefix → directory, served by the listener.
    #[serde(default, rename = "static")]
    pub(crate) statics: Vec<StaticConfig>,
    /// `[web]`: the group's template directory and development mode.
    pub(crate) web: WebConfig,
}

/// `[metrics]` (docs/operations.md#metrics).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct MetricsConfig {
    /// Count HTTP requests by route, method and status, with their
    /// latency, in every listener process (a few atomic additions per
    /// request) for `/metrics` and the dashboard. Default true; false
    /// leaves those series out (the process gauges stay).
    pub(crate) enabled: bool,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig { enabled: true }
    }
}

/// `[admin]` (docs/operations.md#the-admin-endpoint).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct AdminConfig {
    /// Address of the admin endpoint (`/metrics`, the dashboard at `/`),
    /// served by the supervisor; port 0 picks a free one, printed at start
    /// (`admin on http://ADDR`). Default: none (no admin endpoint). It has
    /// no authentication: bind it to loopback or a private network.
    /// `switchyard up --admin-bind ADDR` overrides it.
    pub(crate) bind: Option<std::net::SocketAddr>,
    /// Host names the endpoint answers to besides IP literals and
    /// `localhost` (a scraper reaching it as `metrics.internal:9100`). Any
    /// other `Host` is refused (403), so a web page cannot read it through
    /// DNS rebinding (a name of the attacker's that resolves to 127.0.0.1).
    pub(crate) hosts: Vec<String>,
}

/// `[log]` (docs/operations.md#logs).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct LogConfig {
    /// `text` (default): lines prefixed with the process; `json`: every
    /// line of every process (and the access log) a JSON object. Read at
    /// start: a reload does not change it.
    pub(crate) format: LogFormat,
    /// The access log, one line per HTTP request: `off` (default),
    /// `stdout` (the group's merged output) or a file path, relative to
    /// the configuration file (appended to; reopened on reload).
    pub(crate) access: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: LogFormat::Text,
            access: "off".to_owned(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum LogFormat {
    Text,
    Json,
}

impl LogConfig {
    pub(crate) fn to_listener(&self) -> switchyard_listener::AccessLogConfig {
        let target = match self.access.as_str() {
            "off" => switchyard_listener::AccessTarget::Off,
            "stdout" => switchyard_listener::AccessTarget::Stdout,
            path => switchyard_listener::AccessTarget::File(path.into()),
        };
        switchyard_listener::AccessLogConfig {
            target,
            json: self.format == LogFormat::Json,
        }
    }
}

/// `[tracing]` (docs/operations.md#tracing).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct TracingSettings {
    /// Take each request's W3C `traceparent` (or make one) and carry it
    /// through every hop into the log lines it causes. Default true.
    pub(crate) enabled: bool,
    /// Answer with `Server-Timing` (total, manager, hops, in ms) and the
    /// request's `traceparent`. Default false: it tells clients how long
    /// the inside took.
    pub(crate) server_timing: bool,
}

impl Default for TracingSettings {
    fn default() -> Self {
        TracingSettings {
            enabled: true,
            server_timing: false,
        }
    }
}

impl TracingSettings {
    pub(crate) fn to_listener(&self) -> switchyard_listener::TracingConfig {
        switchyard_listener::TracingConfig {
            enabled: self.enabled,
            server_timing: self.server_timing,
        }
    }
}

// ---- The web side (docs/web.md) ----

/// One `[[static]]` mount.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StaticConfig {
    /// The URL prefix, starting and ending with `/` (`/static/`).
    pub(crate) prefix: String,
    /// The directory served (relative: to the configuration file).
    pub(crate) dir: PathBuf,
    /// The file answered for a directory, e.g. `index.html`; default none
    /// (a directory is 404: no listings).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) index: Option<String>,
    /// `Cache-Control` of every answer. Default `no-cache` (caches keep
    /// the file but revalidate it, a 304 when unchanged); `""` sends none.
    #[serde(default = "no_cache")]
    pub(crate) cache_control: String,
    /// Whether `NAME.br` / `NAME.gz` beside a file is sent to clients
    /// that accept that coding. Default true.
    #[serde(default = "yes")]
    pub(crate) precompressed: bool,
}

fn no_cache() -> String {
    "no-cache".to_owned()
}

fn yes() -> bool {
    true
}

impl StaticConfig {
    fn to_listener(&self) -> switchyard_listener::StaticMount {
        switchyard_listener::StaticMount {
            prefix: self.prefix.clone(),
            dir: self.dir.clone(),
            index: self.index.clone(),
            cache_control: (!self.cache_control.is_empty()).then(|| self.cache_control.clone()),
            precompressed: self.precompressed,
        }
    }
}

/// `[web]`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct WebConfig {
    /// The group's template directory, for managers without their own
    /// `managers[].templates` (relative: to the configuration file).
    /// Default none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) templates: Option<PathBuf>,
    /// Development mode: templates are read again on every render, so
    /// an edit shows on the next request. Default false (read once).
    pub(crate) development: bool,
}

impl Config {
    /// The listener's `[[static]]` mounts.
    pub(crate) fn static_mounts(&self) -> Vec<switchyard_listener::StaticMount> {
        self.statics.iter().map(StaticConfig::to_listener).collect()
    }

    /// The template directory of manager `m`: its own, else the group's.
    pub(crate) fn templates_of<'a>(&'a self, m: &'a ManagerConfig) -> Option<&'a Path> {
        m.templates.as_deref().or(self.web.templates.as_deref())
    }

    fn validate_web(&self, problems: &mut Vec<String>) {
        for (i, mount) in self.statics.iter().enumerate() {
            if let Err(problem) = mount.to_listener().check(&format!("static[{i}]")) {
                problems.push(problem);
            }
        }
        if let Some(dir) = &self.web.templates
            && !dir.is_dir()
        {
            problems.push(format!("web.templates: `{}` is not a directory", dir.display()));
        }
        for (i, m) in self.managers.iter().enumerate() {
            if let Some(dir) = &m.templates
                && !dir.is_dir()
            {
                problems.push(format!(
                    "managers[{i}].templates: `{}` is not a directory",
                    dir.display()
                ));
            }
        }
    }
}

// ---- end of the web side ----

/// `[request_id]` (docs/http.md#request-ids).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RequestIdConfig {
    /// Whether every request gets an id, carried through every hop into
    /// the log lines it causes and answered in `header`. Default true.
    pub(crate) enabled: bool,
    /// The header the id is read from and answered in. Default
    /// `x-request-id`.
    pub(crate) header: String,
    /// Whether a client's own id (1 to 128 visible ASCII characters) is
    /// kept; otherwise (or when it is not acceptable) a new one is made.
    /// Default true.
    pub(crate) accept_incoming: bool,
}

impl Default for RequestIdConfig {
    fn default() -> Self {
        RequestIdConfig {
            enabled: true,
            header: "x-request-id".to_owned(),
            accept_incoming: true,
        }
    }
}

impl RequestIdConfig {
    pub(crate) fn to_listener(&self) -> switchyard_listener::RequestIdConfig {
        let default = switchyard_listener::RequestIdConfig::default();
        switchyard_listener::RequestIdConfig {
            enabled: self.enabled,
            // Checked by `Config::validate`.
            header: http::HeaderName::from_bytes(self.header.to_ascii_lowercase().as_bytes())
                .unwrap_or(default.header),
            accept_incoming: self.accept_incoming,
        }
    }
}

// ---- The built-in middleware ----

/// The demo group's JWT secret, for `GET /me` and `switchyard token`.
/// DEVELOPMENT ONLY: it is public (it is in this source), so a token it
/// signs proves nothing. A configuration file never inherits it.
pub(crate) const DEMO_JWT_SECRET: &str = "switchyard-demo-development-key-do-not-use-in-production";

/// The demo group's `[auth]`: bearer tokens signed with
/// [`DEMO_JWT_SECRET`], required on `/me`.
fn demo_auth() -> switchyard_listener::AuthConfig {
    switchyard_listener::AuthConfig {
        jwt: Some(switchyard_listener::JwtConfig {
            algorithms: vec!["HS256".to_owned()],
            secret: Some(DEMO_JWT_SECRET.to_owned()),
            ..Default::default()
        }),
        rules: vec![switchyard_listener::AuthRule {
            prefix: Some("/me".to_owned()),
            ..Default::default()
        }],
        ..Default::default()
    }
}

impl Config {
    /// The listener's middleware settings.
    pub(crate) fn middleware(&self) -> switchyard_listener::MiddlewareConfig {
        switchyard_listener::MiddlewareConfig {
            auth: self.auth.clone(),
            cors: self.cors.clone(),
            rate_limit: self.rate_limit.clone(),
            compression: self.compression.clone(),
            security_headers: self.security_headers.clone(),
        }
    }

    /// Key files named relative to the configuration file, made relative
    /// to `base` (its directory).
    fn resolve_middleware_paths(&mut self, base: &Path) {
        if let Some(jwt) = &mut self.auth.jwt {
            for path in [&mut jwt.secret_file, &mut jwt.public_key_file, &mut jwt.jwks_file]
                .into_iter()
                .flatten()
            {
                if path.is_relative() {
                    *path = base.join(&*path);
                }
            }
        }
    }
}

// ---- end of the built-in middleware ----

/// The HTTP front end.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct ListenerConfig {
    /// Address to listen on: an IP address or a host name, and a port.
    /// Port 0 picks a free port (printed at start).
    #[serde(deserialize_with = "bind_address")]
    pub(crate) bind: SocketAddr,
    /// A second address serving gRPC alone (it is also served on `bind`,
    /// by content type). Port 0 picks a free port (printed at start).
    pub(crate) grpc_bind: Option<SocketAddr>,
    /// Listener processes sharing the port (each with its own return pipes).
    pub(crate) workers: u32,
    /// Runtime threads of each listener process (0: one, which owns its
    /// accept, connections and return rings; scale out with `workers`,
    /// decision 0158).
    pub(crate) threads: usize,
    /// Return pipes to the broker (0: one per thread).
    pub(crate) pipes: usize,
    /// Microseconds a listener process of one thread that awaits answers
    /// and has nothing else to run keeps its CPU (yielding it to any
    /// process that wants it) before it sleeps; 0: sleep at once
    /// (decision 0162).
    pub(crate) park_spin_us: u64,
    /// Largest request head in bytes (at least 8192); larger gets 431/400.
    pub(crate) max_header_bytes: usize,
    /// Largest request body in bytes; larger gets 413.
    pub(crate) max_body_bytes: usize,
    /// Largest body of an upload route (streamed, never buffered whole);
    /// larger gets 413.
    pub(crate) max_upload_bytes: u64,
    /// Milliseconds a client has to send its request head.
    pub(crate) header_read_timeout_ms: u64,
    /// Milliseconds from request to response before 504.
    pub(crate) request_timeout_ms: u64,
    /// Connections one listener process keeps open at once; more are
    /// answered 503 and closed. Lowered at start (with a warning) to what
    /// the descriptor limit allows.
    pub(crate) max_connections: usize,
    /// Milliseconds a connection with no request in progress may stay
    /// silent (from accept to its first byte, and between requests)
    /// before it is closed.
    pub(crate) idle_timeout_ms: u64,
    /// Milliseconds a request body may pause between two pieces before the
    /// request gets 408 and the connection is closed (every route).
    pub(crate) body_read_timeout_ms: u64,
    /// Milliseconds a connection with something to send may make no
    /// progress (its client reads nothing, or its h2 window stays shut)
    /// before it is closed and what it held is released.
    pub(crate) write_stall_timeout_ms: u64,
    /// Bytes of responses one connection may hold that its client has not
    /// taken (h2: across its streams); a response that would pass it while
    /// others wait gets 503 with Retry-After.
    pub(crate) max_connection_bytes: u64,
    /// WebSocket limits (`/ws`, `/ws/echo`).
    pub(crate) ws: WsLimits,
    /// Addresses or CIDR ranges of the proxies in front of the listener
    /// (`["10.0.0.0/8", "127.0.0.1"]`): only from those peers do
    /// `Forwarded` and `X-Forwarded-For` name the client. Default: none.
    #[serde(deserialize_with = "proxy_ranges")]
    pub(crate) trusted_proxies: Vec<ipnet::IpNet>,
    /// The header those proxies name the client in: `x-forwarded-for`
    /// (default; nginx, HAProxy) or `forwarded` (RFC 7239). Only that one
    /// is read.
    pub(crate) forwarded_header: switchyard_listener::ForwardedHeader,
    /// TLS on every port of the listener (`[listener.tls]`); absent:
    /// plaintext.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tls: Option<TlsSettings>,
    /// HTTP/3 (QUIC) on a UDP port beside the TCP one
    /// (`[listener.http3]`, docs/http3.md). Default: off.
    pub(crate) http3: Http3Settings,
}

/// `[listener.http3]`: HTTP/3 over QUIC, on the certificates of
/// `[listener.tls]` (which it needs), advertised with `Alt-Svc` on every
/// TCP reply. Every key but `enabled` and `bind` applies on reload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct Http3Settings {
    /// Serve HTTP/3. Default: false.
    pub(crate) enabled: bool,
    /// UDP address to serve it on. Default: the TCP address as bound (same
    /// IP, same port number), which is what `Alt-Svc` then names.
    #[serde(
        deserialize_with = "optional_bind_address",
        skip_serializing_if = "Option::is_none"
    )]
    pub(crate) bind: Option<SocketAddr>,
    /// Seconds a client may remember the `Alt-Svc` advertisement
    /// (`ma=`). Default: 86400 (a day).
    pub(crate) alt_svc_max_age_s: u64,
    /// Request streams one connection may have open at once; a client
    /// waits for credit before opening more. Default: 100.
    pub(crate) max_concurrent_streams: u32,
    /// Bytes a client may send on one request stream ahead of the
    /// listener reading them (QUIC stream flow-control window). Default:
    /// 1048576 (1 MiB).
    pub(crate) stream_window: u32,
    /// Bytes a client may send on all streams of a connection ahead of the
    /// listener reading them (connection flow-control window). Default:
    /// 4194304 (4 MiB).
    pub(crate) connection_window: u32,
    /// Response bytes buffered per connection for a client that has not
    /// acknowledged them. Default: 4194304 (4 MiB).
    pub(crate) send_window: u32,
    /// Milliseconds a QUIC connection may exchange no packet before it is
    /// closed (the transport's idle timeout; `listener.idle_timeout_ms`
    /// also closes one with no request in progress). Default: 30000.
    pub(crate) idle_timeout_ms: u64,
    /// When a new connection must first prove its address with a retry
    /// token: `"auto"` (once `retry_threshold` handshakes are in
    /// progress: a flood of Initials), `"always"`, or `"never"`.
    /// Default: "auto".
    pub(crate) retry: RetryMode,
    /// With `retry = "auto"`: handshakes in progress in one listener
    /// process from which on new ones get a Retry. Default: 64.
    pub(crate) retry_threshold: usize,
    /// Serve requests sent in 0-RTT early data: GET, HEAD and OPTIONS
    /// only; other methods in early data get 425 Too Early. Early data can
    /// be replayed by an attacker. Cannot be combined with
    /// `listener.tls.client_ca`. Default: false.
    pub(crate) zero_rtt: bool,
}

/// `listener.http3.retry`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RetryMode {
    Auto,
    Always,
    Never,
}

impl Default for Http3Settings {
    fn default() -> Self {
        let d = switchyard_listener::Http3Config::default();
        Http3Settings {
            enabled: false,
            bind: None,
            alt_svc_max_age_s: d.alt_svc_max_age.as_secs(),
            max_concurrent_streams: d.max_concurrent_streams,
            stream_window: d.stream_window,
            connection_window: d.connection_window,
            send_window: d.send_window,
            idle_timeout_ms: d.idle_timeout.as_millis() as u64,
            retry: RetryMode::Auto,
            retry_threshold: 64,
            zero_rtt: d.zero_rtt,
        }
    }
}

impl Http3Settings {
    /// The listener's settings, when HTTP/3 is on. Without `bind` the port
    /// is 0: the listener advertises its TCP port's number, where the
    /// supervisor bound the UDP socket.
    pub(crate) fn to_listener(&self) -> Option<switchyard_listener::Http3Config> {
        if !self.enabled {
            return None;
        }
        Some(switchyard_listener::Http3Config {
            port: self.bind.map_or(0, |b| b.port()),
            alt_svc_max_age: Duration::from_secs(self.alt_svc_max_age_s),
            max_concurrent_streams: self.max_concurrent_streams,
            stream_window: self.stream_window,
            connection_window: self.connection_window,
            send_window: self.send_window,
            idle_timeout: Duration::from_millis(self.idle_timeout_ms),
            retry: match self.retry {
                RetryMode::Auto => switchyard_listener::Retry::Above(self.retry_threshold),
                RetryMode::Always => switchyard_listener::Retry::Always,
                RetryMode::Never => switchyard_listener::Retry::Never,
            },
            zero_rtt: self.zero_rtt,
            steering: None,
        })
    }
}

/// `"10.0.0.0/8"` or a bare address (`"127.0.0.1"`, `"::1"`: one host).
fn proxy_ranges<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<ipnet::IpNet>, D::Error> {
    let texts = Vec::<String>::deserialize(d)?;
    texts
        .iter()
        .map(|text| {
            text.parse::<ipnet::IpNet>()
                .or_else(|_| text.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                .map_err(|_| {
                    serde::de::Error::custom(format!(
                        "`{text}` is neither an IP address nor a CIDR range (10.0.0.0/8, fd00::/8)"
                    ))
                })
        })
        .collect()
}

/// `[listener.tls]`: HTTPS, gRPC over TLS and `wss://` on the listener's
/// ports (docs/tls.md). The files are read at start and again on every
/// reload; relative paths are relative to the configuration file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TlsSettings {
    /// PEM certificate chain: the server's certificate first, then its
    /// intermediates. Required.
    pub(crate) cert: PathBuf,
    /// PEM private key of that certificate (PKCS#8, PKCS#1 or SEC1).
    /// Required.
    pub(crate) key: PathBuf,
    /// PEM bundle of the CAs whose client certificates are accepted
    /// (mTLS). Default: none, no client certificate is asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) client_ca: Option<PathBuf>,
    /// With `client_ca`: `"required"` (default; a client without a valid
    /// certificate fails the handshake) or `"optional"` (a certificate is
    /// asked for and verified if given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) client_auth: Option<ClientAuth>,
}

/// `listener.tls.client_auth`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ClientAuth {
    Required,
    Optional,
}

impl TlsSettings {
    pub(crate) fn to_listener(&self) -> switchyard_listener::TlsConfig {
        switchyard_listener::TlsConfig {
            cert: self.cert.clone(),
            key: self.key.clone(),
            client_ca: self.client_ca.clone(),
            client_cert_required: self.client_auth != Some(ClientAuth::Optional),
        }
    }
}

/// `HOST:PORT` → the first address it resolves to (`localhost:0` works as
/// well as `127.0.0.1:0`).
pub(crate) fn resolve_bind(text: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(addr) = text.parse() {
        return Ok(addr);
    }
    let mut addrs = text
        .to_socket_addrs()
        .map_err(|e| format!("`{text}` is not HOST:PORT with a host that resolves ({e})"))?;
    // IPv4 first: `localhost` should mean 127.0.0.1 where both exist.
    let all: Vec<SocketAddr> = addrs.by_ref().collect();
    all.iter()
        .find(|a| a.is_ipv4())
        .or(all.first())
        .copied()
        .ok_or_else(|| format!("`{text}` resolves to no address"))
}

fn bind_address<'de, D: serde::Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    let text = String::deserialize(d)?;
    resolve_bind(&text).map_err(serde::de::Error::custom)
}

fn optional_bind_address<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
    bind_address(d).map(Some)
}

/// `[listener.ws]`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct WsLimits {
    /// Largest message a client may send, in bytes; more closes with 1009.
    pub(crate) max_message_bytes: usize,
    /// Subscriptions one connection may hold; more are refused.
    pub(crate) max_subscriptions: usize,
    /// Messages queued towards one client; a client that lets it fill is
    /// dropped (close 1008 "too slow") so it delays nobody else.
    pub(crate) queue: usize,
    /// Milliseconds between server pings; a client that misses one is closed.
    pub(crate) ping_ms: u64,
    /// Requests of one connection in flight at once.
    pub(crate) max_in_flight: usize,
    /// Whether clients may emit notifications into the group (off: any
    /// client could otherwise reach every subscribed manager).
    pub(crate) notify: bool,
    /// Subprotocols the server answers to; none in common with the
    /// client's offer: no subprotocol in the answer.
    pub(crate) subprotocols: Vec<String>,
    /// Whether permessage-deflate is offered.
    pub(crate) deflate: bool,
    /// Milliseconds a message has to arrive whole; past it, close 1008.
    pub(crate) message_timeout_ms: u64,
}

impl Default for WsLimits {
    fn default() -> Self {
        let d = switchyard_listener::WsConfig::default();
        WsLimits {
            max_message_bytes: d.max_message_bytes,
            max_subscriptions: d.max_subscriptions,
            queue: d.queue,
            ping_ms: d.ping_interval.as_millis() as u64,
            max_in_flight: d.max_in_flight,
            notify: d.notify,
            subprotocols: d.subprotocols,
            deflate: d.deflate,
            message_timeout_ms: d.message_timeout.as_millis() as u64,
        }
    }
}

impl WsLimits {
    pub(crate) fn to_listener(&self) -> switchyard_listener::WsConfig {
        switchyard_listener::WsConfig {
            max_message_bytes: self.max_message_bytes,
            max_subscriptions: self.max_subscriptions,
            queue: self.queue,
            ping_interval: Duration::from_millis(self.ping_ms),
            max_in_flight: self.max_in_flight,
            notify: self.notify,
            subprotocols: self.subprotocols.clone(),
            deflate: self.deflate,
            message_timeout: Duration::from_millis(self.message_timeout_ms),
        }
    }
}

impl Default for ListenerConfig {
    fn default() -> Self {
        ListenerConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], 8080)),
            grpc_bind: None,
            workers: 1,
            threads: 0,
            pipes: 0,
            park_spin_us: 150,
            max_header_bytes: 16 * 1024,
            max_body_bytes: 1024 * 1024,
            max_upload_bytes: 4 << 30,
            header_read_timeout_ms: 10_000,
            request_timeout_ms: 30_000,
            max_connections: 10_000,
            idle_timeout_ms: 30_000,
            body_read_timeout_ms: 10_000,
            write_stall_timeout_ms: 30_000,
            max_connection_bytes: 64 << 20,
            ws: WsLimits::default(),
            trusted_proxies: Vec::new(),
            forwarded_header: switchyard_listener::ForwardedHeader::default(),
            tls: None,
            http3: Http3Settings::default(),
        }
    }
}

/// Settings shared by every process of the group.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct GroupConfig {
    /// Largest frame between processes, in bytes. Bodies up to this size
    /// travel inline (see docs/decisions/0002-frame-limit.md).
    pub(crate) max_frame_bytes: usize,
    /// Frames queued per connection before new requests get 503.
    pub(crate) queue_capacity: usize,
    /// Requests in flight per manager instance before new ones get 503.
    pub(crate) max_outstanding_per_instance: u32,
    /// Milliseconds in-flight requests get to finish on SIGTERM.
    pub(crate) shutdown_grace_ms: u64,
    /// Milliseconds a child gets to report ready before start-up fails.
    pub(crate) start_timeout_ms: u64,
    /// Whether 5xx error messages from handlers reach clients (off by
    /// default: they may carry internals).
    pub(crate) expose_errors: bool,
    /// Bodies of at least this many bytes cross between processes in shared
    /// memory instead of inside frames.
    pub(crate) shm_threshold_bytes: usize,
    /// Shared memory one process may hold (created or mapped) at once, in
    /// bytes; past it, requests get 503.
    pub(crate) shm_budget_bytes: u64,
    /// Milliseconds a manager may spend in one call into its plugin (a
    /// synchronous handler, or a batch of them, that has not returned)
    /// before its watchdog kills the process and the supervisor restarts
    /// it; its requests in flight get 503. Default 30 000; at least 100.
    pub(crate) handler_timeout_ms: u64,
    /// How frames travel between the group's processes: `ring` (a
    /// shared-memory ring per direction of each connection, the socket for
    /// descriptors only; decision 0040) or `socket` (batched writes on the
    /// Unix socket). Default `ring`.
    pub(crate) transport: switchyard_proto::link::Transport,
    /// With the ring transport: how many times a process that found its
    /// incoming ring empty gives up the CPU (re-checking in between) before
    /// it sleeps and must be woken. 0: sleep at once. Default 3.
    pub(crate) ring_yields: usize,
    /// How answers to listeners' requests travel back: `direct` (the
    /// manager instance writes them into the listener pipe's return link
    /// and tells the router in batches; decision 0143) or `router` (back
    /// through router and broker, the way the request came).
    pub(crate) return_path: switchyard_proto::returns::ReturnPath,
    /// Environment variables the group's processes get from the
    /// supervisor's environment besides the fixed list (`PATH`, `HOME`,
    /// `LANG`, `LC_*`, `TZ`, `RUST_LOG`, `RUST_BACKTRACE`, ...): what the
    /// plugins need, such as `DATABASE_URL`. A name ending in `*` passes
    /// every variable it begins. Default empty: no other variable, so no
    /// secret of the supervisor's environment reaches a plugin
    /// (docs/decisions/0101-child-environment-and-secrets.md).
    pub(crate) pass_env: Vec<String>,
}

impl Default for GroupConfig {
    fn default() -> Self {
        GroupConfig {
            max_frame_bytes: 1024 * 1024,
            queue_capacity: 16 * 1024,
            max_outstanding_per_instance: 4096,
            shutdown_grace_ms: 10_000,
            start_timeout_ms: 10_000,
            expose_errors: false,
            shm_threshold_bytes: switchyard_proto::shm::DEFAULT_THRESHOLD,
            shm_budget_bytes: 1 << 30,
            handler_timeout_ms: 30_000,
            transport: switchyard_proto::link::Transport::default(),
            ring_yields: switchyard_proto::link::DEFAULT_YIELDS,
            return_path: switchyard_proto::returns::ReturnPath::default(),
            pass_env: Vec::new(),
        }
    }
}

/// One-for-one restart policy, with a restart intensity per child
/// (docs/operations.md, decision 0025).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RestartConfig {
    /// First restart delay in milliseconds; doubles per quick failure.
    /// Default 10.
    pub(crate) initial_backoff_ms: u64,
    /// Largest restart delay in milliseconds (below the intensity).
    /// Default 5 000.
    pub(crate) max_backoff_ms: u64,
    /// The restart intensity: at most this many restarts of one child
    /// within `window_s` ... Default 10.
    pub(crate) max_restarts: u32,
    /// ... seconds. Past the intensity, a broker, router or listener stops
    /// the group (exit 1); a manager or worker is crash-looping. A child
    /// that stays up this long starts afresh. Default 30.
    pub(crate) window_s: u64,
    /// Milliseconds between restarts of a crash-looping manager or worker;
    /// its routes answer 503 with `Retry-After` meanwhile. Default 30 000.
    pub(crate) crash_loop_backoff_ms: u64,
}

impl Default for RestartConfig {
    fn default() -> Self {
        RestartConfig {
            initial_backoff_ms: 10,
            max_backoff_ms: 5_000,
            max_restarts: 10,
            window_s: 30,
            crash_loop_backoff_ms: 30_000,
        }
    }
}

/// A manager to run.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ManagerConfig {
    /// The manager's name in this group (routing, logs, status).
    pub(crate) name: String,
    /// The plugin library (`.so`); relative paths are relative to the
    /// configuration file. Absent: the built-in demo plugin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) plugin: Option<PathBuf>,
    /// Which manager type of the plugin to run (default: `name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) manager: Option<String>,
    /// A manager shipped with the binary instead of a plugin: `"store"` or
    /// `"scheduler"` (docs/store.md, docs/scheduler.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) builtin: Option<String>,
    /// How many processes of this manager to run.
    #[serde(default = "one")]
    pub(crate) instances: u32,
    /// Handed to the manager's `create` as its config.
    #[serde(default)]
    pub(crate) config: toml::Table,
    /// The manager's worker pool, for `cx.spawn_job`.
    #[serde(default)]
    pub(crate) workers: WorkersConfig,
    /// The manager's template directory (docs/web.md); relative paths are
    /// relative to the configuration file. Default: `web.templates`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) templates: Option<PathBuf>,
}

fn one() -> u32 {
    1
}

/// A manager's worker pool (`[managers.workers]`, see docs/workers.md).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct WorkersConfig {
    /// `thread`: OS threads in the manager process; `process`: worker
    /// processes, supervised like the other children.
    pub(crate) kind: WorkerKind,
    /// Threads or processes per manager instance (default: 4 threads, or
    /// one process per core).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) size: Option<usize>,
    /// Jobs that may wait for a worker; more get 503 with Retry-After.
    pub(crate) queue: usize,
    /// Milliseconds a job may take (waiting included) before its caller
    /// gets 504; a process worker still running it is killed and replaced.
    pub(crate) job_timeout_ms: u64,
}

impl Default for WorkersConfig {
    fn default() -> Self {
        WorkersConfig {
            kind: WorkerKind::Thread,
            size: None,
            queue: 256,
            job_timeout_ms: 30_000,
        }
    }
}

impl WorkersConfig {
    /// Threads, or worker processes per manager instance.
    pub(crate) fn size(&self) -> usize {
        self.size.unwrap_or(match self.kind {
            WorkerKind::Thread => 4,
            WorkerKind::Process => std::thread::available_parallelism().map_or(1, |n| n.get()),
        })
    }

    /// Worker processes the supervisor runs per manager instance.
    pub(crate) fn processes(&self) -> usize {
        match self.kind {
            WorkerKind::Thread => 0,
            WorkerKind::Process => self.size(),
        }
    }
}

impl ManagerConfig {
    /// The manager type to instantiate.
    pub(crate) fn kind(&self) -> &str {
        self.builtin
            .as_deref()
            .or(self.manager.as_deref())
            .unwrap_or(&self.name)
    }

    /// The socket where worker processes of `instance` connect. `epoch`
    /// counts the reloads that replaced the manager: the instances that
    /// replace it listen apart from the ones still draining.
    pub(crate) fn workers_socket(&self, runtime_dir: &Path, instance: u32, epoch: u64) -> PathBuf {
        match epoch {
            0 => runtime_dir.join(format!("workers-{}-{instance}.sock", self.name)),
            _ => runtime_dir.join(format!("workers-{}-{instance}.{epoch}.sock", self.name)),
        }
    }

    /// Opens the plugin library (or the built-in one). Runs the plugin's
    /// code: only in the processes that serve it and in the validation
    /// child (`validate.rs`), never in the supervisor.
    pub(crate) fn library(&self) -> Result<Library, LoadError> {
        open_manager_library(self.plugin.as_deref(), self.builtin.is_some())
    }
}

/// Opens the plugin at `path`, or the built-in demo plugin.
pub(crate) fn open_library(path: Option<&Path>) -> Result<Library, LoadError> {
    match path {
        Some(path) => Library::open(path),
        None => Ok(Library::linked(switchyard_demo::switchyard_plugin_vtable, "demo")),
    }
}

// ---- Data directory and built-in managers (the Store and the Scheduler) ----

/// Opens the library of a manager: the built-ins' table, or as
/// [`open_library`].
pub(crate) fn open_manager_library(path: Option<&Path>, builtin: bool) -> Result<Library, LoadError> {
    if builtin {
        return Ok(Library::linked(switchyard_builtin::vtable, "managers"));
    }
    open_library(path)
}

/// `[data]`: the data directory of the built-in Store and Scheduler.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct DataConfig {
    /// The directory of the database (`store.db`), created with mode 0700
    /// if missing; relative to the configuration file. `--data-dir`
    /// overrides it. Default: `$STATE_DIRECTORY` (systemd's
    /// `StateDirectory=`), else `$XDG_STATE_HOME/switchyard`, else
    /// `~/.local/state/switchyard`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) dir: Option<PathBuf>,
}

impl DataConfig {
    /// The data directory: the configured one, else the default above.
    pub(crate) fn resolve(&self) -> Result<PathBuf, String> {
        if let Some(dir) = &self.dir {
            return std::path::absolute(dir).map_err(|e| format!("data.dir: {e}"));
        }
        let env = |name: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        if let Some(state) = env("STATE_DIRECTORY") {
            // systemd may list several, colon-separated: the first is ours.
            let first = state
                .to_string_lossy()
                .split(':')
                .next()
                .unwrap_or_default()
                .to_owned();
            return Ok(PathBuf::from(first));
        }
        if let Some(xdg) = env("XDG_STATE_HOME").filter(|p| p.is_absolute()) {
            return Ok(xdg.join("switchyard"));
        }
        match env("HOME") {
            Some(home) => Ok(home.join(".local/state/switchyard")),
            None => Err("data.dir: no default without $HOME: set data.dir or pass --data-dir".to_owned()),
        }
    }
}

impl Config {
    /// Whether a built-in (which needs the data directory) is configured.
    pub(crate) fn uses_data_dir(&self) -> bool {
        self.managers.iter().any(|m| m.builtin.is_some())
    }

    /// Fixes the data directory (`--data-dir`, else `data.dir`, else the
    /// default) and creates it, so that every process sees the same one
    /// and a directory that cannot exist stops `up` before any process
    /// starts.
    pub(crate) fn prepare_data_dir(&mut self, flag: Option<PathBuf>) -> Result<(), String> {
        if let Some(dir) = flag {
            self.data.dir = Some(dir);
        }
        if !self.uses_data_dir() {
            return Ok(());
        }
        let dir = self.data.resolve()?;
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| format!("data.dir: cannot create {}: {e}", dir.display()))?;
        self.data.dir = Some(dir);
        Ok(())
    }

    /// Checks the built-in entries and `[data]`.
    fn validate_builtins(&self, problems: &mut Vec<String>) {
        for (i, m) in self.managers.iter().enumerate() {
            let Some(builtin) = &m.builtin else { continue };
            if !switchyard_builtin::BUILTINS.contains(&builtin.as_str()) {
                problems.push(format!(
                    "managers[{i}].builtin: no built-in manager `{builtin}` (there are: {})",
                    switchyard_builtin::BUILTINS.join(", ")
                ));
            }
            if m.plugin.is_some() || m.manager.is_some() {
                problems.push(format!(
                    "managers[{i}].builtin: a built-in manager takes no `plugin` or `manager`"
                ));
            }
            if m.instances != 1 {
                problems.push(format!(
                    "managers[{i}].instances: the built-in `{builtin}` runs as one instance (the one writer of its database)"
                ));
            }
            if m.config.get("backend").and_then(|b| b.as_str()) == Some("jetstream")
                && !self.cluster.enabled()
            {
                problems.push(format!(
                    "managers[{i}].config.backend: `jetstream` needs `[cluster]` (the NATS servers to reach JetStream through)"
                ));
            }
            if m.config.contains_key(switchyard_builtin::CLUSTER_KEY) {
                problems.push(format!(
                    "managers[{i}].config.{}: the built-ins take the NATS servers from `[cluster]`",
                    switchyard_builtin::CLUSTER_KEY
                ));
            }
            if m.config.contains_key(switchyard_builtin::DATA_DIR_KEY) {
                problems.push(format!(
                    "managers[{i}].config.{}: set the data directory with `data.dir` or `--data-dir`",
                    switchyard_builtin::DATA_DIR_KEY
                ));
            }
            let twice = self.managers[..i]
                .iter()
                .any(|o| o.builtin.as_ref() == Some(builtin));
            if twice {
                problems.push(format!(
                    "managers[{i}].builtin: `{builtin}` is configured twice (they would share one database)"
                ));
            }
        }
    }

    /// The `config` JSON handed to a manager's `create`: its table, and for
    /// a built-in the data directory.
    pub(crate) fn manager_config_json(&self, m: &ManagerConfig) -> Result<String, serde_json::Error> {
        let mut value = serde_json::to_value(&m.config)?;
        if let (Some(dir), serde_json::Value::Object(map)) = (self.templates_of(m), &mut value) {
            // Taken out again by the SDK before `create` sees its config.
            map.insert(
                switchyard_manager::WEB_CONFIG_KEY.to_owned(),
                serde_json::json!({ "templates": dir, "development": self.web.development }),
            );
        }
        if m.builtin.is_some()
            && let (Some(dir), serde_json::Value::Object(map)) = (&self.data.dir, &mut value)
        {
            map.insert(
                switchyard_builtin::DATA_DIR_KEY.to_owned(),
                serde_json::to_value(dir)?,
            );
        }
        // The built-ins reach JetStream through the cluster's servers, with
        // its credentials (decisions 0135, 0140).
        if m.builtin.is_some()
            && self.cluster.enabled()
            && let serde_json::Value::Object(map) = &mut value
        {
            map.insert(
                switchyard_builtin::CLUSTER_KEY.to_owned(),
                serde_json::to_value(&self.cluster)?,
            );
        }
        serde_json::to_string(&value)
    }
}

/// The default group's built-ins: the Store and the Scheduler, so that the
/// demo's `/kv` and `/reminders` routes work with no configuration.
fn default_builtins() -> impl Iterator<Item = ManagerConfig> {
    switchyard_builtin::BUILTINS.iter().map(|name| ManagerConfig {
        name: (*name).to_owned(),
        plugin: None,
        manager: None,
        builtin: Some((*name).to_owned()),
        instances: 1,
        config: toml::Table::new(),
        // They submit no jobs: one idle thread, not four.
        workers: WorkersConfig {
            size: Some(1),
            ..WorkersConfig::default()
        },
        templates: None,
    })
}

// ---- end of the data directory and built-ins ----

impl Default for Config {
    fn default() -> Self {
        Config {
            listener: ListenerConfig::default(),
            group: GroupConfig::default(),
            restart: RestartConfig::default(),
            // The built-ins first: the demo's managers call them.
            managers: default_builtins()
                .chain(switchyard_demo::MANAGERS.iter().map(|name| ManagerConfig {
                    name: (*name).to_owned(),
                    plugin: None,
                    manager: None,
                    builtin: None,
                    instances: 1,
                    config: toml::Table::new(),
                    workers: demo_workers(name),
                    templates: demo_dir(switchyard_demo::TEMPLATES_DIR),
                }))
                .collect(),
            data: DataConfig::default(),
            request_id: RequestIdConfig::default(),
            auth: demo_auth(),
            cors: Default::default(),
            rate_limit: Default::default(),
            compression: Default::default(),
            security_headers: Default::default(),
            api: Default::default(),
            catalog: Default::default(),
            cluster: Default::default(),
            admin: Default::default(),
            log: Default::default(),
            tracing: Default::default(),
            metrics: Default::default(),
            statics: demo_dir(switchyard_demo::STATIC_DIR)
                .map(|dir| StaticConfig {
                    prefix: "/static/".to_owned(),
                    dir,
                    index: Some("index.html".to_owned()),
                    cache_control: no_cache(),
                    precompressed: true,
                })
                .into_iter()
                .collect(),
            web: WebConfig::default(),
        }
    }
}

/// A directory of the demo's source tree, when this binary runs where it
/// was built (the zero-configuration group serves its templates and
/// static files from there; elsewhere it goes without).
fn demo_dir(dir: &str) -> Option<PathBuf> {
    let dir = PathBuf::from(dir);
    dir.is_dir().then_some(dir)
}

/// The demo's pools: `compute` runs `/cpu` and `/crash` jobs in two worker
/// processes (few, so that the zero-config group starts quickly); the
/// others use the default thread pool.
fn demo_workers(name: &str) -> WorkersConfig {
    if name == <switchyard_demo::Compute as switchyard_manager::Manager>::NAME {
        WorkersConfig {
            kind: WorkerKind::Process,
            size: Some(2),
            ..WorkersConfig::default()
        }
    } else {
        WorkersConfig::default()
    }
}

/// A configuration error, naming the key.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    #[error("{0}")]
    Invalid(String),
}

/// The environment variables that override configuration keys (docs/configuration.md,
/// "From the environment"): `SWITCHYARD_LISTENER__BIND=127.0.0.1:9000` sets `listener.bind`,
/// `SWITCHYARD_LISTENER__TLS__CERT=…` sets `listener.tls.cert`: the name
/// after the prefix is the key's path, its parts joined by `__`, in any
/// case. A variable without `__` (`SWITCHYARD_LOG`) is not one of them.
const ENV_PREFIX: &str = "SWITCHYARD_";

/// One override: the variable's name, the key's path, the raw value.
type Override = (String, Vec<String>, String);

/// The overrides in this process's environment, in name order.
fn env_overrides() -> Vec<Override> {
    let mut found: Vec<Override> = std::env::vars()
        .filter_map(|(name, value)| as_override(name, value))
        .collect();
    found.sort();
    found
}

/// The override variable `name` makes, if it is one.
fn as_override(name: String, value: String) -> Option<Override> {
    let path = name.strip_prefix(ENV_PREFIX)?;
    path.contains("__").then(|| {
        let keys = path.split("__").map(str::to_ascii_lowercase).collect();
        (name.clone(), keys, value)
    })
}

/// `table` (read from `source`) with `overrides` applied, as a
/// configuration not yet validated; a key or value it refuses is reported
/// against `source` and names the variables applied.
fn overridden(mut table: toml::Table, overrides: &[Override], source: &str) -> Result<Config, ConfigError> {
    apply_overrides(&mut table, overrides)?;
    table.try_into().map_err(|e: toml::de::Error| ConfigError::Parse {
        path: source.to_owned(),
        message: with_overrides(e.to_string(), overrides),
    })
}

/// Sets each override in `table`, over what the file says. The value is
/// read as a TOML value when it is one (`8080`, `true`, `["a", "b"]`,
/// `"text"`), else taken as a string (`127.0.0.1:9000`). Entries of
/// arrays of tables (`[[managers]]`) cannot be addressed.
fn apply_overrides(table: &mut toml::Table, overrides: &[Override]) -> Result<(), ConfigError> {
    for (name, path, raw) in overrides {
        let Some((leaf, sections)) = path.split_last().filter(|_| path.iter().all(|k| !k.is_empty())) else {
            return Err(ConfigError::Invalid(format!(
                "{name}: not a key path (sections and key joined by `__`, e.g. SWITCHYARD_LISTENER__BIND)"
            )));
        };
        let value = toml::from_str::<toml::Table>(&format!("v = {raw}"))
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(raw.clone()));
        let mut at = &mut *table;
        for (depth, section) in sections.iter().enumerate() {
            let entry = at
                .entry(section.clone())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            let toml::Value::Table(inner) = entry else {
                return Err(ConfigError::Invalid(format!(
                    "{name}: `{}` is not a table",
                    path[..=depth].join(".")
                )));
            };
            at = inner;
        }
        at.insert(leaf.clone(), value);
    }
    Ok(())
}

/// `message` naming the variables that changed the configuration, so a
/// bad value from the environment is not looked for in the file.
fn with_overrides(message: String, overrides: &[Override]) -> String {
    if overrides.is_empty() {
        return message;
    }
    let names: Vec<&str> = overrides.iter().map(|(name, ..)| name.as_str()).collect();
    format!(
        "{message}\n(with the environment's overrides: {})",
        names.join(", ")
    )
}

impl Config {
    /// The built-in demo configuration with the environment's overrides
    /// (`SWITCHYARD_SECTION__KEY`), validated when there are any.
    pub(crate) fn demo() -> Result<Config, ConfigError> {
        let overrides = env_overrides();
        if overrides.is_empty() {
            return Ok(Config::default());
        }
        let table = toml::Table::try_from(Config::default())
            .map_err(|e| ConfigError::Invalid(format!("the demo configuration: {e}")))?;
        let config = overridden(table, &overrides, "the demo configuration")?;
        config.validate()?;
        Ok(config)
    }

    /// Reads `path` and resolves its relative plugin paths; checks nothing
    /// serde does not.
    pub(crate) fn read(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let table: toml::Table = toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        let mut config = overridden(table, &env_overrides(), &path.display().to_string())?;
        let base = path.parent().unwrap_or(Path::new("."));
        for m in &mut config.managers {
            if let Some(plugin) = &m.plugin
                && plugin.is_relative()
            {
                m.plugin = Some(base.join(plugin));
            }
        }
        if let Some(dir) = &config.data.dir
            && dir.is_relative()
        {
            config.data.dir = Some(base.join(dir));
        }
        config.resolve_middleware_paths(base);
        if !matches!(config.log.access.as_str(), "off" | "stdout" | "")
            && Path::new(&config.log.access).is_relative()
        {
            config.log.access = base.join(&config.log.access).to_string_lossy().into_owned();
        }
        for dir in config
            .statics
            .iter_mut()
            .map(|s| &mut s.dir)
            .chain(config.web.templates.as_mut())
            .chain(config.managers.iter_mut().filter_map(|m| m.templates.as_mut()))
        {
            if dir.is_relative() {
                *dir = base.join(&*dir);
            }
        }
        if let Some(tls) = &mut config.listener.tls {
            for path in [Some(&mut tls.cert), Some(&mut tls.key), tls.client_ca.as_mut()]
                .into_iter()
                .flatten()
            {
                if path.is_relative() {
                    *path = base.join(&*path);
                }
            }
        }
        Ok(config)
    }

    /// Checks values serde cannot; reports every problem at once.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        let l = &self.listener;
        if l.max_header_bytes < 8192 {
            problems.push("listener.max_header_bytes: must be at least 8192".to_owned());
        }
        if l.max_body_bytes as u64 > self.group.shm_budget_bytes {
            problems.push(format!(
                "listener.max_body_bytes: must fit in group.shm_budget_bytes ({})",
                self.group.shm_budget_bytes
            ));
        }
        if l.request_timeout_ms == 0 {
            problems.push("listener.request_timeout_ms: must be positive".to_owned());
        }
        if l.workers == 0 || l.workers > 64 {
            problems.push("listener.workers: must be between 1 and 64".to_owned());
        }
        problems.extend(self.api.problems());
        let ws = &l.ws;
        for (key, value) in [
            ("max_message_bytes", ws.max_message_bytes),
            ("max_subscriptions", ws.max_subscriptions),
            ("queue", ws.queue),
            ("ping_ms", ws.ping_ms as usize),
            ("max_in_flight", ws.max_in_flight),
            ("message_timeout_ms", ws.message_timeout_ms as usize),
        ] {
            if value == 0 {
                problems.push(format!("listener.ws.{key}: must be positive"));
            }
        }
        for name in &ws.subprotocols {
            // A token (RFC 9110 §5.6.2), as Sec-WebSocket-Protocol requires;
            // `bearer.` names are credentials, never a protocol.
            let token = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
            if !token || name.starts_with("bearer.") {
                problems.push(format!(
                    "listener.ws.subprotocols: `{name}` is not a protocol name (a token, not `bearer.*`)"
                ));
            }
        }
        for (key, value) in [
            ("header_read_timeout_ms", l.header_read_timeout_ms),
            ("idle_timeout_ms", l.idle_timeout_ms),
            ("body_read_timeout_ms", l.body_read_timeout_ms),
            ("write_stall_timeout_ms", l.write_stall_timeout_ms),
        ] {
            if value == 0 {
                problems.push(format!("listener.{key}: must be positive"));
            }
        }
        if l.max_connections == 0 || l.max_connections > 1_000_000 {
            problems.push("listener.max_connections: must be between 1 and 1000000".to_owned());
        }
        if l.max_connection_bytes == 0 {
            problems.push("listener.max_connection_bytes: must be positive".to_owned());
        }
        if self.log.access.is_empty() {
            problems.push("log.access: `off`, `stdout` or a file path".to_owned());
        } else if !matches!(self.log.access.as_str(), "off" | "stdout") {
            let path = std::path::Path::new(&self.log.access);
            match path.parent().filter(|p| !p.as_os_str().is_empty()) {
                Some(dir) if !dir.is_dir() => problems.push(format!(
                    "log.access: the directory of {} does not exist",
                    path.display()
                )),
                _ if path.is_dir() => problems.push(format!("log.access: {} is a directory", path.display())),
                _ => {}
            }
        }
        if self.tracing.server_timing && !self.tracing.enabled {
            problems.push("tracing.server_timing: needs tracing.enabled".to_owned());
        }
        if let Some(admin) = self.admin.bind
            && (admin == self.listener.bind && admin.port() != 0)
        {
            problems.push(format!(
                "admin.bind: {admin} is the listener's address; the admin endpoint is off the public port"
            ));
        }
        let id_header = &self.request_id.header;
        if http::HeaderName::from_bytes(id_header.as_bytes()).is_err() || id_header.is_empty() {
            problems.push(format!(
                "request_id.header: `{id_header}` is not an HTTP header name"
            ));
        }
        if let Some(tls) = &l.tls {
            if tls.client_auth.is_some() && tls.client_ca.is_none() {
                problems.push(
                    "listener.tls.client_auth: needs listener.tls.client_ca (the CAs to verify clients with)"
                        .to_owned(),
                );
            }
            // The same loading the listener does, so that a bad file stops
            // `up` (or is refused by `reload`) before any process runs it.
            if let Err(err) = switchyard_listener::tls::load(&tls.to_listener()) {
                let text = err.to_string();
                problems.push(format!(
                    "listener.tls.{}",
                    text.strip_prefix("TLS: ").unwrap_or(&text)
                ));
            }
        }
        let h3 = &l.http3;
        if h3.enabled {
            if l.tls.is_none() {
                problems.push(
                    "listener.http3.enabled: needs [listener.tls] (QUIC is always encrypted; the same certificates serve both)"
                        .to_owned(),
                );
            }
            if h3.zero_rtt && l.tls.as_ref().is_some_and(|t| t.client_ca.is_some()) {
                problems.push(
                    "listener.http3.zero_rtt: cannot be used with listener.tls.client_ca (0.5-RTT answers would precede the client certificate check)"
                        .to_owned(),
                );
            }
            if h3.idle_timeout_ms < 100 || h3.idle_timeout_ms > 3_600_000 {
                problems.push("listener.http3.idle_timeout_ms: must be between 100 and 3600000".to_owned());
            }
            if l.workers > 64 {
                problems.push(
                    "listener.workers: at most 64 with listener.http3 (each process's index rides in its QUIC connection ids)"
                        .to_owned(),
                );
            }
            if h3.alt_svc_max_age_s == 0 {
                problems.push("listener.http3.alt_svc_max_age_s: must be positive".to_owned());
            }
            if h3.bind.is_some_and(|b| b.port() == 0) {
                problems.push(
                    "listener.http3.bind: needs a port (leave it out to use the TCP port's number)"
                        .to_owned(),
                );
            }
            if let Some(settings) = h3.to_listener()
                && let Err(err) = settings.check()
                && !err.contains("idle_timeout_ms")
            {
                problems.push(err);
            }
        }
        if self.group.max_frame_bytes < 64 * 1024 || self.group.max_frame_bytes > u32::MAX as usize {
            problems.push("group.max_frame_bytes: must be between 65536 and 4294967295".to_owned());
        }
        if self.group.queue_capacity == 0 {
            problems.push("group.queue_capacity: must be positive".to_owned());
        }
        for name in &self.group.pass_env {
            // `*` alone would hand every secret of the environment to
            // every plugin: what the allow-list is there to prevent.
            if name.is_empty()
                || name == "*"
                || name.contains('=')
                || name.strip_suffix('*').unwrap_or(name).contains('*')
            {
                problems.push(format!(
                    "group.pass_env: `{name}` is not a variable name or a prefix ending in `*` (`*` alone passes everything and is refused)"
                ));
            }
        }
        if self.listener.park_spin_us > 10_000 {
            problems.push("listener.park_spin_us: must be at most 10000 (10 ms)".to_owned());
        }
        if self.group.ring_yields > 1000 {
            problems.push("group.ring_yields: must be at most 1000".to_owned());
        }
        if self.group.shm_threshold_bytes + 64 * 1024 > self.group.max_frame_bytes {
            problems.push(format!(
                "group.shm_threshold_bytes: must be at least 64 KiB below group.max_frame_bytes ({})",
                self.group.max_frame_bytes
            ));
        }
        if self.group.handler_timeout_ms < 100 {
            problems.push("group.handler_timeout_ms: must be at least 100".to_owned());
        }
        let r = &self.restart;
        if r.initial_backoff_ms == 0 {
            problems.push("restart.initial_backoff_ms: must be positive".to_owned());
        }
        if r.max_backoff_ms < r.initial_backoff_ms {
            problems.push(format!(
                "restart.max_backoff_ms: must be at least restart.initial_backoff_ms ({})",
                r.initial_backoff_ms
            ));
        }
        if r.window_s == 0 {
            problems.push("restart.window_s: must be positive".to_owned());
        }
        if r.crash_loop_backoff_ms < r.max_backoff_ms || r.crash_loop_backoff_ms > 3_600_000 {
            problems.push(format!(
                "restart.crash_loop_backoff_ms: must be between restart.max_backoff_ms ({}) and 3600000 (an hour)",
                r.max_backoff_ms
            ));
        }
        if self.managers.is_empty() {
            problems.push("managers: at least one manager is needed".to_owned());
        }
        let mut seen = std::collections::HashSet::new();
        for (i, m) in self.managers.iter().enumerate() {
            if !seen.insert(&m.name) {
                problems.push(format!("managers[{i}].name: `{}` is listed twice", m.name));
            }
            if m.instances == 0 || m.instances > 64 {
                problems.push(format!("managers[{i}].instances: must be between 1 and 64"));
            }
            let w = &m.workers;
            if w.size.is_some_and(|n| n == 0 || n > 256) {
                problems.push(format!("managers[{i}].workers.size: must be between 1 and 256"));
            }
            if w.queue > 1_000_000 {
                problems.push(format!("managers[{i}].workers.queue: must be at most 1000000"));
            }
            if w.job_timeout_ms == 0 {
                problems.push(format!("managers[{i}].workers.job_timeout_ms: must be positive"));
            }
        }
        self.validate_builtins(&mut problems);
        problems.extend(self.cluster.problems());
        self.validate_web(&mut problems);
        // The listener's own builder, run here: key files are read and
        // every middleware key checked before any process starts.
        if let Err(problem) = switchyard_listener::check_middleware(&self.middleware()) {
            problems.push(problem);
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(problems.join("\n")))
        }
    }

    /// The listener's runtime threads: as configured, or one. One thread
    /// that owns everything of its process spends no wake-ups between
    /// threads; more cores are used by more listener processes
    /// (`workers`), not more threads (decision 0158).
    pub(crate) fn threads(&self) -> usize {
        self.listener.threads.max(1)
    }

    pub(crate) fn pipes(&self) -> usize {
        if self.listener.pipes > 0 {
            self.listener.pipes
        } else {
            self.threads()
        }
    }

    pub(crate) fn shutdown_grace(&self) -> Duration {
        Duration::from_millis(self.group.shutdown_grace_ms)
    }
}

/// `[api]` (docs/configuration.md, docs/api.md).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct ApiSettings {
    /// Serve `GET /openapi.json`, the OpenAPI 3.1 description of every
    /// HTTP route. Default true.
    pub(crate) openapi: bool,
    /// Serve `GET /docs`, an HTML page of the routes, events and
    /// notification types. Default true.
    pub(crate) docs: bool,
    /// The description's title (`info.title`, the page's heading). Default
    /// `"Switchyard"`.
    pub(crate) title: String,
    /// The version of your API (`info.version`). Default `"1.0.0"`.
    pub(crate) version: String,
}

impl Default for ApiSettings {
    fn default() -> Self {
        ApiSettings {
            openapi: true,
            docs: true,
            title: "Switchyard".to_owned(),
            version: "1.0.0".to_owned(),
        }
    }
}

impl ApiSettings {
    pub(crate) fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (key, value) in [("title", &self.title), ("version", &self.version)] {
            if value.trim().is_empty() || value.len() > 200 {
                out.push(format!("api.{key}: must be 1 to 200 characters"));
            }
        }
        out
    }

    /// Whether anything reads the catalog.
    pub(crate) fn enabled(&self) -> bool {
        self.openapi || self.docs
    }

    /// The listener's settings, with `catalog`.
    pub(crate) fn to_listener(
        &self,
        catalog: std::sync::Arc<switchyard_proto::api::Catalog>,
    ) -> switchyard_listener::api::ApiConfig {
        switchyard_listener::api::ApiConfig::new(
            self.openapi,
            self.docs,
            self.title.clone(),
            self.version.clone(),
            catalog,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn overridden(text: &str, overrides: &[(&str, &str)]) -> Result<Config, String> {
        let overrides: Vec<Override> = overrides
            .iter()
            .map(|(name, value)| as_override(name.to_string(), value.to_string()).unwrap())
            .collect();
        super::overridden(toml::from_str(text).unwrap(), &overrides, "switchyard.toml")
            .map_err(|e| e.to_string())
    }

    #[test]
    fn environment_variables_override_keys() {
        let config = overridden(
            "[listener]\nbind = \"127.0.0.1:8080\"\nmax_body_bytes = 10\n",
            &[
                ("SWITCHYARD_LISTENER__BIND", "127.0.0.1:9000"),
                ("SWITCHYARD_LISTENER__MAX_BODY_BYTES", "2048"),
                ("SWITCHYARD_GROUP__RING_YIELDS", "7"),
                ("SWITCHYARD_REQUEST_ID__ENABLED", "false"),
                ("SWITCHYARD_COMPRESSION__ALGORITHMS", "[\"zstd\"]"),
            ],
        )
        .unwrap();
        assert_eq!(config.listener.bind, SocketAddr::from(([127, 0, 0, 1], 9000)));
        assert_eq!(config.listener.max_body_bytes, 2048, "over the file's value");
        assert_eq!(config.group.ring_yields, 7, "a section the file does not have");
        assert!(!config.request_id.enabled);
        // A value that is no TOML value is a string; one that is, is typed.
        let err = overridden("", &[("SWITCHYARD_LISTENER__BND", "1")]).unwrap_err();
        assert!(
            err.contains("bnd") && err.contains("SWITCHYARD_LISTENER__BND"),
            "{err}"
        );
        let err = overridden("", &[("SWITCHYARD_LISTENER__MAX_BODY_BYTES", "lots")]).unwrap_err();
        assert!(err.contains("SWITCHYARD_LISTENER__MAX_BODY_BYTES"), "{err}");
        let err = overridden(
            "[listener]\nbind = \"127.0.0.1:1\"\n",
            &[("SWITCHYARD_LISTENER__BIND__X", "1")],
        )
        .unwrap_err();
        assert!(err.contains("`listener.bind` is not a table"), "{err}");
        let err = overridden("", &[("SWITCHYARD_LISTENER____BIND", "1")]).unwrap_err();
        assert!(err.contains("not a key path"), "{err}");
    }

    #[test]
    fn defaults_are_valid_and_round_trip() {
        let config = Config::default();
        config.validate().unwrap();
        let text = toml::to_string(&config).unwrap();
        let back: Config = toml::from_str(&text).unwrap();
        assert_eq!(back.listener.bind, config.listener.bind);
    }

    #[test]
    fn pass_env_takes_names_and_prefixes_but_not_everything() {
        let config: Config =
            toml::from_str("[group]\npass_env = [\"DATABASE_URL\", \"MYAPP_*\", \"*\", \"A*B\", \"\"]\n")
                .unwrap();
        let err = config.validate().unwrap_err().to_string();
        for bad in ["`*`", "`A*B`", "``"] {
            assert!(
                err.contains(&format!("group.pass_env: {bad} is not")),
                "{bad}: {err}"
            );
        }
        assert!(!err.contains("DATABASE_URL") && !err.contains("MYAPP_"), "{err}");
    }

    #[test]
    fn websocket_subprotocols_are_names_and_timeouts_positive() {
        let config: Config = toml::from_str(
            "[listener.ws]\nsubprotocols = [\"mqtt\", \"bearer.x\", \"a b\"]\nmessage_timeout_ms = 0\n",
        )
        .unwrap();
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("`bearer.x` is not a protocol name"), "{err}");
        assert!(err.contains("`a b` is not a protocol name"), "{err}");
        assert!(!err.contains("`mqtt`"), "{err}");
        assert!(
            err.contains("listener.ws.message_timeout_ms: must be positive"),
            "{err}"
        );
        let config: Config = toml::from_str("[listener.ws]\nsubprotocols = []\n").unwrap();
        config.validate().unwrap();
    }

    #[test]
    fn the_listeners_spin_is_at_most_ten_milliseconds() {
        let config: Config = toml::from_str("[listener]\npark_spin_us = 10001\n").unwrap();
        let err = config.validate().unwrap_err().to_string();
        assert!(
            err.contains("listener.park_spin_us: must be at most 10000"),
            "{err}"
        );
        assert_eq!(Config::default().listener.park_spin_us, 150, "on by default");
        let config: Config = toml::from_str("[listener]\npark_spin_us = 0\n").unwrap();
        config.validate().unwrap();
    }

    #[test]
    fn bind_takes_host_names() {
        assert_eq!(
            resolve_bind("localhost:0").unwrap(),
            SocketAddr::from(([127, 0, 0, 1], 0))
        );
        assert_eq!(resolve_bind("127.0.0.1:8080").unwrap().port(), 8080);
        assert!(resolve_bind("localhost").unwrap_err().contains("HOST:PORT"));
        let config: Config = toml::from_str("[listener]\nbind = \"localhost:9000\"\n").unwrap();
        assert_eq!(config.listener.bind, SocketAddr::from(([127, 0, 0, 1], 9000)));
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_key() {
        let err = toml::from_str::<Config>("[listener]\nbnd = \"x\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("bnd"), "{err}");
        let err = toml::from_str::<Config>("[listener]\nbind = \"nope\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("bind"), "{err}");
        let config: Config = toml::from_str(
            "[listener]\nmax_header_bytes = 10\n[[managers]]\nname = \"zzz\"\ninstances = 0\n",
        )
        .unwrap();
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("listener.max_header_bytes"), "{err}");
        assert!(err.contains("managers[0].instances"), "{err}");
        let config: Config = toml::from_str(
            "[group]\nhandler_timeout_ms = 5\n[restart]\nmax_backoff_ms = 100\ncrash_loop_backoff_ms = 50\nwindow_s = 0\n",
        )
        .unwrap();
        let err = config.validate().unwrap_err().to_string();
        assert!(
            err.contains("group.handler_timeout_ms: must be at least 100"),
            "{err}"
        );
        assert!(err.contains("restart.crash_loop_backoff_ms"), "{err}");
        assert!(err.contains("restart.window_s"), "{err}");
        let config: Config = toml::from_str(
            "[listener]\nidle_timeout_ms = 0\nwrite_stall_timeout_ms = 0\nbody_read_timeout_ms = 0\n\
             max_connections = 0\nmax_connection_bytes = 0\n",
        )
        .unwrap();
        let err = config.validate().unwrap_err().to_string();
        for key in [
            "listener.idle_timeout_ms",
            "listener.write_stall_timeout_ms",
            "listener.body_read_timeout_ms",
            "listener.max_connections",
            "listener.max_connection_bytes",
        ] {
            assert!(err.contains(key), "{key} not named in {err}");
        }
        // Plugins are checked by the validation child: tests/validation.rs.
    }

    #[test]
    fn http3_keys_are_checked_and_named() {
        let config: Config = toml::from_str("[listener.http3]\nenabled = true\n").unwrap();
        let err = config.validate().unwrap_err().to_string();
        assert!(
            err.contains("listener.http3.enabled: needs [listener.tls]"),
            "{err}"
        );
        let config: Config = toml::from_str(
            "[listener.http3]\nenabled = true\nbind = \"127.0.0.1:0\"\nmax_concurrent_streams = 0\n\
             idle_timeout_ms = 5\nalt_svc_max_age_s = 0\n",
        )
        .unwrap();
        let err = config.validate().unwrap_err().to_string();
        for key in [
            "listener.http3.bind",
            "listener.http3.max_concurrent_streams",
            "listener.http3.idle_timeout_ms",
            "listener.http3.alt_svc_max_age_s",
        ] {
            assert!(err.contains(key), "{key} not named in {err}");
        }
        let config: Config =
            toml::from_str("[listener.http3]\nenabled = true\nstream_window = 8000000\nretry = \"auto\"\nretry_threshold = 0\n")
                .unwrap();
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("listener.http3.stream_window"), "{err}");
        let config: Config =
            toml::from_str("[listener]\nworkers = 65\n[listener.http3]\nenabled = true\n").unwrap();
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("listener.workers: at most 64"), "{err}");
        let err = toml::from_str::<Config>("[listener.http3]\nretry = \"sometimes\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("retry"), "{err}");
        // Off (the default), nothing of it is checked or served.
        let config: Config = toml::from_str("[listener.http3]\nmax_concurrent_streams = 0\n").unwrap();
        assert!(config.listener.http3.to_listener().is_none());
    }

    #[test]
    fn middleware_keys_are_checked_and_files_never_inherit_the_demo_key() {
        let config: Config = toml::from_str("[listener]\nworkers = 1\n").unwrap();
        assert!(config.auth.jwt.is_none(), "a file got the demo's key");
        assert!(Config::default().auth.jwt.is_some());
        let config: Config = toml::from_str(
            "[auth.jwt]\nalgorithms = [\"HS256\"]\nsecret = \"short\"\n\
             [cors]\nallow_origins = [\"*\"]\nallow_credentials = true\n",
        )
        .unwrap();
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("auth.jwt.secret"), "{err}");
        let err = toml::from_str::<Config>("[rate_limit]\nmax_client = 3\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("max_client"), "{err}");
        let mut config: Config =
            toml::from_str("[auth.jwt]\nalgorithms = [\"RS256\"]\npublic_key_file = \"keys/pub.pem\"\n")
                .unwrap();
        config.resolve_middleware_paths(Path::new("/etc/switchyard"));
        assert_eq!(
            config.auth.jwt.unwrap().public_key_file.unwrap(),
            Path::new("/etc/switchyard/keys/pub.pem")
        );
    }
}
