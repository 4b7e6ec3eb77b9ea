//! WebSocket conformance against a real group: permessage-deflate (RFC
//! 7692) with a real client (Python `websockets`, which offers it as
//! browsers do) and byte for byte on the wire, over HTTP/1.1 and over h2
//! (RFC 8441); a deflate bomb closed with 1009 at the message limit;
//! subprotocols chosen only among those the server speaks (RFC 6455
//! §4.2.2); and a message left unfinished closed at its deadline.

mod common;

use std::collections::HashMap;
use std::process::Command;

use bytes::Bytes;
use common::h2_stream::H2Stream;
use common::*;
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};
use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{CloseCode, Data, OpCode};

/// Raw deflate of one message, its sync-flush tail left off (RFC 7692 §7.2.1).
fn deflate(bytes: &[u8]) -> Vec<u8> {
    let mut c = Compress::new(Compression::default(), false);
    let mut out = Vec::with_capacity(bytes.len() + 1024);
    while (c.total_in() as usize) < bytes.len() || out.len() == out.capacity() {
        let at = c.total_in() as usize;
        out.reserve(64 * 1024);
        c.compress_vec(&bytes[at..], &mut out, FlushCompress::Sync)
            .unwrap();
    }
    assert!(out.ends_with(&[0, 0, 0xff, 0xff]));
    out.truncate(out.len() - 4);
    out
}

fn inflate(bytes: &[u8]) -> Vec<u8> {
    let mut d = Decompress::new(false);
    let mut input = bytes.to_vec();
    input.extend_from_slice(&[0, 0, 0xff, 0xff]);
    let mut out = Vec::with_capacity(1 << 20);
    while (d.total_in() as usize) < input.len() {
        let at = d.total_in() as usize;
        out.reserve(1 << 20);
        d.decompress_vec(&input[at..], &mut out, FlushDecompress::Sync)
            .unwrap();
    }
    out
}

/// A compressed data frame: RSV1 on a message's first frame only.
fn compressed_frame(payload: Vec<u8>, opcode: Data, first: bool, fin: bool) -> Message {
    let mut frame = Frame::message(Bytes::from(payload), OpCode::Data(opcode), fin);
    frame.header_mut().rsv1 = first;
    Message::Frame(frame)
}

/// An HTTP/1.1 upgrade written by hand: the status, the answer's headers
/// (lowercase names) and the socket.
async fn handshake(
    g: &Group,
    path: &str,
    extra: &[(&str, &str)],
) -> (u16, HashMap<String, String>, TcpStream) {
    let mut tcp = TcpStream::connect(g.addr).await.unwrap();
    let mut head = format!(
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    );
    for (name, value) in extra {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    tcp.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    while !answer.ends_with(b"\r\n\r\n") {
        let b = tokio::time::timeout(PATIENCE, tcp.read_u8())
            .await
            .unwrap()
            .unwrap();
        answer.push(b);
    }
    let text = String::from_utf8(answer).unwrap();
    let mut lines = text.split("\r\n");
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    (status, headers, tcp)
}

/// Writes one masked client frame.
async fn write_frame(tcp: &mut TcpStream, first_byte: u8, payload: &[u8]) {
    let mut out = vec![first_byte];
    match payload.len() {
        n if n < 126 => out.push(0x80 | n as u8),
        n if n < 65536 => {
            out.push(0x80 | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(0x80 | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    let mask = [0x12, 0x34, 0x56, 0x78];
    out.extend_from_slice(&mask);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    tcp.write_all(&out).await.unwrap();
}

/// Reads one server frame: its first byte and payload.
async fn read_frame(tcp: &mut TcpStream) -> (u8, Vec<u8>) {
    let read = async {
        let first = tcp.read_u8().await.unwrap();
        let second = tcp.read_u8().await.unwrap();
        assert_eq!(second & 0x80, 0, "server frames are not masked");
        let len = match second & 0x7f {
            126 => tcp.read_u16().await.unwrap() as usize,
            127 => tcp.read_u64().await.unwrap() as usize,
            n => n as usize,
        };
        let mut payload = vec![0; len];
        tcp.read_exact(&mut payload).await.unwrap();
        (first, payload)
    };
    tokio::time::timeout(PATIENCE, read)
        .await
        .expect("a frame in time")
}

#[test]
fn a_python_websockets_client_negotiates_deflate_and_protocols() {
    let g = Group::start("ws-deflate-python");
    let out = Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/ws_deflate_client.py"))
        .arg(g.addr.to_string())
        .output()
        .expect("run python3 (pip install websockets)");
    assert!(
        out.status.success(),
        "the Python client failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        result["extensions"]
            .as_str()
            .is_some_and(|e| e.starts_with("permessage-deflate")),
        "{result}"
    );
    assert_eq!(
        result["negotiated"],
        serde_json::json!(["PerMessageDeflate"]),
        "{result}"
    );
    assert_eq!(
        result["echoed"],
        serde_json::json!([true, true, true, true, true]),
        "{result}"
    );
    // 2 MiB inflated from ~2 KiB: refused at the 256 KiB message limit.
    assert_eq!(result["bomb"], 1009, "{result}");
    assert_eq!(result["foreign_protocol"], Value::Null, "{result}");
    assert_eq!(result["own_protocol"], "switchyard.v1", "{result}");
    assert_eq!(result["request_status"], 200, "{result}");
}

#[tokio::test]
async fn compressed_messages_on_the_wire_over_http1() {
    let g = Group::start("ws-deflate-wire");
    // What browsers offer.
    let (status, headers, mut tcp) = handshake(
        &g,
        "/ws/echo",
        &[(
            "Sec-WebSocket-Extensions",
            "permessage-deflate; client_max_window_bits",
        )],
    )
    .await;
    assert_eq!(status, 101);
    assert_eq!(
        headers["sec-websocket-extensions"],
        "permessage-deflate; server_no_context_takeover; client_no_context_takeover"
    );
    let text = "the quick brown fox jumps over the lazy dog; ".repeat(5_000);
    // Compressed, in two frames (RSV1 on the first only).
    let z = deflate(text.as_bytes());
    let (a, b) = z.split_at(z.len() / 2);
    write_frame(&mut tcp, 0x41, a).await;
    write_frame(&mut tcp, 0x80, b).await;
    // The echo comes back compressed.
    let (first, mut payload) = read_frame(&mut tcp).await;
    assert_eq!(first & 0x4f, 0x41, "a text message with RSV1: {first:#x}");
    let mut fin = first & 0x80 != 0;
    while !fin {
        let (next, more) = read_frame(&mut tcp).await;
        assert_eq!(next & 0x7f, 0x00, "a plain continuation: {next:#x}");
        payload.extend(more);
        fin = next & 0x80 != 0;
    }
    assert!(
        payload.len() < text.len() / 10,
        "{} bytes on the wire",
        payload.len()
    );
    assert_eq!(inflate(&payload), text.as_bytes());
    // An uncompressed message is still a message.
    write_frame(&mut tcp, 0x81, b"plain").await;
    assert_eq!(read_frame(&mut tcp).await, (0x81, b"plain".to_vec()));

    // Garbage where deflate data should be: 1007.
    write_frame(&mut tcp, 0xc2, &[0xff; 64]).await;
    let (first, payload) = read_frame(&mut tcp).await;
    assert_eq!(first, 0x88, "a close frame");
    assert_eq!(u16::from_be_bytes([payload[0], payload[1]]), 1007);

    // Without an offer, or when it is off, no extension.
    let (status, headers, _) = handshake(&g, "/ws/echo", &[]).await;
    assert_eq!(status, 101);
    assert!(!headers.contains_key("sec-websocket-extensions"));
    let off = Group::builder("ws-deflate-off")
        .config("[listener.ws]\ndeflate = false\n")
        .start();
    let (status, headers, _) = handshake(
        &off,
        "/ws/echo",
        &[("Sec-WebSocket-Extensions", "permessage-deflate")],
    )
    .await;
    assert_eq!(status, 101);
    assert!(!headers.contains_key("sec-websocket-extensions"));
}

#[tokio::test]
async fn subprotocols_are_chosen_among_those_the_server_speaks() {
    let g = Group::start("ws-subprotocols");
    let offer = |p: &'static str| [("Sec-WebSocket-Protocol", p)];
    let (status, headers, _) = handshake(&g, "/ws", &offer("mqtt, graphql-ws")).await;
    assert_eq!(status, 101);
    assert!(!headers.contains_key("sec-websocket-protocol"), "{headers:?}");
    let (_, headers, _) = handshake(&g, "/ws", &offer("mqtt, switchyard.v1")).await;
    assert_eq!(headers["sec-websocket-protocol"], "switchyard.v1");
    // Configured to speak none: never one.
    let none = Group::builder("ws-subprotocols-none")
        .config("[listener.ws]\nsubprotocols = []\n")
        .start();
    let (status, headers, _) = handshake(&none, "/ws", &offer("switchyard.v1")).await;
    assert_eq!(status, 101);
    assert!(!headers.contains_key("sec-websocket-protocol"), "{headers:?}");
}

#[tokio::test]
async fn an_unfinished_message_is_closed_at_its_deadline() {
    let g = Group::builder("ws-unfinished")
        .config("[listener.ws]\nmessage_timeout_ms = 300\nping_ms = 100\n")
        .start();
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{}/ws", g.addr))
        .await
        .unwrap();
    // A whole message is served as ever.
    ws.send(Message::text(r#"{"id":1,"type":"demo.Noop"}"#))
        .await
        .unwrap();
    // The first fragment of a message whose end never comes; the client
    // keeps answering the server's pings meanwhile (tungstenite does).
    let part = Frame::message(Bytes::from_static(b"{\"id\":2,"), OpCode::Data(Data::Text), false);
    ws.send(Message::Frame(part)).await.unwrap();
    let mut answered = false;
    let close = loop {
        match tokio::time::timeout(PATIENCE, ws.next())
            .await
            .expect("closed in time")
        {
            Some(Ok(Message::Close(frame))) => break frame.expect("a close code"),
            Some(Ok(Message::Text(_))) => answered = true,
            Some(Ok(_)) => {}
            other => panic!("{other:?}"),
        }
    };
    assert!(answered, "the whole message was answered");
    assert_eq!(close.code, CloseCode::Policy);
    assert_eq!(close.reason.as_str(), "message not finished in time");
}

#[tokio::test]
async fn deflate_over_h2_extended_connect() {
    let g = Group::start("ws-deflate-h2");
    let tcp = TcpStream::connect(g.addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut client = tokio::time::timeout(PATIENCE, client.ready())
        .await
        .unwrap()
        .unwrap();
    // The server's SETTINGS come before its first answer.
    let get = http::Request::get("http://localhost/health").body(()).unwrap();
    let (response, _) = client.send_request(get, true).unwrap();
    tokio::time::timeout(PATIENCE, response).await.unwrap().unwrap();
    let mut req = http::Request::builder()
        .method(http::Method::CONNECT)
        .uri("http://localhost/ws/echo")
        .header("sec-websocket-version", "13")
        // A window the server's compressor cannot keep to: its messages
        // then go uncompressed, which tungstenite's client can read.
        .header(
            "sec-websocket-extensions",
            "permessage-deflate; server_max_window_bits=10",
        )
        .body(())
        .unwrap();
    req.extensions_mut()
        .insert(h2::ext::Protocol::from_static("websocket"));
    let (response, send) = client.send_request(req, false).unwrap();
    let response = tokio::time::timeout(PATIENCE, response).await.unwrap().unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["sec-websocket-extensions"],
        "permessage-deflate; server_no_context_takeover; client_no_context_takeover; server_max_window_bits=10"
    );
    let io = H2Stream {
        send,
        recv: response.into_body(),
        pending: Bytes::new(),
    };
    let mut ws = WebSocketStream::from_raw_socket(io, Role::Client, None).await;
    let text = "over h2, compressed ".repeat(3_000);
    ws.send(compressed_frame(deflate(text.as_bytes()), Data::Text, true, true))
        .await
        .unwrap();
    match tokio::time::timeout(PATIENCE, ws.next()).await.unwrap() {
        Some(Ok(Message::Text(got))) => assert_eq!(got.as_str(), text),
        other => panic!("{other:?}"),
    }
    // A bomb on the same connection: 4 MiB of zeros in a few KiB.
    let zeros = deflate(&vec![0u8; 4 << 20]);
    assert!(zeros.len() < 64 * 1024);
    ws.send(compressed_frame(zeros, Data::Binary, true, true))
        .await
        .unwrap();
    let close = loop {
        match tokio::time::timeout(PATIENCE, ws.next()).await.unwrap() {
            Some(Ok(Message::Close(frame))) => break frame.expect("a close code"),
            Some(Ok(_)) => {}
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(close.code, CloseCode::Size);
    // The connection serves on.
    let get = http::Request::get("http://localhost/health").body(()).unwrap();
    let (response, _) = client.send_request(get, true).unwrap();
    let response = tokio::time::timeout(PATIENCE, response).await.unwrap().unwrap();
    assert_eq!(response.status(), 200);
}
