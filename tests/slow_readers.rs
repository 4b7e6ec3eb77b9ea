//! Clients that ask for large responses and never read them: they must not
//! hold the listener's shared memory, and with it everyone else's answers.
//! A connection with something to send that makes no progress for
//! `listener.write_stall_timeout_ms` is closed and what it held released,
//! whether its socket is full (HTTP/1.1) or its h2 window stays shut; and
//! one connection holds at most `listener.max_connection_bytes` of
//! responses its client has not taken.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::Instant;

use common::*;
use http_body_util::Empty;
use hyper_util::rt::{TokioExecutor, TokioIo};

/// Copied into shared memory per response: each unread answer holds its own.
const BIG: &str = "/payload/16777216?copy=true";

/// A budget that a dozen unread 16 MiB answers exhaust.
fn config(extra: &str) -> String {
    format!("[group]\nshm_budget_bytes = 134217728\n[listener]\n{extra}")
}

/// A connection whose answer is never read; the receive buffer is kept
/// small so that the server's writes block early.
fn never_reading(g: &Group) -> TcpStream {
    let s = TcpStream::connect(g.addr).unwrap();
    let small: libc::c_int = 4096;
    // SAFETY: setsockopt reads a c_int of the given size from a valid pointer.
    unsafe {
        use std::os::fd::AsRawFd;
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&small as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
    (&s).write_all(format!("GET {BIG} HTTP/1.1\r\nhost: t\r\n\r\n").as_bytes())
        .unwrap();
    s
}

#[test]
fn http1_clients_that_never_read_are_closed_and_release_their_memory() {
    // Those answered 503 instead are idle afterwards: closed soon too.
    let g = Group::builder("slow-read-h1")
        .config(&config(
            "write_stall_timeout_ms = 1000\nidle_timeout_ms = 1000\nheader_read_timeout_ms = 1000\n",
        ))
        .start();
    let listener = g.pid_of("listener");
    // The first answer opens the manager instance's return link to this
    // listener process (decision 0143), which stays: counted before, not
    // taken for a stalled connection's descriptor.
    assert_eq!(get(g.addr, BIG).unwrap().status, 200);
    let fds_before = open_fds(listener);
    let listing_before = fd_targets(listener);
    let stalled: Vec<TcpStream> = (0..12).map(|_| never_reading(&g)).collect();
    // Once the stalled connections are closed, a client that reads gets
    // the whole answer again.
    let deadline = Instant::now() + PATIENCE;
    loop {
        let r = get(g.addr, BIG).unwrap_or_else(|err| {
            panic!(
                "a reading client's GET: {err}; the listener's descriptors: {:?}",
                fd_targets(listener)
            )
        });
        if r.status == 200 {
            assert_eq!(r.body.len(), 16 << 20);
            break;
        }
        assert_eq!(r.status, 503, "{}", r.text());
        assert!(
            Instant::now() < deadline,
            "the stalled clients still hold the budget"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // The listener closed them all (reading them here would make them
    // progress).
    let deadline = Instant::now() + PATIENCE;
    while open_fds(listener) > fds_before {
        assert!(
            Instant::now() < deadline,
            "the listener keeps stalled connections open: {:?} before, {:?} now",
            listing_before,
            fd_targets(listener)
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    drop(stalled);
    assert_eq!(get(g.addr, "/noop").unwrap().status, 200);
}

/// An h2 connection with 64 KiB windows that reads no response body.
async fn h2_never_reading(
    g: &Group,
) -> (
    hyper::client::conn::http2::SendRequest<Empty<bytes::Bytes>>,
    tokio::task::JoinHandle<()>,
) {
    let tcp = tokio::net::TcpStream::connect(g.addr).await.unwrap();
    let (send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(65_535)
        .adaptive_window(false)
        .handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    (send, driver)
}

fn big_request(g: &Group) -> http::Request<Empty<bytes::Bytes>> {
    http::Request::get(format!("http://{}{BIG}", g.addr))
        .body(Empty::new())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_connection_whose_window_stays_shut_is_closed() {
    let g = Group::builder("slow-read-h2")
        .config(&config("write_stall_timeout_ms = 1000\n"))
        .start();
    let (mut send, driver) = h2_never_reading(&g).await;
    // Answers whose bodies are never read: held by flow control.
    let mut unread = Vec::new();
    for _ in 0..12 {
        match send.send_request(big_request(&g)).await {
            Ok(response) => unread.push(response),
            Err(_) => break, // closed already
        }
    }
    assert!(unread.iter().any(|r| r.status() == 200));
    // The server ends the connection on its own.
    tokio::time::timeout(PATIENCE, driver)
        .await
        .expect("the stalled h2 connection is closed by the server")
        .unwrap();
    drop(unread);
    let addr = g.addr;
    let status = tokio::task::spawn_blocking(move || get(addr, BIG).unwrap().status)
        .await
        .unwrap();
    assert_eq!(status, 200, "the memory the connection held was released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_holds_at_most_max_connection_bytes() {
    let g = Group::builder("conn-bytes")
        .config("[listener]\nmax_connection_bytes = 33554432\n")
        .start();
    let (mut send, _driver) = h2_never_reading(&g).await;
    let mut statuses = Vec::new();
    let mut unread = Vec::new();
    for _ in 0..5 {
        let response = send.send_request(big_request(&g)).await.unwrap();
        statuses.push(response.status().as_u16());
        if response.status() == 503 {
            assert_eq!(response.headers()["retry-after"], "1");
        }
        unread.push(response);
    }
    assert_eq!(
        statuses,
        [200, 200, 503, 503, 503],
        "two 16 MiB answers fit in 32 MiB"
    );
    // Another connection is not affected.
    let addr = g.addr;
    let status = tokio::task::spawn_blocking(move || get(addr, BIG).unwrap().status)
        .await
        .unwrap();
    assert_eq!(status, 200);
}
