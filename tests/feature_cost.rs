//! What the per-request features cost: the group's CPU per `GET /noop`
//! with request ids, route metrics and trace context on (the defaults),
//! with each of them off alone, and with all three off: five groups
//! measured in alternating slices of one run, as `perf_budget` measures
//! (decision 0147). Each variant's cost is the default's CPU per request
//! minus its own, for the whole group and for the listener, the process
//! that does most of the features' work. The figures are printed, not
//! judged: the budget test judges the default.
//!
//! Opt-in, because it measures: `SWITCHYARD_PERF_BUDGET=1 cargo nextest
//! run --release -p switchyard --test feature_cost --no-capture`.

mod common;

use common::load::{noop_load, process_ns, tree_ns};
use common::*;

const SLICES: usize = 6;
const CLIENTS: usize = 8;
/// Fewer in a debug build, which serves a few thousand a second.
const REQUESTS: usize = if cfg!(debug_assertions) { 4_000 } else { 16_000 };

/// The default first: every other variant is compared with it.
/// (name, the group's tag, its configuration)
const VARIANTS: [(&str, &str, &str); 5] = [
    ("all on (default)", "features-on", ""),
    (
        "request ids off",
        "features-no-ids",
        "[request_id]\nenabled = false\n",
    ),
    ("tracing off", "features-no-trace", "[tracing]\nenabled = false\n"),
    (
        "metrics off",
        "features-no-metrics",
        "[metrics]\nenabled = false\n",
    ),
    (
        "all three off",
        "features-off",
        "[request_id]\nenabled = false\n\n[tracing]\nenabled = false\n\n[metrics]\nenabled = false\n",
    ),
];

#[test]
fn request_ids_metrics_and_tracing_on_and_off() {
    if std::env::var("SWITCHYARD_PERF_BUDGET")
        .unwrap_or_default()
        .is_empty()
    {
        eprintln!("skipped: set SWITCHYARD_PERF_BUDGET=1 to measure");
        return;
    }
    let groups: Vec<Group> = VARIANTS
        .iter()
        .map(|(_, tag, config)| Group::builder(tag).config(config).start())
        .collect();
    let listeners: Vec<u32> = groups
        .iter()
        .map(|g| {
            g.eventually_status("/noop", 200);
            noop_load(g.addr, 2_000, CLIENTS);
            g.pid_of("listener")
        })
        .collect();
    // Per variant: the group's and the listener's nanoseconds.
    let mut totals = vec![(0u64, 0u64); VARIANTS.len()];
    for _ in 0..SLICES {
        for ((g, listener), total) in groups.iter().zip(&listeners).zip(&mut totals) {
            let (group_before, listener_before) = (tree_ns(g.supervisor_pid()), process_ns(*listener));
            noop_load(g.addr, REQUESTS, CLIENTS);
            total.0 += tree_ns(g.supervisor_pid()).saturating_sub(group_before);
            total.1 += process_ns(*listener).saturating_sub(listener_before);
        }
    }
    let per = |ns: u64| ns as f64 / 1e3 / (SLICES * REQUESTS) as f64;
    let (on_group, on_listener) = (per(totals[0].0), per(totals[0].1));
    eprintln!(
        "features ({}, {CLIENTS} clients, {SLICES} slices of {REQUESTS} requests), µs per request:",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
    eprintln!("  variant              group  listener  on - variant (group / listener)");
    for ((name, _, _), (group, listener)) in VARIANTS.iter().zip(&totals) {
        let (group, listener) = (per(*group), per(*listener));
        eprintln!(
            "  {name:<18} {group:>7.1} {listener:>9.1}  {:>5.1} / {:.1}",
            on_group - group,
            on_listener - listener
        );
    }
}
