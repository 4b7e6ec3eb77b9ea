//! Internal events (decision 0108): an event type is reachable from
//! WebSocket and gRPC clients only if its manager marks it public (an HTTP
//! route, or `#[event(public)]`) or the operator opens it (`[auth]
//! expose`). Any other — the demo's `demo.ReminderDue` (a Scheduler
//! target), the built-in `store.*` and `scheduler.*` — is answered as a
//! type no manager declares on `/ws`, `Events/Call` and typed gRPC, is
//! absent from reflection and `/docs`, and a client may not notify it;
//! managers still call it. Real groups, real clients.

mod common;

use common::raw_codec::Raw;
use common::*;
use serde_json::{Value, json};
use switchyard_client::proto::CallRequest;
use switchyard_client::proto::events_client::EventsClient;
use switchyard_client::{Client, ClientError};
use tonic::Code;
use tonic::transport::Channel;

/// Types the demo group declares internal (no route, no `public` mark).
const INTERNAL: &[&str] = &[
    "demo.ReminderDue",
    "store.Get",
    "store.Set",
    "store.List",
    "scheduler.Schedule",
    "scheduler.List",
];

fn undeclared(name: &str) -> String {
    format!("no manager declares event type `{name}`")
}

async fn within<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(PATIENCE, f).await.expect("in time")
}

async fn channel(g: &Group) -> Channel {
    Channel::from_shared(format!("http://{}", g.addr))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

fn call_request(ty: &str, data: &Value) -> CallRequest {
    CallRequest {
        r#type: ty.into(),
        content_type: "application/json".into(),
        payload: data.to_string().into_bytes().into(),
        deadline_ms: 0,
    }
}

/// What a `/ws` request of `ty` gets: 404 and its detail, or the reply.
async fn ws_call(client: &Client, ty: &str, data: &Value) -> Result<Value, (u16, String)> {
    match within(client.call::<_, Value>(ty, data)).await {
        Ok(v) => Ok(v),
        Err(ClientError::Status { status, problem }) => {
            Err((status, problem["detail"].as_str().unwrap_or_default().to_owned()))
        }
        Err(other) => panic!("{ty}: {other:?}"),
    }
}

/// The typed rpc at `path` with an empty message: its gRPC status.
async fn typed_call(g: &Group, path: &'static str) -> tonic::Status {
    let mut grpc = tonic::client::Grpc::new(channel(g).await);
    grpc.ready().await.unwrap();
    let path = http::uri::PathAndQuery::from_static(path);
    within(grpc.unary(tonic::Request::new(bytes::Bytes::new()), path, Raw))
        .await
        .expect_err("refused")
}

async fn reflected_services(g: &Group) -> Vec<String> {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let mut reflection = ServerReflectionClient::new(channel(g).await);
    let ask = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = within(reflection.server_reflection_info(futures_util::stream::iter(vec![ask])))
        .await
        .unwrap()
        .into_inner();
    let answer = within(answers.message()).await.unwrap().expect("an answer");
    match answer.message_response.expect("a response") {
        MessageResponse::ListServicesResponse(list) => list.service.into_iter().map(|s| s.name).collect(),
        other => panic!("expected a service list, got {other:?}"),
    }
}

// Several threads: the group's drop blocks one while the gRPC client's
// connection task answers the listener's graceful GOAWAY on another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn internal_types_answer_clients_as_undeclared_ones_do() {
    let g = Group::start("internal-refused");

    // WebSocket: the public type answers; every internal one gets exactly
    // what a type no manager declares gets.
    let ws = within(Client::connect(&format!("ws://{}/ws", g.addr)))
        .await
        .unwrap();
    let hello = ws_call(&ws, "demo.Hello", &json!({"name": "Ada"})).await.unwrap();
    assert_eq!(hello["message"], "Hello, Ada!");
    let nope = ws_call(&ws, "demo.Nope", &json!({})).await.unwrap_err();
    assert_eq!(nope, (404, undeclared("demo.Nope")));
    for ty in INTERNAL {
        let data = json!({"key": "k", "value": 1, "job": "j", "planned_ms": 0, "payload": {"text": "x"},
                          "when": {"after_ms": 1}, "event": "demo.Panic"});
        assert_eq!(
            ws_call(&ws, ty, &data).await.unwrap_err(),
            (404, undeclared(ty)),
            "{ty} over /ws"
        );
    }

    // gRPC Events/Call: NOT_FOUND with the same message.
    let mut events = EventsClient::new(channel(&g).await);
    let ok = within(events.call(call_request("demo.Hello", &json!({"name": "Bob"}))))
        .await
        .unwrap();
    assert!(String::from_utf8_lossy(&ok.get_ref().payload).contains("Hello, Bob!"));
    for ty in INTERNAL.iter().chain(&["demo.Nope"]) {
        let refused = within(events.call(call_request(ty, &json!({"key": "k"}))))
            .await
            .unwrap_err();
        assert_eq!(
            (refused.code(), refused.message()),
            (Code::NotFound, undeclared(ty).as_str()),
            "{ty} over Events/Call"
        );
    }

    // Typed gRPC: no rpc for an internal type, as for a made-up one; the
    // public ones stay.
    let unknown = typed_call(&g, "/demo.v1.Basics/Nope").await;
    for path in [
        "/demo.v1.Basics/ReminderDue",
        "/store.v1.Store/Get",
        "/scheduler.v1.Scheduler/Schedule",
    ] {
        let refused = typed_call(&g, path).await;
        assert_eq!(refused.code(), unknown.code(), "{path}: {refused:?}");
        assert_eq!(refused.code(), Code::Unimplemented, "{path}: {refused:?}");
    }
    let services = reflected_services(&g).await;
    assert!(services.iter().any(|s| s == "demo.v1.Basics"), "{services:?}");
    for gone in ["store.", "scheduler."] {
        assert!(
            !services.iter().any(|s| s.starts_with(gone)),
            "{gone} in {services:?}"
        );
    }
    let proto = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .arg("proto")
        .output()
        .unwrap();
    let proto = String::from_utf8_lossy(&proto.stdout);
    assert!(proto.contains("rpc Hello("), "{proto}");
    assert!(
        !proto.contains("ReminderDue"),
        "an internal type in the .proto:\n{proto}"
    );

    // The API description: the page lists public types only.
    let docs = get(g.addr, "/docs").unwrap();
    assert_eq!(docs.status, 200);
    let page = docs.text();
    assert!(page.contains("demo.Hello"));
    for ty in INTERNAL {
        assert!(!page.contains(ty), "{ty} on /docs");
    }
    let openapi = get(g.addr, "/openapi.json").unwrap().text();
    for ty in INTERNAL {
        assert!(!openapi.contains(ty), "{ty} in /openapi.json");
    }

    // Managers still send internal types: the demo's `/kv` routes call
    // `store.*`.
    let put = request(g.addr, "PUT", "/kv/internal", b"7").unwrap();
    assert!(put.status < 300, "{}", put.text());
    let got = get(g.addr, "/kv/internal").unwrap();
    assert_eq!((got.status, got.json()), (200, json!(7)), "{}", got.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_may_not_notify_an_internal_type() {
    let g = Group::builder("internal-notify")
        .env("SWITCHYARD_LISTENER__WS__NOTIFY", "true")
        .start();
    let ws = within(Client::connect(&format!("ws://{}/ws", g.addr)))
        .await
        .unwrap();
    // `demo.reminder` is what the demo's reminders emit; a client could
    // forge one for every subscriber.
    match within(ws.notify("demo.reminder", &json!({"text": "forged"}))).await {
        Err(ClientError::Status { status: 404, problem }) => {
            assert_eq!(problem["detail"], undeclared("demo.reminder"));
        }
        other => panic!("expected 404, got {other:?}"),
    }
    let mut events = EventsClient::new(channel(&g).await);
    let refused = within(events.notify(switchyard_client::proto::NotifyRequest {
        r#type: "store.Set".into(),
        content_type: String::new(),
        payload: b"{}".to_vec().into(),
    }))
    .await
    .unwrap_err();
    assert_eq!(
        (refused.code(), refused.message()),
        (Code::NotFound, undeclared("store.Set").as_str())
    );
    // A name no manager declares reaches client subscribers only: allowed.
    within(ws.notify("client.ping", &json!({}))).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exposed_types_are_reachable_and_only_those() {
    let g = Group::builder("internal-exposed")
        .env("SWITCHYARD_AUTH__EXPOSE", r#"["store.Get", "store.Set"]"#)
        .start();
    let ws = within(Client::connect(&format!("ws://{}/ws", g.addr)))
        .await
        .unwrap();
    ws_call(&ws, "store.Set", &json!({"key": "open", "value": 3}))
        .await
        .unwrap();
    let got = ws_call(&ws, "store.Get", &json!({"key": "open"})).await.unwrap();
    assert_eq!(got["value"], 3, "{got}");
    assert_eq!(
        ws_call(&ws, "store.Delete", &json!({"key": "open"}))
            .await
            .unwrap_err(),
        (404, undeclared("store.Delete"))
    );
    // The rules apply to an exposed type as to any: the demo requires a
    // token on `/me` only, so store.Get is open; reflection now lists it.
    let services = reflected_services(&g).await;
    assert!(services.iter().any(|s| s.starts_with("store.")), "{services:?}");
}

/// A group whose operator opened the Scheduler to clients, with a rule
/// that requires an identity for `demo.Panic`, and client notifications
/// off (the default).
fn scheduler_open() -> Group {
    Group::builder("internal-jobs")
        .config(
            "[[managers]]\nname = \"basics\"\n\n\
             [[managers]]\nname = \"store\"\nbuiltin = \"store\"\n\n\
             [[managers]]\nname = \"scheduler\"\nbuiltin = \"scheduler\"\n\n\
             [auth]\nexpose = [\"scheduler.*\"]\n\n\
             [auth.jwt]\nalgorithms = [\"HS256\"]\nsecret = \"a-test-secret-of-thirty-two-bytes!!\"\n\n\
             [[auth.rules]]\nevent = \"demo.Panic\"\n",
        )
        .start()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_does_only_what_its_client_may_do_and_is_its_own() {
    let g = scheduler_open();
    let ws = within(Client::connect(&format!("ws://{}/ws", g.addr)))
        .await
        .unwrap();
    // Refused directly to an anonymous client...
    let direct = ws_call(&ws, "demo.Panic", &json!({})).await.unwrap_err();
    assert_eq!(direct.0, 401, "{direct:?}");
    // ... and refused the same when scheduled: nothing is stored to fire.
    let job = json!({"id": "panic", "when": {"after_ms": 0}, "event": "demo.Panic"});
    let scheduled = ws_call(&ws, "scheduler.Schedule", &job).await.unwrap_err();
    assert_eq!(scheduled, direct, "a job is admitted as its client");
    // An internal target: as undeclared.
    let job = json!({"when": {"after_ms": 0}, "event": "demo.ReminderDue"});
    assert_eq!(
        ws_call(&ws, "scheduler.Schedule", &job).await.unwrap_err(),
        (404, undeclared("demo.ReminderDue"))
    );
    // A notification, with client notifications off: 403 directly and
    // when scheduled.
    let notified = match within(ws.notify("client.ping", &json!({}))).await {
        Err(ClientError::Status { status, problem }) => {
            (status, problem["detail"].as_str().unwrap().to_owned())
        }
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert_eq!(notified.0, 403);
    let job = json!({"when": {"after_ms": 0}, "event": "client.ping", "kind": "notification"});
    assert_eq!(
        ws_call(&ws, "scheduler.Schedule", &job).await.unwrap_err(),
        notified
    );
    // Faster than the scheduler's `min_every_ms`: 422.
    let job = json!({"when": {"every_ms": 1}, "event": "demo.Noop"});
    assert_eq!(ws_call(&ws, "scheduler.Schedule", &job).await.unwrap_err().0, 422);

    // What a client may do, its job does.
    let job = json!({"id": "mine", "when": {"after_ms": 600000}, "event": "demo.Noop"});
    ws_call(&ws, "scheduler.Schedule", &job).await.unwrap();
    // A manager's job (the demo's reminder, scheduled by `basics`) is not
    // the client's: not listed, not found, not cancelled.
    let r = request(
        g.addr,
        "POST",
        "/reminders",
        br#"{"in_ms": 600000, "text": "hi"}"#,
    )
    .unwrap();
    assert_eq!(r.status, 201, "{}", r.text());
    let theirs = r.json()["id"].as_str().unwrap().to_owned();
    let listed = ws_call(&ws, "scheduler.List", &json!({})).await.unwrap();
    let ids: Vec<&str> = listed["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["mine"], "{listed}");
    let found = ws_call(&ws, "scheduler.Get", &json!({"id": theirs}))
        .await
        .unwrap();
    assert_eq!(found["job"], Value::Null, "{found}");
    let cancelled = ws_call(&ws, "scheduler.Cancel", &json!({"id": theirs}))
        .await
        .unwrap();
    assert_eq!(cancelled["cancelled"], false);
    let cancelled = ws_call(&ws, "scheduler.Cancel", &json!({"id": "mine"}))
        .await
        .unwrap();
    assert_eq!(cancelled["cancelled"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_holds_a_bounded_number_of_jobs() {
    let g = scheduler_open();
    let ws = within(Client::connect(&format!("ws://{}/ws", g.addr)))
        .await
        .unwrap();
    // The default bound: 100 jobs per client (all anonymous ones share it).
    for i in 0..100 {
        let job = json!({"id": format!("j{i}"), "when": {"after_ms": 600000}, "event": "demo.Noop"});
        ws_call(&ws, "scheduler.Schedule", &job).await.unwrap();
    }
    let job = json!({"id": "one-more", "when": {"after_ms": 600000}, "event": "demo.Noop"});
    let refused = ws_call(&ws, "scheduler.Schedule", &job).await.unwrap_err();
    assert_eq!(refused.0, 429, "{refused:?}");
    // The managers are not bound by it: the demo's reminders still work.
    let r = request(
        g.addr,
        "POST",
        "/reminders",
        br#"{"in_ms": 600000, "text": "hi"}"#,
    )
    .unwrap();
    assert_eq!(r.status, 201, "{}", r.text());
}

const JOBS_SECRET: &str = "a-test-secret-of-thirty-two-bytes!!";

fn jobs_config(extra_rules: &str) -> String {
    format!(
        "[[managers]]\nname = \"basics\"\n\n\
         [[managers]]\nname = \"scheduler\"\nbuiltin = \"scheduler\"\n\n\
         [auth]\nexpose = [\"scheduler.*\"]\n\n\
         [auth.jwt]\nalgorithms = [\"HS256\"]\nsecret = \"{JOBS_SECRET}\"\n\n\
         [auth.websocket]\ntoken_from = [\"header\", \"query\"]\n\n\
         [[auth.rules]]\nevent = \"demo.Panic\"\n{extra_rules}"
    )
}

/// A `/ws` session that presents `token`, if any.
async fn ws_as(g: &Group, token: Option<&str>) -> Client {
    let url = match token {
        Some(t) => format!("ws://{}/ws?access_token={t}", g.addr),
        None => format!("ws://{}/ws", g.addr),
    };
    within(Client::connect(&url)).await.unwrap()
}

fn jobs_token(sub: &str, exp_in_s: u64) -> String {
    let claims = json!({"sub": sub, "exp": jsonwebtoken::get_current_timestamp() + exp_in_s});
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(JOBS_SECRET.as_bytes()),
    )
    .unwrap()
}

/// A client's job fires as that client (decision 0113): a listener admits
/// each firing under the rules as they are then, with the identity the job
/// was scheduled with. A reload that makes its target need an identity
/// stops an anonymous client's stored job; a job whose token expires stops
/// at `exp`; a job whose client still may goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_job_fires_only_while_its_client_may_send_its_event() {
    let dir = scratch_dir("jobs-reload");
    let file = dir.path().join("switchyard.toml");
    std::fs::write(&file, jobs_config("")).unwrap();
    let mut g = Group::builder("jobs-reload")
        .config_file(&file)
        .env("SWITCHYARD_LOG", "info,switchyard_manager_host=debug")
        .start();
    let anonymous = ws_as(&g, None).await;
    let every = |id: &str| json!({"id": id, "when": {"every_ms": 200}, "event": "demo.Noop"});
    ws_call(&anonymous, "scheduler.Schedule", &every("anon"))
        .await
        .unwrap();
    let lasting = ws_as(&g, Some(&jobs_token("ada", 600))).await;
    ws_call(&lasting, "scheduler.Schedule", &every("ada"))
        .await
        .unwrap();
    // Allowed now: both fire, as their clients.
    g.wait_line("job `anon`: demo.Noop answered 200");
    g.wait_line("job `ada`: demo.Noop answered 200");

    // `demo.Noop` now needs an identity.
    std::fs::write(&file, jobs_config("\n[[auth.rules]]\nevent = \"demo.Noop\"\n")).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["reload", "--runtime-dir"])
        .arg(&g.runtime_dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    g.wait_line("job `anon`: demo.Noop answered 401");
    // The identified client's job still fires after the reload: its
    // firings answered 200 keep coming (counted past the refusal).
    let seen = || g.count_lines("job `ada`: demo.Noop answered 200");
    let before = seen();
    eventually("ada's job fires after the reload", PATIENCE, || {
        if seen() > before { Ok(()) } else { Err(before) }
    });

    // A token that expires: the job fires until `exp`, then is refused.
    let brief = ws_as(&g, Some(&jobs_token("bo", 2))).await;
    ws_call(&brief, "scheduler.Schedule", &every("bo")).await.unwrap();
    let expired = g.wait_line("job `bo`: demo.Noop answered 401");
    assert!(expired.contains("expired"), "{expired}");
}
