//! Subscriptions against a real group (decision 0106): the matrix of the
//! documented rule layouts ("exception before a broader rule": `public.*`
//! open, `admin.*` for admins, then `*` for any identity; and the broad
//! rule first), each subscribed by an anonymous client, a `viewer` and an
//! `admin`: a subscription is refused unless every rule that could decide
//! one of its types allows the caller, and no session receives a
//! notification its caller could not have asked for. Sessions end at
//! their token's `exp` (WebSocket close 1008, gRPC `UNAUTHENTICATED`), and
//! a reload that tightens the rules or rotates the keys ends the sessions
//! it no longer allows (and holds at once on kept-alive connections).
//!
//! One return pipe per listener, so a session's pushes arrive in the order
//! they were emitted: a marker notification that every session may receive
//! is sent last, and a session that has the marker has everything it was
//! going to get.

mod common;

use std::collections::BTreeMap;

use common::*;
use futures_util::{SinkExt, StreamExt};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

const SECRET: &str = "subscriptions-matrix-test-secret-32-bytes!";

fn token(sub: &str, roles: &[&str], exp_in_s: u64) -> String {
    let claims = json!({
        "sub": sub,
        "roles": roles,
        "exp": jsonwebtoken::get_current_timestamp() + exp_in_s,
    });
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(SECRET.as_bytes()),
    )
    .unwrap()
}

fn config(rules: &str) -> String {
    format!(
        r#"[[managers]]
name = "basics"

[listener]
pipes = 1

[listener.ws]
notify = true

[auth.jwt]
algorithms = ["HS256"]
secret = "{SECRET}"
{rules}"#
    )
}

/// "public.* open, then narrower and broader rules": the layout
/// docs/middleware.md recommends.
const EXCEPTION_FIRST: &str = r#"
[[auth.rules]]
event = "public.*"
require = "none"

[[auth.rules]]
event = "admin.*"
roles = ["admin"]

[[auth.rules]]
event = "*"
"#;

/// The broad rule first: the exception after it never decides anything.
const BROAD_FIRST: &str = r#"
[[auth.rules]]
event = "*"

[[auth.rules]]
event = "public.*"
require = "none"
"#;

async fn connect(g: &Group, token: Option<&str>) -> Ws {
    let mut req = format!("ws://{}/ws", g.addr).into_client_request().unwrap();
    if let Some(token) = token {
        req.headers_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
    }
    tokio::time::timeout(PATIENCE, tokio_tungstenite::connect_async(req))
        .await
        .expect("in time")
        .expect("upgraded")
        .0
}

/// The next text message as JSON; `None` once the server closed (with
/// the close frame's code).
async fn next(ws: &mut Ws) -> Result<Value, Option<u16>> {
    loop {
        match tokio::time::timeout(PATIENCE, ws.next())
            .await
            .expect("a message in time")
        {
            Some(Ok(Message::Text(t))) => return Ok(serde_json::from_str(t.as_str()).unwrap()),
            Some(Ok(Message::Close(frame))) => return Err(frame.map(|f| u16::from(f.code))),
            Some(Ok(_)) => continue,
            None | Some(Err(_)) => return Err(None),
        }
    }
}

/// The next text message as it came; `None` once closed.
async fn next_text(ws: &mut Ws) -> Option<String> {
    loop {
        match tokio::time::timeout(PATIENCE, ws.next())
            .await
            .expect("a message in time")
        {
            Some(Ok(Message::Text(t))) => return Some(t.as_str().to_owned()),
            Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return None,
            Some(Ok(_)) => continue,
        }
    }
}

/// The close code `ws` ends with, within PATIENCE (pings do not extend it).
async fn closed(ws: &mut Ws) -> Option<u16> {
    tokio::time::timeout(PATIENCE, async {
        loop {
            if let Err(code) = next(ws).await {
                return code;
            }
        }
    })
    .await
    .expect("the session is closed in time")
}

/// Subscribes to `pattern`: `Ok` or the refusal's status.
async fn subscribe(ws: &mut Ws, pattern: &str) -> Result<(), u64> {
    ws.send(Message::text(
        json!({"id": pattern, "subscribe": pattern}).to_string(),
    ))
    .await
    .unwrap();
    let answer = next(ws).await.expect("an answer");
    assert_eq!(answer["id"], pattern, "{answer}");
    match answer.get("subscribed") {
        Some(_) => Ok(()),
        None => Err(answer["status"].as_u64().unwrap_or(0)),
    }
}

async fn notify(ws: &mut Ws, ty: &str) {
    ws.send(Message::text(
        json!({"id": ty, "notify": ty, "data": {"of": ty}}).to_string(),
    ))
    .await
    .unwrap();
    let answer = next(ws).await.expect("an answer");
    assert_eq!(answer["notified"], ty, "{answer}");
}

/// The event types pushed to `ws` up to and including `marker`.
async fn pushed_until(ws: &mut Ws, marker: &str) -> Vec<String> {
    let mut seen = Vec::new();
    loop {
        let push = next(ws).await.expect("pushes until the marker");
        let event = push["event"].as_str().expect("a push").to_owned();
        seen.push(event.clone());
        if event == marker {
            return seen;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rule_that_could_decide_a_subscription_is_met_and_every_push_checked() {
    let g = Group::builder("subs-matrix")
        .config(&config(EXCEPTION_FIRST))
        .start();
    let admin_token = token("root", &["admin"], 600);
    let viewer_token = token("vera", &["viewer"], 600);
    let mut admin = connect(&g, Some(&admin_token)).await;
    let mut viewer = connect(&g, Some(&viewer_token)).await;
    let mut anon = connect(&g, None).await;
    // Notifications come from a session that receives none, so that its
    // answers are not interleaved with pushes.
    let mut sender = connect(&g, Some(&admin_token)).await;

    // (who, pattern) → allowed, or the refusal's status.
    let matrix: &[(&str, &str, Result<(), u64>)] = &[
        ("anon", "*", Err(401)),
        ("anon", "admin.*", Err(401)),
        ("anon", "user.*", Err(401)),
        ("anon", "admin.Audit", Err(401)),
        ("anon", "public.*", Ok(())),
        ("viewer", "*", Err(403)),
        ("viewer", "admin.*", Err(403)),
        ("viewer", "admin.Audit", Err(403)),
        ("viewer", "user.*", Ok(())),
        ("viewer", "public.*", Ok(())),
        ("admin", "*", Ok(())),
    ];
    for (who, pattern, expected) in matrix {
        let ws = match *who {
            "anon" => &mut anon,
            "viewer" => &mut viewer,
            _ => &mut admin,
        };
        assert_eq!(
            subscribe(ws, pattern).await,
            *expected,
            "{who} subscribing to {pattern}"
        );
    }

    // Every kind of notification, the marker last.
    for ty in ["admin.Audit", "user.Note", "public.News", "public.Done"] {
        notify(&mut sender, ty).await;
    }
    let got: BTreeMap<&str, Vec<String>> = [
        ("anon", pushed_until(&mut anon, "public.Done").await),
        ("viewer", pushed_until(&mut viewer, "public.Done").await),
        ("admin", pushed_until(&mut admin, "public.Done").await),
    ]
    .into_iter()
    .collect();
    assert_eq!(got["anon"], ["public.News", "public.Done"], "{got:?}");
    assert_eq!(
        got["viewer"],
        ["user.Note", "public.News", "public.Done"],
        "{got:?}"
    );
    assert_eq!(
        got["admin"],
        ["admin.Audit", "user.Note", "public.News", "public.Done"],
        "{got:?}"
    );
    // A client cannot emit what it could not send either.
    viewer
        .send(Message::text(
            json!({"id": 1, "notify": "admin.Audit"}).to_string(),
        ))
        .await
        .unwrap();
    assert_eq!(next(&mut viewer).await.unwrap()["status"], 403);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broad_rule_first_decides_every_subscription() {
    let g = Group::builder("subs-broad").config(&config(BROAD_FIRST)).start();
    let mut anon = connect(&g, None).await;
    assert_eq!(subscribe(&mut anon, "public.*").await, Err(401));
    assert_eq!(subscribe(&mut anon, "*").await, Err(401));
    let viewer_token = token("vera", &["viewer"], 600);
    let mut viewer = connect(&g, Some(&viewer_token)).await;
    assert_eq!(subscribe(&mut viewer, "*").await, Ok(()));
    let mut sender = connect(&g, Some(&viewer_token)).await;
    notify(&mut sender, "public.Done").await;
    assert_eq!(pushed_until(&mut viewer, "public.Done").await, ["public.Done"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_end_at_their_tokens_exp() {
    use switchyard_client::proto::SubscribeRequest;
    use switchyard_client::proto::events_client::EventsClient;

    let g = Group::builder("subs-exp")
        .config(&config(EXCEPTION_FIRST))
        .start();
    // Four seconds of validity (room for a loaded machine to subscribe
    // first): the session is closed when they are over,
    // whatever it is doing.
    let short = token("vera", &["viewer"], 4);
    let mut ws = connect(&g, Some(&short)).await;
    assert_eq!(subscribe(&mut ws, "user.*").await, Ok(()));
    assert_eq!(
        closed(&mut ws).await,
        Some(1008),
        "closed at exp with a policy violation"
    );
    // `/ws/echo` too.
    let short = token("vera", &["viewer"], 4);
    let mut req = format!("ws://{}/ws/echo", g.addr).into_client_request().unwrap();
    req.headers_mut()
        .insert("authorization", format!("Bearer {short}").parse().unwrap());
    let (mut echo, _) = tokio_tungstenite::connect_async(req).await.expect("upgraded");
    echo.send(Message::text("still here")).await.unwrap();
    assert_eq!(next_text(&mut echo).await.as_deref(), Some("still here"));
    assert_eq!(
        closed(&mut echo).await,
        Some(1008),
        "the echo session ends at exp too"
    );

    let channel = tonic::transport::Channel::from_shared(format!("http://{}", g.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let short = token("vera", &["viewer"], 4);
    let mut req = tonic::Request::new(SubscribeRequest {
        pattern: "user.*".into(),
        filter_json: String::new(),
    });
    req.metadata_mut()
        .insert("authorization", format!("Bearer {short}").parse().unwrap());
    let mut stream = EventsClient::new(channel)
        .subscribe(req)
        .await
        .expect("subscribed")
        .into_inner();
    let ended = tokio::time::timeout(PATIENCE, async {
        loop {
            match stream.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => return None,
                Err(status) => return Some(status.code()),
            }
        }
    })
    .await
    .expect("the stream ends in time");
    assert_eq!(ended, Some(tonic::Code::Unauthenticated));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_tightens_the_rules_or_rotates_the_keys_ends_the_sessions_it_no_longer_allows() {
    let dir = scratch_dir("subs-reload");
    let file = dir.path().join("switchyard.toml");
    std::fs::write(&file, config(EXCEPTION_FIRST)).unwrap();
    let g = Group::builder("subs-reload").config_file(&file).start();
    let viewer_token = token("vera", &["viewer"], 600);
    let mut viewer = connect(&g, Some(&viewer_token)).await;
    let mut public = connect(&g, Some(&viewer_token)).await;
    assert_eq!(subscribe(&mut viewer, "user.*").await, Ok(()));
    assert_eq!(subscribe(&mut public, "public.*").await, Ok(()));

    // `user.*` becomes admin-only.
    let tighter = config(EXCEPTION_FIRST).replace(
        "[[auth.rules]]\nevent = \"*\"\n",
        "[[auth.rules]]\nevent = \"user.*\"\nroles = [\"admin\"]\n\n[[auth.rules]]\nevent = \"*\"\n",
    );
    assert_ne!(tighter, config(EXCEPTION_FIRST));
    std::fs::write(&file, tighter).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["reload", "--runtime-dir"])
        .arg(&g.runtime_dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        closed(&mut viewer).await,
        Some(1008),
        "the rules no longer allow user.*"
    );
    // The session the new rules still allow goes on.
    let mut sender = connect(&g, Some(&viewer_token)).await;
    notify(&mut sender, "public.Done").await;
    assert_eq!(pushed_until(&mut public, "public.Done").await, ["public.Done"]);

    // A gRPC channel opened before the keys change.
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", g.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = switchyard_client::proto::events_client::EventsClient::new(channel);
    let call = || {
        let mut req = tonic::Request::new(switchyard_client::proto::CallRequest {
            r#type: "demo.Noop".into(),
            content_type: "application/json".into(),
            payload: b"{}".to_vec().into(),
            deadline_ms: 0,
        });
        req.metadata_mut()
            .insert("authorization", format!("Bearer {viewer_token}").parse().unwrap());
        req
    };
    assert!(client.call(call()).await.is_ok());
    // The key is rotated: the open session's token no longer verifies, so
    // the session ends, and the kept-alive channel's next call is refused.
    std::fs::write(
        &file,
        config(EXCEPTION_FIRST).replace(SECRET, "another-secret-after-rotation-32-bytes!"),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["reload", "--runtime-dir"])
        .arg(&g.runtime_dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(closed(&mut public).await, Some(1008), "the token's key is gone");
    let err = client.call(call()).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");
}
