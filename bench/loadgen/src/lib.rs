//! The load generator behind `switchyard bench URL` (also the `switchyard-load`
//! binary of `switchyard-bench`): a crate of its own so that the product
//! binary links it without the scenario suite and the in-process baseline.
//! It steps the number of simulated clients, each with its own
//! connection, and reports per step the throughput, latency percentiles,
//! errors and `/ready`, then where the server broke and where it saturated.
//!
//! Latency is measured honestly for the mode: closed loop (the default) says
//! it is not corrected for coordinated omission; open loop (`--rate`) measures
//! from each request's scheduled send time, which corrects it. The generator
//! also measures its own CPU time, because a generator that uses a whole core
//! measures itself rather than the server.

mod client;
pub mod h3;
mod options;
mod report;
mod schedule;
pub mod tls;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use hdrhistogram::Histogram;
use tokio::task::JoinSet;
use tokio::time::Instant;

use client::{Latencies, Server, Tally, Workload};
pub use options::{Options, Route};
use report::clients;
pub use report::{
    Break, Counts, Latency, Ready, Report, RoutesFrom, Saturation, Step, find_break, find_saturation,
    print_table, render_table,
};
use schedule::Schedule;

/// Runs the warm-up and every step of `opts` and returns what they found.
/// Progress goes to stderr; the report is for the caller to print.
///
/// Fails only when the run cannot start: the server does not resolve or
/// accept a connection, or an option cannot become a request. Errors during
/// the steps are figures of the report.
/// The whole command (`switchyard bench URL`, `switchyard-load URL`): runs
/// the steps on a runtime of its own and prints the table or the JSON.
/// Exit status: 0; 1 when the run cannot start; 2 when `--fail-on-break` is
/// set and a step broke the thresholds.
pub fn main(options: Options) -> std::process::ExitCode {
    use std::io::Write;
    let inner = || -> anyhow::Result<std::process::ExitCode> {
        // Two workers at most, so that on the 2-core machines this project is
        // measured on the generator cannot take every core from the server; it
        // reports its own CPU use, so a figure it limited is flagged as such.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cores.min(2))
            .enable_all()
            .build()
            .context("cannot build the tokio runtime")?;
        let (json, fail_on_break) = (options.json, options.fail_on_break);
        let report = runtime.block_on(run(options))?;
        if json {
            let mut stdout = std::io::stdout().lock();
            serde_json::to_writer_pretty(&mut stdout, &report)?;
            writeln!(stdout)?;
        } else {
            print_table(&report);
        }
        Ok(if fail_on_break && report.break_at.is_some() {
            std::process::ExitCode::from(2)
        } else {
            std::process::ExitCode::SUCCESS
        })
    };
    inner().unwrap_or_else(|err| {
        eprintln!("switchyard bench: {err:#}");
        std::process::ExitCode::FAILURE
    })
}

pub async fn run(opts: Options) -> anyhow::Result<Report> {
    anyhow::ensure!(!opts.concurrency.is_empty(), "no concurrency steps");
    let server = Server::connect(&opts)
        .await
        .with_context(|| format!("cannot reach {}", opts.url))?;
    let (routes, routes_from) = if opts.routes.is_empty() {
        discover_routes(&server).await
    } else {
        (opts.routes.clone(), RoutesFrom::Options)
    };
    let requests = routes
        .iter()
        .map(|route| {
            server
                .prepare(route, opts.body.as_ref())
                .with_context(|| format!("cannot build a request for {route}"))
        })
        .collect::<anyhow::Result<_>>()?;
    let workload = Arc::new(Workload { server, requests });
    let routes: Vec<String> = routes.iter().map(Route::to_string).collect();
    // `Uri` prints http://host:port with a `/` path that the routes already start with.
    let url = opts.url.to_string().trim_end_matches('/').to_owned();
    eprintln!(
        "switchyard-load: {} on {url} ({})",
        routes.join(", "),
        workload.server.protocol()
    );

    if !opts.warmup.is_zero() {
        eprintln!(
            "warm-up: {} for {} s",
            clients(opts.concurrency[0]),
            opts.warmup.as_secs_f64()
        );
        load(&workload, opts.concurrency[0], opts.warmup, opts.rate).await?;
    }
    let mut steps = Vec::with_capacity(opts.concurrency.len());
    for (i, &concurrency) in opts.concurrency.iter().enumerate() {
        eprintln!(
            "step {}/{}: {} for {} s",
            i + 1,
            opts.concurrency.len(),
            clients(concurrency),
            opts.duration.as_secs_f64()
        );
        let cpu_before = cpu_seconds();
        let wall = Instant::now();
        let window = load(&workload, concurrency, opts.duration, opts.rate).await?;
        let wall = wall.elapsed();
        let generator_cpu = match (cpu_before, cpu_seconds()) {
            (Some(before), Some(after)) => Some((after - before) / wall.as_secs_f64()),
            _ => None,
        };
        let ready = read_ready(&workload.server).await;
        steps.push(step(concurrency, opts.duration, &window, ready, generator_cpu));
    }

    let latency_note = match opts.rate {
        None => "closed loop: latency not corrected for coordinated omission".to_owned(),
        Some(rate) => format!(
            "open loop at {rate} req/s: latency from each request's scheduled send time \
             (corrected for coordinated omission)"
        ),
    };
    Ok(Report {
        url,
        routes,
        routes_from,
        protocol: workload.server.protocol().to_owned(),
        rate: opts.rate,
        latency_note,
        step_duration_s: opts.duration.as_secs_f64(),
        warmup_s: opts.warmup.as_secs_f64(),
        max_p99_ms: opts.max_p99_ms,
        max_error_rate: opts.max_error_rate,
        break_at: find_break(&steps, opts.max_p99_ms, opts.max_error_rate),
        // A fixed rate caps throughput by design: more clients cannot buy more of it.
        saturation: if opts.rate.is_none() {
            find_saturation(&steps)
        } else {
            None
        },
        steps,
    })
}

/// What the clients of one window saw, all told.
struct Window {
    counts: Counts,
    /// Requests cut by the deadline, and in open loop the slots nobody got to.
    unfinished: u64,
    latency_us: Histogram<u64>,
}

/// `concurrency` clients for `duration`, at `rate` requests per second in
/// total or closed loop.
async fn load(
    workload: &Arc<Workload>,
    concurrency: u32,
    duration: Duration,
    rate: Option<f64>,
) -> anyhow::Result<Window> {
    let latencies = Arc::new(Latencies::new());
    let start = Instant::now();
    let deadline = start + duration;
    let schedule = rate.map(|rate| Arc::new(Schedule::new(start, deadline, rate)));
    let releaser = schedule
        .clone()
        .map(|schedule| tokio::task::spawn_blocking(move || schedule.release()));
    let mut tasks = JoinSet::new();
    for id in 0..concurrency as usize {
        let client = client::client(
            workload.clone(),
            latencies.clone(),
            schedule.clone(),
            id,
            deadline,
        );
        tasks.spawn(client);
    }
    let mut total = Tally::default();
    while let Some(tally) = tasks.join_next().await {
        total.merge(tally.context("a client task failed")?);
    }
    if let Some(releaser) = releaser {
        releaser.await.context("the open-loop schedule failed")?;
    }
    // Every client has returned its reference.
    let latencies = Arc::into_inner(latencies).context("a client outlived its window")?;
    let mut histogram = latencies.into_histogram();

    // The requests the deadline cut, and in open loop the slots nobody got to:
    // their waits so far are lower bounds of their latencies. Those longer than
    // every response go into the histogram, so that a stalled server shows in
    // the percentiles; the others, mostly ordinary requests in flight at the
    // end, whose waits say little, are only counted.
    let slowest = histogram.max();
    let unclaimed = schedule.iter().flat_map(|schedule| schedule.unclaimed());
    let mut unfinished = 0;
    for due in total.cut.iter().copied().chain(unclaimed) {
        let waited = u64::try_from((deadline - due).as_micros()).unwrap_or(u64::MAX);
        if waited > slowest {
            histogram.saturating_record(waited);
        }
        unfinished += 1;
    }
    Ok(Window {
        counts: total.counts,
        unfinished,
        latency_us: histogram,
    })
}

fn step(
    concurrency: u32,
    duration: Duration,
    window: &Window,
    ready: Ready,
    generator_cpu: Option<f64>,
) -> Step {
    let (counts, histogram) = (&window.counts, &window.latency_us);
    let ms = |us: u64| us as f64 / 1000.0;
    let latency_ms = (!histogram.is_empty()).then(|| Latency {
        p50: ms(histogram.value_at_quantile(0.50)),
        p95: ms(histogram.value_at_quantile(0.95)),
        p99: ms(histogram.value_at_quantile(0.99)),
        max: ms(histogram.max()),
    });
    let seconds = duration.as_secs_f64();
    Step {
        concurrency,
        duration_s: seconds,
        requests: counts.total(),
        rps: round(counts.responses() as f64 / seconds, 1),
        latency_ms,
        status: *counts,
        unfinished: window.unfinished,
        error_rate: round(counts.error_rate(), 9),
        ready,
        generator_cpu: generator_cpu.map(|cpu| round(cpu, 3)),
    }
}

/// `x` to `decimals` places: the JSON report then shows no float noise, and it
/// reads back exactly, which 17-digit figures do not with serde_json's default
/// (fast, not always correctly rounded) float parser.
fn round(x: f64, decimals: i32) -> f64 {
    let scale = 10f64.powi(decimals);
    (x * scale).round() / scale
}

/// The parameter-free GET paths of the server's `/openapi.json`, or `GET /noop`
/// when there is no such document or it lists none.
async fn discover_routes(server: &Server) -> (Vec<Route>, RoutesFrom) {
    let fallback = || (vec![Route::get("/noop")], RoutesFrom::Default);
    let body = match server.fetch("/openapi.json").await {
        Ok((status, body)) if status.is_success() => body,
        Ok((status, _)) => {
            eprintln!("switchyard-load: /openapi.json answered {status}; using GET /noop");
            return fallback();
        }
        Err(err) => {
            eprintln!("switchyard-load: cannot read /openapi.json ({err:#}); using GET /noop");
            return fallback();
        }
    };
    // A route that needs a credential, or that does not answer 2xx to a
    // plain GET (a handler that fails on purpose, say), would only measure
    // errors: each candidate is tried once first.
    let mut routes = Vec::new();
    for (route, path) in openapi_get_routes(&body) {
        match server.fetch(&path).await {
            Ok((status, _)) if status.is_success() => routes.push(route),
            Ok((status, _)) => eprintln!("switchyard-load: skipping GET {path}: it answered {status}"),
            Err(err) => eprintln!("switchyard-load: skipping GET {path}: {err:#}"),
        }
    }
    if routes.is_empty() {
        eprintln!(
            "switchyard-load: /openapi.json lists no parameter-free GET path that answers 2xx; using GET /noop"
        );
        return fallback();
    }
    (routes, RoutesFrom::Openapi)
}

/// Every path of an OpenAPI document with a `get` operation, no `{parameter}`
/// and no required security, with the path itself. A Switchyard group's
/// own routes (`x-switchyard-builtin`: `/health`, `/openapi.json`, ...)
/// are not its application's load.
fn openapi_get_routes(document: &[u8]) -> Vec<(Route, String)> {
    let Ok(document) = serde_json::from_slice::<serde_json::Value>(document) else {
        return Vec::new();
    };
    let Some(paths) = document.get("paths").and_then(|p| p.as_object()) else {
        return Vec::new();
    };
    paths
        .iter()
        .filter(|(path, item)| {
            path.starts_with('/')
                && !path.contains('{')
                && item.get("get").is_some_and(|op| {
                    op.get("security")
                        .and_then(|s| s.as_array())
                        .is_none_or(Vec::is_empty)
                        && op.get("x-switchyard-builtin").is_none()
                })
        })
        .filter_map(|(path, _)| Some((format!("GET {path}").parse().ok()?, path.clone())))
        .collect()
}

async fn read_ready(server: &Server) -> Ready {
    match server.fetch("/ready").await {
        Ok((status, body)) => Ready {
            status: Some(status.as_u16()),
            ready: serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v.get("ready").and_then(serde_json::Value::as_bool)),
            error: None,
        },
        Err(err) => Ready {
            status: None,
            ready: None,
            error: Some(format!("{err:#}")),
        },
    }
}

/// CPU time (user + system) this process has used, from `/proc/self/stat`.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) may hold spaces and parentheses: count from its end.
    let mut fields = stat.get(stat.rfind(')')? + 1..)?.split_whitespace();
    // utime and stime are fields 14 and 15 of the whole line, 12th and 13th after the name.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    // SAFETY: sysconf reads a constant of the system and has no preconditions.
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (ticks_per_second > 0).then(|| (utime + stime) as f64 / ticks_per_second as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openapi_paths_without_parameters_that_have_a_get() {
        let document = br#"{
            "openapi": "3.1.0",
            "paths": {
                "/noop": {"get": {}},
                "/echo": {"post": {}},
                "/hello/{name}": {"get": {}},
                "/ready": {"get": {}, "head": {}},
                "/me": {"get": {"security": [{"bearer": []}]}},
                "/open": {"get": {"security": []}},
                "/health": {"get": {"x-switchyard-builtin": true}},
                "relative": {"get": {}}
            }
        }"#;
        let routes: Vec<Route> = openapi_get_routes(document).into_iter().map(|(r, _)| r).collect();
        assert_eq!(
            routes,
            [Route::get("/noop"), Route::get("/open"), Route::get("/ready")]
        );
        assert!(openapi_get_routes(b"not json").is_empty());
        assert!(openapi_get_routes(br#"{"paths": []}"#).is_empty());
        assert!(openapi_get_routes(br#"{"openapi": "3.1.0"}"#).is_empty());
    }

    #[test]
    fn own_cpu_time_is_readable_and_grows() {
        let Some(before) = cpu_seconds() else {
            // Not Linux: the report says "–" for the generator's CPU.
            return;
        };
        // Busy for a while: enough ticks (10 ms each) to show.
        let mut x = 0u64;
        while cpu_seconds().unwrap() - before < 0.02 {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        assert!(x > 0);
    }
}
