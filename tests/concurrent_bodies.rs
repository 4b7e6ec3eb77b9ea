//! Many large bodies in flight at once, in every direction: downloads
//! (shared-memory replies), uploads (shared-memory requests, answered with
//! the same bytes) and client notifications fanned out to a subscriber.
//! Each body is over the shared-memory threshold (64 KiB), so every frame
//! carries a descriptor; with a hundred of them in flight a process reads
//! behind its peers, and its links must hold that backlog instead of
//! closing with everything in flight. Zero non-2xx, on both transports.

mod common;

use std::sync::{Arc, Barrier};
use std::thread;

use common::*;
use futures_util::StreamExt;
use serde_json::json;
use switchyard_client::{Client, GrpcClient};

const CLIENTS: usize = 100;
const ROUNDS: usize = 3;
const DOWNLOAD: usize = 256 * 1024;
const UPLOAD: usize = 128 * 1024;
const NOTIFICATION: usize = 96 * 1024;

fn config(transport: &str) -> String {
    format!("[group]\ntransport = \"{transport}\"\n\n[listener.ws]\nnotify = true\n")
}

/// `CLIENTS` threads, started together, each running `ROUNDS` requests;
/// every answer that is not a whole 200 is returned as a line.
fn hammer(
    addr: std::net::SocketAddr,
    request: fn(std::net::SocketAddr, usize) -> Result<(), String>,
) -> Vec<String> {
    let start = Arc::new(Barrier::new(CLIENTS));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|client| {
            let start = start.clone();
            thread::spawn(move || {
                start.wait();
                (0..ROUNDS)
                    .filter_map(|round| request(addr, client * ROUNDS + round).err())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    clients.into_iter().flat_map(|c| c.join().unwrap()).collect()
}

fn download(addr: std::net::SocketAddr, _: usize) -> Result<(), String> {
    let r = get(addr, &format!("/payload/{DOWNLOAD}")).map_err(|e| format!("download: {e}"))?;
    if r.status != 200 || r.body.len() != DOWNLOAD {
        return Err(format!(
            "download: {} with {} bytes: {:.200}",
            r.status,
            r.body.len(),
            r.text()
        ));
    }
    Ok(())
}

fn upload(addr: std::net::SocketAddr, n: usize) -> Result<(), String> {
    let body: Vec<u8> = (0..UPLOAD).map(|i| (i * 31 + n) as u8).collect();
    let r = request_with(
        addr,
        "POST",
        "/echo-bytes",
        &[("content-type", "application/octet-stream")],
        &body,
    )
    .map_err(|e| format!("upload: {e}"))?;
    if r.status != 200 || r.body != body {
        return Err(format!(
            "upload: {} with {} bytes: {:.200}",
            r.status,
            r.body.len(),
            r.text()
        ));
    }
    Ok(())
}

fn bodies_in_flight_never_drop_the_links(tag: &'static str, transport: &str) {
    let g = Group::builder(tag).config(&config(transport)).start();

    let failed = hammer(g.addr, download);
    assert!(
        failed.is_empty(),
        "{} of {} downloads failed: {:?}",
        failed.len(),
        CLIENTS * ROUNDS,
        &failed[..failed.len().min(5)]
    );
    let failed = hammer(g.addr, upload);
    assert!(
        failed.is_empty(),
        "{} of {} uploads failed: {:?}",
        failed.len(),
        CLIENTS * ROUNDS,
        &failed[..failed.len().min(5)]
    );

    large_notifications_all_arrive(&g);

    // The links held: no process of the group logged a link it dropped.
    for needle in ["descriptors", "went down while handling"] {
        let lines = g.lines_with(needle);
        assert!(lines.is_empty(), "{needle}: {:?}", &lines[..lines.len().min(3)]);
    }
}

async fn within<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(PATIENCE, f).await.expect("in time")
}

fn large_notifications_all_arrive(g: &Group) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let ws = within(Client::connect(&format!("ws://{}/ws", g.addr)))
            .await
            .unwrap();
        let grpc = within(GrpcClient::connect(&format!("http://{}", g.addr)))
            .await
            .unwrap();
        let mut sub = within(ws.subscribe("bulk.*")).await.unwrap();
        // The subscription reaches the broker a moment after `subscribe`
        // returns: small probes until one comes back.
        within(async {
            loop {
                grpc.notify("bulk.probe", &json!({})).await.unwrap();
                let wait = tokio::time::sleep(std::time::Duration::from_millis(100));
                tokio::select! {
                    Some(_) = sub.next() => break,
                    () = wait => {}
                }
            }
        })
        .await;
        let sent: Vec<_> = (0..CLIENTS)
            .map(|i| {
                let grpc = grpc.clone();
                tokio::spawn(async move {
                    let blob = char::from(b'a' + (i % 26) as u8).to_string().repeat(NOTIFICATION);
                    grpc.notify("bulk.big", &json!({ "n": i, "blob": blob })).await
                })
            })
            .collect();
        for s in sent {
            s.await.unwrap().expect("a large notification is accepted");
        }
        let mut seen = vec![false; CLIENTS];
        within(async {
            while seen.iter().any(|s| !s) {
                let event = sub.next().await.expect("the subscription stays open");
                if event.event != "bulk.big" {
                    continue;
                }
                let n = event.data["n"].as_u64().unwrap() as usize;
                let blob = event.data["blob"].as_str().unwrap();
                assert_eq!(blob.len(), NOTIFICATION, "notification {n} arrives whole");
                seen[n] = true;
            }
        })
        .await;
    });
}

#[test]
fn bodies_in_flight_never_drop_ring_links() {
    bodies_in_flight_never_drop_the_links("bodies-ring", "ring");
}

#[test]
fn bodies_in_flight_never_drop_socket_links() {
    bodies_in_flight_never_drop_the_links("bodies-socket", "socket");
}
