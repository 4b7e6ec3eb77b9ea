//! What the per-request features cost: the group's CPU per `GET /noop`
//! with request ids, route metrics and trace context on (the defaults)
//! and with all three off, two groups measured in alternating slices of
//! one run, as `perf_budget` measures (decision 0147). The figures are
//! printed, not judged: the budget test judges the default.
//!
//! Opt-in, because it measures: `SWITCHYARD_PERF_BUDGET=1 cargo nextest
//! run -p switchyard --test feature_cost --no-capture`.

mod common;

use common::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};

const SLICES: usize = 4;
const CLIENTS: usize = 8;
/// Fewer in a debug build, which serves a few thousand a second.
const REQUESTS: usize = if cfg!(debug_assertions) { 5_000 } else { 20_000 };

/// Clock ticks of user+system time of `root` and all its descendants.
fn tree_ticks(root: u32) -> u64 {
    let mut parent = std::collections::HashMap::new();
    let mut ticks = std::collections::HashMap::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(close) = stat.rfind(')') else { continue };
        let fields: Vec<&str> = stat[close + 2..].split(' ').collect();
        let ppid: u32 = fields[1].parse().unwrap_or(0);
        let t: u64 = fields[11].parse::<u64>().unwrap_or(0) + fields[12].parse::<u64>().unwrap_or(0);
        parent.insert(pid, ppid);
        ticks.insert(pid, t);
    }
    let mut total = 0;
    for (&pid, &t) in &ticks {
        let mut p = pid;
        loop {
            if p == root {
                total += t;
                break;
            }
            match parent.get(&p) {
                Some(&pp) if pp != 0 && pp != p => p = pp,
                _ => break,
            }
        }
    }
    total
}

/// `n` keep-alive `GET /noop` requests over [`CLIENTS`] connections, each
/// answered 200.
fn load(addr: SocketAddr, n: usize) {
    let per = n / CLIENTS;
    let threads: Vec<_> = (0..CLIENTS)
        .map(|_| {
            std::thread::spawn(move || {
                let stream = TcpStream::connect(addr).unwrap();
                stream.set_nodelay(true).unwrap();
                let mut writer = stream.try_clone().unwrap();
                let mut reader = BufReader::new(stream);
                let mut line = String::new();
                for _ in 0..per {
                    writer
                        .write_all(b"GET /noop HTTP/1.1\r\nhost: bench\r\n\r\n")
                        .unwrap();
                    let mut length = 0usize;
                    let mut status_ok = false;
                    loop {
                        line.clear();
                        reader.read_line(&mut line).unwrap();
                        if line.starts_with("HTTP/1.1 ") {
                            status_ok = line.starts_with("HTTP/1.1 200");
                        } else if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap();
                        } else if line == "\r\n" {
                            break;
                        }
                    }
                    let mut body = vec![0; length];
                    reader.read_exact(&mut body).unwrap();
                    assert!(status_ok, "non-200 during the run");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn request_ids_metrics_and_tracing_on_and_off() {
    if std::env::var("SWITCHYARD_PERF_BUDGET")
        .unwrap_or_default()
        .is_empty()
    {
        eprintln!("skipped: set SWITCHYARD_PERF_BUDGET=1 to measure");
        return;
    }
    let on = Group::builder("features-on").start();
    let off = Group::builder("features-off")
        .config("[request_id]\nenabled = false\n\n[tracing]\nenabled = false\n\n[metrics]\nenabled = false\n")
        .start();
    on.eventually_status("/noop", 200);
    off.eventually_status("/noop", 200);
    load(on.addr, 2_000);
    load(off.addr, 2_000);
    let (mut on_ticks, mut off_ticks) = (0u64, 0u64);
    for _ in 0..SLICES {
        for (g, total) in [(&on, &mut on_ticks), (&off, &mut off_ticks)] {
            let before = tree_ticks(g.supervisor_pid());
            load(g.addr, REQUESTS);
            *total += tree_ticks(g.supervisor_pid()) - before;
        }
    }
    let per = |ticks: u64| ticks as f64 / 100.0 / (SLICES * REQUESTS) as f64 * 1e6;
    let (a, b) = (per(on_ticks), per(off_ticks));
    eprintln!(
        "features ({}, {CLIENTS} clients): on {a:.1} µs/req, off {b:.1} µs/req, on - off {:.1} µs/req, on/off {:.3}",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        a - b,
        a / b.max(f64::MIN_POSITIVE)
    );
}
