//! Notifications larger than a frame (decision 0033) reach WebSocket
//! and gRPC subscribers whole, whether a manager or a client emits them:
//! the broker fans their bodies out through shared memory instead of
//! dropping frames over `group.max_frame_bytes` (1 MiB by default).

mod common;

use common::*;
use futures_util::StreamExt;
use serde_json::{Value, json};
use switchyard_client::{Client, GrpcClient};

/// Over the default 1 MiB frame limit.
const BIG: usize = 1_500_000;

fn config() -> String {
    format!(
        "[[managers]]\nname = \"basics\"\n\n[[managers]]\nname = \"ticker\"\n\
         [managers.config]\ninterval_ms = 200\npad_bytes = {BIG}\n\n\
         [listener.ws]\nnotify = true\n"
    )
}

async fn within<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(PATIENCE, f).await.expect("in time")
}

fn assert_padded(data: &Value, field: &str, fill: char) {
    let pad = data[field]
        .as_str()
        .unwrap_or_else(|| panic!("{field} in {data:.200}"));
    assert_eq!(pad.len(), BIG, "{field} arrives whole");
    assert!(pad.chars().all(|c| c == fill), "{field} arrives unchanged");
}

// Several threads: the group's drop blocks one while the gRPC client's
// connection task answers the listener's graceful GOAWAY on another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_notifications_reach_websocket_and_grpc_subscribers_whole() {
    let g = Group::builder("notify-large").config(&config()).start();
    let ws = within(Client::connect(&format!("ws://{}/ws", g.addr)))
        .await
        .unwrap();
    let grpc = within(GrpcClient::connect(&format!("http://{}", g.addr)))
        .await
        .unwrap();

    // From a manager: the ticker pads every tick past the frame limit.
    let mut ws_ticks = within(ws.subscribe("demo.tick")).await.unwrap();
    let mut grpc_ticks = within(grpc.subscribe("demo.tick")).await.unwrap();
    let tick = within(ws_ticks.next()).await.expect("a tick over WebSocket");
    assert_padded(&tick.data, "pad", 'x');
    let tick = within(grpc_ticks.next()).await.expect("a tick over gRPC");
    assert_padded(&tick.data, "pad", 'x');
    drop((ws_ticks, grpc_ticks));

    // From a client: a gRPC `Notify` of the same size is acknowledged only
    // because it is delivered, to subscribers of both kinds.
    let mut ws_sub = within(ws.subscribe("client.*")).await.unwrap();
    let mut grpc_sub = within(grpc.subscribe("client.*")).await.unwrap();
    // A subscription is active in the listener when `subscribe` returns,
    // and at the broker a moment later: small probes until both see one.
    within(async {
        let (mut ws_ready, mut grpc_ready) = (false, false);
        while !(ws_ready && grpc_ready) {
            grpc.notify("client.probe", &json!({})).await.unwrap();
            let wait = tokio::time::sleep(std::time::Duration::from_millis(100));
            tokio::pin!(wait);
            loop {
                tokio::select! {
                    Some(_) = ws_sub.next(), if !ws_ready => ws_ready = true,
                    Some(_) = grpc_sub.next(), if !grpc_ready => grpc_ready = true,
                    () = &mut wait => break,
                }
            }
        }
    })
    .await;
    let blob = "y".repeat(BIG);
    within(grpc.notify("client.big", &json!({ "blob": blob })))
        .await
        .expect("the notification is accepted");
    let push = within(next_big(&mut ws_sub)).await;
    assert_padded(&push, "blob", 'y');
    let push = within(next_big_grpc(&mut grpc_sub)).await;
    assert_padded(&push, "blob", 'y');
}

/// The data of the next `client.big` push (probes still in flight skipped).
async fn next_big(sub: &mut switchyard_client::Subscription) -> Value {
    loop {
        let push = sub.next().await.expect("a push over WebSocket");
        if push.event == "client.big" {
            return push.data;
        }
    }
}

async fn next_big_grpc(sub: &mut switchyard_client::GrpcSubscription) -> Value {
    loop {
        let push = sub.next().await.expect("a push over gRPC");
        if push.event == "client.big" {
            return push.data;
        }
    }
}
