//! Large bodies cross in shared memory: byte-exact both ways at the edges of
//! the threshold and far beyond it, and nothing leaks (descriptors,
//! mappings, `/dev/shm` entries), even across `kill -9`.

mod common;

use common::*;
use sha2::Digest;

const THRESHOLD: usize = 64 * 1024;
const CONFIG: &str = "[listener]\nmax_body_bytes = 70000000\n";

fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn post(addr: std::net::SocketAddr, path: &str, body: &[u8]) -> HttpResponse {
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nhost: t\r\nconnection: close\r\ncontent-type: application/octet-stream\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(body);
    raw(addr, &req).unwrap()
}

fn mappings(pid: u32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .map(|m| m.lines().count())
        .unwrap_or(0)
}

#[test]
fn bodies_round_trip_byte_exact_across_the_threshold_both_ways() {
    let g = Group::builder("shm-sizes").config(CONFIG).start();
    for (i, size) in [0, 1, THRESHOLD - 1, THRESHOLD, THRESHOLD + 1, 1 << 20, 64 << 20]
        .into_iter()
        .enumerate()
    {
        let body = random_bytes(size, i as u64 + 7);
        let r = post(g.addr, "/echo-bytes", &body);
        assert_eq!(r.status, 200, "size {size}: {}", r.text());
        assert_eq!(r.body.len(), size, "size {size}");
        assert!(r.body == body, "size {size}: bytes differ");
        let r = post(g.addr, "/upload", &body);
        let uploaded: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(uploaded["length"], size as u64);
        let want: String = sha2::Sha256::digest(&body)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(uploaded["sha256"], want, "size {size}");
    }
}

#[test]
fn repeated_large_bodies_do_not_grow_descriptors_or_mappings() {
    let g = Group::builder("shm-leak").config(CONFIG).start();
    let body = random_bytes(256 * 1024, 3);
    let pids: Vec<u32> = ["listener", "broker", "router", "payload"]
        .iter()
        .map(|n| g.pid_of(n))
        .collect();
    let round = |n| {
        for _ in 0..n {
            assert_eq!(post(g.addr, "/echo-bytes", &body).status, 200);
        }
    };
    round(20);
    let before: Vec<(usize, usize)> = pids.iter().map(|&p| (open_fds(p), mappings(p))).collect();
    round(200);
    let after: Vec<(usize, usize)> = pids.iter().map(|&p| (open_fds(p), mappings(p))).collect();
    for ((b, a), pid) in before.iter().zip(&after).zip(&pids) {
        // A handful of descriptors or mappings may come and go (connections,
        // allocator arenas); 200 leaked bodies would show as hundreds.
        assert!(a.0 <= b.0 + 8, "pid {pid}: descriptors {} → {}", b.0, a.0);
        assert!(a.1 <= b.1 + 16, "pid {pid}: mappings {} → {}", b.1, a.1);
    }
}

#[test]
fn nothing_of_the_group_is_left_in_dev_shm_after_kill_9_and_stop() {
    let before = dev_shm_listing();
    let mut g = Group::builder("shm-kill").config(CONFIG).start();
    let body = random_bytes(1 << 20, 5);
    assert_eq!(post(g.addr, "/echo-bytes", &body).status, 200);
    let old = g.kill9("payload");
    g.eventually_restarted("payload", old);
    g.eventually_status("/payload/100000", 200);
    assert!(
        post(g.addr, "/echo-bytes", &body).body == body,
        "the next request is fine"
    );
    assert!(g.terminate().success());
    let new: Vec<String> = dev_shm_listing()
        .into_iter()
        .filter(|n| !before.contains(n))
        .collect();
    assert!(new.is_empty(), "left in /dev/shm: {new:?}");
}

#[test]
fn single_ranges_get_206_and_unsatisfiable_ones_416() {
    let g = Group::start("range");
    // 1 MiB: the body crosses in shared memory; the range is a slice of it.
    let range = |spec: &str| {
        let req =
            format!("GET /payload/1048576 HTTP/1.1\r\nhost: t\r\nconnection: close\r\nrange: {spec}\r\n\r\n");
        raw(g.addr, req.as_bytes()).unwrap()
    };
    let r = range("bytes=1000-1999");
    assert_eq!(r.status, 206);
    assert_eq!(r.header("content-range"), Some("bytes 1000-1999/1048576"));
    assert_eq!(r.body, vec![b'x'; 1000]);
    let r = range("bytes=-10");
    assert_eq!((r.status, r.body.len()), (206, 10));
    assert_eq!(r.header("content-range"), Some("bytes 1048566-1048575/1048576"));
    let r = range("bytes=2000000-");
    assert_eq!(r.status, 416);
    assert_eq!(r.header("content-range"), Some("bytes */1048576"));
    // Several ranges: the whole body, as RFC 9110 allows.
    let r = range("bytes=0-1,5-6");
    assert_eq!((r.status, r.body.len()), (200, 1048576));
}

/// A body its manager keeps sealed (`shared_body`; the demo's `/payload`)
/// crosses as its memfd's descriptor: the manager copies it into no
/// segment, the listener keeps one mapping of it for every answer after
/// the first two, and lets it go when idle (decision 0160).
#[test]
fn a_shared_body_crosses_without_a_copy_and_is_mapped_once() {
    let g = Group::start("shm-shared");
    let (listener, manager) = (g.pid_of("listener"), g.pid_of("payload"));
    four_clients_get_a_mib(g.addr, "/payload/1048576", 25);
    assert_eq!(segment_mappings(manager), 0, "no body was copied into a segment");
    assert_eq!(segment_mappings(listener), 0);
    assert_eq!(sealed_mappings(listener), 1, "one mapping serves every answer");
    let r = get(g.addr, "/payload/1000").unwrap();
    assert_eq!(r.body, vec![b'x'; 1000], "small prefixes go inline");
    eventually("the idle mapping is let go", PATIENCE, || {
        match sealed_mappings(listener) {
            0 => Ok(()),
            n => Err(n),
        }
    });
    let r = get(g.addr, "/payload/1048576").unwrap();
    assert_eq!((r.status, r.body.len()), (200, 1 << 20));
}

/// Four clients at once, `each` GETs of `path` apiece, every answer 1 MiB
/// of `x`.
fn four_clients_get_a_mib(addr: std::net::SocketAddr, path: &'static str, each: usize) {
    let clients: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                for _ in 0..each {
                    let r = get(addr, path).unwrap();
                    assert_eq!(r.status, 200, "{path}");
                    assert!(r.body == vec![b'x'; 1 << 20], "{path}: the body's bytes");
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
}

/// Sealed bodies (`memfd:switchyard-body`) mapped in a process right now.
fn sealed_mappings(pid: u32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .map(|m| m.lines().filter(|l| l.contains("switchyard-body")).count())
        .unwrap_or(0)
}

/// Pool segments (decision 0011) mapped in a process right now.
fn segment_mappings(pid: u32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .map(|m| m.lines().filter(|l| l.contains("switchyard-segment")).count())
        .unwrap_or(0)
}

#[test]
fn response_segments_are_reused_under_load_and_released_when_idle() {
    let g = Group::start("shm-pool");
    let (listener, manager) = (g.pid_of("listener"), g.pid_of("payload"));
    // Concurrent 1 MiB responses: a few segments, reused, not one per body.
    four_clients_get_a_mib(g.addr, "/payload/1048576?copy=true", 50);
    let in_use = segment_mappings(manager);
    assert!((1..=8).contains(&in_use), "200 bodies took {in_use} segments");
    assert!(segment_mappings(listener) <= in_use);
    // Idle: both sides let go of them (the producer after ~10 s unused, the
    // consumer's mapping cache likewise).
    eventually("idle segments are unmapped", PATIENCE, || {
        match (segment_mappings(manager), segment_mappings(listener)) {
            (0, 0) => Ok(()),
            mapped => Err(mapped),
        }
    });
    let r = get(g.addr, "/payload/1048576").unwrap();
    assert_eq!(r.body.len(), 1 << 20);
}
