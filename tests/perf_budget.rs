//! CPU-time budget: each process role's CPU time per request (listener,
//! broker, router, the `basics` manager that serves `GET /noop`) and the
//! whole group's, each as a ratio to the in-process baseline server's
//! measured in the same run, must not grow more than 25 % over the ratios
//! recorded in `bench/baseline/linux-x86_64.json` for this build profile
//! (a role's: 25 % or 0.15× the baseline, whichever is more).
//! Per role, because one hop's regression drowns in the group's total: 5 µs
//! more in the router is +10 % of the group's ~50 µs but doubles the
//! router's own share (decision 0148).
//!
//! Only ratios are compared: the machine's speed and load cancel out, because
//! both servers are measured in alternating slices under the same
//! conditions, and each ratio is the median over the slices, so that one
//! slice disturbed by a neighbour does not decide. A pair of slices during
//! which the hypervisor stole more than 5 % of the CPU is measured again
//! (at most 20 times); a run left with fewer than half its slices clean
//! says it is inconclusive and judges nothing.
//!
//! A release measurement, out of the debug suite: the nextest profile
//! `budget` selects this binary and the others leave it out (`.ci/run`):
//! `cargo nextest run --release -p switchyard --test perf_budget --profile
//! budget`. Re-record (and say why) with `SWITCHYARD_PERF_BUDGET=record
//! SWITCHYARD_PERF_BUDGET_REASON='…'`. A debug build outside nextest
//! (`cargo test`) skips both tests unless `SWITCHYARD_PERF_BUDGET` is set.
//!
//! The same binary runs the two return paths (`group.return_path`, decision
//! 0143) side by side: two groups, one per path, measured in alternating
//! slices in one run (`return_paths_side_by_side`), printed, not judged.

mod common;

use common::load::{noop_load, process_ns, tree_ns};
use common::*;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// Many short slices rather than a few long ones: the median of the
/// per-slice ratios then shrugs off the slices a neighbour disturbed.
const SLICES: usize = 20;
const REQUESTS_PER_SLICE: usize = 24_000;
const CLIENTS: usize = 8;
const ALLOWED_GROWTH: f64 = 1.25;
/// A role may also grow by this much of the baseline's CPU, whichever
/// allows more: the broker's and router's ~6 µs per request move by 1–2 µs
/// with the hand-off's timing alone (their medians read 0.40–0.51× the
/// baseline over one day with no change to them), which 25 % of 0.4 cannot
/// absorb. A 5 µs regression in one hop is ~0.3× the baseline and still
/// fails (decision 0148, amended).
const ROLE_FLOOR: f64 = 0.15;
/// A pair of slices during which the hypervisor ran other guests on our
/// CPUs for more than this share of the time is measured again: under
/// steal every hand-off costs more, the group's many more than the
/// baseline's few, and the ratio reads 4.7 where a quiet machine reads
/// 3.3–3.9 (decision 0148, third amendment).
const MAX_STEAL: f64 = 0.05;
/// Pairs measured again at most; with fewer than half of [`SLICES`] clean
/// pairs the run judges nothing and says so.
const MAX_STOLEN_PAIRS: usize = 20;
/// The processes whose CPU per request is judged one by one: every hop of
/// `GET /noop`, and the manager that serves it.
const ROLES: [&str; 4] = ["listener", "broker", "router", "basics"];

fn profile() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

/// Whether to measure at all: always in a release build (only the nextest
/// profile `budget` selects this binary), on request in a debug one.
fn enabled() -> bool {
    let asked = !std::env::var("SWITCHYARD_PERF_BUDGET")
        .unwrap_or_default()
        .is_empty();
    if !asked && cfg!(debug_assertions) {
        eprintln!(
            "skipped in a debug build: run `cargo nextest run --release -p switchyard --test perf_budget --profile budget` (or set SWITCHYARD_PERF_BUDGET=1)"
        );
        return false;
    }
    true
}

fn baseline_file() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("bench/baseline/linux-x86_64.json")
}

/// CPU nanoseconds per request during one slice of load on a group: its
/// whole process tree, then each of [`ROLES`].
struct Slice {
    group: f64,
    roles: [f64; ROLES.len()],
}

fn measure_group(group: &Group, pids: &[u32; ROLES.len()], requests: usize) -> Slice {
    let before = tree_ns(group.supervisor_pid());
    let before_roles = pids.map(process_ns);
    noop_load(group.addr, requests, CLIENTS);
    let after = tree_ns(group.supervisor_pid());
    let mut roles = [0.0; ROLES.len()];
    for (i, pid) in pids.iter().enumerate() {
        roles[i] = process_ns(*pid).saturating_sub(before_roles[i]) as f64 / requests as f64;
    }
    Slice {
        group: after.saturating_sub(before) as f64 / requests as f64,
        roles,
    }
}

/// CPU nanoseconds per request of the baseline during one slice of load.
fn measure_baseline(baseline: &Baseline, requests: usize) -> f64 {
    let pid = baseline.child.id();
    let before = process_ns(pid);
    noop_load(baseline.addr, requests, CLIENTS);
    process_ns(pid).saturating_sub(before) as f64 / requests as f64
}

/// The machine's CPU time so far, from `/proc/stat`'s first line, in
/// clock ticks: all of it, and what the hypervisor stole.
struct CpuTicks {
    total: u64,
    steal: u64,
}

impl CpuTicks {
    fn steal_share_since(&self, before: &CpuTicks) -> f64 {
        let total = self.total.saturating_sub(before.total).max(1);
        self.steal.saturating_sub(before.steal) as f64 / total as f64
    }
}

fn cpu_ticks() -> CpuTicks {
    let stat = std::fs::read_to_string("/proc/stat").expect("/proc/stat");
    // cpu user nice system idle iowait irq softirq steal ...
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .expect("the cpu line")
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|f| f.parse().expect("a tick count"))
        .collect();
    CpuTicks {
        total: fields.iter().sum(),
        steal: fields.get(7).copied().unwrap_or(0),
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len().is_multiple_of(2) {
        (values[mid - 1] + values[mid]) / 2.0
    } else {
        values[mid]
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

/// Starts the baseline `.ci/run` built beside the server. Not built here: a
/// `cargo build -p switchyard-bench` from inside the test resolves other
/// features for the dependencies both share and rebuilds them, then the next
/// build of the server rebuilds them back (minutes each in release).
fn start_baseline() -> Baseline {
    let bin = plugin_dir().join("switchyard-baseline");
    assert!(
        bin.exists(),
        "no {}: build it first with `cargo build {}-p switchyard-bench --bin switchyard-baseline`",
        bin.display(),
        if profile() == "release" { "--release " } else { "" }
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

/// One judged figure: the group's whole tree or one role.
struct Figure {
    name: &'static str,
    /// Median over the slices of its CPU per request over the baseline's.
    ratio: f64,
    lowest: f64,
    highest: f64,
    /// Median CPU per request, µs.
    us: f64,
}

#[test]
fn group_cpu_per_request_stays_within_budget_of_the_baseline() {
    if !enabled() {
        return;
    }
    let mode = std::env::var("SWITCHYARD_PERF_BUDGET").unwrap_or_default();
    let group = Group::start("budget");
    let baseline = start_baseline();
    group.eventually_status("/noop", 200);
    // Warm both up (connections, caches, lazy allocations).
    noop_load(group.addr, 2_000, CLIENTS);
    noop_load(baseline.addr, 2_000, CLIENTS);
    let pids = ROLES.map(|role| group.pid_of(role));

    let (mut group_slices, mut base_slices) = (Vec::new(), Vec::new());
    let (mut pairs, mut stolen) = (0, 0);
    while group_slices.len() < SLICES && stolen < MAX_STOLEN_PAIRS {
        let before = cpu_ticks();
        // Who goes first alternates, so that a trend in the machine's load
        // does not always favour the same server.
        let (g, b) = if pairs % 2 == 0 {
            let g = measure_group(&group, &pids, REQUESTS_PER_SLICE);
            (g, measure_baseline(&baseline, REQUESTS_PER_SLICE))
        } else {
            let b = measure_baseline(&baseline, REQUESTS_PER_SLICE);
            (measure_group(&group, &pids, REQUESTS_PER_SLICE), b)
        };
        pairs += 1;
        let share = cpu_ticks().steal_share_since(&before);
        if share > MAX_STEAL {
            stolen += 1;
            eprintln!(
                "  pair {pairs}: the host stole {:.0} % of the CPU; measured again",
                share * 100.0
            );
            continue;
        }
        group_slices.push(g);
        base_slices.push(b);
    }
    if group_slices.len() < SLICES / 2 {
        // Not a judgement of the code: the host ran other guests on our
        // CPUs for most of the run. The next run on a quieter host judges.
        eprintln!(
            "perf budget inconclusive: the host stole more than {:.0} % of the CPU in {stolen} of {pairs} pairs of slices; nothing judged",
            MAX_STEAL * 100.0
        );
        return;
    }
    let base_us = median(base_slices.clone()) / 1e3;
    let figure = |name: &'static str, of: &dyn Fn(&Slice) -> f64| {
        let ratios: Vec<f64> = group_slices
            .iter()
            .zip(&base_slices)
            .map(|(s, b)| of(s) / b.max(f64::MIN_POSITIVE))
            .collect();
        Figure {
            name,
            ratio: median(ratios.clone()),
            lowest: ratios.iter().copied().fold(f64::INFINITY, f64::min),
            highest: ratios.iter().copied().fold(0.0, f64::max),
            us: median(group_slices.iter().map(of).collect()) / 1e3,
        }
    };
    let mut figures = vec![figure("group", &|s| s.group)];
    for (i, role) in ROLES.iter().enumerate() {
        figures.push(figure(role, &|s| s.roles[i]));
    }

    let path = baseline_file();
    let mut recorded: serde_json::Value = std::fs::read_to_string(&path)
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_else(|| serde_json::json!({}));
    let budget = |name: &str| recorded[profile()]["cpu_ratio"][name].as_f64();
    // What a figure may reach, from its recorded ratio.
    let allowed = |name: &str, recorded: f64| {
        let grown = recorded * ALLOWED_GROWTH;
        if name == "group" {
            grown
        } else {
            grown.max(recorded + ROLE_FLOOR)
        }
    };
    eprintln!(
        "perf budget ({}, {CLIENTS} clients, {} slices of {REQUESTS_PER_SLICE} requests, {stolen} pairs dropped for steal): baseline {base_us:.1} µs/req",
        profile(),
        group_slices.len()
    );
    eprintln!("  figure    µs/req  ratio  (slices)       recorded  allowed");
    for f in &figures {
        let (was, allowed) = budget(f.name).map_or(("-".into(), "-".into()), |b| {
            (format!("{b:.2}"), format!("{:.2}", allowed(f.name, b)))
        });
        eprintln!(
            "  {:<9} {:>6.1}  {:>5.2}  ({:.2}–{:.2})  {was:>8}  {allowed:>7}",
            f.name, f.us, f.ratio, f.lowest, f.highest
        );
    }

    if mode == "record" {
        let reason = std::env::var("SWITCHYARD_PERF_BUDGET_REASON")
            .expect("say why in SWITCHYARD_PERF_BUDGET_REASON: it is recorded beside the figures");
        let round = |x: f64, places: i32| (x * 10f64.powi(places)).round() / 10f64.powi(places);
        recorded[profile()] = serde_json::json!({
            "reason": reason,
            "clients": CLIENTS,
            "slices": SLICES,
            "requests_per_slice": REQUESTS_PER_SLICE,
            "baseline_us_per_request": round(base_us, 1),
            "cpu_ratio": figures.iter().map(|f| (f.name.to_string(), round(f.ratio, 2).into())).collect::<serde_json::Map<_, _>>(),
            "us_per_request": figures.iter().map(|f| (f.name.to_string(), round(f.us, 1).into())).collect::<serde_json::Map<_, _>>(),
        });
        std::fs::write(&path, serde_json::to_string_pretty(&recorded).unwrap() + "\n").unwrap();
        eprintln!("recorded in {}", path.display());
        return;
    }
    let over: Vec<String> = figures
        .iter()
        .filter_map(|f| {
            let b = budget(f.name).unwrap_or_else(|| {
                panic!(
                    "no recorded {} ratio for {} in {}; run with SWITCHYARD_PERF_BUDGET=record",
                    profile(),
                    f.name,
                    path.display()
                )
            });
            (f.ratio > allowed(f.name, b)).then(|| {
                format!(
                    "{}: {:.1} µs/req, {:.2}× the baseline's (recorded {b:.2}×, allowed up to {:.2}×, +{:.0} %)",
                    f.name,
                    f.us,
                    f.ratio,
                    allowed(f.name, b),
                    (f.ratio / b - 1.0) * 100.0
                )
            })
        })
        .collect();
    assert!(
        over.is_empty(),
        "CPU per request regressed more than {:.0} % (a role: or {ROLE_FLOOR}× the baseline) over the recorded ratio in {}:\n  {}",
        (ALLOWED_GROWTH - 1.0) * 100.0,
        path.display(),
        over.join("\n  ")
    );
}

/// Slices of [`return_paths_side_by_side`], and requests in each: fewer in a
/// debug build, which serves a few thousand a second.
const PATH_SLICES: usize = 4;
const PATH_REQUESTS: usize = if cfg!(debug_assertions) { 5_000 } else { 20_000 };

/// The group's CPU per `GET /noop` with answers through the router and
/// straight back (decision 0143), in alternating slices of one run: the
/// figures BENCHMARKS.md shows for the two paths. Both groups must answer
/// every request 200; the figures are printed, not judged (the budget
/// above judges the default).
#[test]
fn return_paths_side_by_side() {
    if !enabled() {
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
    noop_load(router.addr, 2_000, CLIENTS);
    noop_load(direct.addr, 2_000, CLIENTS);
    let pids = |g: &Group| ROLES.map(|role| g.pid_of(role));
    let (router_pids, direct_pids) = (pids(&router), pids(&direct));
    let (mut router_sum, mut direct_sum) = (0.0, 0.0);
    let (mut router_roles, mut direct_roles) = ([0.0; ROLES.len()], [0.0; ROLES.len()]);
    for _ in 0..PATH_SLICES {
        for (g, pids, total, roles) in [
            (&router, &router_pids, &mut router_sum, &mut router_roles),
            (&direct, &direct_pids, &mut direct_sum, &mut direct_roles),
        ] {
            let slice = measure_group(g, pids, PATH_REQUESTS);
            *total += slice.group;
            for (sum, role) in roles.iter_mut().zip(slice.roles) {
                *sum += role;
            }
        }
    }
    let us = |ns_sum: f64| ns_sum / PATH_SLICES as f64 / 1e3;
    let (r, d) = (us(router_sum), us(direct_sum));
    eprintln!(
        "return paths ({}, {CLIENTS} clients): router {r:.1} µs/req, direct {d:.1} µs/req, direct/router {:.2}",
        profile(),
        d / r.max(f64::MIN_POSITIVE)
    );
    for (i, role) in ROLES.iter().enumerate() {
        eprintln!(
            "  {role}: router {:.1} µs/req, direct {:.1} µs/req",
            us(router_roles[i]),
            us(direct_roles[i])
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
