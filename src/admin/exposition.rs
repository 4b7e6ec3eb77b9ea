//! The group's figures in the Prometheus text format (0.0.4), written by
//! prometheus-client's encoder (escaping, `HELP`/`TYPE` lines, histogram
//! buckets) from the figures the children reported.
//!
//! Every label set is bounded: routes are templates or fixed labels
//! (`metrics` in the listener), statuses are three digits, and processes
//! are named by role, name and replica, never by pid.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use switchyard_proto::supervision::{LATENCY_BUCKETS, RouteFigures};

use super::Sampled;

/// The content type of the text format.
pub(super) const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `/metrics`.
pub(super) fn encode(processes: &[Sampled], routes: &[RouteFigures]) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Group {
        processes: processes.to_vec(),
        routes: routes.to_vec(),
    }));
    let mut out = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)?;
    Ok(out)
}

#[derive(Debug)]
struct Group {
    processes: Vec<Sampled>,
    routes: Vec<RouteFigures>,
}

/// A per-process gauge or counter: its name, help, type and value.
type PerProcess = (
    &'static str,
    &'static str,
    MetricType,
    fn(&Sampled) -> Option<f64>,
);

fn gauge(p: &Sampled, name: &str) -> Option<f64> {
    p.process
        .gauges
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| *v as f64)
}

/// Which processes report which gauge.
fn role_is(p: &Sampled, roles: &[&str]) -> bool {
    roles.contains(&p.process.info.role.as_str())
}

const PER_PROCESS: [PerProcess; 11] = [
    (
        "switchyard_process_up",
        "Whether the process is running (1) or not (0: starting, restarting, stopped).",
        MetricType::Gauge,
        |p| Some(f64::from(u8::from(p.process.info.state == "running"))),
    ),
    (
        "switchyard_process_restarts",
        "Times the supervisor restarted the process.",
        MetricType::Counter,
        |p| Some(f64::from(p.process.info.restarts)),
    ),
    (
        "switchyard_process_in_flight",
        "Requests the process is handling or waiting on.",
        MetricType::Gauge,
        |p| Some(p.process.info.load.in_flight as f64),
    ),
    (
        "switchyard_process_queued",
        "Work waiting in the process's bounded queues (frames to send, jobs for workers).",
        MetricType::Gauge,
        |p| Some(p.process.info.load.queued as f64),
    ),
    (
        "switchyard_process_cpu_seconds",
        "User and system CPU time of the process, in seconds (from /proc).",
        MetricType::Counter,
        |p| p.cpu_seconds,
    ),
    (
        "switchyard_process_resident_memory_bytes",
        "Resident memory of the process, in bytes (from /proc).",
        MetricType::Gauge,
        |p| p.rss_bytes.map(|b| b as f64),
    ),
    (
        "switchyard_shm_bytes_in_use",
        "Shared memory the process holds for bodies, in bytes (counted against group.shm_budget_bytes).",
        MetricType::Gauge,
        |p| gauge(p, "shm_bytes"),
    ),
    (
        "switchyard_websocket_connections",
        "Open WebSocket sessions of a listener process.",
        MetricType::Gauge,
        |p| {
            if role_is(p, &["listener"]) {
                gauge(p, "ws_connections")
            } else {
                None
            }
        },
    ),
    (
        "switchyard_websocket_subscriptions",
        "WebSocket subscriptions the broker holds.",
        MetricType::Gauge,
        |p| {
            if role_is(p, &["broker"]) {
                gauge(p, "ws_subscriptions")
            } else {
                None
            }
        },
    ),
    (
        "switchyard_return_links",
        "Manager instances answering a listener process straight back (group.return_path = \"direct\"; decision 0143).",
        MetricType::Gauge,
        |p| {
            if role_is(p, &["listener"]) {
                gauge(p, "return_links")
            } else {
                None
            }
        },
    ),
    (
        "switchyard_workers_busy",
        "Jobs a manager instance's workers are running.",
        MetricType::Gauge,
        |p| {
            if role_is(p, &["manager"]) {
                gauge(p, "workers_busy")
            } else {
                None
            }
        },
    ),
];

impl Collector for Group {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let mut requests = encoder.encode_descriptor(
            "switchyard_http_requests",
            "HTTP requests answered, by route template, method and status.",
            None,
            MetricType::Counter,
        )?;
        for r in &self.routes {
            for (status, count) in &r.statuses {
                let status = status.to_string();
                let labels = [
                    ("route", r.route.as_str()),
                    ("method", r.method.as_str()),
                    ("status", status.as_str()),
                ];
                ConstCounter::new(*count).encode(requests.encode_family(&labels)?)?;
            }
        }
        let mut durations = encoder.encode_descriptor(
            "switchyard_http_request_duration_seconds",
            "Time from a request's arrival to its response's head, by route template and method.",
            None,
            MetricType::Histogram,
        )?;
        for r in &self.routes {
            let labels = [("route", r.route.as_str()), ("method", r.method.as_str())];
            let buckets: Vec<(f64, u64)> = LATENCY_BUCKETS
                .iter()
                .copied()
                .chain(std::iter::once(f64::INFINITY))
                .zip(r.buckets.iter().copied().chain(std::iter::repeat(0)))
                .collect();
            let count = r.buckets.iter().sum();
            durations
                .encode_family(&labels)?
                .encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                    r.sum_us as f64 / 1e6,
                    count,
                    &buckets,
                    None,
                )?;
        }
        for (name, help, kind, value) in PER_PROCESS {
            let mut family = encoder.encode_descriptor(name, help, None, kind)?;
            for p in &self.processes {
                let Some(v) = value(p) else { continue };
                let info = &p.process.info;
                let labels = [
                    ("role", info.role.as_str()),
                    ("name", info.name.as_str()),
                    ("replica", p.replica.as_str()),
                ];
                let metric = family.encode_family(&labels)?;
                match kind {
                    MetricType::Counter => ConstCounter::new(v).encode(metric)?,
                    _ => ConstGauge::new(v).encode(metric)?,
                }
            }
        }
        let mut workers = encoder.encode_descriptor(
            "switchyard_workers",
            "Workers (threads or processes) of a manager instance's pool.",
            None,
            MetricType::Gauge,
        )?;
        for p in self.processes.iter().filter(|p| p.process.info.role == "manager") {
            let Some(pool) = &p.process.info.workers else {
                continue;
            };
            let info = &p.process.info;
            let labels = [
                ("role", info.role.as_str()),
                ("name", info.name.as_str()),
                ("replica", p.replica.as_str()),
                ("kind", pool.kind.as_str()),
            ];
            ConstGauge::new(pool.size as i64).encode(workers.encode_family(&labels)?)?;
        }
        Ok(())
    }
}
