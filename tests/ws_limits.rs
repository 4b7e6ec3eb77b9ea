//! WebSocket clients that abuse the protocol rather than the API: pings
//! sent by a client that never reads, endless empty continuation frames,
//! and thousands of idle connections. Raw sockets, so that the client does
//! exactly (and only) what the test says.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;

/// An upgraded `/ws`-style connection, the 101 read.
fn handshake(g: &Group, path: &str) -> TcpStream {
    let mut s = TcpStream::connect(g.addr).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    s.set_write_timeout(Some(PATIENCE)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: t\r\nupgrade: websocket\r\nconnection: Upgrade\r\n\
         sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n\r\n"
    )
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    s
}

/// A masked client frame.
fn frame(opcode: u8, fin: bool, payload: &[u8]) -> Vec<u8> {
    assert!(payload.len() < 126);
    let mask = [0x11, 0x22, 0x33, 0x44];
    let mut out = vec![opcode | if fin { 0x80 } else { 0 }, 0x80 | payload.len() as u8];
    out.extend_from_slice(&mask);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    out
}

/// Reads server frames until a close frame; its code, or `None` if the
/// connection ended without one.
fn close_code(s: &mut TcpStream) -> Option<u16> {
    loop {
        let mut head = [0u8; 2];
        s.read_exact(&mut head).ok()?;
        let len = match head[1] & 0x7f {
            126 => {
                let mut l = [0u8; 2];
                s.read_exact(&mut l).ok()?;
                u16::from_be_bytes(l) as usize
            }
            127 => {
                let mut l = [0u8; 8];
                s.read_exact(&mut l).ok()?;
                u64::from_be_bytes(l) as usize
            }
            n => n as usize,
        };
        let mut payload = vec![0u8; len];
        s.read_exact(&mut payload).ok()?;
        if head[0] & 0x0f == 0x8 {
            return Some(u16::from_be_bytes([payload[0], payload[1]]));
        }
    }
}

fn listener_rss(g: &Group) -> u64 {
    rss_kib(g.pid_of("listener"))
}

#[test]
fn a_ping_flood_from_a_client_that_never_reads_is_bounded_and_closed() {
    let g = Group::builder("ws-ping-flood")
        .config("[listener]\nwrite_stall_timeout_ms = 1000\n[listener.ws]\nping_ms = 600000\n")
        .start();
    let ping = frame(0x9, true, &[b'p'; 125]);
    let burst: Vec<u8> = ping.iter().copied().cycle().take(ping.len() * 512).collect();
    for path in ["/ws", "/ws/echo"] {
        let before = listener_rss(&g);
        let mut s = handshake(&g, path);
        // Pings, never a read: each asks for a pong the client never takes.
        let started = Instant::now();
        let mut sent = 0usize;
        let closed = loop {
            if s.write_all(&burst).is_err() {
                break true;
            }
            sent += burst.len();
            if sent >= 256 << 20 || started.elapsed() > PATIENCE {
                break false;
            }
        };
        let grown_mib = listener_rss(&g).saturating_sub(before) / 1024;
        assert!(closed, "{path}: still open after {} MiB of pings", sent >> 20);
        assert!(grown_mib < 32, "{path}: the listener grew by {grown_mib} MiB");
    }
    assert_eq!(get(g.addr, "/noop").unwrap().status, 200);
}

#[test]
fn endless_empty_continuation_frames_are_closed_with_1008() {
    let g = Group::start("ws-empty-fragments");
    for path in ["/ws", "/ws/echo"] {
        let mut s = handshake(&g, path);
        s.write_all(&frame(0x1, false, b"{")).unwrap();
        let empty = frame(0x0, false, b"");
        // Written until the server gives up on them (it stops reading, and
        // a write fails) or enough to be sure it never will.
        for _ in 0..10_000 {
            if s.write_all(&empty).is_err() {
                break;
            }
        }
        assert_eq!(close_code(&mut s), Some(1008), "{path}");
    }
    assert_eq!(get(g.addr, "/noop").unwrap().status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_websockets_cost_a_few_kib_each() {
    let g = Group::start("ws-idle");
    let url = format!("ws://{}/ws", g.addr);
    let open = |n: usize| {
        let url = url.clone();
        async move {
            let mut all = Vec::new();
            for _ in 0..n / 50 {
                let batch = (0..50).map(|_| tokio_tungstenite::connect_async(url.clone()));
                for c in futures_util::future::join_all(batch).await {
                    all.push(c.unwrap().0);
                }
            }
            all
        }
    };
    // What the first connections allocate once (runtime, buffers reused
    // afterwards) is not theirs alone.
    let warm = open(50).await;
    let settle = || tokio::time::sleep(Duration::from_millis(500));
    settle().await;
    let before = listener_rss(&g);
    let idle = open(500).await;
    settle().await;
    let per_connection = listener_rss(&g).saturating_sub(before) / idle.len() as u64;
    eprintln!("an idle WebSocket costs the listener {per_connection} KiB");
    assert!(
        per_connection <= 24,
        "an idle WebSocket costs the listener {per_connection} KiB"
    );
    drop((warm, idle));
}
