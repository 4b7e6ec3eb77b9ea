//! A real group for integration tests of a plugin: the `switchyard` binary
//! started on an ephemeral port with a private runtime directory, waited on
//! until it reports ready, stopped with SIGTERM when dropped.
//!
//! [`Group::start_crate`] builds the plugin crate under test first (in the
//! test's own profile) and serves that build, so an edited handler is what
//! answers; [`Group::start`] serves a configuration as it is.

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
/// use switchyard_manager_host::testing::Group;
///
/// // Builds this crate's plugin, then serves its switchyard.toml with it.
/// // `switchyard` is found through $SWITCHYARD_BIN, then $PATH.
/// let group = Group::start_crate(env!("CARGO_MANIFEST_DIR")).unwrap();
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

/// The `switchyard` binary: `$SWITCHYARD_BIN`, else the first on `$PATH`.
fn switchyard_bin() -> std::io::Result<PathBuf> {
    if let Some(bin) = std::env::var_os("SWITCHYARD_BIN") {
        return Ok(PathBuf::from(bin));
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("switchyard"))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "cannot find the `switchyard` binary: install it with `cargo install --path <switchyard checkout>` \
                 (it goes to ~/.cargo/bin, which must be on PATH), or set SWITCHYARD_BIN to its path",
            )
        })
}

/// The cargo profile the running test was built in (`target/<dir>/deps/`),
/// so the plugin is built the same way.
fn test_profile() -> String {
    let dir = std::env::current_exe().ok().and_then(|exe| {
        Some(
            exe.parent()?
                .parent()?
                .file_name()?
                .to_string_lossy()
                .into_owned(),
        )
    });
    match dir.as_deref() {
        None | Some("debug") => "dev".to_owned(),
        Some(other) => other.to_owned(),
    }
}

/// Builds the library of the crate at `manifest_dir` and returns the
/// plugin file cargo made (`lib<name>.so`).
fn build_plugin(manifest_dir: &Path) -> std::io::Result<PathBuf> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .args(["build", "--lib", "--message-format=json", "--profile"])
        .arg(test_profile())
        .arg("--manifest-path")
        .arg(manifest_dir.join("Cargo.toml"))
        .stderr(Stdio::inherit())
        .output()?;
    if !output.status.success() {
        return Err(std::io::Error::other(format!(
            "building the plugin in {} failed ({})",
            manifest_dir.display(),
            output.status
        )));
    }
    // The last cdylib artifact cargo reports is this crate's own library.
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .rev()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|message| {
            message["reason"] == "compiler-artifact"
                && message["target"]["kind"]
                    .as_array()
                    .is_some_and(|kinds| kinds.iter().any(|k| k == "cdylib"))
        })
        .find_map(|message| {
            message["filenames"]
                .as_array()?
                .iter()
                .filter_map(|f| f.as_str())
                .find(|f| f.ends_with(".so"))
                .map(PathBuf::from)
        })
        .ok_or_else(|| {
            std::io::Error::other(format!(
                "{} builds no plugin: its [lib] needs crate-type = [\"cdylib\", \"rlib\"]",
                manifest_dir.display()
            ))
        })
}

impl Group {
    /// Builds the plugin crate at `manifest_dir` (pass
    /// `env!("CARGO_MANIFEST_DIR")`) in the test's profile, then starts its
    /// `switchyard.toml` with every manager whose plugin is this crate's
    /// library (`lib<name>.so`, wherever the file says it is) served from
    /// that fresh build.
    pub fn start_crate(manifest_dir: impl AsRef<Path>) -> std::io::Result<Group> {
        let dir = manifest_dir.as_ref();
        let built = build_plugin(dir)?;
        let file_name = built.file_name().map(|n| n.to_owned());
        let config_path = dir.join("switchyard.toml");
        let text = std::fs::read_to_string(&config_path).map_err(|e| {
            std::io::Error::new(e.kind(), format!("cannot read {}: {e}", config_path.display()))
        })?;
        // Line by line, so that the rest of the file (comments, order,
        // relative paths) stays as it is.
        let rewritten: Vec<String> = text
            .lines()
            .map(|line| {
                let key = line.trim_start();
                let points_here = key.starts_with("plugin")
                    && key["plugin".len()..].trim_start().starts_with('=')
                    && file_name
                        .as_ref()
                        .is_some_and(|name| line.contains(&*name.to_string_lossy()));
                if points_here {
                    format!("plugin = {:?}", built.display().to_string())
                } else {
                    line.to_owned()
                }
            })
            .collect();
        // Next to the original, so its relative paths still resolve.
        let copy = dir.join(format!(".switchyard-test-{}.toml", std::process::id()));
        std::fs::write(&copy, rewritten.join("\n"))?;
        let started = Group::start(&copy);
        let _ = std::fs::remove_file(&copy);
        started
    }

    /// Starts `switchyard up -c config` and waits (at most 60 s) until it is ready.
    pub fn start(config: &Path) -> std::io::Result<Group> {
        let bin = switchyard_bin()?;
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

    /// The group's private runtime directory (for `switchyard status
    /// --runtime-dir`).
    pub fn runtime_dir(&self) -> &Path {
        &self.runtime_dir
    }

    /// Lines printed since the last call (logs of every process).
    pub fn drain_lines(&self) -> Vec<String> {
        self.lines.try_iter().collect()
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(15);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.runtime_dir);
    }
}
