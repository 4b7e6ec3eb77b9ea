//! `switchyard-ws-idle`: what an idle WebSocket connection costs a listener.
//! Opens N connections to a running group's `/ws`, lets them sit, and
//! reports the listener's resident memory before, with them open (per
//! connection), and after they closed. The listener's pid comes from the
//! caller (`switchyard status --json`; `bench/run_ws_idle.sh` does it all).
//!
//! ```text
//! switchyard-ws-idle ws://127.0.0.1:8080/ws --pid PID [--connections 5000] [--settle 3]
//! ```

use std::time::Duration;

use anyhow::Context;
use clap::Parser;

#[derive(Parser)]
#[command(name = "switchyard-ws-idle")]
struct Cli {
    /// The WebSocket URL, e.g. ws://127.0.0.1:8080/ws.
    url: String,
    /// The listener process to measure.
    #[arg(long)]
    pid: u32,
    /// Idle connections to open.
    #[arg(long, default_value_t = 5000)]
    connections: usize,
    /// Seconds to let the listener settle before each reading.
    #[arg(long, default_value_t = 3.0)]
    settle: f64,
}

/// Resident memory of `pid`, in KiB.
fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).context("read the listener's status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS")
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // One descriptor per connection here too.
    switchyard_proto::accept::raise_nofile_limit()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(measure(cli))
}

async fn measure(cli: Cli) -> anyhow::Result<()> {
    let settle = Duration::from_secs_f64(cli.settle);
    tokio::time::sleep(settle).await;
    let before = rss_kib(cli.pid)?;
    let mut open = Vec::with_capacity(cli.connections);
    // In batches, so that the listener's backlog never overflows.
    for batch in (0..cli.connections).collect::<Vec<_>>().chunks(200) {
        let connects = batch
            .iter()
            .map(|_| tokio_tungstenite::connect_async(cli.url.as_str()));
        for connected in futures_util::future::join_all(connects).await {
            open.push(connected.context("connect")?.0);
        }
    }
    tokio::time::sleep(settle).await;
    let with = rss_kib(cli.pid)?;
    let n = open.len();
    drop(open);
    tokio::time::sleep(settle).await;
    let after = rss_kib(cli.pid)?;
    let per = (with.saturating_sub(before)) as f64 / n as f64;
    println!(
        "| idle connections | listener RSS before | with them open | per connection | after they closed |"
    );
    println!("|---:|---:|---:|---:|---:|");
    println!(
        "| {n} | {:.1} MiB | {:.1} MiB | {per:.1} KiB | {:.1} MiB |",
        before as f64 / 1024.0,
        with as f64 / 1024.0,
        after as f64 / 1024.0
    );
    Ok(())
}
