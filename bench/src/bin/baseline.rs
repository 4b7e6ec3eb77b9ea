//! `switchyard-baseline`: the zero-hop baseline as a process of its own, so
//! that a load generator can measure it exactly as it measures `switchyard up`.

use std::io::Write;
use std::net::SocketAddr;

use anyhow::Context;
use clap::Parser;
use tokio::signal::unix::{SignalKind, signal};

/// The group's allocator (decision 0087): the comparison is between
/// architectures, not allocators.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// In-process hyper server answering the Switchyard demo routes.
#[derive(Parser)]
#[command(name = "switchyard-baseline", version)]
struct Cli {
    /// Listen address (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    bind: SocketAddr,
    /// Runtime worker threads (default: one per core).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    threads: Option<u16>,
    /// Serve HTTPS with this PEM certificate chain (with --tls-key).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
    /// Serve `/static/{name}` from this directory (to compare with a
    /// `[[static]]` mount of it).
    #[arg(long)]
    static_dir: Option<std::path::PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Some(dir) = cli.static_dir.clone() {
        switchyard_bench::baseline::set_static_dir(dir);
    }
    let threads = match cli.threads {
        Some(n) => usize::from(n),
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    // Multi-thread even with one worker: the Switchyard listener runs this
    // runtime flavour, and the comparison should differ only in the hops.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .context("cannot build the tokio runtime")?;
    let tls = match (&cli.tls_cert, &cli.tls_key) {
        (Some(cert), Some(key)) => Some(switchyard_bench::tls::server_config(cert, key)?),
        _ => None,
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(cli.bind)
            .await
            .with_context(|| format!("cannot bind {}", cli.bind))?;
        // Signal handlers go in before the readiness line, so that a SIGTERM
        // sent as soon as it is read is never fatal.
        let mut sigterm = signal(SignalKind::terminate())?;
        let mut sigint = signal(SignalKind::interrupt())?;
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "listening on {scheme}://{}", listener.local_addr()?)?;
        stdout.flush()?;
        drop(stdout);
        let shutdown = async move {
            tokio::select! {
                _ = sigterm.recv() => {}
                _ = sigint.recv() => {}
            }
        };
        switchyard_bench::baseline::serve_with(listener, tls, shutdown).await;
        Ok(())
    })
}
