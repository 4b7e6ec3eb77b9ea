//! Notification fan-out across groups, for BENCHMARKS.md: one WebSocket
//! client emits `bench.fanout` notifications into a group as fast as
//! `--in-flight` acknowledgements allow; a subscriber on each of the given
//! groups counts what reaches it (and any number seen twice).
//!
//! `cargo run --release -p switchyard-cluster --example fanout -- \
//!     --emit ws://A/ws --sub ws://A/ws --sub ws://B/ws -n 20000 --in-flight 64`
//!
//! The emitting group needs `[listener.ws] notify = true`.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use switchyard_client::Client;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut emit = None;
    let mut subs = Vec::new();
    let mut n = 20_000u64;
    let mut in_flight = 64usize;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args
            .next()
            .ok_or_else(|| anyhow::anyhow!("{arg} needs a value"))?;
        match arg.as_str() {
            "--emit" => emit = Some(value),
            "--sub" => subs.push(value),
            "-n" => n = value.parse()?,
            "--in-flight" => in_flight = value.parse()?,
            other => anyhow::bail!("unknown argument {other}"),
        }
    }
    let emit = emit.ok_or_else(|| anyhow::anyhow!("--emit URL is required"))?;
    let mut receivers = Vec::new();
    for url in &subs {
        let client = Client::connect(url).await?;
        let mut sub = client.subscribe("bench.fanout").await?;
        let url = url.clone();
        receivers.push(tokio::spawn(async move {
            let _client = client;
            let mut seen = HashSet::new();
            let mut dup = 0u64;
            let mut last = None;
            // Done at n, or when nothing has come for 5 s (losses).
            while (seen.len() as u64) < n {
                match tokio::time::timeout(Duration::from_secs(5), sub.next()).await {
                    Ok(Some(push)) => {
                        let i = push.data["i"].as_u64().unwrap_or(u64::MAX);
                        if !seen.insert(i) {
                            dup += 1;
                        }
                        last = Some(Instant::now());
                    }
                    _ => break,
                }
            }
            (url, seen.len() as u64, dup, last)
        }));
    }
    let emitter = Client::connect(&emit).await?;
    let started = Instant::now();
    let mut next = 0u64;
    let mut tasks = tokio::task::JoinSet::new();
    while next < n || !tasks.is_empty() {
        while next < n && tasks.len() < in_flight {
            let c = emitter.clone();
            let i = next;
            tasks.spawn(async move { c.notify("bench.fanout", &serde_json::json!({ "i": i })).await });
            next += 1;
        }
        if let Some(done) = tasks.join_next().await {
            done??;
        }
    }
    let sent = started.elapsed();
    println!(
        "emitted {n} in {:.3} s: {:.0}/s acknowledged",
        sent.as_secs_f64(),
        n as f64 / sent.as_secs_f64()
    );
    for r in receivers {
        let (url, got, dup, last) = r.await?;
        let took = last.map_or(Duration::ZERO, |l| l - started);
        println!(
            "{url}: received {got}/{n} ({dup} twice) in {:.3} s: {:.0}/s",
            took.as_secs_f64(),
            got as f64 / took.as_secs_f64().max(1e-9)
        );
    }
    Ok(())
}
