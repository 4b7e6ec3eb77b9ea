//! Rate limits against a real group: a burst over a client's bucket gets
//! 429 with `Retry-After` while another client (an API key) keeps its own
//! bucket, and a flood of distinct identities (JWT subjects) is held to
//! `max_clients` buckets: past it, new clients share one bucket, and the
//! listener's memory stays flat. Every request that a limit refuses is
//! answered, and the group keeps serving.

mod common;

use common::*;

fn sha256_hex(text: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn get_with(addr: std::net::SocketAddr, path: &str, headers: &[(&str, &str)]) -> HttpResponse {
    let mut req = format!("GET {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    raw(addr, req.as_bytes()).unwrap()
}

/// Five requests a minute per address on `/hello`, and per API key on
/// `/noop`; the keys `key-0` .. `key-2` are known.
fn config() -> String {
    let mut keys = String::new();
    for i in 0..3 {
        keys.push_str(&format!(
            "[[auth.api_keys.keys]]\nname = \"key-{i}\"\nsha256 = \"{}\"\n",
            sha256_hex(&format!("key-{i}"))
        ));
    }
    format!(
        r#"[[managers]]
name = "basics"

[auth.jwt]
algorithms = ["HS256"]
secret = "{SECRET}"

[auth.api_keys]
{keys}
[rate_limit]
max_clients = 1000

[[rate_limit.limits]]
prefix = "/hello"
requests = 5
per_s = 60

[[rate_limit.limits]]
event = "demo.Noop"
key = "api_key"
requests = 5
per_s = 60

[[rate_limit.limits]]
prefix = "/me"
key = "identity"
requests = 5
per_s = 3600
"#
    )
}

const SECRET: &str = "a-test-secret-of-at-least-thirty-two-bytes";

fn token(sub: &str) -> String {
    let now = jsonwebtoken::get_current_timestamp();
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &serde_json::json!({"sub": sub, "exp": now + 600}),
        &jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes()),
    )
    .unwrap()
}

#[test]
fn a_burst_over_the_limit_gets_429_with_retry_after() {
    let g = Group::builder("rate-burst").config(&config()).start();
    let statuses: Vec<u16> = (0..8).map(|_| get_with(g.addr, "/hello/x", &[]).status).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429, 429], "{statuses:?}");
    let r = get_with(g.addr, "/hello/x", &[]);
    assert_eq!(r.status, 429);
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=12).contains(&retry), "one request every 12 s: {retry}");
    assert!(r.text().contains("rate limit"), "{}", r.text());
    // Another path is not limited; the group keeps serving.
    assert_eq!(get_with(g.addr, "/health", &[]).status, 200);

    // By API key: each key its own bucket, from the same address.
    for key in ["key-0", "key-1"] {
        let statuses: Vec<u16> = (0..6)
            .map(|_| get_with(g.addr, "/noop", &[("x-api-key", key)]).status)
            .collect();
        assert_eq!(statuses, [200, 200, 200, 200, 200, 429], "{key}: {statuses:?}");
    }
}

#[test]
fn many_distinct_clients_leave_memory_bounded() {
    let g = Group::builder("rate-many").config(&config()).start();
    let listener = g.pid_of("listener");
    let before = rss_kib(listener);
    // 3000 identities, one request each, against buckets for at most 1000
    // (of 5 an hour each: none is forgotten during the test). The first
    // 1000 get a bucket of their own; the rest share one, whose 5 requests
    // go to the first of them.
    let mut passed = 0;
    for i in 0..3000 {
        let bearer = format!("Bearer {}", token(&format!("user-{i}")));
        let r = get_with(g.addr, "/me", &[("authorization", &bearer)]);
        match r.status {
            200 => passed += 1,
            429 => assert!(i >= 1000, "user-{i} had a bucket of its own"),
            other => panic!("user-{i}: {other} {}", r.text()),
        }
    }
    assert_eq!(passed, 1000 + 5);
    // A known identity still has its own bucket.
    let bearer = format!("Bearer {}", token("user-0"));
    assert_eq!(get_with(g.addr, "/me", &[("authorization", &bearer)]).status, 200);
    let after = rss_kib(listener);
    // Generous: allocator noise, not per-client state (1000 buckets are
    // tens of KiB).
    assert!(
        after < before + 16 * 1024,
        "listener RSS grew from {before} KiB to {after} KiB"
    );
}
