//! `switchyard-roundtrips`: closed-loop request/response round trips per
//! second over WebSocket and gRPC unary (through `switchyard-client`, one
//! connection per client) against a running group, next to gRPC unary
//! against the in-process baseline (`switchyard_bench::baseline`, hyper and
//! tonic answering the same call itself: the zero-hop baseline), rounds
//! alternating. `switchyard-suite ws grpc` runs the same comparison on fresh
//! servers with latencies.
//!
//! ```text
//! switchyard-roundtrips http://127.0.0.1:8080 [--clients 1,8,32] [--duration 4] [--runs 3]
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;

#[derive(Parser)]
#[command(name = "switchyard-roundtrips")]
struct Cli {
    /// The running group, e.g. http://127.0.0.1:8080.
    url: String,
    /// Concurrent clients per step.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    clients: Vec<usize>,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 4.0)]
    duration: f64,
    /// Rounds (median and min-max reported).
    #[arg(long, default_value_t = 3)]
    runs: usize,
}

/// Serves the baseline (`switchyard_bench::baseline`, which answers
/// `demo.Noop` over gRPC and WebSocket in-process) on its own runtime thread;
/// returns its URL.
fn start_baseline() -> anyhow::Result<String> {
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    std_listener.set_nonblocking(true)?;
    let url = format!("http://{}", std_listener.local_addr()?);
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(std_listener).expect("listener");
            switchyard_bench::baseline::serve(listener, std::future::pending()).await;
        });
    });
    Ok(url)
}

#[derive(Clone, Copy, Debug)]
enum Transport {
    Ws,
    Grpc,
    /// gRPC bidi: calls on one `Session` stream per client.
    GrpcSession,
}

/// One connection of either transport, with the same call.
enum Client {
    Ws(switchyard_client::Client),
    // Boxed: the client (with its credential) is far larger than the others.
    Grpc(Box<switchyard_client::GrpcClient>),
    Session(switchyard_client::GrpcSession),
}

impl Client {
    async fn connect(transport: Transport, url: &str) -> anyhow::Result<Client> {
        Ok(match transport {
            Transport::Ws => {
                let ws_url = format!("{}/ws", url.replacen("http://", "ws://", 1));
                Client::Ws(
                    switchyard_client::Client::connect(&ws_url)
                        .await
                        .context("websocket connect")?,
                )
            }
            Transport::Grpc => Client::Grpc(Box::new(
                switchyard_client::GrpcClient::connect(url)
                    .await
                    .context("grpc connect")?,
            )),
            Transport::GrpcSession => Client::Session(
                switchyard_client::GrpcClient::connect(url)
                    .await
                    .context("grpc connect")?
                    .session()
                    .await
                    .context("session")?,
            ),
        })
    }

    /// One `demo.Noop` round trip.
    async fn noop(&self) -> anyhow::Result<()> {
        let empty = serde_json::json!({});
        let _: serde_json::Value = match self {
            Client::Ws(c) => c.call("demo.Noop", &empty).await,
            Client::Grpc(c) => c.call("demo.Noop", &empty).await,
            Client::Session(c) => c.call("demo.Noop", &empty).await,
        }
        .map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(())
    }
}

/// Round trips per second with `clients` connections for `duration`.
async fn measure(transport: Transport, url: &str, clients: usize, duration: Duration) -> anyhow::Result<f64> {
    let done = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (done, count) = (done.clone(), count.clone());
        let client = Client::connect(transport, url).await?;
        tasks.push(tokio::spawn(async move {
            while !done.load(Ordering::Relaxed) {
                client.noop().await?;
                count.fetch_add(1, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    // Warm-up, then count.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let start_count = count.load(Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(duration).await;
    let done_count = count.load(Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    done.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await??;
    }
    Ok((done_count - start_count) as f64 / elapsed)
}

fn summary(mut xs: Vec<f64>) -> String {
    xs.sort_by(f64::total_cmp);
    let median = xs[xs.len() / 2];
    format!("{median:.0} ({:.0}–{:.0})", xs[0], xs[xs.len() - 1])
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let baseline = start_baseline()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let duration = Duration::from_secs_f64(cli.duration);
    println!(
        "| clients | WebSocket rt/s | gRPC unary rt/s | gRPC bidi (Session) rt/s | baseline gRPC unary rt/s (in-process tonic) | gRPC unary / baseline |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    for &clients in &cli.clients {
        let (mut ws, mut grpc, mut bidi, mut base) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for run in 0..cli.runs {
            eprintln!(
                "switchyard-roundtrips: {clients} clients, round {}/{}",
                run + 1,
                cli.runs
            );
            runtime.block_on(async {
                // Flip the order every round so drift hits both sides.
                if run % 2 == 0 {
                    base.push(measure(Transport::Grpc, &baseline, clients, duration).await?);
                    grpc.push(measure(Transport::Grpc, &cli.url, clients, duration).await?);
                    bidi.push(measure(Transport::GrpcSession, &cli.url, clients, duration).await?);
                    ws.push(measure(Transport::Ws, &cli.url, clients, duration).await?);
                } else {
                    ws.push(measure(Transport::Ws, &cli.url, clients, duration).await?);
                    bidi.push(measure(Transport::GrpcSession, &cli.url, clients, duration).await?);
                    grpc.push(measure(Transport::Grpc, &cli.url, clients, duration).await?);
                    base.push(measure(Transport::Grpc, &baseline, clients, duration).await?);
                }
                anyhow::Ok(())
            })?;
        }
        let ratio = {
            let mut g = grpc.clone();
            let mut b = base.clone();
            g.sort_by(f64::total_cmp);
            b.sort_by(f64::total_cmp);
            g[g.len() / 2] / b[b.len() / 2]
        };
        println!(
            "| {clients} | {} | {} | {} | {} | {ratio:.2} |",
            summary(ws),
            summary(grpc),
            summary(bidi),
            summary(base)
        );
    }
    Ok(())
}
