//! `switchyard-load`: the load generator of `switchyard bench URL` as a binary
//! of its own. Exit status: 0, 1 when the run cannot start, 2 when
//! `--fail-on-break` is set and a step broke the thresholds.

use clap::Parser;
use switchyard_bench::load::Options;

/// Steps concurrency against an HTTP server and reports, per step, req/s, latency
/// percentiles, errors and /ready, then where the server breaks and where it saturates.
#[derive(Parser)]
#[command(name = "switchyard-load", version)]
struct Cli {
    #[command(flatten)]
    options: Options,
}

fn main() -> std::process::ExitCode {
    switchyard_bench::load::main(Cli::parse().options)
}
