//! `switchyard-store-bench`: the built-in Store's operations per second
//! through the SDK from a manager, next to the same SQLite operations done
//! directly in this process, in the same run; then the memory of the store
//! and of the scheduler as keys and pending jobs grow.
//!
//! Through the SDK: a group (`switchyard up`, release build) whose `basics`
//! manager runs the demo's `POST /bench/store` — N operations by
//! `cx.store()`, C in flight — and reports the time it took inside the
//! manager. Directly: `rusqlite` on a database with the same pragmas, one
//! operation after the other on one thread (what a single process would do
//! without the Store). Increments under contention: two `basics` instances
//! at once on the same keys.
//!
//! ```sh
//! cargo build --release -p switchyard -p switchyard-bench
//! target/release/switchyard-store-bench --ops 20000 --concurrency 32
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use rusqlite::{Connection, OptionalExtension, params};
use switchyard_bench::group::spawn_ready;

#[derive(Parser)]
#[command(
    name = "switchyard-store-bench",
    about = "Store and Scheduler figures (BENCHMARKS.md)"
)]
struct Options {
    /// The `switchyard` binary (default: next to this one).
    #[arg(long)]
    switchyard: Option<PathBuf>,
    /// Operations per measurement.
    #[arg(long, default_value_t = 20_000)]
    ops: u64,
    /// Operations in flight at once from the manager.
    #[arg(long, default_value_t = 32)]
    concurrency: u32,
    /// Distinct keys the operations spread over.
    #[arg(long, default_value_t = 1000)]
    keys: u64,
    /// Writes measured with `fsync` durability (each costs an fsync).
    #[arg(long, default_value_t = 2_000)]
    fsync_ops: u64,
    /// Keys, then pending jobs, written for the memory figures (0: skip).
    #[arg(long, default_value_t = 1_000_000)]
    memory_rows: u64,
    /// Where the databases go (default: a fresh directory in /tmp).
    #[arg(long)]
    dir: Option<PathBuf>,
}

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
        std::env::temp_dir().join(format!("switchyard-store-bench-{}", std::process::id()))
    });
    std::fs::create_dir_all(&dir)?;
    println!(
        "# switchyard-store-bench: {} ops, {} in flight, {} keys",
        opts.ops, opts.concurrency, opts.keys
    );
    println!("# data in {} ({})", dir.display(), filesystem(&dir));
    println!();
    println!(
        "| operation | through the SDK from a manager (ops/s) | SQLite directly, one process (ops/s) | ratio |"
    );
    println!("|---|---|---|---|");

    let group = |durability: &str, instances: u32, tag: &str| -> anyhow::Result<Group> {
        let data = dir.join(format!("group-{tag}"));
        let config = format!(
            "[[managers]]\nname = \"store\"\nbuiltin = \"store\"\n[managers.config]\ndurability = \"{durability}\"\n\n\
             [[managers]]\nname = \"scheduler\"\nbuiltin = \"scheduler\"\n[managers.config]\ndurability = \"group\"\n\n\
             [[managers]]\nname = \"basics\"\ninstances = {instances}\n"
        );
        Group::start(&bin, &dir.join(format!("{tag}.toml")), &config, &data)
    };

    // get, set and incr with group commit; set with fsync.
    let g = group("group", 2, "group")?;
    let (ops, c, keys) = (opts.ops, opts.concurrency, opts.keys);
    let direct_dir = dir.join("direct-group");
    let mut direct = Direct::open(&direct_dir, "NORMAL")?;
    g.bench("set", keys, c, keys)?; // fill the keys
    direct.fill(keys)?;
    row("get", g.bench("get", ops, c, keys)?, direct.get(ops, keys)?);
    row(
        "set (`group`)",
        g.bench("set", ops, c, keys)?,
        direct.set(ops, keys)?,
    );
    row(
        "increment (1 instance)",
        g.bench("incr", ops, c, keys)?,
        direct.incr(ops, keys)?,
    );
    row(
        "increment, 2 instances on the same keys",
        g.bench_two("incr", ops / 2, c, keys)?,
        direct.incr(ops, keys)?,
    );
    drop(g);
    let g = group("fsync", 1, "fsync")?;
    let mut direct = Direct::open(&dir.join("direct-fsync"), "FULL")?;
    row(
        "set (`fsync`)",
        g.bench("set", opts.fsync_ops, c, keys)?,
        direct.set(opts.fsync_ops, keys)?,
    );
    row(
        "set (`fsync`), 1 in flight",
        g.bench("set", opts.fsync_ops / 4, 1, keys)?,
        direct.set(opts.fsync_ops / 4, keys)?,
    );
    drop(g);

    if opts.memory_rows > 0 {
        println!();
        println!(
            "| rows | store RSS (KiB) with this many keys | scheduler RSS (KiB) with this many pending jobs |"
        );
        println!("|---|---|---|");
        let g = group("group", 1, "memory")?;
        let (store, scheduler) = (g.pid_of("store")?, g.pid_of("scheduler")?);
        println!("| 0 | {} | {} |", rss_kib(store), rss_kib(scheduler));
        let mut done = 0;
        let mut step = (opts.memory_rows / 10).max(1);
        while done < opts.memory_rows {
            step = step.min(opts.memory_rows - done);
            // Keys `bench:done..done+step`, jobs likewise (far in the future).
            g.bench_from("set", done, step, 64, u64::MAX)?;
            g.bench_from("schedule", done, step, 64, u64::MAX)?;
            done += step;
            println!("| {done} | {} | {} |", rss_kib(store), rss_kib(scheduler));
        }
        drop(g);
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn row(op: &str, sdk: f64, direct: f64) {
    println!("| {op} | {sdk:.0} | {direct:.0} | {:.2} |", sdk / direct);
}

fn filesystem(dir: &Path) -> String {
    Command::new("df")
        .args(["--output=fstype"])
        .arg(dir)
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|t| t.lines().nth(1).map(|l| l.trim().to_owned()))
        .unwrap_or_else(|| "unknown fs".into())
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// A group under test.
struct Group {
    child: Child,
    addr: SocketAddr,
    runtime: PathBuf,
    bin: PathBuf,
}

impl Group {
    fn start(bin: &Path, config_path: &Path, config: &str, data: &Path) -> anyhow::Result<Group> {
        std::fs::write(config_path, config)?;
        let runtime = config_path.with_extension("run");
        let ready_file = config_path.with_extension("ready.json");
        let mut command = Command::new(bin);
        command
            .args(["up", "--bind", "127.0.0.1:0", "-c"])
            .arg(config_path)
            .arg("--runtime-dir")
            .arg(&runtime)
            .arg("--data-dir")
            .arg(data)
            .arg("--ready-file")
            .arg(&ready_file)
            .env("SWITCHYARD_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        let (child, addr) = spawn_ready(&mut command, &ready_file)?;
        Ok(Group {
            child,
            addr,
            runtime,
            bin: bin.to_owned(),
        })
    }

    fn pid_of(&self, name: &str) -> anyhow::Result<u32> {
        let out = Command::new(&self.bin)
            .args(["status", "--json", "--runtime-dir"])
            .arg(&self.runtime)
            .output()?;
        let status: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        status["processes"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["name"] == name))
            .and_then(|p| p["pid"].as_u64())
            .map(|p| p as u32)
            .with_context(|| format!("no process {name}"))
    }

    /// Runs `n` operations in `basics`; ops/s as the manager measured them.
    fn bench(&self, op: &str, n: u64, concurrency: u32, keys: u64) -> anyhow::Result<f64> {
        let (ops, us) = post_bench(self.addr, op, 0, n, concurrency, keys)?;
        Ok(ops as f64 / (us as f64 / 1e6))
    }

    fn bench_from(&self, op: &str, from: u64, n: u64, concurrency: u32, keys: u64) -> anyhow::Result<()> {
        post_bench(self.addr, op, from, n, concurrency, keys).map(drop)
    }

    /// Two requests at once: the router gives them to the two instances.
    fn bench_two(&self, op: &str, n: u64, concurrency: u32, keys: u64) -> anyhow::Result<f64> {
        let addr = self.addr;
        let started = Instant::now();
        let op2 = op.to_owned();
        let other = std::thread::spawn(move || post_bench(addr, &op2, 0, n, concurrency, keys));
        let (a, _) = post_bench(addr, op, 0, n, concurrency, keys)?;
        let (b, _) = other
            .join()
            .map_err(|_| anyhow::anyhow!("bench thread panicked"))??;
        Ok((a + b) as f64 / started.elapsed().as_secs_f64())
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

/// `POST /bench/store`; (ops, µs). Keys are `bench:{(from + i) % keys}`.
fn post_bench(
    addr: SocketAddr,
    op: &str,
    from: u64,
    n: u64,
    concurrency: u32,
    keys: u64,
) -> anyhow::Result<(u64, u64)> {
    use std::io::{Read, Write};
    let body = serde_json::json!({"op": op, "n": n, "concurrency": concurrency, "keys": keys, "from": from})
        .to_string();
    let mut stream = std::net::TcpStream::connect(addr)?;
    write!(
        stream,
        "POST /bench/store HTTP/1.1\r\nhost: bench\r\nconnection: close\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw)?;
    let (head, body) = raw.split_once("\r\n\r\n").context("no response")?;
    if !head.starts_with("HTTP/1.1 200") {
        bail!("{op}: {head}\n{body}");
    }
    let v: serde_json::Value = serde_json::from_str(body)?;
    Ok((
        v["ops"].as_u64().unwrap_or(0),
        v["elapsed_us"].as_u64().unwrap_or(1).max(1),
    ))
}

/// The same operations on SQLite directly: the store's table and pragmas.
struct Direct {
    conn: Connection,
    version: u64,
}

impl Direct {
    fn open(dir: &Path, synchronous: &str) -> anyhow::Result<Direct> {
        std::fs::create_dir_all(dir)?;
        let conn = Connection::open(dir.join("direct.db"))?;
        conn.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))?;
        conn.execute_batch(&format!(
            "PRAGMA synchronous = {synchronous};
             PRAGMA cache_size = -8192;
             CREATE TABLE IF NOT EXISTS kv (key BLOB PRIMARY KEY, value BLOB NOT NULL,
               version INTEGER NOT NULL, expires_ms INTEGER) WITHOUT ROWID;"
        ))?;
        Ok(Direct { conn, version: 0 })
    }

    fn write(&mut self, key: &str, value: &str) -> anyhow::Result<()> {
        self.version += 1;
        self.conn
            .prepare_cached(
                "INSERT INTO kv(key, value, version, expires_ms) VALUES (?1, ?2, ?3, NULL)
                 ON CONFLICT(key) DO UPDATE SET value = excluded.value, version = excluded.version",
            )?
            .execute(params![key.as_bytes(), value.as_bytes(), self.version as i64])?;
        Ok(())
    }

    fn read(&mut self, key: &str) -> anyhow::Result<Option<Vec<u8>>> {
        Ok(self
            .conn
            .prepare_cached("SELECT value, version, expires_ms FROM kv WHERE key = ?1")?
            .query_row([key.as_bytes()], |r| r.get(0))
            .optional()?)
    }

    fn fill(&mut self, keys: u64) -> anyhow::Result<()> {
        self.conn.execute_batch("BEGIN")?;
        for i in 0..keys {
            self.write(&format!("bench:{i}"), &i.to_string())?;
        }
        self.conn.execute_batch("COMMIT")?;
        Ok(())
    }

    fn timed(n: u64, mut f: impl FnMut(u64) -> anyhow::Result<()>) -> anyhow::Result<f64> {
        let started = Instant::now();
        for i in 0..n {
            f(i)?;
        }
        Ok(n as f64 / started.elapsed().max(Duration::from_nanos(1)).as_secs_f64())
    }

    fn get(&mut self, n: u64, keys: u64) -> anyhow::Result<f64> {
        Self::timed(n, |i| self.read(&format!("bench:{}", i % keys)).map(drop))
    }

    fn set(&mut self, n: u64, keys: u64) -> anyhow::Result<f64> {
        Self::timed(n, |i| self.write(&format!("bench:{}", i % keys), &i.to_string()))
    }

    fn incr(&mut self, n: u64, keys: u64) -> anyhow::Result<f64> {
        Self::timed(n, |i| {
            let key = format!("bench:{}", i % keys);
            let old: i64 = self
                .read(&key)?
                .and_then(|v| String::from_utf8(v).ok()?.parse().ok())
                .unwrap_or(0);
            self.write(&key, &(old + 1).to_string())
        })
    }
}
