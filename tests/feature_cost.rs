//! What the per-request features cost: the group's CPU per `GET /noop`
//! with request ids, route metrics and trace context on (the defaults)
//! and with all three off, two groups measured in alternating slices of
//! one run, as `perf_budget` measures (decision 0147). The figures are
//! printed, not judged: the budget test judges the default.
//!
//! Opt-in, because it measures: `SWITCHYARD_PERF_BUDGET=1 cargo nextest
//! run -p switchyard --test feature_cost --no-capture`.

mod common;

use common::load::{noop_load, tree_ns};
use common::*;

const SLICES: usize = 4;
const CLIENTS: usize = 8;
/// Fewer in a debug build, which serves a few thousand a second.
const REQUESTS: usize = if cfg!(debug_assertions) { 5_000 } else { 20_000 };

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
    noop_load(on.addr, 2_000, CLIENTS);
    noop_load(off.addr, 2_000, CLIENTS);
    let (mut on_ns, mut off_ns) = (0u64, 0u64);
    for _ in 0..SLICES {
        for (g, total) in [(&on, &mut on_ns), (&off, &mut off_ns)] {
            let before = tree_ns(g.supervisor_pid());
            noop_load(g.addr, REQUESTS, CLIENTS);
            *total += tree_ns(g.supervisor_pid()).saturating_sub(before);
        }
    }
    let per = |ns: u64| ns as f64 / 1e3 / (SLICES * REQUESTS) as f64;
    let (a, b) = (per(on_ns), per(off_ns));
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
