//! `switchyard-load`: the load generator of `switchyard bench URL` as a binary
//! of its own. Exit status: 0, 1 when the run cannot start, 2 when
//! `--fail-on-break` is set and a step broke the thresholds.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use switchyard_bench::load::{self, Options};

/// Steps concurrency against an HTTP server and reports, per step, req/s, latency
/// percentiles, errors and /ready, then where the server breaks and where it saturates.
#[derive(Parser)]
#[command(name = "switchyard-load", version)]
struct Cli {
    #[command(flatten)]
    options: Options,
}

fn main() -> anyhow::Result<ExitCode> {
    let options = Cli::parse().options;
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
    let report = runtime.block_on(load::run(options))?;
    if json {
        let mut stdout = std::io::stdout().lock();
        serde_json::to_writer_pretty(&mut stdout, &report)?;
        writeln!(stdout)?;
    } else {
        load::print_table(&report);
    }
    Ok(if fail_on_break && report.break_at.is_some() {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    })
}
