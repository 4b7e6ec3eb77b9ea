//! A JetStream cluster on loopback for the tests of the built-ins' JetStream
//! back ends: three `nats-server -js` processes routed to each other (or
//! one alone), each with its own store directory, killed and restarted on
//! the same ports; killed when dropped.

use std::io::{BufRead, BufReader};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{PATIENCE, scratch_dir};

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
