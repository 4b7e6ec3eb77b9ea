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
