//! The load generator against real servers on ephemeral ports: the in-process
//! baseline, and a small server with an OpenAPI document, a `/ready` and a
//! token check. Steps last a fraction of a second; assertions are on counts
//! and on what the report computes from them, never on timing figures.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use switchyard_bench::load::{self, Options, Report, RoutesFrom};
use tokio::net::TcpListener;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    options: Options,
}

fn options(url: &str, args: &[&str]) -> Options {
    let argv = ["load", url].into_iter().chain(args.iter().copied());
    Cli::try_parse_from(argv).unwrap().options
}

/// The baseline on an ephemeral port, served until the test's runtime ends.
async fn baseline() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(switchyard_bench::baseline::serve(
        listener,
        std::future::pending(),
    ));
    url
}

/// Thresholds no debug build on a busy machine can cross, for tests that are not about breaks.
const LENIENT: [&str; 4] = ["--max-p99-ms", "1e9", "--max-error-rate", "1"];

fn args<'a>(mine: &[&'a str]) -> Vec<&'a str> {
    mine.iter().copied().chain(LENIENT).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_loop_steps_against_the_baseline() {
    let url = baseline().await;
    let report = load::run(options(
        &url,
        &args(&["-c", "1,4", "-d", "0.3", "--warmup", "0.1"]),
    ))
    .await
    .unwrap();

    // No -r and no /openapi.json on the baseline: GET /noop.
    assert_eq!(
        (report.routes.as_slice(), report.routes_from),
        (&["GET /noop".to_owned()][..], RoutesFrom::Default)
    );
    assert_eq!(report.protocol, "HTTP/1.1");
    assert!(
        report
            .latency_note
            .contains("not corrected for coordinated omission")
    );
    assert_eq!(
        report.steps.iter().map(|s| s.concurrency).collect::<Vec<_>>(),
        [1, 4]
    );
    for step in &report.steps {
        assert!(step.requests > 0, "{step:?}");
        assert_eq!(step.status.ok, step.requests, "{step:?}");
        assert_eq!(step.status.errors(), 0, "{step:?}");
        assert_eq!(step.error_rate, 0.0);
        assert!(step.latency_ms.is_some());
        assert!(step.rps > 0.0);
        // Answered, whatever the status: the baseline need not serve /ready.
        assert!(
            step.ready.status.is_some() && step.ready.error.is_none(),
            "{:?}",
            step.ready
        );
    }
    assert_eq!(report.break_at, None);

    // The JSON report reads back as the same report.
    let json = serde_json::to_string(&report).unwrap();
    assert_eq!(serde_json::from_str::<Report>(&json).unwrap(), report);
    let value: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(value["steps"][0]["status"]["2xx"], report.steps[0].requests);
    assert!(value.get("break").is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_go_round_robin_and_404_counts_as_an_error() {
    let url = baseline().await;
    let opts = options(
        &url,
        &args(&[
            "-r",
            "GET /noop",
            "-r",
            "GET /nope",
            "-r",
            "POST /echo",
            "--body",
            r#"{"a":[1,2]}"#,
            "-c",
            "3",
            "-d",
            "0.3",
            "--warmup",
            "0",
        ]),
    );
    let report = load::run(opts).await.unwrap();
    assert_eq!(report.routes, ["GET /noop", "GET /nope", "POST /echo"]);
    assert_eq!(report.routes_from, RoutesFrom::Options);
    let step = &report.steps[0];
    let c = step.status;
    assert!(c.ok > 0 && c.client_error > 0, "{step:?}");
    // /echo answered 2xx, so it got the JSON body; only /nope is a 4xx.
    assert_eq!(c.ok + c.client_error, step.requests, "{step:?}");
    assert_eq!(
        (c.server_error, c.too_many_requests, c.transport, c.other),
        (0, 0, 0, 0)
    );
    // Round-robin: each client's requests take the routes in turn, so a third of
    // them, give or take one per client, are /nope.
    assert!((3 * c.client_error).abs_diff(step.requests) <= 3 * 3, "{step:?}");
    // A 404 is a failed request: a run against a wrong route must not look
    // healthy (decision 0063). It keeps its own 4xx column.
    assert_eq!(step.status.errors(), c.client_error, "{step:?}");
    assert!(step.error_rate > 0.25, "{step:?}");

    let only_404 = options(
        &url,
        &args(&["-r", "GET /nope", "-c", "2", "-d", "0.2", "--warmup", "0"]),
    );
    let step = &load::run(only_404).await.unwrap().steps[0];
    assert!(step.requests > 0);
    assert_eq!((step.status.ok, step.status.client_error), (0, step.requests));
    assert_eq!(step.error_rate, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_step_breaks_a_zero_p99_threshold() {
    let url = baseline().await;
    let opts = options(
        &url,
        &["-c", "1,2", "-d", "0.2", "--warmup", "0", "--max-p99-ms", "0"],
    );
    let report = load::run(opts).await.unwrap();
    let b = report.break_at.as_ref().unwrap();
    assert_eq!((b.step, b.concurrency), (0, 1));
    assert_eq!(b.reasons.len(), 1);
    assert!(b.reasons[0].starts_with("p99 "), "{b:?}");
    assert!(load::render_table(&report).contains("break: 1 client (p99 "));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_with_one_connection_per_client() {
    let url = baseline().await;
    let opts = options(
        &url,
        &args(&["--http2", "-c", "1,4", "-d", "0.2", "--warmup", "0"]),
    );
    let report = load::run(opts).await.unwrap();
    assert_eq!(report.protocol, "h2");
    for step in &report.steps {
        assert!(step.requests > 0, "{step:?}");
        assert_eq!(step.status.ok, step.requests, "{step:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_sends_on_schedule() {
    let url = baseline().await;
    // 100 req/s for 0.5 s: slots 0..50, shared by the two clients.
    let opts = options(
        &url,
        &args(&["--rate", "100", "-c", "1,2", "-d", "0.5", "--warmup", "0"]),
    );
    let report = load::run(opts).await.unwrap();
    assert_eq!(report.rate, Some(100.0));
    assert!(report.latency_note.contains("corrected for coordinated omission"));
    assert!(!report.latency_note.contains("not corrected"));
    // A fixed rate cannot saturate: not even a question.
    assert_eq!(report.saturation, None);
    assert!(load::render_table(&report).contains("saturation: not applicable"));
    for step in &report.steps {
        // Every slot before the deadline is either finished or counted as unfinished.
        assert_eq!(step.requests + step.unfinished, 50, "{step:?}");
        assert_eq!(step.status.ok, step.requests, "{step:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_from_openapi_with_token_headers_and_ready() {
    let url = serve_app().await;

    let opts = options(
        &url,
        &args(&[
            "--token",
            "s3cret",
            "-H",
            "x-tenant: blue",
            "-c",
            "2",
            "-d",
            "0.2",
            "--warmup",
            "0",
        ]),
    );
    let report = load::run(opts).await.unwrap();
    assert_eq!(report.routes_from, RoutesFrom::Openapi);
    assert_eq!(report.routes, ["GET /a", "GET /ready"]);
    let step = &report.steps[0];
    assert!(step.requests > 0);
    // The app answers 401 without the token and 400 without the header: all 2xx means both went.
    assert_eq!(step.status.ok, step.requests, "{step:?}");
    assert_eq!((step.ready.status, step.ready.ready), (Some(200), Some(false)));

    let without_token = options(
        &url,
        &args(&["-r", "GET /a", "-c", "1", "-d", "0.1", "--warmup", "0"]),
    );
    let step = &load::run(without_token).await.unwrap().steps[0];
    assert_eq!(step.status.client_error, step.requests);
}

/// [`app`] on an ephemeral port, served until the test's runtime ends.
async fn serve_app() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), hyper::service::service_fn(app)),
            );
        }
    });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_server_shows_in_the_percentiles_and_breaks() {
    let url = serve_app().await;
    let opts = options(
        &url,
        &[
            "-r",
            "GET /stall",
            "-c",
            "2",
            "-d",
            "0.3",
            "--warmup",
            "0",
            "--max-p99-ms",
            "100",
        ],
    );
    let report = load::run(opts).await.unwrap();
    let step = &report.steps[0];
    // Nothing finished, and yet the step is not empty: both requests waited the
    // whole step, and their waits so far are the latency figures.
    assert_eq!((step.requests, step.unfinished), (0, 2), "{step:?}");
    assert!(step.latency_ms.is_some());
    let b = report.break_at.as_ref().unwrap();
    assert_eq!(b.step, 0);
    assert!(b.reasons[0].starts_with("p99 "), "{b:?}");
    assert!(load::render_table(&report).contains("note: at 2 clients 2 requests were not finished"));
}

/// An application with an OpenAPI document that needs a bearer token and a
/// header, and a route that never answers.
async fn app(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let reply = |status: StatusCode, body: &'static str| {
        let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
        *response.status_mut() = status;
        Ok(response)
    };
    if req.uri().path() == "/stall" {
        return std::future::pending().await;
    }
    let headers = req.headers();
    if headers.get("authorization").is_none_or(|v| v != "Bearer s3cret") {
        return reply(StatusCode::UNAUTHORIZED, "");
    }
    if headers.get("x-tenant").is_none_or(|v| v != "blue") {
        return reply(StatusCode::BAD_REQUEST, "");
    }
    match req.uri().path() {
        "/openapi.json" => reply(
            StatusCode::OK,
            r#"{"paths": {"/a": {"get": {}}, "/b/{id}": {"get": {}}, "/c": {"post": {}}, "/ready": {"get": {}}}}"#,
        ),
        "/a" => reply(StatusCode::OK, "a"),
        "/ready" => reply(StatusCode::OK, r#"{"ready": false}"#),
        _ => reply(StatusCode::NOT_FOUND, ""),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_not_there_fails_the_run() {
    // A port that was free a moment ago.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let err = load::run(options(&url, &["-d", "0.1"])).await.unwrap_err();
    assert!(format!("{err:#}").contains("cannot reach"), "{err:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_prints_json_and_exits_2_on_a_break() {
    let url = baseline().await;
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_switchyard-load"))
        .args([
            &url,
            "-c",
            "1",
            "-d",
            "0.2",
            "--warmup",
            "0",
            "--json",
            "--max-p99-ms",
            "0",
            "--fail-on-break",
        ])
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Report = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report.break_at.map(|b| b.step), Some(0));
    assert!(report.steps[0].requests > 0);

    // Without --fail-on-break the same break is only reported.
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_switchyard-load"))
        .args([&url, "-c", "1", "-d", "0.1", "--warmup", "0", "--max-p99-ms", "0"])
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(output.status.code(), Some(0));
    let table = String::from_utf8(output.stdout).unwrap();
    assert!(table.contains("| clients | requests | req/s |"), "{table}");
    assert!(table.contains("break: 1 client"), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_transports_call_the_baselines_ws_and_grpc_endpoints() {
    let url = baseline().await;
    for (flag, protocol) in [
        ("--ws", "WebSocket"),
        ("--grpc", "gRPC"),
        ("--grpc-bidi", "gRPC bidi (Session)"),
    ] {
        let report = load::run(options(
            &url,
            &args(&[flag, "-c", "1,4", "-d", "0.3", "--warmup", "0.1"]),
        ))
        .await
        .unwrap();
        assert_eq!(report.protocol, protocol);
        for step in &report.steps {
            assert!(step.requests > 0, "{flag}: {step:?}");
            assert_eq!(step.status.ok, step.requests, "{flag}: {step:?}");
        }
        // An event type the baseline does not answer is a 404: every request
        // of the run failed, and the error rate says so.
        let report = load::run(options(
            &url,
            &args(&[
                flag,
                "--event",
                "demo.Nope",
                "-c",
                "1",
                "-d",
                "0.2",
                "--warmup",
                "0",
            ]),
        ))
        .await
        .unwrap();
        let step = &report.steps[0];
        assert!(step.requests > 0 && step.status.ok == 0, "{flag}: {step:?}");
        assert_eq!(step.status.errors(), step.requests, "{flag}: {step:?}");
        assert_eq!(step.error_rate, 1.0, "{flag}: {step:?}");
    }
}
