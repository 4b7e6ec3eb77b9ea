//! The scenario suite (`switchyard-suite`): each scenario starts the real
//! group in the shape it needs (a runtime directory of its own, an ephemeral
//! port) and the zero-hop baseline, drives both with [`load`](crate::load) in
//! alternating rounds on fresh servers, and prints a markdown table per
//! scenario with medians, ranges and the ratio. `--record` puts the same
//! block into BENCHMARKS.md.
//!
//! The baseline runs as the `switchyard-baseline` process, not in the
//! suite's process: the load generator measures its own process's CPU to
//! tell when it is the bottleneck, and a server inside that process would
//! make every run look generator-bound.
//!
//! # Layout
//! - `scenarios`: what each scenario starts and drives.
//! - `server`: server processes: start, readiness, status, stop.
//! - [`routing`]: the router round-trip rig of the `routing` scenario.
//! - [`stats`], [`table`]: medians, ranges, ratios, and their tables.
//! - `machine`, `record`: the header of a run, and BENCHMARKS.md.

mod machine;
mod record;
pub mod routing;
mod scenarios;
mod server;
pub mod stats;
pub mod table;
mod tmp;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use clap::builder::PossibleValuesParser;

pub use machine::{shell_words, utc};
pub use record::insert_entry;
use scenarios::{Ctx, Outcome};
pub use server::{ManagerEntry, Pool, config_toml};

/// Every scenario, in the order a full run takes them.
pub const SCENARIOS: [&str; 14] = [
    "rest",
    "tls",
    "http3",
    "payload",
    "routing",
    "managers",
    "workers",
    "middleware",
    "slow",
    "ws",
    "grpc",
    "listener-workers",
    "transport",
    "metrics",
];

/// Runs scenarios against a real Switchyard group and the in-process hyper
/// baseline, alternating, and prints a table per scenario.
#[derive(Args, Clone, Debug)]
pub struct Options {
    /// The `switchyard` binary to measure (default: the one next to this binary).
    #[arg(long, value_name = "PATH")]
    pub switchyard: Option<PathBuf>,

    /// Rounds per scenario; each round runs every contender once, on a fresh server.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=50))]
    pub runs: u32,

    /// Seconds per load step (fractions allowed).
    #[arg(long, value_name = "SECONDS", default_value = "5", value_parser = parse_duration)]
    pub duration: Duration,

    /// Also put the output into BENCHMARKS.md, above the older entries (needs --runs 3 or more).
    #[arg(long)]
    pub record: bool,

    /// Scenarios to run (default: all).
    #[arg(value_name = "NAME", value_parser = PossibleValuesParser::new(SCENARIOS))]
    pub names: Vec<String>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    match s.parse::<f64>() {
        Ok(secs) if secs > 0.0 && secs <= 3600.0 => Ok(Duration::from_secs_f64(secs)),
        _ => Err(format!("expected seconds in (0, 3600], not {s:?}")),
    }
}

/// The repository this suite was built from: its BENCHMARKS.md and its
/// commit are the ones a run speaks about.
fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_owned)
}

/// Runs the scenarios of `opts`, printing as it goes; `argv` is the command
/// line, for the header. Returns whether every scenario ran or skipped
/// cleanly (a failed one is reported in its section, and the others still run).
pub fn run(opts: Options, argv: &[String]) -> anyhow::Result<bool> {
    anyhow::ensure!(
        !opts.record || opts.runs >= 3,
        "--record needs --runs 3 or more: BENCHMARKS.md takes medians of at least 3 runs"
    );
    let mut names: Vec<&str> = if opts.names.is_empty() {
        SCENARIOS.to_vec()
    } else {
        opts.names.iter().map(String::as_str).collect()
    };
    // Asked twice, run once.
    let mut seen = Vec::new();
    names.retain(|n| {
        let first = !seen.contains(n);
        seen.push(*n);
        first
    });

    let here = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_owned))
        .unwrap_or_default();
    let switchyard = opts.switchyard.clone().unwrap_or_else(|| here.join("switchyard"));
    let baseline = here.join("switchyard-baseline");
    if names.iter().any(|n| scenarios::needs_servers(n)) {
        for (path, how) in [
            (
                &switchyard,
                "cargo build --release -p switchyard, or pass --switchyard PATH",
            ),
            (&baseline, "cargo build --release -p switchyard-bench"),
        ] {
            anyhow::ensure!(path.is_file(), "no {} (build it: {how})", path.display());
        }
    }
    // As switchyard-load does: two workers at most, so that on a small
    // machine the generator cannot take every core from the server.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let generator_threads = cores.min(2);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(generator_threads)
        .enable_all()
        .build()
        .context("cannot build the load generator's runtime")?;
    let ctx = Ctx {
        switchyard,
        baseline,
        runs: opts.runs,
        duration: opts.duration,
        runtime,
    };

    let epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (date, time) = utc(epoch);
    let mut block = header(&ctx, &names, argv, &date, &time, generator_threads);
    emit(&block);
    let mut clean = true;
    for name in &names {
        let section = match scenarios::run(name, &ctx) {
            Ok(Outcome::Done { title, body }) => format!("### {title}\n\n{}\n", body.trim_end()),
            Ok(Outcome::Skipped(why)) => format!("### {name}\n\nskipped: {why}\n"),
            Err(err) => {
                clean = false;
                eprintln!("suite: {name} failed: {err:#}");
                format!("### {name}\n\nfailed: {err:#}\n")
            }
        };
        emit(&format!("\n{section}"));
        block.push('\n');
        block.push_str(&section);
    }

    if opts.record {
        let file = repository().join("BENCHMARKS.md");
        if clean {
            record::record(&file, &block)?;
            eprintln!("suite: recorded in {}", file.display());
        } else {
            eprintln!("suite: not recorded in {}: a scenario failed", file.display());
        }
    }
    Ok(clean)
}

/// Prints a part of the block at once, so that a long run shows its tables
/// as they come.
fn emit(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(text.as_bytes());
    let _ = stdout.flush();
}

fn header(
    ctx: &Ctx,
    names: &[&str],
    argv: &[String],
    date: &str,
    time: &str,
    generator_threads: usize,
) -> String {
    let duration = ctx.duration.as_secs_f64();
    let mut lines = vec![
        format!("## {date} — suite: {}", names.join(", ")),
        String::new(),
        format!("- date: {date} {time} UTC"),
        format!(
            "- machine: {}; the load generator runs on the same cores",
            machine::machine()
        ),
        format!("- load average when the run started: {}", machine::load_average()),
        format!("- rustc: {}", machine::rustc()),
        format!("- commit: {}", machine::commit(&repository())),
        format!("- command: `{}`", shell_words(argv)),
    ];
    if names.iter().any(|n| scenarios::needs_servers(n)) {
        lines.extend([
            format!("- switchyard: `{}`", ctx.switchyard.display()),
            format!(
                "- baseline: `{}` (bench::baseline: hyper, one tokio worker per core), a process \
                 of its own, not inside the suite, whose CPU the load generator counts as its own",
                ctx.baseline.display()
            ),
            format!(
                "- load: bench::load in the suite's process, on a tokio runtime of its own with \
                 {generator_threads} workers; HTTP/1.1, closed loop, one connection per client; \
                 {WARMUP} s of warm-up, then {duration} s per step",
                WARMUP = scenarios::WARMUP_S
            ),
        ]);
    }
    lines.push(format!(
        "- rounds: {} per scenario, contenders alternating with the order flipped every round, \
         each on a fresh server; req/s as median (min–max), p50 and p99 as medians",
        ctx.runs
    ));
    let mut text = lines.join("\n");
    text.push('\n');
    text
}
