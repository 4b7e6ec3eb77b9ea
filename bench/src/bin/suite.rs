//! `switchyard-suite`: the scenario suite. Exit status: 0, 1 when a
//! scenario failed or the run could not start.

use std::process::ExitCode;

use clap::Parser;
use switchyard_bench::suite::{self, Options};

/// Runs scenarios against a real Switchyard group and the in-process hyper
/// baseline, alternating, and prints a markdown table per scenario.
#[derive(Parser)]
#[command(name = "switchyard-suite", version)]
struct Cli {
    #[command(flatten)]
    options: Options,
}

fn main() -> anyhow::Result<ExitCode> {
    let argv: Vec<String> = std::env::args().collect();
    let options = Cli::parse().options;
    Ok(if suite::run(options, &argv)? {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
