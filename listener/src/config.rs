//! The listener's settings (`[listener]` and the sections it serves:
//! middleware, TLS, HTTP/3, API, tracing, access log, static mounts), and
//! the checks a configuration passes before it is used, at start or on a
//! reload.

use std::path::PathBuf;
use std::time::Duration;

use crate::access::AccessLogConfig;
use crate::api::ApiConfig;
use crate::context::{ForwardedHeader, RequestIdConfig};
use crate::error::Error;
use crate::quic::Http3Config;
use crate::static_files::StaticMount;
use crate::tls::TlsConfig;
use crate::trace::TracingConfig;
use switchyard_middleware as middleware;
use switchyard_middleware::config::MiddlewareConfig;

/// The listener's settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// The broker's socket, where the return pipes connect.
    pub broker_socket: PathBuf,
    /// Return pipes in the pool (about one per runtime thread).
    pub pipes: usize,
    /// Largest frame accepted or sent, in bytes.
    pub max_frame: usize,
    /// Frames queued per pipe before requests get 503.
    pub queue_capacity: usize,
    /// Largest request head (request line and headers), in bytes; at least 8192.
    pub max_header_bytes: usize,
    /// Largest request body, in bytes; larger gets 413.
    pub max_body_bytes: usize,
    /// Largest body of an upload route (streamed through a pipe, never
    /// buffered whole), in bytes; larger gets 413.
    pub max_upload_bytes: u64,
    /// Time a client has to send the whole request head (slowloris guard).
    pub header_read_timeout: Duration,
    /// Deadline of a request from arrival to response; past it, 504.
    pub request_timeout: Duration,
    /// Request bodies of at least this many bytes go through shared memory.
    pub shm_threshold: usize,
    /// Connections open at once in this process; more are answered 503
    /// and closed. Kept under the descriptor limit.
    pub max_connections: usize,
    /// A connection with no request in progress that sends nothing for
    /// this long is closed (from accept to its first byte, and between
    /// requests). Its first request head must also be whole within this
    /// plus `header_read_timeout` of connecting.
    pub idle_timeout: Duration,
    /// A request body that sends nothing for this long is cut: 408.
    pub body_read_timeout: Duration,
    /// A connection with something to send (a blocked write, or response
    /// bytes the client's h2 window does not admit) that makes no progress
    /// for this long is closed, and what it held is released.
    pub write_stall_timeout: Duration,
    /// Response bytes one connection may hold that its client has not
    /// taken (h2: across its streams); a response that would pass it while
    /// others wait gets 503.
    pub max_connection_bytes: u64,
    /// WebSocket limits.
    pub ws: WsConfig,
    /// Proxies whose `Forwarded` / `X-Forwarded-For` name the client
    /// (`listener.trusted_proxies`); from any other peer those headers
    /// are the client's own word, and ignored.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// The header those proxies name the client in
    /// (`listener.forwarded_header`); the other is never read.
    pub forwarded_header: ForwardedHeader,
    /// Request ids (`[request_id]`).
    pub request_id: RequestIdConfig,
    /// The built-in middleware (docs/middleware.md).
    pub middleware: MiddlewareConfig,
    /// Serve TLS on every port with these certificates (none: plaintext).
    pub tls: Option<TlsConfig>,
    /// HTTP/3 on a UDP port beside the TCP one, on the same certificates
    /// (`[listener.http3]`; none: not served, not advertised).
    pub http3: Option<Http3Config>,
    /// `/openapi.json` and `/docs` (`[api]`).
    pub api: ApiConfig,
    /// W3C trace context and `Server-Timing` (`[tracing]`).
    pub tracing: TracingConfig,
    /// Whether requests are counted by route for `/metrics`
    /// (`[metrics] enabled`).
    pub metrics: bool,
    /// The access log (`[log] access`, `[log] format`).
    pub access_log: AccessLogConfig,
    /// `[[static]]` mounts, served here with no hop (docs/web.md).
    pub statics: Vec<StaticMount>,
}

/// WebSocket limits (`[listener.ws]` in switchyard.toml).
#[derive(Clone, Debug)]
pub struct WsConfig {
    /// Largest message (and frame) a client may send; more closes with 1009.
    pub max_message_bytes: usize,
    /// Subscriptions one connection may hold; more are refused (error 429).
    pub max_subscriptions: usize,
    /// Messages queued towards one client; a push that finds it full drops
    /// the client (1008 "too slow").
    pub queue: usize,
    /// The server pings this often; a client that has not answered the
    /// previous ping by the next one is closed (1008).
    pub ping_interval: Duration,
    /// Requests of one connection in flight at once; the connection is not
    /// read further until one completes.
    pub max_in_flight: usize,
    /// Whether clients may emit notifications (`{"notify": type, "data"}`)
    /// into the group. Off by default: it lets any client reach every
    /// subscribed manager.
    pub notify: bool,
    /// Subprotocols the server answers to (RFC 6455 §4.2.2): the first one
    /// a client offers that is in this list is named in the answer; none
    /// in common (or an empty list) answers with no subprotocol.
    pub subprotocols: Vec<String>,
    /// Whether permessage-deflate (RFC 7692) is offered to clients that ask.
    pub deflate: bool,
    /// A message must arrive whole within this of its first byte: a
    /// client that leaves one unfinished is closed (1008), so it cannot
    /// keep a partial message's memory.
    pub message_timeout: Duration,
}

impl Default for WsConfig {
    fn default() -> Self {
        WsConfig {
            max_message_bytes: 256 * 1024,
            max_subscriptions: 64,
            queue: 1024,
            ping_interval: Duration::from_secs(20),
            max_in_flight: 256,
            notify: false,
            subprotocols: vec!["switchyard.v1".to_owned()],
            deflate: true,
            message_timeout: Duration::from_secs(30),
        }
    }
}

impl Config {
    pub(crate) fn validate(&self) -> Result<(), Error> {
        if self.max_header_bytes < 8192 {
            return Err(Error::Config("max_header_bytes must be at least 8192".into()));
        }
        if self.pipes == 0 {
            return Err(Error::Config("pipes must be at least 1".into()));
        }
        if self.max_connections == 0 {
            return Err(Error::Config("max_connections must be at least 1".into()));
        }
        for (name, value) in [
            ("idle_timeout", self.idle_timeout),
            ("body_read_timeout", self.body_read_timeout),
            ("write_stall_timeout", self.write_stall_timeout),
        ] {
            if value.is_zero() {
                return Err(Error::Config(format!("{name} must be positive")));
            }
        }
        // Bodies at or above the threshold cross in shared memory; below it
        // they ride in frames, which must have room for them.
        if self.shm_threshold + 64 * 1024 > self.max_frame {
            return Err(Error::Config(format!(
                "shm_threshold ({}) must leave 64 KiB of room under max_frame ({})",
                self.shm_threshold, self.max_frame
            )));
        }
        middleware::check(&self.middleware).map_err(Error::Config)?;
        if let Some(http3) = &self.http3 {
            http3.check().map_err(Error::Config)?;
            let Some(tls) = &self.tls else {
                return Err(Error::Config(
                    "listener.http3 needs [listener.tls]: QUIC is always encrypted".into(),
                ));
            };
            // 0.5-RTT answers would go out before a client certificate is
            // checked.
            if http3.zero_rtt && tls.client_ca.is_some() {
                return Err(Error::Config(
                    "listener.http3.zero_rtt cannot be used with listener.tls.client_ca".into(),
                ));
            }
        }
        for (i, mount) in self.statics.iter().enumerate() {
            mount.check(&format!("static[{i}]")).map_err(Error::Config)?;
        }
        Ok(())
    }
}
