//! CORS against a real group: a preflight from an allowed origin is
//! answered by the listener itself (it used to get 405), a disallowed
//! origin gets no `Access-Control-Allow-*` headers (so the browser refuses
//! the answer), and simple requests are marked for allowed origins only.
//! Security headers ride on every answer, and a handler's own value wins.

mod common;

use common::*;

const CONFIG: &str = r#"[[managers]]
name = "basics"

[cors]
allow_origins = ["https://app.example"]
allow_headers = ["content-type", "authorization"]
allow_credentials = true
max_age_s = 120

[security_headers.headers]
referrer-policy = "strict-origin"
x-frame-options = ""
"#;

fn send(addr: std::net::SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> HttpResponse {
    let mut req =
        format!("{method} {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\ncontent-length: 0\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    raw(addr, req.as_bytes()).unwrap()
}

#[test]
fn preflights_origins_and_security_headers() {
    let g = Group::builder("cors").config(CONFIG).start();
    let preflight = |origin: &str| {
        send(
            g.addr,
            "OPTIONS",
            "/echo",
            &[
                ("origin", origin),
                ("access-control-request-method", "POST"),
                ("access-control-request-headers", "content-type"),
            ],
        )
    };

    // An allowed origin: answered by the listener, not 405.
    let r = preflight("https://app.example");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    assert_eq!(r.header("access-control-allow-credentials"), Some("true"));
    assert_eq!(r.header("access-control-max-age"), Some("120"));
    let methods = r
        .header("access-control-allow-methods")
        .unwrap_or_default()
        .to_owned();
    assert!(methods.contains("POST"), "{methods}");
    let vary = r.header("vary").unwrap_or_default().to_ascii_lowercase();
    assert!(vary.contains("origin"), "{vary}");

    // A disallowed origin: no `Access-Control-Allow-Origin`, which is what
    // makes the browser refuse (the other headers describe the policy and
    // grant nothing without it).
    let r = preflight("https://evil.example");
    assert!(
        r.header("access-control-allow-origin").is_none(),
        "{:?}",
        r.headers
    );
    // `null` (a sandboxed frame, a file) is not an origin in the list.
    let r = preflight("null");
    assert!(
        r.header("access-control-allow-origin").is_none(),
        "{:?}",
        r.headers
    );

    // A simple request: marked for the allowed origin only.
    let r = send(g.addr, "GET", "/noop", &[("origin", "https://app.example")]);
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    let r = send(g.addr, "GET", "/noop", &[("origin", "https://evil.example")]);
    assert_eq!(r.status, 200);
    assert!(r.header("access-control-allow-origin").is_none());

    // Security headers: the defaults, one replaced, one removed.
    assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
    assert_eq!(r.header("referrer-policy"), Some("strict-origin"));
    assert_eq!(
        r.header("content-security-policy"),
        Some("frame-ancestors 'none'")
    );
    assert!(r.header("x-frame-options").is_none());
    // On the listener's own answers too.
    let r = send(g.addr, "GET", "/nowhere", &[]);
    assert_eq!(r.status, 404);
    assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
}

#[test]
fn a_bad_cors_setting_stops_the_start_naming_its_key() {
    let out = Group::builder("cors-bad")
        .config("[cors]\nallow_origins = [\"*\"]\nallow_credentials = true\n")
        .try_start()
        .err()
        .expect("the group refuses to start");
    assert!(out.contains("cors.allow_credentials"), "{out}");
}
