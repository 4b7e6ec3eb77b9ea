//! A real group for integration tests of a plugin: the `switchyard` binary
//! started on an ephemeral port with a private runtime directory, waited on
//! until it reports ready, stopped with SIGTERM when dropped.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A running group.
///
/// ```no_run
/// use switchyard_manager::testing::Group;
///
/// // `switchyard` is found through $SWITCHYARD_BIN, then $PATH.
/// let group = Group::start(std::path::Path::new("switchyard.toml")).unwrap();
/// let (status, body) = group.get("/my-plugin/hello/world").unwrap();
/// assert_eq!(status, 200, "{body}");
/// ```
pub struct Group {
    child: Child,
    /// Where the group listens.
    pub addr: SocketAddr,
    runtime_dir: PathBuf,
    /// Every line the group printed so far is collected here as it arrives.
    lines: mpsc::Receiver<String>,
}

impl Group {
    /// Starts `switchyard up -c config` and waits (at most 60 s) until it is ready.
    pub fn start(config: &Path) -> std::io::Result<Group> {
        let bin = std::env::var_os("SWITCHYARD_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| "switchyard".into());
        static STARTED: AtomicU32 = AtomicU32::new(0);
        let runtime_dir = std::env::temp_dir().join(format!(
            "switchyard-test-{}-{}",
            std::process::id(),
            STARTED.fetch_add(1, Ordering::Relaxed)
        ));
        let mut child = Command::new(&bin)
            .args(["up", "--bind", "127.0.0.1:0", "-c"])
            .arg(config)
            .arg("--runtime-dir")
            .arg(&runtime_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| std::io::Error::new(e.kind(), format!("cannot run {}: {e}", bin.display())))?;
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                eprintln!("group| {line}");
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) if line.contains("listening on http://") => {
                    let addr = line
                        .split("http://")
                        .nth(1)
                        .and_then(|rest| rest.split_whitespace().next())
                        .and_then(|a| a.parse().ok())
                        .ok_or_else(|| std::io::Error::other(format!("bad readiness line: {line}")))?;
                    return Ok(Group {
                        child,
                        addr,
                        runtime_dir,
                        lines,
                    });
                }
                Ok(_) => {}
                Err(_) => {
                    let _ = child.kill();
                    let status = child.wait()?;
                    return Err(std::io::Error::other(format!(
                        "the group did not become ready ({status})"
                    )));
                }
            }
        }
    }

    /// `GET path` → (status, body), on a fresh connection.
    pub fn get(&self, path: &str) -> std::io::Result<(u16, String)> {
        self.request("GET", path, "")
    }

    /// A request with a JSON body → (status, body).
    pub fn request(&self, method: &str, path: &str, json: &str) -> std::io::Result<(u16, String)> {
        let mut stream = TcpStream::connect(self.addr)?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        let content_type = if json.is_empty() {
            ""
        } else {
            "content-type: application/json\r\n"
        };
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\n{content_type}content-length: {}\r\n\r\n{json}",
            json.len()
        )?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw)?;
        let text = String::from_utf8_lossy(&raw);
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        Ok((status, body.to_owned()))
    }

    /// Lines printed since the last call (logs of every process).
    pub fn drain_lines(&self) -> Vec<String> {
        self.lines.try_iter().collect()
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.runtime_dir);
    }
}
