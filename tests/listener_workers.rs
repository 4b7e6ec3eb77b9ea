//! `listener.workers = 2`: two listener processes accept on one port, each
//! with its own return pipes, and pushes reach a WebSocket client whichever
//! process holds its connection.

mod common;

use common::*;
use futures_util::{SinkExt, StreamExt};
use std::collections::HashSet;
use tokio_tungstenite::tungstenite::Message;

const CONFIG: &str = "[listener]\nworkers = 2\nthreads = 1\n\
                      [[managers]]\nname = \"basics\"\n[[managers]]\nname = \"ticker\"\n\
                      [managers.config]\ninterval_ms = 20\n";

/// Established TCP connections on local `port` held by process `pid`.
fn connections_of(pid: u32, port: u16) -> usize {
    let inodes: HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .filter_map(|l| {
                    l.to_str()?
                        .strip_prefix("socket:[")?
                        .strip_suffix(']')
                        .map(str::to_owned)
                })
                .collect()
        })
        .unwrap_or_default();
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|t| t.lines().skip(1).map(str::to_owned).collect::<Vec<_>>())
        .filter(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let local_port = cols
                .get(1)
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            local_port == Some(port)
                && cols.get(3) == Some(&"01")
                && cols.get(9).is_some_and(|i| inodes.contains(*i))
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_reach_clients_on_every_listener_process() {
    let g = Group::builder("listener-workers").config(CONFIG).start();
    let status = g.status();
    let listeners: Vec<u32> = status["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["role"] == "listener")
        .map(|p| p["pid"].as_u64().unwrap() as u32)
        .collect();
    assert_eq!(listeners.len(), 2, "{status}");
    assert_ne!(listeners[0], listeners[1]);

    // Connect until both processes hold at least one client: the kernel,
    // not us, decides which process accepts a connection.
    let url = format!("ws://{}/ws", g.addr);
    let mut clients = Vec::new();
    while listeners
        .iter()
        .any(|&pid| connections_of(pid, g.addr.port()) == 0)
    {
        assert!(
            clients.len() < 200,
            "200 connections all went to one listener process"
        );
        clients.push(tokio_tungstenite::connect_async(&url).await.unwrap().0);
    }
    for ws in &mut clients {
        ws.send(Message::Text(r#"{"id":"s","subscribe":"demo.tick"}"#.into()))
            .await
            .unwrap();
    }
    // Every client, on either process, receives ticks.
    for (i, ws) in clients.iter_mut().enumerate() {
        let mut pushes = 0;
        while pushes < 3 {
            let msg = tokio::time::timeout(PATIENCE, ws.next())
                .await
                .expect("a push in time")
                .unwrap()
                .unwrap();
            if let Message::Text(text) = msg {
                let v: serde_json::Value = serde_json::from_str(&text).unwrap();
                if v["event"] == "demo.tick" {
                    pushes += 1;
                }
            }
        }
        assert_eq!(pushes, 3, "client {i}");
    }
    // Plain requests are served too, whichever process takes them.
    for _ in 0..20 {
        assert_eq!(get(g.addr, "/noop").unwrap().status, 200);
    }
}
