//! The request path: demo routes served by manager processes through the
//! listener, broker and router processes.

mod common;

use common::*;
use std::io::{Read, Write};

#[test]
fn demo_routes_are_served_by_separate_processes() {
    let g = Group::start("pipeline");

    let r = get(g.addr, "/noop").unwrap();
    assert_eq!((r.status, r.text().as_str()), (200, r#"{"ok":true}"#));
    assert_eq!(r.header("content-type"), Some("application/json"));

    let r = get(g.addr, "/hello/Ada").unwrap();
    assert_eq!(
        (r.status, r.text().as_str()),
        (200, r#"{"message":"Hello, Ada!"}"#)
    );
    let r = get(g.addr, "/hello/J%C3%BCrgen").unwrap();
    assert_eq!(r.text(), r#"{"message":"Hello, Jürgen!"}"#);

    let r = request(g.addr, "POST", "/echo", br#"{"nested":{"list":[1,2,3]},"s":"x"}"#).unwrap();
    assert_eq!(
        (r.status, r.text().as_str()),
        (200, r#"{"nested":{"list":[1,2,3]},"s":"x"}"#)
    );

    for size in [0usize, 1, 4096, 65_536, 1 << 20, 16 << 20] {
        let r = get(g.addr, &format!("/payload/{size}")).unwrap();
        assert_eq!(r.status, 200, "size {size}");
        assert_eq!(r.header("content-type"), Some("application/octet-stream"));
        assert_eq!(r.body.len(), size);
        assert!(r.body.iter().all(|&b| b == b'x'));
    }
    let r = get(g.addr, &format!("/payload/{}", (16 << 20) + 1)).unwrap();
    // Past `maximum` in the event's schema: refused by validation, as documented.
    assert_eq!(r.status, 422);

    let r = get(g.addr, "/health").unwrap();
    assert_eq!(r.status, 200);
    let r = get(g.addr, "/ready").unwrap();
    assert_eq!(r.status, 200);
    let ready: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(ready["ready"], true);

    // Eleven processes, each its own pid: the request above crossed them
    // (compute's two worker processes are listed after the managers).
    let status = g.status();
    let processes = status["processes"].as_array().unwrap();
    let names: Vec<&str> = processes.iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "supervisor",
            "broker",
            "router",
            "store",
            "scheduler",
            "basics",
            "payload",
            "compute",
            "ticker",
            "compute",
            "compute",
            "listener"
        ]
    );
    let mut pids: Vec<u64> = processes.iter().map(|p| p["pid"].as_u64().unwrap()).collect();
    assert!(processes.iter().all(|p| p["state"] == "running"), "{status}");
    pids.sort_unstable();
    pids.dedup();
    assert_eq!(pids.len(), 12, "every process has its own pid: {status}");
    assert_ne!(g.pid_of("listener"), g.pid_of("basics"));
}

#[test]
fn unknown_paths_and_methods_are_answered_at_once() {
    let g = Group::start("routes");
    let r = get(g.addr, "/no/such/route").unwrap();
    assert_eq!(r.status, 404);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    let r = request(g.addr, "DELETE", "/noop", b"").unwrap();
    assert_eq!(r.status, 405);
    // HEAD is served by GET's route, and OPTIONS everywhere (docs/http.md).
    assert_eq!(r.header("allow"), Some("GET, HEAD, OPTIONS"));
    let r = get(g.addr, "/echo").unwrap();
    assert_eq!(r.status, 405);
}

#[test]
fn http2_is_served_on_the_same_port() {
    let g = Group::start("h2");
    let mut s = std::net::TcpStream::connect(g.addr).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    // Client preface plus an empty SETTINGS frame (h2c with prior knowledge).
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .unwrap();
    let mut head = [0u8; 9];
    s.read_exact(&mut head).unwrap();
    assert_eq!(head[3], 0x4, "server answers with a SETTINGS frame");
}

#[test]
fn many_concurrent_clients_get_their_own_answers() {
    let g = Group::start("concurrency");
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let addr = g.addr;
            std::thread::spawn(move || {
                for i in 0..50 {
                    let name = format!("c{t}-{i}");
                    let r = get(addr, &format!("/hello/{name}")).unwrap();
                    assert_eq!(r.status, 200);
                    assert_eq!(r.text(), format!(r#"{{"message":"Hello, {name}!"}}"#));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn switchyard_bench_steps_load_against_the_running_group() {
    let g = Group::start("bench-cmd");
    // HTTP/1.1 on a route; WebSocket and gRPC calling the same event.
    for transport in [&["-r", "GET /noop"][..], &["--ws"], &["--grpc"]] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
            .args([
                "bench",
                &format!("http://{}", g.addr),
                "-c",
                "1,2",
                "-d",
                "0.3",
                "--warmup",
                "0.1",
                "--json",
            ])
            .args(transport)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{transport:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let steps = report["steps"].as_array().expect("steps");
        assert_eq!(steps.len(), 2);
        for step in steps {
            assert!(step["requests"].as_u64().unwrap() > 0, "{transport:?}: {step}");
            assert_eq!(
                step["requests"], step["status"]["2xx"],
                "{transport:?}: every request was a 2xx: {step}"
            );
        }
    }
}
