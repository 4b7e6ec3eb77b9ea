//! Bounded work and memory per request, against a real group: a
//! compressed request body is refused once it expands past the allowed
//! ratio (not decoded to the route's limit first), and the payload
//! manager's memory per in-flight large reply is about one body and comes
//! back after the load.

mod common;

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::rt::{TokioExecutor, TokioIo};

use common::*;

/// `len` zero bytes as zstd: a few KiB on the wire.
fn zstd_zeros(len: usize) -> Vec<u8> {
    let mut encoder = zstd::stream::Encoder::new(Vec::new(), 3).unwrap();
    let chunk = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        let n = left.min(chunk.len());
        encoder.write_all(&chunk[..n]).unwrap();
        left -= n;
    }
    encoder.finish().unwrap()
}

#[test]
fn a_compressed_body_is_refused_once_it_expands_past_the_ratio() {
    let g = Group::start("bounded-decode");
    let encoded = [("content-encoding", "zstd")];
    // 64 MiB in a few KiB: far below the upload limit (4 GiB), far past
    // 200 times what was sent.
    let bomb = zstd_zeros(64 << 20);
    assert!(bomb.len() < 64 * 1024, "{} bytes", bomb.len());
    let r = request_with(g.addr, "POST", "/upload", &encoded, &bomb).unwrap();
    assert_eq!(r.status, 413, "{}", r.text());
    assert!(
        r.text().contains("expands more than 200 times when decoded"),
        "{}",
        r.text()
    );
    // The same to a route that takes its body whole: 413 too.
    let r = request_with(g.addr, "POST", "/echo-bytes", &encoded, &bomb).unwrap();
    assert_eq!(r.status, 413, "{}", r.text());

    // A small body may compress as well as it likes.
    let small = zstd_zeros(512 * 1024);
    let r = request_with(g.addr, "POST", "/upload", &encoded, &small).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["length"], 512 * 1024);
    // A large one that expands within the ratio is served whole.
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    let text: Vec<u8> = (0..4 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b"abcdefghijklmnopqrstuvwxyz"[(x % 26) as usize]
        })
        .collect();
    let z = zstd::encode_all(&text[..], 3).unwrap();
    assert!(z.len() * 200 > text.len(), "within the ratio: {} bytes", z.len());
    let r = request_with(g.addr, "POST", "/upload", &encoded, &z).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["length"], text.len());
    assert_eq!(get(g.addr, "/health").unwrap().status, 200);
}

/// Shared-memory segments (pooled, or of one body) mapped in a process.
fn segment_mappings(pid: u32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .map(|m| m.lines().filter(|l| l.contains("switchyard-segment")).count())
        .unwrap_or(0)
}

/// Shared-memory pages and heap together, as the kernel counts them.
fn rss_bytes(pid: u32) -> u64 {
    rss_kib(pid) * 1024
}

#[test]
fn large_replies_cost_one_body_each_and_memory_comes_back() {
    const SIZE: u64 = 16 << 20;
    const CLIENTS: u64 = 16;
    const ROUNDS: u64 = 2;
    let g = Group::start("bounded-payload");
    let manager = g.pid_of("payload");
    // The handler's own buffer (one body, kept for reuse) is part of the
    // baseline.
    let r = get(g.addr, &format!("/payload/{SIZE}?copy=true")).unwrap();
    assert_eq!((r.status, r.body.len() as u64), (200, SIZE));
    eventually(
        "the first reply's segment is released",
        PATIENCE,
        || match segment_mappings(manager) {
            0 => Ok(()),
            n => Err(n),
        },
    );
    let baseline = rss_bytes(manager);

    let peak = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (peak.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(rss_bytes(manager), Ordering::Relaxed);
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        })
    };
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let addr = g.addr;
            std::thread::spawn(move || {
                (0..ROUNDS)
                    .map(|_| {
                        let r = get(addr, &format!("/payload/{SIZE}?copy=true")).unwrap();
                        (r.status, r.body.len() as u64)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for c in clients {
        for answer in c.join().unwrap() {
            assert_eq!(answer, (200, SIZE));
        }
    }
    done.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let peak = peak.load(Ordering::Relaxed);
    // At most one body per reply in flight, and some slack for the rest.
    let bound = baseline + CLIENTS * SIZE + (64 << 20);
    assert!(
        peak <= bound,
        "peak {} MiB over a baseline of {} MiB for {CLIENTS} replies of 16 MiB in flight",
        peak >> 20,
        baseline >> 20
    );
    // After the load, the memory goes back (segments are released once
    // read, at the manager's next wake).
    eventually("the manager's memory comes back", PATIENCE, || {
        let rss = rss_bytes(manager);
        if rss <= baseline + (32 << 20) {
            Ok(())
        } else {
            Err(format!(
                "{} MiB against a baseline of {} MiB",
                rss >> 20,
                baseline >> 20
            ))
        }
    });
}

/// Answers whose clients left before they came (the soak's h2load stopping
/// with hundreds of 1 MiB downloads in flight) release their shared memory
/// at once: the payload manager's segments go, well before the two-minute
/// lease that used to hold every one of them busy and mapped.
#[test]
fn answers_abandoned_by_their_clients_release_their_segments() {
    const STREAMS: usize = 200;
    let g = Group::start("abandoned-answers");
    let manager = g.pid_of("payload");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let stream = tokio::net::TcpStream::connect(g.addr).await.unwrap();
        let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .handshake::<_, Empty<Bytes>>(TokioIo::new(stream))
            .await
            .unwrap();
        let conn = tokio::spawn(conn);
        let mut answers = tokio::task::JoinSet::new();
        for _ in 0..STREAMS {
            let mut sender = sender.clone();
            let uri = format!("http://{}/payload/1048576?copy=true", g.addr);
            answers.spawn(async move {
                sender.ready().await?;
                sender
                    .send_request(http::Request::get(uri).body(Empty::new()).unwrap())
                    .await
            });
        }
        // Once the first answer is in, the rest are on their way: the
        // client leaves without reading any of them.
        let first = tokio::time::timeout(PATIENCE, answers.join_next()).await.unwrap();
        assert_eq!(first.unwrap().unwrap().unwrap().status(), 200);
        answers.abort_all();
        conn.abort();
    });
    drop(rt);
    // The group keeps serving, and the manager's segments are released.
    let r = get(g.addr, "/payload/1048576?copy=true").unwrap();
    assert_eq!((r.status, r.body.len()), (200, 1 << 20));
    eventually(
        "the abandoned answers' segments are released",
        PATIENCE,
        || match segment_mappings(manager) {
            0 => Ok(()),
            n => Err(format!("{n} segments still mapped")),
        },
    );
}
