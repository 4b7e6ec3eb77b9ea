//! A JetStream cluster on loopback for the tests of the built-ins' JetStream
//! back ends: three `nats-server -js` processes routed to each other (or
//! one alone), each with its own store directory, killed and restarted on
//! the same ports; killed when dropped.

use std::io::{BufRead, BufReader};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use switchyard_client::{Client, ClientError};

use super::{Group, PATIENCE, scratch_dir};

/// One JetStream server of the cluster: its ports and store directory
/// stay the same across a kill and a restart.
pub struct Server {
    pub child: Option<Child>,
    pub name: String,
    pub port: u16,
    pub routes_port: u16,
    pub store: PathBuf,
    pub routes: String,
    pub cluster: String,
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Server {
    /// One JetStream server of its own (not clustered: buckets of one
    /// replica), its store under `dir`, started.
    pub fn alone(name: &str, dir: &std::path::Path) -> Server {
        let mut server = Server {
            child: None,
            name: format!("{name}-{}", std::process::id()),
            port: free_port(),
            routes_port: 0,
            store: dir.join("js"),
            routes: String::new(),
            cluster: String::new(),
        };
        server.spawn();
        server
    }

    pub fn spawn(&mut self) {
        let mut cmd = Command::new("nats-server");
        cmd.args(["-a", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-n", &self.name, "-js", "-sd"])
            .arg(&self.store);
        // No routes: a server of its own, not a cluster of one.
        if !self.routes.is_empty() {
            cmd.args(["--cluster_name", &self.cluster])
                .args(["--cluster", &format!("nats://127.0.0.1:{}", self.routes_port)])
                .args(["--routes", &self.routes]);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server is installed (apt-get install nats-server; .ci/run does)");
        self.child = Some(child);
        let deadline = Instant::now() + PATIENCE;
        loop {
            assert!(
                !matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(Some(_)))),
                "nats-server {} exited at start (port {} taken?)",
                self.name,
                self.port
            );
            if let Ok(stream) = TcpStream::connect(("127.0.0.1", self.port)) {
                let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                let mut line = String::new();
                if BufReader::new(stream).read_line(&mut line).is_ok() && line.starts_with("INFO") {
                    assert!(
                        line.contains("\"jetstream\":true"),
                        "this nats-server has no JetStream (needs nats-server 2.9 or later, run with -js); it said: {line}"
                    );
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "nats-server {} not ready within {PATIENCE:?}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Three servers routed to each other, each with its own store directory.
pub struct JsCluster {
    pub servers: Vec<Server>,
    _dir: tempfile::TempDir,
}

impl JsCluster {
    pub fn start(tag: &str) -> JsCluster {
        let dir = scratch_dir(tag);
        let cluster = format!("{tag}-{}", std::process::id());
        let routes_ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let routes = routes_ports
            .iter()
            .map(|p| format!("nats-route://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut servers: Vec<Server> = (0..3)
            .map(|i| Server {
                child: None,
                name: format!("{cluster}-{i}"),
                port: free_port(),
                routes_port: routes_ports[i],
                store: dir.path().join(format!("js{i}")),
                routes: routes.clone(),
                cluster: cluster.clone(),
            })
            .collect();
        for s in &mut servers {
            s.spawn();
        }
        JsCluster { servers, _dir: dir }
    }

    pub fn urls(&self) -> String {
        self.servers
            .iter()
            .map(|s| format!("\"{}\"", s.url()))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// `switchyard check` of the configuration `toml` (written under `dir`):
/// its exit code and stderr.
pub fn check_config(dir: &std::path::Path, toml: &str) -> (Option<i32>, String) {
    let path = dir.join("switchyard.toml");
    std::fs::write(&path, toml).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["check", "-c"])
        .arg(&path)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The WebSocket endpoint of `g`.
pub fn ws(g: &Group) -> String {
    format!("ws://{}/ws", g.addr)
}

/// The status of a client's call: 200 for an answer, the error's status.
pub fn status_of<T>(r: &Result<T, ClientError>) -> u16 {
    match r {
        Ok(_) => 200,
        Err(ClientError::Status { status, .. }) => *status,
        Err(e) => panic!("not an answer: {e}"),
    }
}

/// Stops `g` (SIGTERM, waited for) off the async runtime's threads.
pub async fn stop(g: Group) {
    tokio::task::spawn_blocking(move || drop(g)).await.unwrap();
}

/// What [`hammer`] counted: increments acknowledged, those whose outcome
/// is unknown (a 504, or the connection to a killed group lost with one in
/// flight), and the clients whose group went away.
#[derive(Debug, Default)]
pub struct Hammered {
    pub acked: u64,
    pub unknown: u64,
    pub lost_clients: u64,
}

impl Hammered {
    /// Acknowledged and unknown, where no group was expected to go away.
    pub fn counted(&self) -> (u64, u64) {
        assert_eq!(self.lost_clients, 0, "no group went away: {self:?}");
        (self.acked, self.unknown)
    }
}

/// Increments `key` `n` times from each of `clients` WebSocket clients of
/// each group, retrying what was refused (503: not applied). A client
/// whose connection is lost (its group killed) stops, its increment in
/// flight unknown.
pub async fn hammer(groups: &[&Group], key: &str, clients: usize, n: usize) -> Hammered {
    let urls: Vec<String> = groups.iter().map(|g| ws(g)).collect();
    hammer_urls(urls, key.to_owned(), clients, n).await
}

/// [`hammer`] on WebSocket endpoints, to run as a task of its own.
pub async fn hammer_urls(urls: Vec<String>, key: String, clients: usize, n: usize) -> Hammered {
    let acked = Arc::new(AtomicU64::new(0));
    let unknown = Arc::new(AtomicU64::new(0));
    let lost = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for url in &urls {
        for _ in 0..clients {
            let (url, key) = (url.clone(), key.clone());
            let (acked, unknown, lost) = (acked.clone(), unknown.clone(), lost.clone());
            tasks.push(tokio::spawn(async move {
                let Ok(client) = Client::connect(&url).await else {
                    // Its group was killed before this client connected.
                    lost.fetch_add(1, Ordering::Relaxed);
                    return;
                };
                let store = client.store();
                for _ in 0..n {
                    let deadline = Instant::now() + PATIENCE * 2;
                    loop {
                        let r = tokio::time::timeout(PATIENCE, store.increment(&key, 1))
                            .await
                            .expect("an increment is answered, never held");
                        match r {
                            Ok(_) => {
                                acked.fetch_add(1, Ordering::Relaxed);
                                break;
                            }
                            Err(ClientError::Status { status: 504, .. }) => {
                                unknown.fetch_add(1, Ordering::Relaxed);
                                break;
                            }
                            Err(ClientError::Status { status: 503, .. }) => {
                                assert!(Instant::now() < deadline, "the store did not come back");
                                tokio::time::sleep(Duration::from_millis(50)).await;
                            }
                            Err(ClientError::Status { status, problem }) => {
                                panic!("increment answered {status}: {problem}")
                            }
                            Err(_) => {
                                unknown.fetch_add(1, Ordering::Relaxed);
                                lost.fetch_add(1, Ordering::Relaxed);
                                return;
                            }
                        }
                    }
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    Hammered {
        acked: acked.load(Ordering::Relaxed),
        unknown: unknown.load(Ordering::Relaxed),
        lost_clients: lost.load(Ordering::Relaxed),
    }
}

/// The counter's value, once the store of `g` answers (503: not yet).
pub async fn counter(g: &Group, key: &str) -> i64 {
    let client = Client::connect(&ws(g)).await.unwrap();
    let store = client.store();
    eventually_async("the store answers", || async {
        let r = tokio::time::timeout(PATIENCE, store.get::<i64>(key))
            .await
            .expect("answered, not held");
        match r {
            Ok(v) => Ok(v.unwrap_or(0)),
            Err(ClientError::Status { status: 503, problem }) => Err(problem),
            Err(e) => panic!("reading `{key}`: {e}"),
        }
    })
    .await
}

/// [`eventually`] for an async check, bounded by PATIENCE.
pub async fn eventually_async<T, E: std::fmt::Debug, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let deadline = Instant::now() + PATIENCE;
    loop {
        let last = match check().await {
            Ok(v) => return v,
            Err(e) => e,
        };
        assert!(
            Instant::now() < deadline,
            "not within {PATIENCE:?}: {what}; last seen: {last:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
