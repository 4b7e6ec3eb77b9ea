//! What a run found: the per-step figures, where the server broke and where
//! it saturated, and the table that shows them.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

/// Throughput gain below which more clients count as buying nothing.
const SATURATION_GAIN: f64 = 0.10;

/// Share of one core above which the generator, not the server, may be the limit.
const GENERATOR_SATURATED: f64 = 0.90;

/// The result of [`run`](super::run); `--json` prints it as is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The base URL.
    pub url: String,
    /// The routes requested, round-robin, as "METHOD /path".
    pub routes: Vec<String>,
    /// Where the routes came from.
    pub routes_from: RoutesFrom,
    /// "HTTP/1.1" or "h2".
    pub protocol: String,
    /// Open loop: the fixed total rate in requests per second. `None`: closed loop.
    pub rate: Option<f64>,
    /// How latency was measured, in words.
    pub latency_note: String,
    /// Seconds per step, as asked for.
    pub step_duration_s: f64,
    /// Seconds of warm-up before the first step.
    pub warmup_s: f64,
    /// The p99 threshold of a break, in milliseconds.
    pub max_p99_ms: f64,
    /// The error-rate threshold of a break.
    pub max_error_rate: f64,
    /// One entry per concurrency step, in the order run.
    pub steps: Vec<Step>,
    /// The first step over a threshold, if any.
    #[serde(rename = "break")]
    pub break_at: Option<Break>,
    /// The step after which more clients bought less than 10 % more throughput, if any
    /// (never in open loop, where the rate is fixed).
    pub saturation: Option<Saturation>,
}

/// Where the routes of a run came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RoutesFrom {
    /// `-r` options.
    Options,
    /// The parameter-free GET paths of the server's `/openapi.json`.
    Openapi,
    /// Neither: `GET /noop`.
    Default,
}

/// The figures of one concurrency step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// Simulated clients, each with its own connection.
    pub concurrency: u32,
    /// Length of the measured window in seconds.
    pub duration_s: f64,
    /// Requests finished in the window: responses of any status plus transport errors.
    pub requests: u64,
    /// Responses (of any status) per second.
    pub rps: f64,
    /// Latency percentiles; `None` when nothing was recorded.
    pub latency_ms: Option<Latency>,
    /// The requests by outcome.
    pub status: Counts,
    /// Requests cut by the end of the window (in open loop, also those due but not yet sent).
    /// Not in `requests`; one that had waited longer than every response of its client is
    /// in the latency figures, with its wait so far as a lower bound.
    pub unfinished: u64,
    /// (5xx + 429 + transport errors) / requests.
    pub error_rate: f64,
    /// `GET /ready` right after the step.
    pub ready: Ready,
    /// CPU time the load generator used during the step, as a share of one core
    /// (`None` where `/proc/self/stat` is not available).
    pub generator_cpu: Option<f64>,
}

impl Step {
    /// Whether the load generator used (nearly) a whole core, making the figures a lower bound.
    pub fn generator_saturated(&self) -> bool {
        self.generator_cpu.is_some_and(|cpu| cpu >= GENERATOR_SATURATED)
    }
}

/// Latency percentiles in milliseconds (microsecond resolution, 3 significant figures).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Slowest.
    pub max: f64,
}

/// Requests by outcome. Every finished request is in exactly one field.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// 2xx responses.
    #[serde(rename = "2xx")]
    pub ok: u64,
    /// 4xx responses other than 429.
    #[serde(rename = "4xx")]
    pub client_error: u64,
    /// 429 Too Many Requests: the server shedding load, so an error of the server's.
    #[serde(rename = "429")]
    pub too_many_requests: u64,
    /// 5xx responses.
    #[serde(rename = "5xx")]
    pub server_error: u64,
    /// 1xx and 3xx final responses.
    pub other: u64,
    /// No response: connection refused or reset, protocol errors.
    pub transport: u64,
}

impl Counts {
    /// Counts a response of status `code`.
    pub fn add_status(&mut self, code: u16) {
        match code {
            200..=299 => self.ok += 1,
            429 => self.too_many_requests += 1,
            400..=499 => self.client_error += 1,
            500..=599 => self.server_error += 1,
            _ => self.other += 1,
        }
    }

    /// Adds `other`'s counts to these.
    pub fn merge(&mut self, other: &Counts) {
        self.ok += other.ok;
        self.client_error += other.client_error;
        self.too_many_requests += other.too_many_requests;
        self.server_error += other.server_error;
        self.other += other.other;
        self.transport += other.transport;
    }

    /// Every finished request.
    pub fn total(&self) -> u64 {
        self.responses() + self.transport
    }

    /// Requests answered with a status, whatever it was.
    pub fn responses(&self) -> u64 {
        self.ok + self.client_error + self.too_many_requests + self.server_error + self.other
    }

    /// The requests that did not succeed: every answer that is not 2xx (a 404 on every
    /// request is a broken run, not a fast one) and transport errors.
    pub fn errors(&self) -> u64 {
        self.total() - self.ok
    }

    /// [`errors`](Self::errors) / [`total`](Self::total), 0 when nothing finished.
    pub fn error_rate(&self) -> f64 {
        match self.total() {
            0 => 0.0,
            total => self.errors() as f64 / total as f64,
        }
    }
}

/// What `GET /ready` said after a step.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ready {
    /// The status code, if there was a response.
    pub status: Option<u16>,
    /// The body's `ready` member, if the body was a JSON object with a boolean there.
    pub ready: Option<bool>,
    /// Why there was no response.
    pub error: Option<String>,
}

/// The first step over a threshold.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Break {
    /// Index of the step in [`Report::steps`].
    pub step: usize,
    /// Its concurrency.
    pub concurrency: u32,
    /// Which thresholds it crossed, in words.
    pub reasons: Vec<String>,
}

/// The step after which more clients bought less than 10 % more throughput.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Saturation {
    /// Index of the step in [`Report::steps`].
    pub step: usize,
    /// Its concurrency.
    pub concurrency: u32,
    /// Its throughput.
    pub rps: f64,
    /// The next step's concurrency.
    pub next_concurrency: u32,
    /// What the next step's extra clients bought: next rps / this rps − 1.
    pub next_gain: f64,
}

/// The first step whose p99 is above `max_p99_ms` or whose error rate is above
/// `max_error_rate`.
pub fn find_break(steps: &[Step], max_p99_ms: f64, max_error_rate: f64) -> Option<Break> {
    steps.iter().enumerate().find_map(|(i, step)| {
        let mut reasons = Vec::new();
        if let Some(latency) = step.latency_ms.filter(|l| l.p99 > max_p99_ms) {
            reasons.push(format!("p99 {} ms > {} ms", ms(latency.p99), max_p99_ms));
        }
        if step.error_rate > max_error_rate {
            reasons.push(format!(
                "error rate {} > {}",
                percent(step.error_rate),
                percent(max_error_rate)
            ));
        }
        (!reasons.is_empty()).then_some(Break {
            step: i,
            concurrency: step.concurrency,
            reasons,
        })
    })
}

/// The first step after which the next step, with more clients, bought less than
/// 10 % more throughput. Pairs where the next step has no more clients say nothing
/// about saturation and are skipped.
pub fn find_saturation(steps: &[Step]) -> Option<Saturation> {
    steps.windows(2).enumerate().find_map(|(i, pair)| {
        let (this, next) = (&pair[0], &pair[1]);
        let saturated = next.concurrency > this.concurrency
            && this.rps > 0.0
            && next.rps < this.rps * (1.0 + SATURATION_GAIN);
        saturated.then(|| Saturation {
            step: i,
            concurrency: this.concurrency,
            rps: this.rps,
            next_concurrency: next.concurrency,
            next_gain: next.rps / this.rps - 1.0,
        })
    })
}

/// Prints [`render_table`] to stdout.
pub fn print_table(report: &Report) {
    print!("{}", render_table(report));
}

/// The report as a markdown table with a heading, followed by the break, saturation and
/// warning lines.
pub fn render_table(report: &Report) -> String {
    let mut out = String::new();
    let mode = match report.rate {
        Some(rate) => format!("open loop at {rate} req/s"),
        None => "closed loop".to_owned(),
    };
    let warmup = if report.warmup_s > 0.0 {
        format!(" after {} s of warm-up", report.warmup_s)
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "{} on {} · {} · {mode} · {} s per step{warmup}",
        report.routes.join(", "),
        report.url,
        report.protocol,
        report.step_duration_s,
    );
    let _ = writeln!(out, "{}\n", report.latency_note);
    let _ = writeln!(
        out,
        "| clients | requests | req/s | p50 ms | p95 ms | p99 ms | max ms \
         | 2xx | 4xx | 429 | 5xx | transport | other | error rate | /ready | generator CPU |"
    );
    let _ = writeln!(out, "|{}", "---:|".repeat(16));
    for step in &report.steps {
        let [p50, p95, p99, max] = match step.latency_ms {
            Some(l) => [l.p50, l.p95, l.p99, l.max].map(ms),
            None => ["–"; 4].map(str::to_owned),
        };
        let c = &step.status;
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} | {p50} | {p95} | {p99} | {max} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            step.concurrency,
            step.requests,
            step.rps,
            c.ok,
            c.client_error,
            c.too_many_requests,
            c.server_error,
            c.transport,
            c.other,
            percent(step.error_rate),
            ready(&step.ready),
            step.generator_cpu
                .map_or("–".to_owned(), |cpu| format!("{:.0} %", cpu * 100.0)),
        );
    }
    out.push('\n');
    match &report.break_at {
        Some(b) => {
            let _ = writeln!(
                out,
                "break: {} ({})",
                clients(b.concurrency),
                b.reasons.join("; ")
            );
        }
        None => {
            let _ = writeln!(
                out,
                "break: none (no step over p99 {} ms or error rate {})",
                report.max_p99_ms,
                percent(report.max_error_rate)
            );
        }
    }
    let _ = match (&report.saturation, report.rate) {
        (Some(s), _) => writeln!(
            out,
            "saturation: {} at {:.0} req/s ({} bought {:+.1} %)",
            clients(s.concurrency),
            s.rps,
            clients(s.next_concurrency),
            s.next_gain * 100.0
        ),
        (None, Some(_)) => writeln!(out, "saturation: not applicable (open loop at a fixed rate)"),
        (None, None) => writeln!(out, "saturation: not reached"),
    };
    // A few requests in flight at the end of a step are normal; more say that the
    // server held the clients (or, in open loop, the schedule) up.
    for step in report
        .steps
        .iter()
        .filter(|s| s.unfinished > 0 && s.unfinished * 100 > s.requests)
    {
        let _ = writeln!(
            out,
            "note: at {} {} requests were not finished by the end of the step ({} finished)",
            clients(step.concurrency),
            step.unfinished,
            step.requests,
        );
    }
    for step in report.steps.iter().filter(|s| s.generator_saturated()) {
        let _ = writeln!(
            out,
            "warning: load generator saturated at {} ({:.0} % of a core): figures are a lower bound",
            clients(step.concurrency),
            step.generator_cpu.unwrap_or_default() * 100.0
        );
    }
    out
}

/// "1 client", "8 clients".
pub(super) fn clients(n: u32) -> String {
    if n == 1 {
        "1 client".to_owned()
    } else {
        format!("{n} clients")
    }
}

/// Milliseconds with about three significant figures, so that 0.085 and 612 both read well.
fn ms(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.3}")
    } else if v < 100.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.1}")
    }
}

fn percent(fraction: f64) -> String {
    format!("{:.2} %", fraction * 100.0)
}

fn ready(ready: &Ready) -> String {
    match (ready.status, ready.ready) {
        (Some(status), Some(true)) => format!("{status} ready"),
        (Some(status), Some(false)) => format!("{status} not ready"),
        (Some(status), None) => status.to_string(),
        (None, _) => "no answer".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(concurrency: u32, rps: f64) -> Step {
        Step {
            concurrency,
            rps,
            ..Step::default()
        }
    }

    #[test]
    fn saturation_is_the_step_before_the_first_small_gain() {
        let steps = [
            step(1, 1000.0),
            step(8, 5000.0),
            step(32, 5400.0),
            step(128, 9000.0),
        ];
        let s = find_saturation(&steps).unwrap();
        assert_eq!(
            (s.step, s.concurrency, s.rps, s.next_concurrency),
            (1, 8, 5000.0, 32)
        );
        assert!((s.next_gain - 0.08).abs() < 1e-9);

        // Exactly +10 % still counts as buying something; a drop counts as saturation.
        assert_eq!(
            find_saturation(&[step(1, 1000.0), step(2, 1100.0), step(4, 2000.0)]),
            None
        );
        let s = find_saturation(&[step(1, 1000.0), step(2, 1500.0), step(4, 900.0)]).unwrap();
        assert_eq!(s.concurrency, 2);
        assert!(s.next_gain < 0.0);
    }

    #[test]
    fn saturation_needs_two_steps_with_more_clients() {
        assert_eq!(find_saturation(&[]), None);
        assert_eq!(find_saturation(&[step(8, 1000.0)]), None);
        // Same or fewer clients: not a question of saturation.
        assert_eq!(find_saturation(&[step(8, 1000.0), step(8, 1000.0)]), None);
        assert_eq!(find_saturation(&[step(8, 1000.0), step(4, 500.0)]), None);
        // Nothing got through at all: there was no throughput to saturate.
        assert_eq!(find_saturation(&[step(1, 0.0), step(8, 0.0)]), None);
    }

    #[test]
    fn break_is_the_first_step_over_a_threshold() {
        let latency = |p99| {
            Some(Latency {
                p99,
                ..Latency::default()
            })
        };
        let steps = [
            Step {
                latency_ms: latency(100.0),
                error_rate: 0.01,
                ..step(1, 1.0)
            },
            Step {
                latency_ms: latency(501.0),
                ..step(8, 1.0)
            },
            Step {
                latency_ms: latency(900.0),
                error_rate: 0.5,
                ..step(32, 1.0)
            },
        ];
        let b = find_break(&steps, 500.0, 0.01).unwrap();
        assert_eq!((b.step, b.concurrency), (1, 8));
        assert_eq!(b.reasons, ["p99 501.0 ms > 500 ms"]);
        let b = find_break(&steps, 1000.0, 0.1).unwrap();
        assert_eq!((b.step, b.reasons.len()), (2, 1));
        let b = find_break(&steps, 50.0, 0.0).unwrap();
        assert_eq!((b.step, b.reasons.len()), (0, 2));
        assert_eq!(find_break(&steps, 1000.0, 0.5), None);
        // No latency recorded is not a latency over the threshold.
        assert_eq!(find_break(&[step(1, 0.0)], 0.0, 0.0), None);
    }

    #[test]
    fn status_classes() {
        let mut c = Counts::default();
        for code in [200, 204, 301, 404, 405, 429, 500, 503] {
            c.add_status(code);
        }
        c.transport += 2;
        let expected = Counts {
            ok: 2,
            client_error: 2,
            too_many_requests: 1,
            server_error: 2,
            other: 1,
            transport: 2,
        };
        assert_eq!(c, expected);
        assert_eq!((c.total(), c.responses(), c.errors()), (10, 8, 8));
        assert_eq!(c.error_rate(), 0.8);
        // Every request answered 404: every one is an error.
        let mut all_404 = Counts::default();
        for _ in 0..100 {
            all_404.add_status(404);
        }
        assert_eq!(all_404.error_rate(), 1.0);
        assert_eq!(Counts::default().error_rate(), 0.0);
    }

    #[test]
    fn table_shows_break_saturation_and_warnings() {
        let report = Report {
            url: "http://127.0.0.1:1".to_owned(),
            routes: vec!["GET /noop".to_owned()],
            routes_from: RoutesFrom::Default,
            protocol: "HTTP/1.1".to_owned(),
            rate: None,
            latency_note: "closed loop: latency not corrected for coordinated omission".to_owned(),
            step_duration_s: 2.0,
            warmup_s: 1.0,
            max_p99_ms: 500.0,
            max_error_rate: 0.01,
            steps: vec![
                Step {
                    generator_cpu: Some(0.4),
                    ready: Ready {
                        status: Some(200),
                        ready: Some(true),
                        error: None,
                    },
                    ..step(1, 1000.0)
                },
                Step {
                    generator_cpu: Some(0.95),
                    requests: 1000,
                    unfinished: 11,
                    ..step(8, 1050.0)
                },
            ],
            break_at: None,
            saturation: None,
        };
        let report = Report {
            saturation: find_saturation(&report.steps),
            ..report
        };
        let table = render_table(&report);
        assert!(table.contains("| 1 | 0 | 1000 | – | – | – | – | 0 |"), "{table}");
        assert!(table.contains("| 200 ready | 40 % |"), "{table}");
        assert!(table.contains("| no answer | 95 % |"), "{table}");
        assert!(table.contains("break: none"), "{table}");
        assert!(table.contains("saturation: 1 client at 1000 req/s (8 clients bought +5.0 %)"));
        assert!(table.contains("warning: load generator saturated at 8 clients (95 % of a core)"));
        assert_eq!(table.matches("warning").count(), 1, "{table}");
        assert!(table.contains(
            "note: at 8 clients 11 requests were not finished by the end of the step (1000 finished)"
        ));
        assert_eq!(table.matches("note").count(), 1, "{table}");
    }
}
