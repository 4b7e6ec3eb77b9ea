//! CPU-time budget: the whole group's CPU time per request, as a ratio to
//! the in-process baseline server's, measured in the same run in
//! interleaved slices, must not grow more than 20 % over the ratio recorded
//! in `bench/baseline/linux-x86_64.json` for this build profile.
//!
//! Opt-in, because it measures: `SWITCHYARD_PERF_BUDGET=1 cargo nextest run
//! --release --test perf_budget --no-capture`. Re-record (and say why in the
//! commit) with `SWITCHYARD_PERF_BUDGET=record`. Only ratios are compared:
//! the machine's speed and load cancel out, because both servers are
//! measured in alternating slices under the same conditions.
//!
//! The same opt-in runs the two return paths (`group.return_path`,
//! decision 0143) side by side: two groups, one per path, measured in
//! alternating slices in one run (`return_paths_side_by_side`).

mod common;

use common::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

const SLICES: usize = 4;
const REQUESTS_PER_SLICE: usize = 20_000;
const CLIENTS: usize = 8;
const ALLOWED_GROWTH: f64 = 1.20;

fn profile() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

fn baseline_file() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("bench/baseline/linux-x86_64.json")
}

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
        // After the command: state(0) ppid(1) ... utime(11) stime(12).
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

/// Clock ticks of user+system time of one process (all its threads).
fn process_ticks(pid: u32) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    let Some(close) = stat.rfind(')') else { return 0 };
    let fields: Vec<&str> = stat[close + 2..].split(' ').collect();
    fields[11].parse::<u64>().unwrap_or(0) + fields[12].parse::<u64>().unwrap_or(0)
}

/// Sends `n` keep-alive `GET /noop` requests over `CLIENTS` connections.
fn load(addr: SocketAddr, n: usize) {
    let per = n / CLIENTS;
    let threads: Vec<_> = (0..CLIENTS)
        .map(|_| {
            std::thread::spawn(move || {
                let stream = TcpStream::connect(addr).unwrap();
                stream.set_nodelay(true).unwrap();
                stream.set_read_timeout(Some(PATIENCE)).unwrap();
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
                    assert!(status_ok, "non-200 during the budget run");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

struct Baseline {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Baseline {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_baseline() -> Baseline {
    let bin = plugin_dir().join("switchyard-baseline");
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args([
        "build",
        "--quiet",
        "-p",
        "switchyard-bench",
        "--bin",
        "switchyard-baseline",
    ]);
    if profile() == "release" {
        cmd.arg("--release");
    }
    assert!(
        cmd.current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .unwrap()
            .success()
    );
    let mut child = Command::new(&bin)
        .args(["--bind", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line.trim().rsplit("http://").next().unwrap().parse().unwrap();
    Baseline { child, addr }
}

fn plugin_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_switchyard"))
        .parent()
        .unwrap()
        .to_path_buf()
}

#[test]
fn group_cpu_per_request_stays_within_budget_of_the_baseline() {
    let mode = std::env::var("SWITCHYARD_PERF_BUDGET").unwrap_or_default();
    if mode.is_empty() {
        eprintln!("skipped: set SWITCHYARD_PERF_BUDGET=1 to measure (or =record to re-record)");
        return;
    }
    let group = Group::start("budget");
    let baseline = start_baseline();
    // Warm both up (connections, caches, lazy allocations).
    load(group.addr, 2_000);
    load(baseline.addr, 2_000);

    let (mut group_ticks, mut base_ticks) = (0u64, 0u64);
    for _ in 0..SLICES {
        let before = tree_ticks(group.supervisor_pid());
        load(group.addr, REQUESTS_PER_SLICE);
        group_ticks += tree_ticks(group.supervisor_pid()) - before;
        let before = tree_ticks(baseline.child.id());
        load(baseline.addr, REQUESTS_PER_SLICE);
        base_ticks += tree_ticks(baseline.child.id()) - before;
    }
    let hz = 100.0; // USER_HZ on Linux
    let requests = (SLICES * REQUESTS_PER_SLICE) as f64;
    let group_us = group_ticks as f64 / hz / requests * 1e6;
    let base_us = base_ticks as f64 / hz / requests * 1e6;
    let ratio = group_us / base_us.max(f64::MIN_POSITIVE);
    eprintln!(
        "perf budget ({}): group {group_us:.1} µs/req, baseline {base_us:.1} µs/req, ratio {ratio:.2}",
        profile()
    );

    let path = baseline_file();
    let mut recorded: serde_json::Value = std::fs::read_to_string(&path)
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_else(|| serde_json::json!({}));
    if mode == "record" {
        recorded[profile()] = serde_json::json!({
            "cpu_ratio": (ratio * 100.0).round() / 100.0,
            "group_us_per_request": (group_us * 10.0).round() / 10.0,
            "baseline_us_per_request": (base_us * 10.0).round() / 10.0,
            "requests": requests,
            "clients": CLIENTS,
        });
        std::fs::write(&path, serde_json::to_string_pretty(&recorded).unwrap() + "\n").unwrap();
        eprintln!("recorded in {}", path.display());
        return;
    }
    let budget = recorded[profile()]["cpu_ratio"].as_f64().unwrap_or_else(|| {
        panic!(
            "no recorded {} ratio in {}; run with =record",
            profile(),
            path.display()
        )
    });
    assert!(
        ratio <= budget * ALLOWED_GROWTH,
        "CPU per request regressed: ratio {ratio:.2} vs recorded {budget:.2} (allowed up to {:.2})",
        budget * ALLOWED_GROWTH
    );
}

/// The group's CPU per `GET /noop` with answers through the router and
/// straight back (decision 0143), in alternating slices of one run: the
/// figures BENCHMARKS.md shows for the two paths. Both groups must answer
/// every request 200; the figures are printed, not judged (the budget
/// above judges the default).
/// Requests per slice of [`return_paths_side_by_side`]: fewer in a debug
/// build, which serves a few thousand a second.
const PATH_REQUESTS: usize = if cfg!(debug_assertions) {
    5_000
} else {
    REQUESTS_PER_SLICE
};

#[test]
fn return_paths_side_by_side() {
    if std::env::var("SWITCHYARD_PERF_BUDGET")
        .unwrap_or_default()
        .is_empty()
    {
        eprintln!("skipped: set SWITCHYARD_PERF_BUDGET=1 to measure");
        return;
    }
    let router = Group::builder("paths-router")
        .config("[group]\nreturn_path = \"router\"\n")
        .start();
    let direct = Group::builder("paths-direct")
        .config("[group]\nreturn_path = \"direct\"\n")
        .start();
    router.eventually_status("/noop", 200);
    direct.eventually_status("/noop", 200);
    load(router.addr, 2_000);
    load(direct.addr, 2_000);
    const ROLES: [&str; 4] = ["listener", "broker", "router", "basics"];
    let pids = |g: &Group| ROLES.map(|role| g.pid_of(role));
    let (router_pids, direct_pids) = (pids(&router), pids(&direct));
    let (mut router_ticks, mut direct_ticks) = (0u64, 0u64);
    let (mut router_roles, mut direct_roles) = ([0u64; 4], [0u64; 4]);
    for _ in 0..SLICES {
        for (g, pids, total, roles) in [
            (&router, &router_pids, &mut router_ticks, &mut router_roles),
            (&direct, &direct_pids, &mut direct_ticks, &mut direct_roles),
        ] {
            let before = tree_ticks(g.supervisor_pid());
            let before_roles = pids.map(process_ticks);
            load(g.addr, PATH_REQUESTS);
            *total += tree_ticks(g.supervisor_pid()) - before;
            for (i, pid) in pids.iter().enumerate() {
                roles[i] += process_ticks(*pid).saturating_sub(before_roles[i]);
            }
        }
    }
    let per = |ticks: u64| ticks as f64 / 100.0 / (SLICES * PATH_REQUESTS) as f64 * 1e6;
    let (r, d) = (per(router_ticks), per(direct_ticks));
    eprintln!(
        "return paths ({}, {CLIENTS} clients): router {r:.1} µs/req, direct {d:.1} µs/req, direct/router {:.2}",
        profile(),
        d / r.max(f64::MIN_POSITIVE)
    );
    for (i, role) in ROLES.iter().enumerate() {
        eprintln!(
            "  {role}: router {:.1} µs/req, direct {:.1} µs/req",
            per(router_roles[i]),
            per(direct_roles[i])
        );
    }
    // Both paths kept every answer (`load` asserts each is a 200), and
    // the direct group's router saw every request finish.
    eventually(
        "the direct group's router holds nothing in flight",
        PATIENCE,
        || {
            let in_flight = direct.status()["processes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["role"] == "router")
                .and_then(|p| p["load"]["in_flight"].as_u64());
            (in_flight == Some(0)).then_some(()).ok_or(in_flight)
        },
    );
}
