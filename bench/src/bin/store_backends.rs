//! `switchyard-store-backends`: the built-in Store's operations on its two
//! back ends side by side — SQLite in the group's data directory, and a
//! JetStream bucket on one `nats-server` (replicas 1) and on three
//! clustered on loopback (replicas 3) — as WebSocket clients see them:
//! latency (p50, p99) and throughput of get, set, increment and
//! compare-and-set, from 1 and from 16 clients at once.
//!
//! Every client works on a key of its own (`bench:<n>`), so the figures are
//! the back end's cost, not contention's: one operation after another per
//! client, each waited for. The same group configuration on each back end
//! but `[cluster]`.
//!
//! ```sh
//! cargo build --profile perf -p switchyard -p switchyard-bench
//! target/perf/switchyard-store-backends --ops 2000
//! ```

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use hdrhistogram::Histogram;
use switchyard_bench::group::spawn_ready;
use switchyard_client::Client;

#[derive(Parser)]
#[command(
    name = "switchyard-store-backends",
    about = "Store latency and throughput on SQLite and JetStream (BENCHMARKS.md)"
)]
struct Options {
    /// The `switchyard` binary (default: next to this one).
    #[arg(long)]
    switchyard: Option<PathBuf>,
    /// Operations per client per measurement.
    #[arg(long, default_value_t = 2000)]
    ops: u64,
    /// Client counts measured.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 16])]
    clients: Vec<u64>,
    /// Back ends measured: sqlite (`fsync`: each write on disk before its
    /// answer), sqlite-group (`group` durability), js1 (one server), js3
    /// (three, replicas 3).
    #[arg(long, value_delimiter = ',', default_values_t = ["sqlite".to_owned(), "sqlite-group".to_owned(), "js1".to_owned(), "js3".to_owned()])]
    backends: Vec<String>,
    /// Where the databases and the servers' stores go (default: a fresh
    /// directory in /tmp).
    #[arg(long)]
    dir: Option<PathBuf>,
}

const OPS: [&str; 4] = ["get", "set", "increment", "cas"];

fn main() -> anyhow::Result<()> {
    let opts = Options::parse();
    let bin = match &opts.switchyard {
        Some(b) => b.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("no directory")?
            .join("switchyard"),
    };
    let dir = opts.dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("switchyard-store-backends-{}", std::process::id()))
    });
    std::fs::create_dir_all(&dir)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    println!(
        "# switchyard-store-backends: {} ops per client, clients {:?}",
        opts.ops, opts.clients
    );
    println!();
    println!("| back end | operation | clients | ops/s | p50 (µs) | p99 (µs) |");
    println!("|---|---|---|---|---|---|");
    for backend in &opts.backends {
        let work = dir.join(backend);
        std::fs::create_dir_all(&work)?;
        let (servers, cluster) = match backend.as_str() {
            "sqlite" | "sqlite-group" => (Vec::new(), String::new()),
            "js1" | "js3" => {
                let n = if backend == "js1" { 1 } else { 3 };
                let servers = Nats::cluster(&work, n)?;
                let urls: Vec<String> = servers.iter().map(|s| format!("\"{}\"", s.url())).collect();
                let cluster = format!(
                    "[cluster]\nnats = [{}]\nname = \"bench-{backend}-{}\"\n",
                    urls.join(", "),
                    std::process::id()
                );
                (servers, cluster)
            }
            other => bail!("unknown back end `{other}` (sqlite, sqlite-group, js1, js3)"),
        };
        let replicas = if backend == "js3" { 3 } else { 1 };
        let durability = if backend == "sqlite-group" {
            "group"
        } else {
            "fsync"
        };
        let config = format!(
            "[auth]\nexpose = [\"store.*\"]\n{cluster}\
             [[managers]]\nname = \"store\"\nbuiltin = \"store\"\n[managers.config]\nreplicas = {replicas}\n\
             durability = \"{durability}\"\n"
        );
        let group = Group::start(&bin, &work, &config)?;
        let url = format!("ws://{}/ws", group.addr);
        rt.block_on(until_served(&url))?;
        for &clients in &opts.clients {
            for op in OPS {
                let (rate, hist) = rt.block_on(measure(&url, op, clients, opts.ops))?;
                println!(
                    "| {backend} | {op} | {clients} | {rate:.0} | {} | {} |",
                    hist.value_at_quantile(0.5),
                    hist.value_at_quantile(0.99)
                );
            }
        }
        drop(group);
        drop(servers);
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Waits until the group's Store answers (JetStream: its bucket is open).
async fn until_served(url: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(client) = Client::connect(url).await
            && client.store().get::<i64>("bench:ready").await.is_ok()
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the store did not answer within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `clients` clients, each doing `ops` operations `op` one after another
/// on its own key: (operations per second, latency histogram in µs).
async fn measure(url: &str, op: &str, clients: u64, ops: u64) -> anyhow::Result<(f64, Histogram<u64>)> {
    let mut connected = Vec::new();
    for n in 0..clients {
        let client = Client::connect(url).await?;
        let key = format!("bench:{n}");
        // Each key exists and holds an integer before any operation.
        client.store().set(&key, &0, None).await?;
        connected.push((client, key));
    }
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (client, key) in connected {
        let op = op.to_owned();
        tasks.push(tokio::spawn(async move {
            let store = client.store();
            let mut hist = Histogram::<u64>::new(3)?;
            let mut version = store.entry(&key).await?.version;
            for i in 0..ops {
                let t = Instant::now();
                match op.as_str() {
                    "get" => drop(store.get::<i64>(&key).await?),
                    "set" => drop(store.set(&key, &(i as i64), None).await?),
                    "increment" => drop(store.increment(&key, 1).await?),
                    "cas" => {
                        let swapped = store.compare_and_set(&key, version, &(i as i64)).await?;
                        anyhow::ensure!(swapped.swapped, "a compare-and-set on a key of one's own failed");
                        version = swapped.version;
                    }
                    other => bail!("unknown operation {other}"),
                }
                hist.record(t.elapsed().as_micros() as u64)?;
            }
            anyhow::Ok(hist)
        }));
    }
    let mut all = Histogram::<u64>::new(3)?;
    for task in tasks {
        all.add(task.await??)?;
    }
    let rate = (clients * ops) as f64 / started.elapsed().as_secs_f64();
    Ok((rate, all))
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// One `nats-server -js` of the bench, killed when dropped.
struct Nats {
    child: Child,
    port: u16,
}

impl Nats {
    /// `n` servers routed to each other (one alone for `n = 1`).
    fn cluster(dir: &Path, n: usize) -> anyhow::Result<Vec<Nats>> {
        let routes_ports: Vec<u16> = (0..n).map(|_| free_port()).collect::<anyhow::Result<_>>()?;
        let routes = routes_ports
            .iter()
            .map(|p| format!("nats-route://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut servers = Vec::new();
        for (i, routes_port) in routes_ports.iter().enumerate() {
            let port = free_port()?;
            let mut cmd = Command::new("nats-server");
            cmd.args(["-a", "127.0.0.1", "-p", &port.to_string()])
                .args(["-n", &format!("bench-{i}"), "-js", "-sd"])
                .arg(dir.join(format!("js{i}")));
            if n > 1 {
                cmd.args(["--cluster_name", "bench"])
                    .args(["--cluster", &format!("nats://127.0.0.1:{routes_port}")])
                    .args(["--routes", &routes]);
            }
            let child = cmd
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("nats-server is installed (apt-get install nats-server)")?;
            servers.push(Nats { child, port });
        }
        for s in &servers {
            s.ready()?;
        }
        Ok(servers)
    }

    fn ready(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(stream) = TcpStream::connect(("127.0.0.1", self.port)) {
                stream.set_read_timeout(Some(Duration::from_secs(5)))?;
                let mut line = String::new();
                if BufReader::new(stream).read_line(&mut line).is_ok() && line.starts_with("INFO") {
                    if !line.contains("\"jetstream\":true") {
                        bail!("this nats-server has no JetStream (needs 2.9 or later): {line}");
                    }
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                bail!("nats-server on port {} not ready within 30 s", self.port);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A group under test, stopped when dropped.
struct Group {
    child: Child,
    addr: SocketAddr,
}

impl Group {
    fn start(bin: &Path, dir: &Path, config: &str) -> anyhow::Result<Group> {
        let config_path = dir.join("switchyard.toml");
        std::fs::write(&config_path, config)?;
        let ready_file = dir.join("ready.json");
        let mut command = Command::new(bin);
        command
            .args(["up", "--bind", "127.0.0.1:0", "-c"])
            .arg(&config_path)
            .arg("--runtime-dir")
            .arg(dir.join("run"))
            .arg("--data-dir")
            .arg(dir.join("data"))
            .arg("--ready-file")
            .arg(&ready_file)
            .env("SWITCHYARD_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        let (child, addr) = spawn_ready(&mut command, &ready_file)?;
        Ok(Group { child, addr })
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}
