//! The command line of the load generator, as a clap [`Args`] so that the
//! root `switchyard bench` command can flatten it.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use bytes::Bytes;
use clap::Args;
use http::{HeaderName, HeaderValue, Method, Uri};

/// Steps concurrency against an HTTP server and reports, per step, the
/// throughput, the latency percentiles, the errors, and `/ready`; then where
/// the server breaks and where it saturates.
#[derive(Args, Clone)]
pub struct Options {
    /// Base URL of the server: `http://HOST:PORT` or `https://HOST:PORT`,
    /// without a path.
    #[arg(value_name = "URL", value_parser = parse_base_url)]
    pub url: Uri,

    /// A route to request, as "METHOD /path" (repeatable; requests go round-robin over the
    /// routes). Default: every parameter-free GET path of URL/openapi.json that requires no
    /// credential and answers a first GET with 2xx, else "GET /noop".
    #[arg(short = 'r', long = "route", value_name = "METHOD PATH")]
    pub routes: Vec<Route>,

    /// Concurrency steps: the number of simulated clients, each with its own connection.
    #[arg(
        short = 'c',
        long,
        value_name = "N,N,...",
        value_delimiter = ',',
        default_value = "1,8,32",
        value_parser = clap::value_parser!(u32).range(1..=100_000)
    )]
    pub concurrency: Vec<u32>,

    /// Seconds per step (fractions allowed).
    #[arg(short = 'd', long, value_name = "SECONDS", default_value = "10", value_parser = parse_step)]
    pub duration: Duration,

    /// Seconds of unrecorded load at the first step's concurrency before the first step (0: none).
    #[arg(long, value_name = "SECONDS", default_value = "1", value_parser = parse_warmup)]
    pub warmup: Duration,

    /// An extra request header, "name: value" (repeatable; replaces a default of the same name).
    #[arg(short = 'H', long = "header", value_name = "NAME: VALUE", value_parser = parse_header)]
    pub headers: Vec<(HeaderName, HeaderValue)>,

    /// Bearer token: sends `authorization: Bearer TOKEN`.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "SWITCHYARD_BENCH_TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,

    /// Request body for POST, PUT and PATCH routes: a string, or @FILE for a file's contents.
    /// Sent as application/json unless -H sets content-type.
    #[arg(long, value_name = "STRING|@FILE", value_parser = parse_body)]
    pub body: Option<Bytes>,

    /// HTTP/2 with prior knowledge (h2c): one HTTP/2 connection per client.
    #[arg(long, conflicts_with_all = ["ws", "grpc", "grpc_bidi"])]
    pub http2: bool,

    /// HTTP/3 over QUIC to the URL's host and port on UDP (an https URL;
    /// the server's `[listener.http3]`): one QUIC connection per client.
    #[arg(long, conflicts_with_all = ["http2", "ws", "grpc", "grpc_bidi", "new_connection"])]
    pub http3: bool,

    /// WebSocket request/response (`/ws`, switchyard-client): each client
    /// one connection, calling `--event` with `--body` (or `{}`) as its data.
    #[arg(long, conflicts_with_all = ["grpc", "grpc_bidi"])]
    pub ws: bool,

    /// gRPC unary `Call` (switchyard-client): each client one channel,
    /// calling `--event` with `--body` (or `{}`) as its payload.
    #[arg(long, conflicts_with = "grpc_bidi")]
    pub grpc: bool,

    /// gRPC bidirectional `Session` (switchyard-client): each client one
    /// channel and one session stream, calling `--event` on it.
    #[arg(long)]
    pub grpc_bidi: bool,

    /// HTTPS: trust the CA certificates in this PEM file (the CA that
    /// signed the server's certificate; there is no system trust store).
    #[arg(long, value_name = "FILE", conflicts_with = "insecure")]
    pub cacert: Option<std::path::PathBuf>,

    /// HTTPS: accept any server certificate, unverified (benches only).
    #[arg(long)]
    pub insecure: bool,

    /// Every request on a new connection (TCP, and TLS for https): the
    /// req/s is then the connection (handshake) rate, and latency counts
    /// from the connect. HTTP/1.1 and h2 only.
    #[arg(long, conflicts_with_all = ["ws", "grpc", "grpc_bidi"])]
    pub new_connection: bool,

    /// The event type `--ws`, `--grpc` and `--grpc-bidi` call.
    #[arg(long, default_value = "demo.Noop")]
    pub event: String,

    /// Print the report as JSON instead of a table.
    #[arg(long)]
    pub json: bool,

    /// Exit with status 2 when a step breaks the thresholds.
    #[arg(long)]
    pub fail_on_break: bool,

    /// A step whose p99 latency is above this many milliseconds breaks.
    #[arg(long, value_name = "MS", default_value_t = 500.0, value_parser = parse_non_negative)]
    pub max_p99_ms: f64,

    /// A step whose error rate ((non-2xx answers + transport errors) / requests) is above this breaks.
    #[arg(long, value_name = "FRACTION", default_value_t = 0.01, value_parser = parse_fraction)]
    pub max_error_rate: f64,

    /// Open loop: send this many requests per second in total, on a fixed schedule shared by the
    /// clients, and measure latency from each request's scheduled send time (corrected for
    /// coordinated omission). Default: closed loop, each client sending as soon as its previous
    /// response is in.
    #[arg(long, value_name = "REQ_PER_S", value_parser = parse_rate)]
    pub rate: Option<f64>,
}

/// One route: a method and a path (with an optional query) under the base URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// The request method.
    pub method: Method,
    /// The origin-form request target: `/path` or `/path?query`.
    pub path: String,
}

impl Route {
    /// `GET path`.
    pub fn get(path: &str) -> Route {
        Route {
            method: Method::GET,
            path: path.to_owned(),
        }
    }
}

impl FromStr for Route {
    type Err = String;

    fn from_str(s: &str) -> Result<Route, String> {
        let mut words = s.split_whitespace();
        let (Some(method), Some(path), None) = (words.next(), words.next(), words.next()) else {
            return Err(format!("expected \"METHOD /path\", not {s:?}"));
        };
        // Methods are case-sensitive in HTTP, but nobody means a method called `get`.
        let method = Method::from_str(&method.to_ascii_uppercase())
            .map_err(|_| format!("{method:?} is not an HTTP method"))?;
        if !path.starts_with('/') {
            return Err(format!("the path must start with '/', not {path:?}"));
        }
        match path.parse::<http::uri::PathAndQuery>() {
            Ok(_) => Ok(Route {
                method,
                path: path.to_owned(),
            }),
            Err(err) => Err(format!("{path:?} is not a valid request path: {err}")),
        }
    }
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.method, self.path)
    }
}

fn parse_base_url(s: &str) -> Result<Uri, String> {
    let uri: Uri = s.parse().map_err(|err| format!("not a URL: {err}"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err("expected http://HOST:PORT or https://HOST:PORT".to_owned()),
    }
    if uri.authority().is_none() {
        return Err("expected http://HOST:PORT or https://HOST:PORT".to_owned());
    }
    // A path would leave unclear whether routes go under it; routes carry the paths.
    if uri.path_and_query().is_some_and(|pq| pq.as_str() != "/") {
        return Err(format!(
            "the URL must not have a path; give it as a route instead: -r \"GET {}\"",
            uri.path_and_query().map_or("/", |pq| pq.as_str())
        ));
    }
    Ok(uri)
}

fn parse_seconds(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    // A day bounds a typo such as -d 1e9 instead of failing later in Duration arithmetic.
    if !(0.0..=86_400.0).contains(&secs) {
        return Err("expected seconds between 0 and 86400".to_owned());
    }
    Ok(Duration::from_secs_f64(secs))
}

fn parse_step(s: &str) -> Result<Duration, String> {
    let duration = parse_seconds(s)?;
    if duration.is_zero() {
        return Err("a step must last longer than 0 s".to_owned());
    }
    Ok(duration)
}

fn parse_warmup(s: &str) -> Result<Duration, String> {
    parse_seconds(s)
}

fn parse_header(s: &str) -> Result<(HeaderName, HeaderValue), String> {
    let Some((name, value)) = s.split_once(':') else {
        return Err(format!("expected \"name: value\", not {s:?}"));
    };
    let name = HeaderName::from_str(name.trim()).map_err(|_| format!("{name:?} is not a header name"))?;
    let value =
        HeaderValue::from_str(value.trim()).map_err(|_| format!("{value:?} is not a header value"))?;
    Ok((name, value))
}

fn parse_body(s: &str) -> Result<Bytes, String> {
    match s.strip_prefix('@') {
        Some(path) => std::fs::read(path)
            .map(Bytes::from)
            .map_err(|err| format!("cannot read {path}: {err}")),
        None => Ok(Bytes::copy_from_slice(s.as_bytes())),
    }
}

fn parse_non_negative(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("expected a number ≥ 0, not {s:?}")),
    }
}

fn parse_fraction(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!(
            "expected a fraction between 0 and 1 (0.01 is 1 %), not {s:?}"
        )),
    }
}

fn parse_rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("expected requests per second > 0, not {s:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        options: Options,
    }

    fn parse(args: &[&str]) -> Result<Options, clap::Error> {
        Cli::try_parse_from(std::iter::once("load").chain(args.iter().copied())).map(|cli| cli.options)
    }

    #[test]
    fn routes_parse() {
        assert_eq!("GET /noop".parse(), Ok(Route::get("/noop")));
        assert_eq!(
            "post   /echo?x=1".parse(),
            Ok(Route {
                method: Method::POST,
                path: "/echo?x=1".to_owned()
            })
        );
        assert_eq!(Route::get("/a").to_string(), "GET /a");
        for bad in [
            "",
            "GET",
            "/noop",
            "GET noop",
            "GET /a /b",
            "G(T /a",
            "GET /a\u{7f}",
        ] {
            assert!(bad.parse::<Route>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn defaults() {
        let o = parse(&["http://127.0.0.1:8080"]).unwrap();
        assert_eq!(o.url, "http://127.0.0.1:8080/");
        assert!(o.routes.is_empty());
        assert_eq!(o.concurrency, [1, 8, 32]);
        assert_eq!(o.duration, Duration::from_secs(10));
        assert_eq!(o.warmup, Duration::from_secs(1));
        assert_eq!((o.max_p99_ms, o.max_error_rate, o.rate), (500.0, 0.01, None));
        assert!(!o.http2 && !o.json && !o.fail_on_break);
    }

    #[test]
    fn every_option() {
        let o = parse(&[
            "http://localhost:9000",
            "-r",
            "GET /noop",
            "--route",
            "POST /echo",
            "-c",
            "1,8,32,128",
            "-d",
            "0.25",
            "--warmup",
            "0",
            "-H",
            "X-Trace:  on ",
            "--token",
            "t0k",
            "--body",
            r#"{"a":1}"#,
            "--http2",
            "--json",
            "--fail-on-break",
            "--max-p99-ms",
            "0",
            "--max-error-rate",
            "0.5",
            "--rate",
            "1000",
        ])
        .unwrap();
        assert_eq!(o.routes, [Route::get("/noop"), "POST /echo".parse().unwrap()]);
        assert_eq!(o.concurrency, [1, 8, 32, 128]);
        assert_eq!(o.duration, Duration::from_millis(250));
        assert_eq!(o.warmup, Duration::ZERO);
        assert_eq!(
            o.headers,
            [(HeaderName::from_static("x-trace"), HeaderValue::from_static("on"))]
        );
        assert_eq!(o.token.as_deref(), Some("t0k"));
        assert_eq!(o.body.as_deref(), Some(&br#"{"a":1}"#[..]));
        assert!(o.http2 && o.json && o.fail_on_break);
        assert_eq!((o.max_p99_ms, o.max_error_rate, o.rate), (0.0, 0.5, Some(1000.0)));
    }

    #[test]
    fn https_with_a_ca_or_unverified() {
        let o = parse(&["https://h:1", "--cacert", "ca.pem", "--new-connection"]).unwrap();
        assert_eq!(o.url.scheme_str(), Some("https"));
        assert_eq!(o.cacert.as_deref(), Some(std::path::Path::new("ca.pem")));
        assert!(o.new_connection && !o.insecure);
        assert!(parse(&["https://h:1", "--insecure"]).unwrap().insecure);
    }

    #[test]
    fn http3_is_one_transport_of_its_own() {
        assert!(parse(&["https://h:1", "--http3", "--insecure"]).unwrap().http3);
        for other in ["--http2", "--ws", "--grpc", "--new-connection"] {
            assert!(parse(&["https://h:1", "--http3", other]).is_err(), "{other}");
        }
    }

    #[test]
    fn body_from_a_file() {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), b"[1,2]").unwrap();
        let o = parse(&["http://h:1", "--body", &format!("@{}", file.path().display())]);
        assert_eq!(o.unwrap().body.as_deref(), Some(&b"[1,2]"[..]));
        assert!(parse(&["http://h:1", "--body", "@/nonexistent/body.json"]).is_err());
    }

    #[test]
    fn rejects_nonsense() {
        for args in [
            &["ftp://h:1"][..],
            &["https://h:1", "--cacert", "ca.pem", "--insecure"],
            &["https://h:1", "--ws", "--new-connection"],
            &["h:1"],
            &["/noop"],
            &["http://h:1/noop"],
            &["http://h:1", "-c", "0"],
            &["http://h:1", "-c", "1,x"],
            &["http://h:1", "-d", "0"],
            &["http://h:1", "-d", "-1"],
            &["http://h:1", "--warmup", "nan"],
            &["http://h:1", "-H", "no colon"],
            &["http://h:1", "-H", "bad name: v"],
            &["http://h:1", "--max-error-rate", "2"],
            &["http://h:1", "--max-p99-ms", "-1"],
            &["http://h:1", "--rate", "0"],
            &["http://h:1", "-r", "GET"],
        ] {
            assert!(parse(args).is_err(), "{args:?}");
        }
    }
}
