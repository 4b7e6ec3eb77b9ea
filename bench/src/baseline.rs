//! The zero-hop baseline: the demo application's routes answered in-process by
//! hyper, under the Switchyard listener's settings and limits, with the same
//! status codes, content types and bodies byte for byte.
//!
//! Nothing here crosses a process boundary, so what separates this server from
//! `switchyard up` on the same route is the price of the hops.
//!
//! `demo.Noop` is also answered over WebSocket (`/ws`) and gRPC
//! (`switchyard.v1.Events` `Call` and `Session`, by content type on the same
//! port), as the listener serves them ([`events`]).

pub mod events;

use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Either, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

/// Largest `/payload/{size}`, as in the demo.
pub const MAX_PAYLOAD: u64 = 16 * 1024 * 1024;

// The listener's defaults, so that both servers parse under the same limits.
const MAX_HEADER_BYTES: usize = 16 * 1024;
const MAX_BODY_BYTES: usize = 1024 * 1024;
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long open connections get to finish once shutdown is asked for.
const GRACE: Duration = Duration::from_secs(5);

const JSON: &str = "application/json";
const PROBLEM_JSON: &str = "application/problem+json";
const OCTET_STREAM: &str = "application/octet-stream";

type Reply = Response<Full<Bytes>>;

/// Serves HTTP/1.1 and h2 (prior knowledge) on `listener` until `shutdown`
/// resolves, then stops accepting and gives open connections a few seconds.
pub async fn serve(listener: TcpListener, shutdown: impl Future<Output = ()>) {
    serve_with(listener, None, shutdown).await
}

/// [`serve`], over TLS when `tls` is given (ALPN h2 and http/1.1), as the
/// listener serves `[listener.tls]`: the handshake in the connection's task.
pub async fn serve_with(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: impl Future<Output = ()>,
) {
    let tls = tls.map(tokio_rustls::TlsAcceptor::from);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_HEADER_BYTES);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(MAX_HEADER_BYTES as u32);
    let builder = Arc::new(builder);
    let payloads = Arc::new(Payloads::default());
    let graceful = GracefulShutdown::new();

    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(_) => {
                        // EMFILE and friends: back off instead of spinning.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                // As the listener does: small responses must not wait for Nagle.
                let _ = stream.set_nodelay(true);
                let builder = builder.clone();
                let payloads = payloads.clone();
                let watcher = graceful.watcher();
                let tls = tls.clone();
                tokio::spawn(async move {
                    let grpc = events::GrpcBaseline::service();
                    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let (payloads, mut grpc) = (payloads.clone(), grpc.clone());
                        async move {
                            let is_grpc = req
                                .headers()
                                .get(header::CONTENT_TYPE)
                                .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
                            if is_grpc {
                                use tonic::codegen::Service;
                                return grpc.call(req).await.map(|r| r.map(Either::Right));
                            }
                            let reply = if req.uri().path() == "/ws" && events::is_upgrade(&req) {
                                events::upgrade(req)
                            } else {
                                let Ok(reply) = handle(payloads, req).await;
                                reply
                            };
                            Ok(reply.map(Either::Left))
                        }
                    });
                    // A client hanging up mid-request (or mid-handshake) is
                    // not the server's problem.
                    match tls {
                        None => {
                            let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
                            let _ = watcher.watch(conn.into_owned()).await;
                        }
                        Some(acceptor) => {
                            let Ok(stream) = acceptor.accept(stream).await else { return };
                            let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
                            let _ = watcher.watch(conn.into_owned()).await;
                        }
                    }
                });
            }
        }
    }
    drop(listener);
    let _ = tokio::time::timeout(GRACE, graceful.shutdown()).await;
}

enum Route {
    Noop,
    Echo,
    Hello(String),
    Payload(String),
    /// A file of [`set_static_dir`]'s directory, by its name.
    Static(String),
}

/// Where `/static/{name}` reads its files (none: no such route).
static STATIC_DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

/// Serves `/static/{name}` from `dir`, as a `[[static]]` mount of the same
/// directory would: each request reads the file (`tokio::fs::read`), the
/// simplest an in-process server does, to compare the listener's mounts
/// with (docs/web.md). One path segment; no index, ranges or validators.
pub fn set_static_dir(dir: std::path::PathBuf) {
    let _ = STATIC_DIR.set(dir);
}

impl Route {
    /// The route of `path` and the one method it answers, as the listener's
    /// route table would match the demo's routes.
    fn of(path: &str) -> Option<(Route, Method)> {
        let one_segment = |rest: &str| {
            (!rest.is_empty() && !rest.contains('/')).then(|| switchyard_listener::percent_decode(rest))
        };
        match path {
            "/noop" => Some((Route::Noop, Method::GET)),
            "/echo" => Some((Route::Echo, Method::POST)),
            _ => {
                if let Some(name) = path.strip_prefix("/hello/").and_then(one_segment) {
                    Some((Route::Hello(name), Method::GET))
                } else if let Some(name) = path
                    .strip_prefix("/static/")
                    .filter(|_| STATIC_DIR.get().is_some())
                    .and_then(one_segment)
                    .filter(|n| !n.starts_with('.'))
                {
                    Some((Route::Static(name), Method::GET))
                } else {
                    let size = path.strip_prefix("/payload/").and_then(one_segment)?;
                    Some((Route::Payload(size), Method::GET))
                }
            }
        }
    }
}

async fn handle(payloads: Arc<Payloads>, req: Request<Incoming>) -> Result<Reply, Infallible> {
    let Some((route, method)) = Route::of(req.uri().path()) else {
        return Ok(problem(StatusCode::NOT_FOUND, "no route matches this path"));
    };
    if req.method() != method {
        let mut reply = problem(StatusCode::METHOD_NOT_ALLOWED, "method not allowed for this path");
        if let Ok(allow) = HeaderValue::from_str(method.as_str()) {
            reply.headers_mut().insert(header::ALLOW, allow);
        }
        return Ok(reply);
    }
    Ok(match route {
        Route::Noop => reply(JSON, Bytes::from_static(br#"{"ok":true}"#)),
        Route::Echo => echo(req).await,
        Route::Hello(name) => {
            #[derive(serde::Serialize)]
            struct Greeting {
                message: String,
            }
            let greeting = Greeting {
                message: format!("Hello, {name}!"),
            };
            match serde_json::to_vec(&greeting) {
                Ok(body) => reply(JSON, body),
                Err(_) => problem(StatusCode::INTERNAL_SERVER_ERROR, "the handler failed"),
            }
        }
        Route::Payload(size) => match size.parse::<u64>() {
            // The demo's messages: serde_urlencoded reports the integer parse error as is.
            Err(err) => problem(StatusCode::UNPROCESSABLE_ENTITY, &err.to_string()),
            Ok(size) if size > MAX_PAYLOAD => problem(
                StatusCode::BAD_REQUEST,
                &format!("size must be at most {MAX_PAYLOAD} bytes"),
            ),
            Ok(size) => reply(OCTET_STREAM, payloads.get(size as usize)),
        },
        Route::Static(name) => match STATIC_DIR.get() {
            Some(dir) => match tokio::fs::read(dir.join(name)).await {
                Ok(bytes) => reply(OCTET_STREAM, bytes),
                Err(_) => problem(StatusCode::NOT_FOUND, "no such file"),
            },
            None => problem(StatusCode::NOT_FOUND, "no route matches this path"),
        },
    })
}

async fn echo(req: Request<Incoming>) -> Reply {
    let too_large = || {
        problem(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("request body is larger than {MAX_BODY_BYTES} bytes"),
        )
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > MAX_BODY_BYTES as u64) {
        return too_large();
    }
    let body = match Limited::new(req.into_body(), MAX_BODY_BYTES).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(err) if err.is::<http_body_util::LengthLimitError>() => return too_large(),
        Err(_) => return problem(StatusCode::BAD_REQUEST, "could not read the request body"),
    };
    let value: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(value) => value,
        Err(err) => {
            return problem(StatusCode::BAD_REQUEST, &format!("body is not valid JSON: {err}"));
        }
    };
    match serde_json::to_vec(&value) {
        Ok(body) => reply(JSON, body),
        Err(_) => problem(StatusCode::INTERNAL_SERVER_ERROR, "the handler failed"),
    }
}

/// Bodies for `/payload/{size}`: one buffer of `x`, grown (in powers of two)
/// to the largest size asked for so far. Every reply is a slice of it, so
/// repeated requests neither copy nor allocate, whatever the mix of sizes,
/// and memory stays bounded by [`MAX_PAYLOAD`].
#[derive(Default)]
struct Payloads {
    filled: Mutex<Bytes>,
}

impl Payloads {
    fn get(&self, size: usize) -> Bytes {
        let mut filled = self.filled.lock().unwrap_or_else(PoisonError::into_inner);
        if filled.len() < size {
            let capacity = size.next_power_of_two().min(MAX_PAYLOAD as usize);
            *filled = Bytes::from(vec![b'x'; capacity]);
        }
        filled.slice(..size)
    }
}

fn reply(content_type: &'static str, body: impl Into<Bytes>) -> Reply {
    let mut reply = Response::new(Full::new(body.into()));
    reply
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    reply
}

/// The same problem+json (RFC 9457) body Switchyard synthesizes: built with
/// `json!` as `switchyard_proto::problem` does, so the member order matches
/// whichever serde_json features the workspace enables.
fn problem(status: StatusCode, detail: &str) -> Reply {
    let body = serde_json::json!({
        "type": "about:blank",
        "title": title(status),
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut reply = reply(PROBLEM_JSON, body.to_string());
    *reply.status_mut() = status;
    reply
}

/// Switchyard's titles follow RFC 9110, where `http`'s reason phrases for 413
/// and 422 still follow RFC 7231.
fn title(status: StatusCode) -> &'static str {
    match status.as_u16() {
        413 => "Content Too Large",
        422 => "Unprocessable Content",
        _ => status.canonical_reason().unwrap_or("Error"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper_util::client::legacy::Client;
    use hyper_util::client::legacy::connect::HttpConnector;
    use serde_json::json;
    use tokio::sync::oneshot;
    use tokio::task::JoinHandle;

    struct Server {
        base: String,
        stop: oneshot::Sender<()>,
        task: JoinHandle<()>,
    }

    async fn start() -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, async {
            let _ = stopped.await;
        }));
        Server { base, stop, task }
    }

    type TestClient = Client<HttpConnector, Full<Bytes>>;

    /// Status, content type and body of one request.
    async fn call(
        client: &TestClient,
        method: Method,
        url: String,
        body: &'static [u8],
    ) -> (StatusCode, String, Bytes) {
        let req = Request::builder()
            .method(method)
            .uri(url)
            .body(Full::new(Bytes::from_static(body)))
            .unwrap();
        let res = client.request(req).await.unwrap();
        let status = res.status();
        let content_type = res
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        let body = res.into_body().collect().await.unwrap().to_bytes();
        (status, content_type, body)
    }

    fn problem_json(status: u16, title: &str, detail: &str) -> serde_json::Value {
        json!({ "type": "about:blank", "title": title, "status": status, "detail": detail })
    }

    #[tokio::test]
    async fn routes_answer_like_the_demo() {
        let server = start().await;
        let client: TestClient = Client::builder(TokioExecutor::new()).build_http();
        let get = |path: &str| call(&client, Method::GET, format!("{}{path}", server.base), b"");
        let post = |path: &str, body: &'static [u8]| {
            call(&client, Method::POST, format!("{}{path}", server.base), body)
        };
        let ok = |ct: &str, body: &[u8]| (StatusCode::OK, ct.to_owned(), Bytes::copy_from_slice(body));

        assert_eq!(get("/noop").await, ok(JSON, br#"{"ok":true}"#));

        assert_eq!(
            post(
                "/echo",
                br#" { "a" : [1, 2.5], "b": {"c": null, "d": "\u00e9"} } "#
            )
            .await,
            ok(JSON, r#"{"a":[1,2.5],"b":{"c":null,"d":"é"}}"#.as_bytes())
        );

        assert_eq!(get("/hello/Ada").await, ok(JSON, br#"{"message":"Hello, Ada!"}"#));
        assert_eq!(
            get("/hello/J%C3%BCrgen%22").await,
            ok(JSON, r#"{"message":"Hello, Jürgen\"!"}"#.as_bytes())
        );

        assert_eq!(get("/payload/1000").await, ok(OCTET_STREAM, &[b'x'; 1000]));
        assert_eq!(get("/payload/0").await, ok(OCTET_STREAM, b""));
        // Smaller than the cached buffer, then larger: both exact.
        assert_eq!(get("/payload/10").await, ok(OCTET_STREAM, &[b'x'; 10]));
        let (status, _, body) = get("/payload/100000").await;
        assert_eq!((status, body.len()), (StatusCode::OK, 100_000));
        assert!(body.iter().all(|&b| b == b'x'));

        let problems = [
            (
                post("/echo", b"{nope").await,
                problem_json(
                    400,
                    "Bad Request",
                    "body is not valid JSON: key must be a string at line 1 column 2",
                ),
            ),
            (
                get("/payload/16777217").await,
                problem_json(400, "Bad Request", "size must be at most 16777216 bytes"),
            ),
            (
                get("/payload/many").await,
                problem_json(422, "Unprocessable Content", "invalid digit found in string"),
            ),
            (
                get("/nope").await,
                problem_json(404, "Not Found", "no route matches this path"),
            ),
            (
                get("/hello/").await,
                problem_json(404, "Not Found", "no route matches this path"),
            ),
            (
                get("/hello/a/b").await,
                problem_json(404, "Not Found", "no route matches this path"),
            ),
            (
                get("/echo").await,
                problem_json(405, "Method Not Allowed", "method not allowed for this path"),
            ),
        ];
        for ((status, content_type, body), expected) in problems {
            assert_eq!(status.as_u16(), expected["status"], "{expected}");
            assert_eq!(content_type, PROBLEM_JSON, "{expected}");
            let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(body, expected);
        }

        server.stop.send(()).unwrap();
        drop(client);
        server.task.await.unwrap();
    }

    #[tokio::test]
    async fn speaks_h2_and_stops_on_shutdown() {
        let server = start().await;
        let client: TestClient = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .build_http();
        let req = Request::get(format!("{}/noop", server.base))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let res = client.request(req).await.unwrap();
        assert_eq!(res.version(), http::Version::HTTP_2);
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(
            res.into_body().collect().await.unwrap().to_bytes(),
            &br#"{"ok":true}"#[..]
        );

        // The client keeps its connection open: shutdown must close it, not wait it out.
        server.stop.send(()).unwrap();
        tokio::time::timeout(GRACE / 2, server.task)
            .await
            .expect("serve returned before the grace period")
            .unwrap();
    }
}
