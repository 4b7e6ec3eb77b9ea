//! Many large bodies in flight at once, in every direction: downloads
//! (shared-memory replies), uploads (shared-memory requests, answered with
//! the same bytes) and client notifications fanned out to a subscriber.
//! Each body is over the shared-memory threshold (64 KiB), so every frame
//! carries a descriptor; with a hundred of them in flight a process reads
//! behind its peers, and its links must hold that backlog instead of
//! closing with everything in flight. Zero non-2xx, on both transports,
//! with answers straight back (the default, decision 0143) and, once, back
//! through the router.

mod common;

use std::sync::{Arc, Barrier};
use std::thread;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};

use common::*;
use futures_util::StreamExt;
use serde_json::json;
use switchyard_client::{Client, GrpcClient};

/// Connections (HTTP/1.1) or streams on one connection (h2c) at once.
const CLIENTS: usize = 100;
/// Requests each HTTP/1.1 client makes, one connection each.
const ROUNDS: usize = 1;
/// Requests each h2c stream slot makes.
const H2_ROUNDS: usize = 3;
/// Over HTTP/1.1 downloads are 1 MiB, over h2c 256 KiB: both above the
/// shared-memory threshold, and together a few seconds in a debug build.
const DOWNLOAD: usize = 1024 * 1024;
const H2_DOWNLOAD: usize = 256 * 1024;
const UPLOAD: usize = 256 * 1024;
const NOTIFICATION: usize = 96 * 1024;

/// `return_path`: `None` for the default (direct).
fn config(transport: &str, return_path: Option<&str>) -> String {
    let return_path = return_path
        .map(|p| format!("return_path = \"{p}\"\n"))
        .unwrap_or_default();
    format!("[group]\ntransport = \"{transport}\"\n{return_path}\n[listener.ws]\nnotify = true\n")
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

/// `CLIENTS` streams at once on one h2c connection, `H2_ROUNDS` requests
/// each: `path` with `body` (a GET when empty); every answer that is not a
/// 200 with `expect_len` bytes (equal to `body` when it has one) is
/// returned as a line.
fn h2_hammer(
    rt: &tokio::runtime::Runtime,
    addr: std::net::SocketAddr,
    path: &str,
    body: Bytes,
    expect_len: usize,
) -> Vec<String> {
    rt.block_on(async {
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .initial_stream_window_size(4 << 20)
            .initial_connection_window_size(64 << 20)
            .handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        let slots: Vec<_> = (0..CLIENTS)
            .map(|_| {
                let mut sender = sender.clone();
                let (path, body) = (path.to_owned(), body.clone());
                tokio::spawn(async move {
                    let mut failed = Vec::new();
                    for _ in 0..H2_ROUNDS {
                        let method = if body.is_empty() { "GET" } else { "POST" };
                        let request = http::Request::builder()
                            .method(method)
                            .uri(format!("http://{addr}{path}"))
                            .header("content-type", "application/octet-stream")
                            .body(Full::new(body.clone()))
                            .unwrap();
                        let outcome = async {
                            sender.ready().await.map_err(|e| e.to_string())?;
                            let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
                            let status = response.status();
                            let got = response
                                .into_body()
                                .collect()
                                .await
                                .map_err(|e| e.to_string())?
                                .to_bytes();
                            if status != 200 || got.len() != expect_len || (!body.is_empty() && got != body) {
                                return Err(format!(
                                    "{status} with {} bytes: {:.200}",
                                    got.len(),
                                    String::from_utf8_lossy(&got)
                                ));
                            }
                            Ok(())
                        };
                        if let Err(e) = within(outcome).await {
                            failed.push(format!("{method} {path}: {e}"));
                        }
                    }
                    failed
                })
            })
            .collect();
        let mut failed = Vec::new();
        for slot in slots {
            failed.extend(slot.await.unwrap());
        }
        failed
    })
}

fn assert_none_failed(what: &str, total: usize, failed: &[String]) {
    assert!(
        failed.is_empty(),
        "{} of {total} {what} failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
}

fn bodies_in_flight_never_drop_the_links(tag: &'static str, transport: &str, return_path: Option<&str>) {
    let g = Group::builder(tag)
        .config(&config(transport, return_path))
        .start();
    let rt = runtime();

    let failed = h2_hammer(
        &rt,
        g.addr,
        &format!("/payload/{H2_DOWNLOAD}"),
        Bytes::new(),
        H2_DOWNLOAD,
    );
    assert_none_failed("h2c downloads", CLIENTS * H2_ROUNDS, &failed);
    let upload_body: Bytes = (0..UPLOAD).map(|i| (i * 31) as u8).collect();
    let failed = h2_hammer(&rt, g.addr, "/echo-bytes", upload_body, UPLOAD);
    assert_none_failed("h2c uploads", CLIENTS * H2_ROUNDS, &failed);
    assert_none_failed("HTTP/1.1 downloads", CLIENTS * ROUNDS, &hammer(g.addr, download));
    assert_none_failed("HTTP/1.1 uploads", CLIENTS * ROUNDS, &hammer(g.addr, upload));

    large_notifications_all_arrive(&rt, &g);

    // The links held: no process of the group logged a link it dropped
    // (a return link's reader either side names a bad frame).
    for needle in ["descriptors", "went down while handling", "bad frame"] {
        let lines = g.lines_with(needle);
        assert!(lines.is_empty(), "{needle}: {:?}", &lines[..lines.len().min(3)]);
    }
}

async fn within<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(PATIENCE, f).await.expect("in time")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn large_notifications_all_arrive(rt: &tokio::runtime::Runtime, g: &Group) {
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
        let mut seen = [false; CLIENTS];
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
    bodies_in_flight_never_drop_the_links("bodies-ring", "ring", None);
}

#[test]
fn bodies_in_flight_never_drop_socket_links() {
    bodies_in_flight_never_drop_the_links("bodies-socket", "socket", None);
}

#[test]
fn bodies_in_flight_never_drop_socket_links_on_the_router_path() {
    bodies_in_flight_never_drop_the_links("bodies-socket-router", "socket", Some("router"));
}
