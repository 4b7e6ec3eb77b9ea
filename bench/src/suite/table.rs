//! The suite's markdown tables: two contenders side by side with their
//! ratio, and the router's round trips against the target.

use std::fmt::Write as _;

use super::routing::RoutingRun;
use super::stats::{Spread, median, ratio, spread};
use crate::load::Step;

/// Share of one core above which the load generator, not the server, may
/// be the limit (as `switchyard-load` warns).
const GENERATOR_SATURATED: f64 = 0.90;

/// What one load run measured at one concurrency.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    /// Responses per second.
    pub rps: f64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// Requests finished, responses and transport errors.
    pub requests: u64,
    /// Of those, the ones without a 2xx: any other status, or no response.
    pub failed: u64,
    /// The generator's CPU over the step, in cores.
    pub generator_cpu: Option<f64>,
}

impl Sample {
    pub fn of(step: &Step) -> Sample {
        Sample {
            rps: step.rps,
            p50_ms: step.latency_ms.map(|l| l.p50),
            p99_ms: step.latency_ms.map(|l| l.p99),
            requests: step.requests,
            failed: step.requests.saturating_sub(step.status.ok),
            generator_cpu: step.generator_cpu,
        }
    }
}

/// One row: the samples of both contenders over the rounds.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// What the row varies: "8", "1 KiB", ...
    pub key: String,
    /// Samples of contender 0 and 1, one per round.
    pub samples: [Vec<Sample>; 2],
}

/// Two contenders under the same loads; the ratio is contender 0 / 1.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// Heading of the key column.
    pub key_header: String,
    pub labels: [String; 2],
    pub rows: Vec<Row>,
}

/// The comparison as a markdown table, followed by a warning for every row
/// where requests failed and a line on the load generator's own CPU.
pub fn render_comparison(c: &Comparison) -> String {
    let mut out = String::new();
    let [a, b] = &c.labels;
    let _ = writeln!(
        out,
        "| {} | {a} req/s | p50 ms | p99 ms | {b} req/s | p50 ms | p99 ms | req/s ratio {a} / {b} |",
        c.key_header
    );
    let _ = writeln!(out, "|{}", "---:|".repeat(8));
    for row in &c.rows {
        let [sa, sb] = &row.samples;
        let (ra, rb) = (rps_spread(sa), rps_spread(sb));
        let ratio = match (ra, rb) {
            (Some(ra), Some(rb)) => {
                ratio(ra.median, rb.median).map_or("–".to_owned(), |r| format!("{r:.2}"))
            }
            _ => "–".to_owned(),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {ratio} |",
            row.key,
            rps_cell(ra),
            latency_cell(sa, |s| s.p50_ms),
            latency_cell(sa, |s| s.p99_ms),
            rps_cell(rb),
            latency_cell(sb, |s| s.p50_ms),
            latency_cell(sb, |s| s.p99_ms),
        );
    }
    out.push('\n');
    for row in &c.rows {
        for (label, samples) in c.labels.iter().zip(&row.samples) {
            let failed: u64 = samples.iter().map(|s| s.failed).sum();
            let requests: u64 = samples.iter().map(|s| s.requests).sum();
            if failed > 0 {
                let _ = writeln!(
                    out,
                    "warning: {label} at {}: {failed} of {requests} requests got no 2xx response",
                    row.key
                );
            }
        }
    }
    let busiest = c
        .rows
        .iter()
        .flat_map(|row| row.samples.iter().flatten())
        .filter_map(|s| s.generator_cpu)
        .fold(None, |max: Option<f64>, cpu| {
            Some(max.map_or(cpu, |m| m.max(cpu)))
        });
    if let Some(cpu) = busiest {
        let _ = write!(
            out,
            "The load generator used at most {:.0} % of one core in any run",
            cpu * 100.0
        );
        let _ = writeln!(
            out,
            "{}.",
            if cpu >= GENERATOR_SATURATED {
                "; at that level the generator, not the server, may be the limit"
            } else {
                ""
            }
        );
    }
    out
}

fn rps_spread(samples: &[Sample]) -> Option<Spread> {
    spread(&samples.iter().map(|s| s.rps).collect::<Vec<_>>())
}

/// "7926 (7664–8132)"; a single run has no range to show.
fn rps_cell(spread: Option<Spread>) -> String {
    match spread {
        None => "–".to_owned(),
        Some(s) if s.min == s.max => format!("{:.0}", s.median),
        Some(s) => format!("{:.0} ({:.0}–{:.0})", s.median, s.min, s.max),
    }
}

/// The median of a latency percentile over the runs, in ms.
fn latency_cell(samples: &[Sample], pick: impl Fn(&Sample) -> Option<f64>) -> String {
    let values: Vec<f64> = samples.iter().filter_map(pick).collect();
    median(&values).map_or("–".to_owned(), |v| format!("{v:.3}"))
}

/// The router's round trips per window of outstanding requests, as a
/// markdown table with each median's share of `target`.
pub fn render_routing(rows: &[(usize, Vec<RoutingRun>)], target: f64) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| outstanding | round trips/s | p50 µs | p99 µs | share of target ({target:.0}/s) |"
    );
    let _ = writeln!(out, "|{}", "---:|".repeat(5));
    for (window, runs) in rows {
        let per_second = spread(&runs.iter().map(RoutingRun::per_second).collect::<Vec<_>>());
        let p50 = median(&runs.iter().filter_map(|r| r.p50_us).collect::<Vec<_>>());
        let p99 = median(&runs.iter().filter_map(|r| r.p99_us).collect::<Vec<_>>());
        let us = |v: Option<f64>| v.map_or("–".to_owned(), |v| format!("{v:.1}"));
        let share = per_second
            .and_then(|s| ratio(s.median, target))
            .map_or("–".to_owned(), |r| format!("{r:.2}"));
        let _ = writeln!(
            out,
            "| {window} | {} | {} | {} | {share} |",
            rps_cell(per_second),
            us(p50),
            us(p99)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(rps: f64, p50: f64, p99: f64) -> Sample {
        Sample {
            rps,
            p50_ms: Some(p50),
            p99_ms: Some(p99),
            requests: 100,
            failed: 0,
            generator_cpu: Some(0.5),
        }
    }

    #[test]
    fn comparison_shows_medians_ranges_and_the_ratio() {
        let c = Comparison {
            key_header: "clients".to_owned(),
            labels: ["Switchyard".to_owned(), "baseline".to_owned()],
            rows: vec![
                Row {
                    key: "8".to_owned(),
                    samples: [
                        vec![
                            sample(3000.0, 0.2, 0.5),
                            sample(2000.0, 0.1, 0.4),
                            sample(4000.0, 0.3, 0.9),
                        ],
                        vec![
                            sample(8000.0, 0.05, 0.1),
                            sample(8200.0, 0.04, 0.2),
                            sample(7900.0, 0.06, 0.3),
                        ],
                    ],
                },
                Row {
                    key: "32".to_owned(),
                    samples: [
                        vec![Sample {
                            failed: 3,
                            generator_cpu: Some(0.95),
                            ..sample(100.0, 1.0, 2.0)
                        }],
                        vec![],
                    ],
                },
            ],
        };
        let table = render_comparison(&c);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[0],
            "| clients | Switchyard req/s | p50 ms | p99 ms | baseline req/s | p50 ms | p99 ms \
             | req/s ratio Switchyard / baseline |"
        );
        assert_eq!(lines[1], "|---:|---:|---:|---:|---:|---:|---:|---:|");
        assert_eq!(
            lines[2],
            "| 8 | 3000 (2000–4000) | 0.200 | 0.500 | 8000 (7900–8200) | 0.050 | 0.200 | 0.38 |"
        );
        // One run: no range; no runs: dashes and no ratio.
        assert_eq!(lines[3], "| 32 | 100 | 1.000 | 2.000 | – | – | – | – |");
        assert!(
            table.contains("warning: Switchyard at 32: 3 of 100 requests got no 2xx response"),
            "{table}"
        );
        assert_eq!(table.matches("warning").count(), 1, "{table}");
        assert!(table.ends_with(
            "The load generator used at most 95 % of one core in any run; \
             at that level the generator, not the server, may be the limit.\n"
        ));
    }

    #[test]
    fn routing_rows_against_the_target() {
        let run = |round_trips, p50, p99| RoutingRun {
            window: 32,
            round_trips,
            seconds: 2.0,
            p50_us: Some(p50),
            p99_us: Some(p99),
        };
        let rows = vec![
            (1, vec![]),
            (
                32,
                vec![
                    run(200_000, 50.0, 90.0),
                    run(300_000, 40.0, 70.0),
                    run(100_000, 60.0, 99.0),
                ],
            ),
        ];
        let table = render_routing(&rows, 300_000.0);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[0],
            "| outstanding | round trips/s | p50 µs | p99 µs | share of target (300000/s) |"
        );
        assert_eq!(lines[2], "| 1 | – | – | – | – |");
        assert_eq!(lines[3], "| 32 | 100000 (50000–150000) | 50.0 | 90.0 | 0.33 |");
    }

    #[test]
    fn samples_count_every_request_without_a_2xx_as_failed() {
        let mut step = Step {
            concurrency: 8,
            rps: 10.0,
            requests: 12,
            ..Step::default()
        };
        step.status.ok = 9;
        step.status.client_error = 1;
        step.status.transport = 2;
        let s = Sample::of(&step);
        assert_eq!((s.rps, s.requests, s.failed, s.p50_ms), (10.0, 12, 3, None));
    }
}
