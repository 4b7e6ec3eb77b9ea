//! What a handler knows of its request, against the real group: fields
//! bound to a header, a cookie or the scope (and the attempts to set them
//! from the body, the query or a WebSocket message), the client address
//! through trusted proxies, request ids in replies and in every hop's log
//! lines, replies with cookies and redirects, `HEAD` and `OPTIONS`.

mod common;

use common::{Group, eventually, request_with};
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

fn fixture_config(extra: &str) -> String {
    let plugin = common::plugin("switchyard-fixture-middleware");
    format!(
        "{extra}\n\
         [[managers]]\nname = \"ctx\"\nplugin = \"{p}\"\n\
         [[managers]]\nname = \"plain\"\nplugin = \"{p}\"\nmanager = \"plain\"\n",
        p = plugin.display()
    )
}

const FORGED: &[u8] = br#"{"api_key":"forged","session":"forged","sub":"admin","note":"n"}"#;

#[test]
fn bound_fields_take_their_source_and_nothing_else() {
    let group = Group::builder("req-bound").config(&fixture_config("")).start();
    let path = "/ctx/echo/7?api_key=forged&session=forged&sub=admin";
    // Smuggled through the body and the query: ignored.
    let r = request_with(group.addr, "POST", path, &[("user-agent", "t/1")], FORGED).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let body = r.json();
    assert_eq!(
        body["event"],
        json!({"id": 7, "api_key": null, "session": null, "sub": null, "note": "n"}),
        "{body}"
    );
    assert_eq!(body["method"], "POST");
    assert_eq!(body["path"], "/ctx/echo/7");
    assert_eq!(body["client"], "127.0.0.1");
    assert_eq!(body["user_agent"], "t/1");
    // From their sources: taken.
    let r = request_with(
        group.addr,
        "POST",
        path,
        &[
            ("x-api-key", "k-1"),
            ("cookie", "other=x; session=s-1"),
            // The scope comes from authentication only: a header of that
            // name is just a header.
            ("sub", "admin"),
        ],
        FORGED,
    )
    .unwrap();
    let body = r.json();
    assert_eq!(body["event"]["api_key"], "k-1", "{body}");
    assert_eq!(body["event"]["session"], "s-1");
    assert_eq!(body["event"]["sub"], json!(null));
    // A WebSocket request's data cannot set them either.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{}/ws", group.addr))
            .await
            .unwrap();
        let message = json!({"id": 1, "type": "ctx.Echo",
            "data": {"id": 3, "api_key": "forged", "sub": "admin", "session": "forged"}});
        ws.send(Message::text(message.to_string())).await.unwrap();
        let reply = loop {
            match ws.next().await.unwrap().unwrap() {
                Message::Text(t) => break serde_json::from_str::<serde_json::Value>(&t).unwrap(),
                _ => continue,
            }
        };
        assert_eq!(reply["status"], 200, "{reply}");
        assert_eq!(
            reply["data"]["event"],
            json!({"id": 3, "api_key": null, "session": null, "sub": null, "note": null}),
            "{reply}"
        );
        // The WebSocket front end knows the client and names the request.
        assert_eq!(reply["data"]["client"], "127.0.0.1");
        assert_eq!(reply["data"]["request_id"].as_str().map(str::len), Some(26));
        assert_eq!(reply["data"]["method"], json!(null));
    });
    // X-Forwarded-For from a peer that is not a trusted proxy is ignored.
    let r = request_with(
        group.addr,
        "POST",
        "/ctx/echo/1",
        &[("x-forwarded-for", "203.0.113.9")],
        b"{}",
    )
    .unwrap();
    assert_eq!(r.json()["client"], "127.0.0.1");
}

#[test]
fn trusted_proxies_and_request_ids() {
    let config = fixture_config(
        "[listener]\ntrusted_proxies = [\"127.0.0.0/8\"]\n\
         [request_id]\nheader = \"X-Trace-Id\"\naccept_incoming = false\n",
    );
    let group = Group::builder("req-proxies").config(&config).start();
    let r = request_with(
        group.addr,
        "POST",
        "/ctx/echo/1",
        &[
            ("x-forwarded-for", "6.6.6.6, 203.0.113.9"),
            ("x-trace-id", "client-chosen"),
        ],
        b"{}",
    )
    .unwrap();
    let body = r.json();
    assert_eq!(body["client"], "203.0.113.9", "the rightmost untrusted hop");
    let id = r.header("x-trace-id").expect("the id is answered").to_owned();
    assert_ne!(id, "client-chosen", "accept_incoming = false");
    assert_eq!(body["request_id"], id.as_str());
    assert_eq!(r.header("x-request-id"), None);
    // The proxy writes X-Forwarded-For (the default setting): a client's
    // own `Forwarded`, passed through untouched, does not pick its address.
    let r = request_with(
        group.addr,
        "POST",
        "/ctx/echo/1",
        &[
            ("forwarded", "for=\"[2001:db8::7]:4711\";proto=http"),
            ("x-forwarded-for", "203.0.113.9"),
        ],
        b"{}",
    )
    .unwrap();
    assert_eq!(r.json()["client"], "203.0.113.9");
}

/// Behind a proxy that writes `Forwarded` (`listener.forwarded_header`),
/// that header names the client and `X-Forwarded-For` is not read.
#[test]
fn the_forwarded_header_is_the_configured_one() {
    let config =
        fixture_config("[listener]\ntrusted_proxies = [\"127.0.0.0/8\"]\nforwarded_header = \"forwarded\"\n");
    let group = Group::builder("req-forwarded").config(&config).start();
    let r = request_with(
        group.addr,
        "POST",
        "/ctx/echo/1",
        &[
            ("forwarded", "for=\"[2001:db8::7]:4711\";proto=http"),
            ("x-forwarded-for", "203.0.113.9"),
        ],
        b"{}",
    )
    .unwrap();
    assert_eq!(r.json()["client"], "2001:db8::7");
}

/// The request id reaches every process the request passes, and the reply.
#[test]
fn a_request_id_is_in_every_hops_log_lines_and_the_reply() {
    let group = Group::builder("req-id-logs")
        .config(&fixture_config(""))
        .env(
            "SWITCHYARD_LOG",
            "info,switchyard_listener=debug,switchyard_broker=debug,switchyard_router=debug,switchyard_manager_host=debug",
        )
        .start();
    let id = "trace-4f2a-77";
    let r = request_with(group.addr, "GET", "/ctx/log", &[("x-request-id", id)], b"").unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-request-id"), Some(id));
    assert_eq!(r.json()["request_id"], id);
    assert_eq!(r.json()["plain"]["served_by"], "plain");
    // ctx's handler calls plain: both handlers' lines name the request.
    for (process, what) in [
        ("listener", "answered"),
        ("broker", "request to the router"),
        ("router", "request routed"),
        // `tracing` records of the handler, before its call and after it
        // (decision 0125).
        ("ctx", "ctx.Log handler ran"),
        ("ctx", "ctx.Log call answered served_by=plain"),
        ("ctx", "request to the plugin"),
        ("plain", "mw.Remote handler ran"),
    ] {
        eventually(
            &format!("a `{what}` line of {process} names the request"),
            common::PATIENCE,
            || {
                let lines = group.lines_with(id);
                lines
                    .iter()
                    .find(|l| l.starts_with(&format!("{process}[")) && l.contains(what))
                    .cloned()
                    .ok_or(lines)
            },
        );
    }
    // A client's id that could break a log line is replaced.
    let r = request_with(group.addr, "GET", "/ctx/log", &[("x-request-id", "a\u{1}b")], b"");
    // (hyper refuses control characters in a header outright.)
    if let Ok(r) = r {
        assert_ne!(r.header("x-request-id"), Some("a\u{1}b"));
    }
    let long = "x".repeat(200);
    let r = request_with(group.addr, "GET", "/ctx/log", &[("x-request-id", &long)], b"").unwrap();
    let made = r.header("x-request-id").unwrap();
    assert_eq!(made.len(), 26, "{made}");
}

#[test]
fn replies_head_and_options() {
    let group = Group::builder("req-replies").config(&fixture_config("")).start();
    let r = request_with(group.addr, "GET", "/ctx/set", &[], b"").unwrap();
    assert_eq!(r.status, 204);
    assert_eq!(
        r.header_all("set-cookie"),
        ["a=1; HttpOnly; Path=/", "b=2"],
        "one Set-Cookie line per cookie, never folded"
    );
    assert_eq!(r.header("cache-control"), Some("no-store"));
    let r = request_with(group.addr, "GET", "/ctx/go?to=/mw/plain", &[], b"").unwrap();
    assert_eq!((r.status, r.header("location")), (303, Some("/mw/plain")));
    let r = request_with(
        group.addr,
        "GET",
        "/ctx/go?to=/x%0D%0ASet-Cookie:%20evil=1",
        &[],
        b"",
    )
    .unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.header("location"), None);
    assert!(r.header_all("set-cookie").is_empty());

    // HEAD on a GET route: its headers, no body.
    let get = request_with(group.addr, "GET", "/mw/plain", &[], b"").unwrap();
    let head = request_with(group.addr, "HEAD", "/mw/plain", &[], b"").unwrap();
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty(), "{:?}", head.text());
    assert_eq!(
        head.header("content-length"),
        Some(get.body.len().to_string().as_str())
    );
    assert_eq!(head.header("content-type"), Some("application/json"));
    // OPTIONS: Allow; 405s say it too.
    let r = request_with(group.addr, "OPTIONS", "/ctx/echo/1", &[], b"").unwrap();
    assert_eq!((r.status, r.header("allow")), (204, Some("OPTIONS, POST")));
    let r = request_with(group.addr, "OPTIONS", "/mw/plain", &[], b"").unwrap();
    assert_eq!(r.header("allow"), Some("GET, HEAD, OPTIONS"));
    let r = request_with(group.addr, "DELETE", "/mw/plain", &[], b"").unwrap();
    assert_eq!((r.status, r.header("allow")), (405, Some("GET, HEAD, OPTIONS")));
    let r = request_with(group.addr, "OPTIONS", "/nowhere", &[], b"").unwrap();
    assert_eq!(r.status, 404);
    // Every answer, the listener's own included, names its request.
    assert!(r.header("x-request-id").is_some());
}

/// The scope from built-in authentication: a verified token's `sub` fills
/// the `#[from(scope = "sub")]` field, and the same name in the body or
/// the query does not.
#[test]
fn the_scope_comes_from_authentication() {
    const AUTH: &str = "[auth.jwt]\nalgorithms = [\"HS256\"]\n\
                        secret = \"a-test-secret-of-thirty-two-bytes-or-more\"\n\
                        [[auth.rules]]\nprefix = \"/ctx\"\n";
    let group = Group::builder("req-scope").config(&fixture_config(AUTH)).start();
    let scratch = common::scratch_dir("req-scope-token");
    let config = scratch.path().join("switchyard.toml");
    std::fs::write(&config, fixture_config(AUTH)).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["token", "--sub", "ada", "-c"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let bearer = format!("Bearer {}", String::from_utf8_lossy(&out.stdout).trim());
    let r = request_with(
        group.addr,
        "POST",
        "/ctx/echo/1?sub=admin",
        &[("authorization", &bearer)],
        br#"{"sub":"admin"}"#,
    )
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["event"]["sub"], "ada", "{}", r.text());
    // Without a token the rule refuses before any handler runs.
    let r = request_with(group.addr, "POST", "/ctx/echo/1", &[], br#"{"sub":"admin"}"#).unwrap();
    assert_eq!(r.status, 401, "{}", r.text());
}
