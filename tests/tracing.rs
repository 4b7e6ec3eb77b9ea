//! W3C trace context through every hop, and `Server-Timing` (decision 0058).

mod common;

use common::{Group, PATIENCE, eventually, request_with};

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[test]
fn a_traceparent_reaches_every_hop_and_the_manager_log() {
    let group = Group::builder("trace-hops")
        .env("SWITCHYARD_LOG", "debug")
        .config("[log]\naccess = \"stdout\"\n")
        .start();
    // The demo's /sleep logs a line from its handler.
    let reply = request_with(
        group.addr,
        "GET",
        "/sleep/1",
        &[("traceparent", TRACEPARENT)],
        b"",
    )
    .unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(reply.header("server-timing").is_none(), "off by default");
    assert!(reply.header("traceparent").is_none(), "off by default");
    // Listener, broker, router, manager host and the handler itself, and
    // the access line, all name the trace.
    let wanted = [
        ("listener[", "answered"),
        ("broker[", "request to the router"),
        ("router[", "request routed"),
        ("payload[", "request to the plugin"),
        ("payload[", "sleeping 1 ms"),
        // The job's line from the worker thread that ran it.
        ("payload[", "job done"),
        ("listener[", "\"GET /sleep/1\" 200"),
    ];
    eventually("a line with the trace id from every hop", PATIENCE, || {
        let lines = group.lines_with(TRACE_ID);
        let missing: Vec<_> = wanted
            .iter()
            .filter(|(process, what)| !lines.iter().any(|l| l.starts_with(process) && l.contains(what)))
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!("missing {missing:?} in {lines:#?}"))
        }
    });
}

/// A job in a worker process: the worker's own line about it (a panic)
/// and the manager's line when its worker dies under it name the trace of
/// the request that submitted it.
#[test]
fn a_jobs_lines_in_worker_processes_name_the_trace() {
    let group = Group::builder("trace-jobs").start();
    let reply = request_with(
        group.addr,
        "GET",
        "/crash/panic",
        &[("traceparent", TRACEPARENT)],
        b"",
    )
    .unwrap();
    assert_eq!(reply.status, 500, "{}", reply.text());
    eventually("the worker's line about the panicked job", PATIENCE, || {
        let lines = group.lines_with(TRACE_ID);
        if lines
            .iter()
            .any(|l| l.starts_with("compute[") && l.contains("job failed") && l.contains("panicked"))
        {
            Ok(())
        } else {
            Err(format!("no worker line in {lines:#?}"))
        }
    });

    const ABORTED: &str = "0af7651916cd43dd8448eb211c80319c";
    let reply = request_with(
        group.addr,
        "GET",
        "/crash/abort",
        &[("traceparent", &format!("00-{ABORTED}-b7ad6b7169203331-01"))],
        b"",
    )
    .unwrap();
    assert_eq!(reply.status, 502, "{}", reply.text());
    eventually(
        "the manager's line about the job its worker died under",
        PATIENCE,
        || {
            let lines = group.lines_with(ABORTED);
            if lines
                .iter()
                .any(|l| l.starts_with("compute[") && l.contains("died while running the job"))
            {
                Ok(())
            } else {
                Err(format!("no line in {lines:#?}"))
            }
        },
    );
}

#[test]
fn server_timing_and_the_reply_traceparent_when_configured() {
    let group = Group::builder("trace-timing")
        .config("[tracing]\nserver_timing = true\n")
        .start();
    let reply = request_with(
        group.addr,
        "GET",
        "/hello/t",
        &[("traceparent", TRACEPARENT)],
        b"",
    )
    .unwrap();
    assert_eq!(reply.status, 200);
    let back = reply.header("traceparent").expect("a traceparent in the reply");
    assert!(back.starts_with(&format!("00-{TRACE_ID}-")), "{back}");
    assert!(back.ends_with("-01"), "the client's flags are kept: {back}");
    assert_ne!(back, TRACEPARENT, "the listener's own span");
    let timing = reply.header("server-timing").expect("Server-Timing");
    let parts: Vec<(&str, f64)> = timing
        .split(", ")
        .map(|p| {
            let (name, dur) = p.split_once(";dur=").unwrap_or_else(|| panic!("{timing}"));
            (name, dur.parse().unwrap())
        })
        .collect();
    let get = |name: &str| parts.iter().find(|(n, _)| *n == name).map(|(_, d)| *d);
    let (total, manager, hops) = (
        get("total").unwrap(),
        get("manager").unwrap(),
        get("hops").unwrap(),
    );
    assert!(total >= manager && manager >= 0.0, "{timing}");
    assert!((total - manager - hops).abs() < 0.01, "{timing}");
    // No traceparent in: one is made, a new trace.
    let made = request_with(group.addr, "GET", "/hello/u", &[], b"").unwrap();
    let tp = made.header("traceparent").expect("a made traceparent");
    assert_eq!(tp.len(), 55, "{tp}");
    assert!(!tp.contains(TRACE_ID));
    // A malformed one is replaced, not carried.
    let bad = request_with(
        group.addr,
        "GET",
        "/hello/v",
        &[("traceparent", "00-zz-yy-01")],
        b"",
    )
    .unwrap();
    assert_eq!(bad.status, 200);
    assert!(!bad.header("traceparent").unwrap().contains("zz"));
}
