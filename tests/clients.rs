//! The Rust clients (`switchyard-client`) against a group with `[auth]`:
//! a bearer token or an API key presented on the WebSocket upgrade and on
//! every gRPC call, and typed requests whose reply type is the event's
//! (`Call`), not named at the call.

mod common;

use common::*;
use serde::{Deserialize, Serialize};
use switchyard_client::{Client, ClientError, GrpcClient, Hop};

const SECRET: &str = "clients-test-secret-of-thirty-two-bytes!";
/// `test`, whose SHA-256 the configuration holds.
const KEY: &str = "test";

/// The demo's `demo.Hello`, as a client crate that shares the plugin's
/// types would see it.
/// It declares its reply, so it is a `Call` with no more code.
#[derive(Serialize, Deserialize, switchyard_manager::Event)]
#[event(name = "demo.Hello", reply = Greeting)]
struct Hello {
    name: String,
}

#[derive(Debug, PartialEq, Deserialize)]
struct Greeting {
    message: String,
}

fn token(sub: &str) -> String {
    let claims = serde_json::json!({
        "sub": sub,
        "exp": jsonwebtoken::get_current_timestamp() + 600,
    });
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes()),
    )
    .unwrap()
}

fn config() -> String {
    format!(
        r#"[[managers]]
name = "basics"

[auth.jwt]
algorithms = ["HS256"]
secret = "{SECRET}"

[auth.api_keys]
[[auth.api_keys.keys]]
name = "ops"
sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

[[auth.rules]]
event = "demo.*"
"#
    )
}

fn status_of<T: std::fmt::Debug>(outcome: Result<T, ClientError>) -> u16 {
    match outcome {
        Err(ClientError::Status { status, .. }) => status,
        other => panic!("expected an error status, got {other:?}"),
    }
}

/// Whether gRPC refused the call for want of a (valid) credential.
#[track_caller]
fn unauthenticated<T: std::fmt::Debug>(outcome: Result<T, ClientError>) {
    match outcome {
        Err(ClientError::Grpc {
            code: tonic::Code::Unauthenticated,
            ..
        }) => {}
        other => panic!("expected UNAUTHENTICATED, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_clients_authenticate_and_make_typed_requests() {
    let g = Group::builder("clients-ws").config(&config()).start();
    let url = format!("ws://{}/ws", g.addr);
    let hello = Hello { name: "Ada".into() };
    let expected = Greeting {
        message: "Hello, Ada!".into(),
    };

    // No credential: the rule refuses the event.
    let anonymous = Client::connect(&url).await.unwrap();
    assert_eq!(status_of(anonymous.request(&hello).await), 401);

    let bearer = Client::builder(&url)
        .bearer(token("ada"))
        .connect()
        .await
        .unwrap();
    // The reply type comes from `Call`: no annotation, no type name.
    let greeting = bearer.request(&hello).await.unwrap();
    assert_eq!(greeting, expected);

    let keyed = Client::builder(&url).api_key(KEY).connect().await.unwrap();
    assert_eq!(keyed.request(&hello).await.unwrap(), expected);

    // Who said no (decision 0116): the listener (its rule; a type no
    // manager declares), or the handler itself (no hop).
    let refused = anonymous.request(&hello).await.unwrap_err();
    assert_eq!(
        (refused.status(), refused.hop()),
        (Some(401), Some(Hop::Listener))
    );
    let nowhere = bearer
        .call::<_, serde_json::Value>("nowhere.Nothing", &serde_json::json!({}))
        .await
        .unwrap_err();
    assert_eq!(
        (nowhere.status(), nowhere.hop()),
        (Some(404), Some(Hop::Listener)),
        "{nowhere}"
    );
    let own = bearer
        .call::<_, serde_json::Value>("demo.GetNote", &serde_json::json!({}))
        .await
        .unwrap_err();
    assert_eq!((own.status(), own.hop()), (Some(404), None), "{own}");

    // A credential that does not verify is refused at the upgrade.
    let wrong = Client::builder(&url).api_key("not-the-key").connect().await;
    assert_eq!(status_of(wrong.map(drop)), 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_clients_authenticate_and_make_typed_requests() {
    let g = Group::builder("clients-grpc").config(&config()).start();
    let url = format!("http://{}", g.addr);
    let hello = Hello { name: "Bo".into() };
    let expected = Greeting {
        message: "Hello, Bo!".into(),
    };

    let anonymous = GrpcClient::connect(&url).await.unwrap();
    unauthenticated(anonymous.request(&hello).await);

    let bearer = GrpcClient::builder(&url)
        .bearer(token("bo"))
        .connect()
        .await
        .unwrap();
    assert_eq!(bearer.request(&hello).await.unwrap(), expected);
    // Streams carry it too.
    assert!(bearer.subscribe("demo.*").await.is_ok());
    unauthenticated(anonymous.subscribe("demo.*").await.map(drop));

    let keyed = GrpcClient::builder(&url).api_key(KEY).connect().await.unwrap();
    assert_eq!(keyed.request(&hello).await.unwrap(), expected);
    let session = keyed.session().await.unwrap();
    let again: Greeting = session.call("demo.Hello", &hello).await.unwrap();
    assert_eq!(again, expected);

    let wrong = GrpcClient::builder(&url)
        .api_key("not-the-key")
        .connect()
        .await
        .unwrap();
    unauthenticated(wrong.request(&hello).await);
}
