//! WebSocket over HTTP/2 (RFC 8441) against a real group: the server
//! advertises `SETTINGS_ENABLE_CONNECT_PROTOCOL`, an extended CONNECT with
//! `:protocol = websocket` opens `/ws/echo` on one h2 stream, and the same
//! session code as an HTTP/1.1 upgrade echoes text and binary messages,
//! while other streams of the same connection keep serving requests.

mod common;

use bytes::Bytes;
use common::h2_stream::{H2Stream, h2_ready};
use common::*;
use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::Role;

fn connect(path: &str, protocol: Option<&'static str>) -> http::Request<()> {
    let mut req = http::Request::builder()
        .method(http::Method::CONNECT)
        .uri(format!("http://localhost{path}"))
        .header("sec-websocket-version", "13")
        .body(())
        .unwrap();
    if let Some(p) = protocol {
        req.extensions_mut().insert(h2::ext::Protocol::from_static(p));
    }
    req
}

#[tokio::test]
async fn websocket_over_h2_echoes_through_the_group() {
    let g = Group::start("ws-h2");
    let mut client = h2_ready(g.addr).await;
    assert!(
        client.is_extended_connect_protocol_enabled(),
        "the server offers SETTINGS_ENABLE_CONNECT_PROTOCOL"
    );
    let (response, send) = client
        .send_request(connect("/ws/echo", Some("websocket")), false)
        .unwrap();
    let response = tokio::time::timeout(PATIENCE, response).await.unwrap().unwrap();
    assert_eq!(response.status(), 200, "a 2xx opens the stream (RFC 8441 §5)");
    assert!(response.headers().get("sec-websocket-accept").is_none());
    let io = H2Stream {
        send,
        recv: response.into_body(),
        pending: Bytes::new(),
    };
    let mut ws = WebSocketStream::from_raw_socket(io, Role::Client, None).await;
    for text in ["hello over h2", "", &"x".repeat(200_000)] {
        ws.send(Message::text(text)).await.unwrap();
        match tokio::time::timeout(PATIENCE, ws.next()).await.unwrap() {
            Some(Ok(Message::Text(got))) => assert_eq!(got.as_str(), text),
            other => panic!("{other:?}"),
        }
    }
    let binary: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    ws.send(Message::binary(binary.clone())).await.unwrap();
    match tokio::time::timeout(PATIENCE, ws.next()).await.unwrap() {
        Some(Ok(Message::Binary(got))) => assert_eq!(got.as_ref(), &binary[..]),
        other => panic!("{other:?}"),
    }

    // The connection still serves ordinary requests beside the session.
    let get = http::Request::get("http://localhost/health").body(()).unwrap();
    let (response, _) = client.send_request(get, true).unwrap();
    let response = tokio::time::timeout(PATIENCE, response).await.unwrap().unwrap();
    assert_eq!(response.status(), 200);

    ws.close(None).await.unwrap();
    loop {
        match tokio::time::timeout(PATIENCE, ws.next()).await.unwrap() {
            Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
            Some(Ok(_)) => {}
        }
    }
}

#[tokio::test]
async fn connect_without_the_websocket_protocol_is_no_session() {
    let g = Group::start("ws-h2-plain");
    let mut client = h2_ready(g.addr).await;
    // A plain CONNECT (a proxy tunnel) is not a WebSocket.
    let (response, _send) = client.send_request(connect("/ws/echo", None), false).unwrap();
    let response = tokio::time::timeout(PATIENCE, response).await.unwrap().unwrap();
    assert_ne!(response.status(), 200);
    // Nor is another protocol.
    let (response, _send) = client
        .send_request(connect("/ws/echo", Some("webtransport")), false)
        .unwrap();
    let response = tokio::time::timeout(PATIENCE, response).await.unwrap().unwrap();
    assert_ne!(response.status(), 200);
    // A WebSocket CONNECT without version 13 gets 426 naming it.
    let mut req = connect("/ws/echo", Some("websocket"));
    req.headers_mut().remove("sec-websocket-version");
    let (response, _send) = client.send_request(req, false).unwrap();
    let response = tokio::time::timeout(PATIENCE, response).await.unwrap().unwrap();
    assert_eq!(response.status(), 426);
}

#[tokio::test]
async fn an_h2_connection_whose_session_ended_is_closed_when_idle() {
    let g = Group::builder("ws-h2-idle")
        .config("[listener]\nidle_timeout_ms = 1000\n")
        .start();
    let tcp = TcpStream::connect(g.addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    let connection = tokio::spawn(connection);
    let mut client = tokio::time::timeout(PATIENCE, client.ready())
        .await
        .unwrap()
        .unwrap();
    let get = http::Request::get("http://localhost/health").body(()).unwrap();
    let (response, _) = client.send_request(get, true).unwrap();
    assert_eq!(
        tokio::time::timeout(PATIENCE, response)
            .await
            .unwrap()
            .unwrap()
            .status(),
        200
    );
    let (response, send) = client
        .send_request(connect("/ws/echo", Some("websocket")), false)
        .unwrap();
    let response = tokio::time::timeout(PATIENCE, response).await.unwrap().unwrap();
    assert_eq!(response.status(), 200);
    let io = H2Stream {
        send,
        recv: response.into_body(),
        pending: Bytes::new(),
    };
    let mut ws = WebSocketStream::from_raw_socket(io, Role::Client, None).await;
    ws.send(Message::text("one")).await.unwrap();
    assert!(matches!(
        tokio::time::timeout(PATIENCE, ws.next()).await.unwrap(),
        Some(Ok(Message::Text(_)))
    ));
    ws.close(None).await.unwrap();
    while let Some(Ok(m)) = tokio::time::timeout(PATIENCE, ws.next()).await.unwrap() {
        if m.is_close() {
            break;
        }
    }
    drop(ws);
    // The session is over: the connection is an idle h2 connection again,
    // and the listener closes it (GOAWAY) after idle_timeout_ms.
    let ended = tokio::time::timeout(PATIENCE, connection).await;
    assert!(ended.is_ok(), "the idle connection was closed");
}
