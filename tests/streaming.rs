//! Streaming shared-memory pipes end to end: a 1 GiB download with the
//! listener's memory flat, backpressure from a reader that stops, a client
//! that goes away, a manager killed mid-stream, ranges of a stream, uploads
//! read as they arrive, and the shared-memory budget saying 503.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::*;
use sha2::Digest;
use switchyard_demo::stream_byte;

/// One period of the `/stream` pattern, long enough to compare any chunk
/// of up to 1 MiB against a slice of it.
fn pattern() -> Vec<u8> {
    (0..(1 << 20) + 251).map(stream_byte).collect()
}

/// A GET whose response is read incrementally: returns the connection
/// positioned after the head, and the head's text.
fn open_stream(addr: std::net::SocketAddr, path: &str, extra: &str) -> (TcpStream, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: t\r\nconnection: close\r\n{extra}\r\n"
    )
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    (s, String::from_utf8(head).unwrap())
}

/// Reads `len` bytes of the pattern starting at stream offset `from`,
/// checking each chunk; returns how many arrived before the end or an error.
fn read_checked(s: &mut TcpStream, from: u64, len: u64, pattern: &[u8]) -> u64 {
    let mut buf = vec![0u8; 1 << 20];
    let mut got = 0u64;
    while got < len {
        let want = buf.len().min((len - got) as usize);
        let n = match s.read(&mut buf[..want]) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let phase = ((from + got) % 251) as usize;
        assert!(
            buf[..n] == pattern[phase..phase + n],
            "bytes differ at offset {}",
            from + got
        );
        got += n as u64;
    }
    got
}

/// Threads of `pid` that are running stream producers or upload readers.
fn stream_threads(pid: u32) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.trim() == "switchyard-stre")
                })
                .filter_map(|t| t.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// For [`eventually`]: `pid` runs no stream producer or upload reader;
/// else the ones it runs.
fn no_stream_threads(pid: u32) -> Result<(), Vec<u32>> {
    let threads = stream_threads(pid);
    if threads.is_empty() { Ok(()) } else { Err(threads) }
}

/// For [`eventually`]: `pid` holds no more descriptors than `before`; else
/// how many it holds.
fn fds_back_to(pid: u32, before: usize) -> Result<(), usize> {
    let now = open_fds(pid);
    if now <= before { Ok(()) } else { Err(now) }
}

/// The bound this test states for the listener: its RSS may grow by at
/// most this much while streaming 1 GiB (it holds one 256 KiB ring mapping
/// and hyper's buffers; the body is never whole in memory).
const LISTENER_GROWTH_BOUND_KIB: u64 = 32 * 1024;

#[test]
fn a_gibibyte_streams_with_the_listeners_memory_flat() {
    let g = Group::start("stream-1g");
    let listener = g.pid_of("listener");
    let pattern = pattern();
    // Warm up the connection machinery so the baseline is steady.
    assert_eq!(get(g.addr, "/stream/1000").unwrap().body.len(), 1000);
    let before = rss_kib(listener);
    const GIB: u64 = 1 << 30;
    let (mut s, head) = open_stream(g.addr, &format!("/stream/{GIB}"), "");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains(&format!("content-length: {GIB}")), "{head}");
    let mut peak = before;
    let mut got = 0u64;
    while got < GIB {
        let n = read_checked(&mut s, got, (64 << 20).min(GIB - got), &pattern);
        assert!(n > 0, "the stream ended early at {got}");
        got += n;
        peak = peak.max(rss_kib(listener));
    }
    assert_eq!(got, GIB);
    assert!(
        peak <= before + LISTENER_GROWTH_BOUND_KIB,
        "listener RSS grew from {before} KiB to {peak} KiB streaming 1 GiB"
    );
}

#[test]
fn a_reader_that_stops_blocks_the_producer_with_memory_flat() {
    let g = Group::start("stream-slow");
    let (listener, manager) = (g.pid_of("listener"), g.pid_of("payload"));
    let pattern = pattern();
    let size: u64 = 512 << 20;
    let (mut s, _) = open_stream(g.addr, &format!("/stream/{size}"), "");
    assert_eq!(read_checked(&mut s, 0, 1 << 20, &pattern), 1 << 20);
    // We stop reading. The producer fills the ring and the socket buffers,
    // then sleeps in poll(2) (syscall 7 on x86-64, 73 ppoll on aarch64)
    // until there is room: it is blocked, not spinning and not buffering.
    let blocked_in_poll = || {
        let syscalls: Vec<String> = stream_threads(manager)
            .iter()
            .filter_map(|tid| std::fs::read_to_string(format!("/proc/{manager}/task/{tid}/syscall")).ok())
            .collect();
        if syscalls
            .iter()
            .any(|s| matches!(s.split(' ').next(), Some("7" | "73" | "271")))
        {
            Ok(())
        } else {
            Err(syscalls)
        }
    };
    eventually("the producer blocks in poll", PATIENCE, blocked_in_poll);
    let (listener_paused, manager_paused) = (rss_kib(listener), rss_kib(manager));
    // Still blocked a moment later: not a passing state.
    eventually("the producer stays blocked", PATIENCE, blocked_in_poll);
    // Then the rest arrives intact, with memory where it was.
    let got = read_checked(&mut s, 1 << 20, size - (1 << 20), &pattern);
    assert_eq!(got, size - (1 << 20));
    for (pid, paused, role) in [
        (listener, listener_paused, "listener"),
        (manager, manager_paused, "manager"),
    ] {
        let now = rss_kib(pid);
        assert!(
            now <= paused + LISTENER_GROWTH_BOUND_KIB,
            "{role} RSS went from {paused} KiB to {now} KiB"
        );
    }
}

#[test]
fn a_client_that_goes_away_stops_the_producer() {
    let g = Group::start("stream-gone");
    let (listener, manager) = (g.pid_of("listener"), g.pid_of("payload"));
    let pattern = pattern();
    assert_eq!(get(g.addr, "/stream/10").unwrap().body.len(), 10);
    let fds_before = open_fds(listener);
    let (mut s, _) = open_stream(g.addr, &format!("/stream/{}", 64u64 << 30), "");
    assert_eq!(read_checked(&mut s, 0, 1 << 20, &pattern), 1 << 20);
    assert_eq!(stream_threads(manager).len(), 1);
    drop(s);
    // 64 GiB would take minutes: the producer must have stopped instead.
    eventually("the producer thread ends", PATIENCE, || {
        no_stream_threads(manager)
    });
    eventually("the listener's descriptors are back", PATIENCE, || {
        fds_back_to(listener, fds_before)
    });
    assert_eq!(get(g.addr, "/stream/1000").unwrap().body.len(), 1000);
}

#[test]
fn kill_9_of_the_manager_mid_stream_ends_the_stream_with_an_error() {
    let shm_before = dev_shm_listing();
    let g = Group::start("stream-kill");
    let listener = g.pid_of("listener");
    let pattern = pattern();
    assert_eq!(get(g.addr, "/stream/10").unwrap().body.len(), 10);
    let fds_before = open_fds(listener);
    let size: u64 = 4 << 30;
    let (mut s, _) = open_stream(g.addr, &format!("/stream/{size}"), "");
    assert_eq!(read_checked(&mut s, 0, 1 << 20, &pattern), 1 << 20);
    let old = g.kill9("payload");
    // The client sees the stream end before its announced length: hyper
    // closes the connection when the pipe reports its producer gone.
    let got = read_checked(&mut s, 1 << 20, size, &pattern);
    assert!(got < size - (1 << 20), "the stream did not break off");
    drop(s);
    g.eventually_restarted("payload", old);
    g.eventually_status("/stream/1000", 200);
    let r = get(g.addr, "/stream/100000").unwrap();
    assert_eq!(r.body.len(), 100_000);
    assert!(r.body[..] == pattern[..100_000], "the next stream is fine");
    eventually("the listener's descriptors are back", PATIENCE, || {
        fds_back_to(listener, fds_before)
    });
    let new: Vec<String> = dev_shm_listing()
        .into_iter()
        .filter(|n| !shm_before.contains(n))
        .collect();
    assert!(new.is_empty(), "left in /dev/shm: {new:?}");
}

#[test]
fn ranges_of_a_stream_get_206_and_416() {
    let g = Group::start("stream-range");
    let pattern = pattern();
    let range = |spec: &str| {
        let req =
            format!("GET /stream/5000000 HTTP/1.1\r\nhost: t\r\nconnection: close\r\nrange: {spec}\r\n\r\n");
        raw(g.addr, req.as_bytes()).unwrap()
    };
    let r = range("bytes=1000000-1000999");
    assert_eq!(r.status, 206);
    assert_eq!(r.header("content-range"), Some("bytes 1000000-1000999/5000000"));
    let phase = 1_000_000 % 251;
    assert!(r.body[..] == pattern[phase..phase + 1000]);
    let r = range("bytes=-7");
    assert_eq!((r.status, r.body.len()), (206, 7));
    let r = range("bytes=5000000-");
    assert_eq!(r.status, 416);
    assert_eq!(r.header("content-range"), Some("bytes */5000000"));
    let r = get(g.addr, "/stream/5000000").unwrap();
    assert_eq!(r.header("accept-ranges"), Some("bytes"));
    assert_eq!(r.body.len(), 5_000_000);
}

fn sha256_hex(bytes: &[u8]) -> String {
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn uploads_stream_in_chunked_or_sized_and_oversized_ones_get_413() {
    let g = Group::builder("upload")
        .config("[listener]\nmax_upload_bytes = 8000000\n")
        .start();
    let body: Vec<u8> = (0..5_000_000u32).map(|i| (i * 7 % 256) as u8).collect();
    let want = sha256_hex(&body);
    // Sized.
    let mut req = format!(
        "POST /upload HTTP/1.1\r\nhost: t\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(&body);
    let r = raw(g.addr, &req).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let up: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(
        (up["length"].as_u64(), up["sha256"].as_str()),
        (Some(5_000_000), Some(&*want))
    );
    // Chunked, in uneven pieces.
    let chunked = |body: &[u8]| {
        let mut req =
            b"POST /upload HTTP/1.1\r\nhost: t\r\nconnection: close\r\ntransfer-encoding: chunked\r\n\r\n"
                .to_vec();
        for piece in body.chunks(333_333) {
            req.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
            req.extend_from_slice(piece);
            req.extend_from_slice(b"\r\n");
        }
        req.extend_from_slice(b"0\r\n\r\n");
        raw(g.addr, &req).unwrap()
    };
    let r = chunked(&body);
    assert_eq!(r.status, 200, "{}", r.text());
    let up: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(up["sha256"].as_str(), Some(&*want));
    // Too large: declared (413 before reading), or crossing the limit.
    let r = raw(
        g.addr,
        b"POST /upload HTTP/1.1\r\nhost: t\r\nconnection: close\r\ncontent-length: 9000000\r\n\r\n",
    )
    .unwrap();
    assert_eq!(r.status, 413, "{}", r.text());
    let big: Vec<u8> = vec![1u8; 9_000_000];
    let r = chunked(&big);
    assert_eq!(r.status, 413, "{}", r.text());
    // A client that breaks off mid-body: the handler gets an error, and the
    // group serves the next upload.
    let manager = g.pid_of("payload");
    {
        let mut s = TcpStream::connect(g.addr).unwrap();
        s.write_all(b"POST /upload HTTP/1.1\r\nhost: t\r\ncontent-length: 6000000\r\n\r\n")
            .unwrap();
        s.write_all(&body[..1_000_000]).unwrap();
        eventually("the upload is being read", PATIENCE, || {
            let threads = stream_threads(manager);
            if threads.len() == 1 { Ok(()) } else { Err(threads) }
        });
    }
    eventually("the upload reader ends", PATIENCE, || no_stream_threads(manager));
    let r = chunked(&body[..1000]);
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn streams_past_the_shared_memory_budget_get_503() {
    // 600 KiB: two 260 KiB rings fit in the manager, the third does not.
    let g = Group::builder("stream-budget")
        .config("[group]\nshm_budget_bytes = 614400\n[listener]\nmax_body_bytes = 65536\n")
        .start();
    let size = 1u64 << 30;
    let held: Vec<_> = (0..2)
        .map(|_| {
            let (s, head) = open_stream(g.addr, &format!("/stream/{size}"), "");
            assert!(head.starts_with("HTTP/1.1 200"), "{head}");
            s
        })
        .collect();
    let r = get(g.addr, &format!("/stream/{size}")).unwrap();
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("1"));
    drop(held);
    eventually("the budget frees up", PATIENCE, || {
        match get(g.addr, "/stream/1000") {
            Ok(r) if r.status == 200 => Ok(()),
            other => Err(other.map(|r| r.status)),
        }
    });
}

#[test]
fn an_upload_may_outlast_the_request_timeout_while_it_moves_but_not_stall() {
    let g = Group::builder("upload-slow")
        .config("[listener]\nrequest_timeout_ms = 1000\nbody_read_timeout_ms = 1000\n")
        .start();
    // Ten pieces 150 ms apart: 1.5 s in all, longer than the timeout, but
    // never idle for long. (The pauses play a slow client; nothing waits on
    // them to synchronise.)
    let body: Vec<u8> = (0..100_000u32).map(|i| (i % 7) as u8).collect();
    let mut s = TcpStream::connect(g.addr).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    write!(
        s,
        "POST /upload HTTP/1.1\r\nhost: t\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    for piece in body.chunks(10_000) {
        s.write_all(piece).unwrap();
        std::thread::sleep(Duration::from_millis(150));
    }
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).unwrap();
    let r = parse_response(&answer).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let up: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(up["sha256"].as_str(), Some(&*sha256_hex(&body)));

    // A body that stops moving is cut with 408, and its reader ends.
    let manager = g.pid_of("payload");
    let mut s = TcpStream::connect(g.addr).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    s.write_all(
        b"POST /upload HTTP/1.1\r\nhost: t\r\nconnection: close\r\ncontent-length: 1000\r\n\r\n0123456789",
    )
    .unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).unwrap();
    let r = parse_response(&answer).unwrap();
    assert_eq!(r.status, 408, "{}", r.text());
    eventually("the upload reader ends", PATIENCE, || no_stream_threads(manager));
}

#[test]
fn a_stream_of_unknown_length_is_chunked() {
    let g = Group::start("stream-chunked");
    let pattern = pattern();
    let r = get(g.addr, "/stream/300000?chunked=true").unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("transfer-encoding"), Some("chunked"));
    assert_eq!(r.header("content-length"), None);
    assert!(r.body[..] == pattern[..300_000], "{} bytes", r.body.len());
    // No length, no ranges: the whole body, as RFC 9110 allows.
    let req =
        "GET /stream/1000?chunked=true HTTP/1.1\r\nhost: t\r\nconnection: close\r\nrange: bytes=0-9\r\n\r\n";
    let r = raw(g.addr, req.as_bytes()).unwrap();
    assert_eq!((r.status, r.body.len()), (200, 1000));
}

#[test]
fn over_grpc_a_streamed_reply_arrives_whole_up_to_the_message_limit() {
    use switchyard_client::proto::CallRequest;
    let g = Group::start("stream-grpc");
    let pattern = pattern();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = switchyard_client::GrpcClient::connect(&format!("http://{}", g.addr))
            .await
            .unwrap();
        let ask = |size: u64| CallRequest {
            r#type: "demo.Stream".into(),
            content_type: "application/json".into(),
            payload: format!(r#"{{"size":{size}}}"#).into_bytes().into(),
            deadline_ms: 0,
        };
        let reply = client.raw().call(ask(300_000)).await.unwrap().into_inner();
        assert_eq!(reply.content_type, "application/octet-stream");
        assert!(reply.payload[..] == pattern[..300_000]);
        // Larger than a message may be (listener.max_body_bytes): refused
        // with the event's 502, and the producer is stopped.
        let err = client.raw().call(ask(2 << 20)).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
        assert!(err.message().contains("larger than a message"), "{err:?}");
    });
    let manager = g.pid_of("payload");
    eventually("no producer is left", PATIENCE, || no_stream_threads(manager));
}

#[test]
fn a_stream_in_progress_finishes_within_the_shutdown_grace() {
    let mut g = Group::start("stream-drain");
    let pattern = pattern();
    let size: u64 = 64 << 20;
    let (mut s, _) = open_stream(g.addr, &format!("/stream/{size}"), "");
    assert_eq!(read_checked(&mut s, 0, 1 << 20, &pattern), 1 << 20);
    // SIGTERM mid-stream: the listener drains (its open connections get
    // the grace period) before the manager producing the stream stops.
    kill(g.supervisor_pid(), Signal::SIGTERM);
    let rest = std::thread::spawn(move || read_checked(&mut s, 1 << 20, size - (1 << 20), &pattern));
    assert_eq!(rest.join().unwrap(), size - (1 << 20), "the stream was cut");
    assert!(g.terminate().success());
}
