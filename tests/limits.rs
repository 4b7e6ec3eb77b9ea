//! Bad input gets a specific status and the group keeps serving.

mod common;

use common::*;
use std::io::{Read, Write};

const CONFIG: &str = r#"
[listener]
max_body_bytes = 1024
header_read_timeout_ms = 500
"#;

#[test]
fn malformed_requests_get_400() {
    let g = Group::builder("malformed").config(CONFIG).start();
    for bad in [
        &b"GARBAGE\r\n\r\n"[..],
        b"GET /noop HTTP/1.1\r\nno colon here\r\n\r\n",
        b"\x00\x01\x02\x03\r\n\r\n",
    ] {
        let r = raw(g.addr, bad).unwrap();
        assert_eq!(r.status, 400, "for {bad:?}");
    }
    assert_eq!(get(g.addr, "/noop").unwrap().status, 200);
}

#[test]
fn oversized_bodies_get_413() {
    let g = Group::builder("body").config(CONFIG).start();
    let r = request(g.addr, "POST", "/echo", &[b' '; 2048]).unwrap();
    assert_eq!(r.status, 413);
    // Without a length up front: chunked, caught while reading.
    let mut req =
        b"POST /echo HTTP/1.1\r\nhost: t\r\nconnection: close\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..4 {
        req.extend_from_slice(b"200\r\n");
        req.extend_from_slice(&[b' '; 0x200]);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"0\r\n\r\n");
    let r = raw(g.addr, &req).unwrap();
    assert_eq!(r.status, 413);
    // Just under the limit is fine.
    let mut body = b"[".to_vec();
    body.extend(std::iter::repeat_n(b' ', 1000));
    body.push(b']');
    assert_eq!(request(g.addr, "POST", "/echo", &body).unwrap().status, 200);
}

#[test]
fn oversized_headers_are_refused() {
    let g = Group::builder("headers").config(CONFIG).start();
    let big = "a".repeat(64 * 1024);
    let req = format!("GET /noop HTTP/1.1\r\nhost: t\r\nx-big: {big}\r\nconnection: close\r\n\r\n");
    let r = raw(g.addr, req.as_bytes()).unwrap();
    assert!(r.status == 431 || r.status == 400, "got {}", r.status);
    assert_eq!(get(g.addr, "/noop").unwrap().status, 200);
}

#[test]
fn bad_json_gets_a_clear_error() {
    let g = Group::builder("json").config(CONFIG).start();
    let r = request(g.addr, "POST", "/echo", b"{not json").unwrap();
    assert_eq!(r.status, 400);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert!(r.text().contains("not valid JSON"), "{}", r.text());
    let r = get(g.addr, "/payload/notanumber").unwrap();
    assert_eq!(r.status, 422, "{}", r.text());
}

#[test]
fn a_slow_client_is_cut_off_by_the_header_timeout() {
    let g = Group::builder("slowloris").config(CONFIG).start();
    let mut s = std::net::TcpStream::connect(g.addr).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    s.write_all(b"GET /noop HTTP/1.1\r\nhost: t\r\n").unwrap();
    // Never finish the head: the server must close the connection on its own.
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    assert!(!text.contains("200 OK"), "{text}");
    assert_eq!(get(g.addr, "/noop").unwrap().status, 200);
}

/// Reads until the server closes; `Err` if it keeps the connection open
/// for a whole PATIENCE.
fn read_until_closed(s: &mut std::net::TcpStream) -> std::io::Result<Vec<u8>> {
    s.set_read_timeout(Some(PATIENCE))?;
    let mut buf = Vec::new();
    match s.read_to_end(&mut buf) {
        Ok(_) => Ok(buf),
        // A reset is a close too.
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Ok(buf),
        Err(e) => Err(e),
    }
}

#[test]
fn silent_connections_are_closed() {
    let g = Group::builder("idle")
        .config("[listener]\nidle_timeout_ms = 300\nheader_read_timeout_ms = 500\n")
        .start();
    // Nothing at all after connecting.
    let mut silent = std::net::TcpStream::connect(g.addr).unwrap();
    let got = read_until_closed(&mut silent).expect("a silent connection is closed");
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    // The start of an h2 preface, then nothing: the version is never
    // known, so no HTTP timer of hyper's runs.
    let mut dripping = std::net::TcpStream::connect(g.addr).unwrap();
    dripping.write_all(b"PRI * HT").unwrap();
    read_until_closed(&mut dripping).expect("a half preface is closed");
    // A kept-alive connection, silent after its first answer.
    let mut kept = std::net::TcpStream::connect(g.addr).unwrap();
    kept.write_all(b"GET /noop HTTP/1.1\r\nhost: t\r\n\r\n").unwrap();
    let got = read_until_closed(&mut kept).expect("an idle kept-alive connection is closed");
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));
    assert_eq!(get(g.addr, "/noop").unwrap().status, 200);
}

#[test]
fn a_stalled_request_body_gets_408_on_every_route() {
    let g = Group::builder("body-stall")
        .config("[listener]\nbody_read_timeout_ms = 300\n")
        .start();
    for path in ["/echo", "/upload"] {
        let mut s = std::net::TcpStream::connect(g.addr).unwrap();
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n["
        );
        s.write_all(head.as_bytes()).unwrap();
        let got = read_until_closed(&mut s).expect("the server ends a stalled body");
        let r = parse_response(&got).unwrap();
        assert_eq!(r.status, 408, "{path}: {}", r.text());
        assert_eq!(r.header("connection"), Some("close"), "{path}");
    }
    assert_eq!(request(g.addr, "POST", "/echo", b"[1]").unwrap().status, 200);
}

#[test]
fn connections_over_the_limit_get_503_and_the_rest_are_served() {
    let g = Group::builder("max-conns")
        .config("[listener]\nmax_connections = 8\nidle_timeout_ms = 600000\n")
        .start();
    let mut held: Vec<_> = (0..8)
        .map(|_| std::net::TcpStream::connect(g.addr).unwrap())
        .collect();
    // The ninth is answered at once and closed, without sending anything.
    for _ in 0..3 {
        let mut over = std::net::TcpStream::connect(g.addr).unwrap();
        let got = read_until_closed(&mut over).expect("refused, not left hanging");
        let r = parse_response(&got).unwrap();
        assert_eq!(r.status, 503, "{}", r.text());
        assert_eq!(r.header("retry-after"), Some("1"));
        assert!(r.text().contains("too many connections"), "{}", r.text());
    }
    // A place frees as soon as one of them goes.
    held.truncate(7);
    g.eventually_status("/noop", 200);
    drop(held);
}

/// The soft and hard `Max open files` of `pid`.
fn nofile_of(pid: u32) -> (u64, u64) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
    let mut fields = line["Max open files".len()..].split_whitespace();
    let soft = fields.next().unwrap().parse().unwrap();
    let hard = fields.next().unwrap().parse().unwrap();
    (soft, hard)
}

#[test]
fn every_group_process_raises_its_descriptor_limit() {
    // Start the group the way a login shell would: with a low soft limit
    // (this test runs in a process of its own, which the group inherits).
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit write to and read from a valid rlimit.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        let low = limit.rlim_max.min(512);
        let lowered = libc::rlimit {
            rlim_cur: low,
            rlim_max: limit.rlim_max,
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lowered), 0);
    }
    let g = Group::start("nofile");
    let mut pids = g.all_pids();
    pids.push(g.supervisor_pid());
    assert!(pids.len() > 4, "{pids:?}");
    for pid in pids {
        let (soft, hard) = nofile_of(pid);
        assert_eq!(soft, hard, "pid {pid} kept a soft limit of {soft} (hard {hard})");
    }
}
