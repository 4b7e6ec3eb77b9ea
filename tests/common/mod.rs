//! Test harness: starts a real group (the `switchyard` binary under its
//! supervisor) on an ephemeral port with a private runtime dir, waits until
//! it reports ready (its `--ready-file`, decision 0150), and tears
//! everything down on drop.

#![allow(dead_code, unreachable_pub)]

use std::fmt::Debug;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub mod grpc;
pub mod h2_stream;
pub mod jetstream;
pub mod load;
pub mod postgres;
pub mod quic;
pub mod raw_codec;

pub use nix::sys::signal::Signal;
use nix::unistd::Pid;
pub use switchyard_manager_host::testing::Ready;
use switchyard_manager_host::testing::wait_ready;
use tempfile::TempDir;

/// How long any wait in a test may take before it counts as a failure. Not a
/// performance threshold: a generous bound so a broken build fails instead
/// of hanging the suite.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Longest pause between two checks of [`eventually`].
const MAX_POLL_PAUSE: Duration = Duration::from_millis(50);

/// Checks until `check` returns `Ok`, and returns its value. Panics when
/// `patience` runs out, naming `what` (the condition awaited) and the last
/// `Err` (what `check` saw instead). The pause between checks grows from
/// 5 ms to [`MAX_POLL_PAUSE`], so a quick condition is seen at once and a
/// slow one is not polled hot.
#[track_caller]
pub fn eventually<T, E: Debug>(what: &str, patience: Duration, check: impl FnMut() -> Result<T, E>) -> T {
    poll(patience, check)
        .unwrap_or_else(|last| panic!("not within {patience:?}: {what}; last seen: {last:?}"))
}

/// [`eventually`] without the panic: the last `Err` when patience runs out.
fn poll<T, E>(patience: Duration, mut check: impl FnMut() -> Result<T, E>) -> Result<T, E> {
    let deadline = Instant::now() + patience;
    let mut pause = Duration::from_millis(5);
    loop {
        let last = match check() {
            Ok(value) => return Ok(value),
            Err(last) => last,
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(last);
        }
        std::thread::sleep(pause.min(left));
        pause = (pause * 2).min(MAX_POLL_PAUSE);
    }
}

/// Builds the plugin crate `package` (same profile as the binary under test)
/// and returns its shared library. Cheap when it is up to date.
pub fn plugin(package: &str) -> PathBuf {
    static BUILD: Mutex<()> = Mutex::new(());
    let _one_at_a_time = BUILD.lock().unwrap_or_else(|p| p.into_inner());
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_switchyard"));
    let profile_dir = bin.parent().unwrap().to_path_buf();
    let release = profile_dir.file_name().is_some_and(|n| n == "release");
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args(["build", "--quiet", "-p", package])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if release {
        cmd.arg("--release");
    }
    let status = cmd.status().expect("run cargo build");
    assert!(status.success(), "building {package} failed");
    let path = profile_dir.join(format!("lib{}.so", package.replace('-', "_")));
    assert!(path.exists(), "{} was not built", path.display());
    path
}

/// A fresh directory of this user's (mode 0700), removed with what it holds
/// when dropped.
pub fn scratch_dir(tag: &str) -> TempDir {
    tempfile::Builder::new()
        .prefix(&format!("switchyard-{tag}-"))
        .tempdir()
        .expect("create a scratch directory")
}

pub struct Group {
    child: Option<Child>,
    pub addr: SocketAddr,
    /// What the group wrote to its `--ready-file` once it served.
    pub ready: Ready,
    /// `<scratch>/ready.json`, removed by the supervisor when it exits.
    pub ready_file: PathBuf,
    /// `<scratch>/rt`, made and removed by the supervisor.
    pub runtime_dir: PathBuf,
    /// The runtime dir is the test's own (`GroupBuilder::runtime_dir`): not
    /// removed on drop.
    lines: Arc<Mutex<Vec<String>>>,
    line_events: mpsc::Receiver<String>,
    /// Holds the runtime dir and the configuration file; removed after the
    /// group has stopped (fields drop after `Drop::drop`).
    scratch: TempDir,
}

pub struct GroupBuilder {
    /// The built-in Store's and Scheduler's data directory (default: a
    /// fresh one per group, removed with it).
    data_dir: Option<PathBuf>,
    config: Option<String>,
    config_file: Option<PathBuf>,
    tag: &'static str,
    env: Vec<(String, String)>,
    runtime_dir: Option<PathBuf>,
    /// More arguments for `switchyard up`.
    args: Vec<String>,
    /// Run the group as this user (uid = gid), not the test's.
    user: Option<u32>,
    /// The command that runs the group: `up`, or `dev`.
    command: &'static str,
    /// How long it may take to serve (default [`PATIENCE`]).
    ready_within: Duration,
}

impl GroupBuilder {
    /// Runs the group as `uid` (and the group of that number, no other
    /// groups), through `setpriv`: for what a root test cannot show, as
    /// root may read any process. The scratch directory becomes its.
    pub fn user(mut self, uid: u32) -> Self {
        self.user = Some(uid);
        self
    }

    /// Waits up to `patience` for the group to serve (`switchyard dev`
    /// builds its plugins first).
    pub fn ready_within(mut self, patience: Duration) -> Self {
        self.ready_within = patience;
        self
    }

    /// Uses this `switchyard.toml` text.
    pub fn config(mut self, toml: &str) -> Self {
        self.config = Some(toml.to_owned());
        self
    }

    /// Keeps the Store's data in `dir` (which outlives the group), e.g. to
    /// start a second group on the data of the first.
    pub fn data_dir(mut self, dir: &Path) -> Self {
        self.data_dir = Some(dir.to_owned());
        self
    }

    /// Sets an environment variable for the group's processes.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Passes one more argument to `switchyard up` (`--admin-bind`, ...).
    pub fn arg(mut self, arg: &str) -> Self {
        self.args.push(arg.to_owned());
        self
    }

    /// Runs the group with `switchyard dev` instead of `up`.
    pub fn dev(mut self) -> Self {
        self.command = "dev";
        self
    }

    /// Uses this runtime dir (which may exist already) instead of a fresh one.
    pub fn runtime_dir(mut self, path: &Path) -> Self {
        self.runtime_dir = Some(path.to_owned());
        self
    }

    /// Uses this configuration file where it is (relative paths in it stay
    /// relative to it).
    pub fn config_file(mut self, path: &Path) -> Self {
        self.config_file = Some(path.to_owned());
        self
    }

    pub fn start(self) -> Group {
        self.try_start()
            .unwrap_or_else(|out| panic!("the group did not start:\n{out}"))
    }

    /// Starts the group, or returns everything it printed if it exits first.
    pub fn try_start(self) -> Result<Group, String> {
        // The runtime dir must not exist yet: the supervisor then creates it
        // (mode 0700) and removes it whole when it stops, which
        // tests/shutdown.rs checks; a directory it did not make it leaves.
        // A test may supply its own (`runtime_dir`), which stays its own.
        let scratch = scratch_dir(self.tag);
        let runtime_dir = self
            .runtime_dir
            .clone()
            .unwrap_or_else(|| scratch.path().join("rt"));
        let mut cmd = match self.user {
            Some(uid) => {
                std::os::unix::fs::chown(scratch.path(), Some(uid), Some(uid))
                    .expect("chown the scratch dir");
                let mut cmd = Command::new("setpriv");
                cmd.arg(format!("--reuid={uid}"))
                    .arg(format!("--regid={uid}"))
                    .arg("--clear-groups")
                    .arg(env!("CARGO_BIN_EXE_switchyard"));
                cmd
            }
            None => Command::new(env!("CARGO_BIN_EXE_switchyard")),
        };
        cmd.arg(self.command)
            .arg("--bind")
            .arg("127.0.0.1:0")
            .arg("--runtime-dir")
            .arg(&runtime_dir)
            .arg("--data-dir")
            .arg(
                self.data_dir
                    .clone()
                    .unwrap_or_else(|| scratch.path().join("data")),
            );
        if let Some(config) = &self.config {
            let path = scratch.path().join("switchyard.toml");
            std::fs::write(&path, config).unwrap();
            cmd.arg("-c").arg(path);
        }
        if let Some(path) = &self.config_file {
            cmd.arg("-c").arg(path);
        }
        // In the scratch dir, which is the group's user's too.
        let ready_file = scratch.path().join("ready.json");
        cmd.arg("--ready-file").arg(&ready_file);
        cmd.args(&self.args);
        // A test may choose its own log filter (`env("SWITCHYARD_LOG", ..)`).
        cmd.env("SWITCHYARD_LOG", "info");
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn switchyard");
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, line_events) = mpsc::channel();
        let store = lines.clone();
        let err_store = lines.clone();
        // Each disconnected once its pipe is drained.
        let (stderr_open, stderr_drained) = mpsc::channel::<()>();
        let (stdout_open, stdout_drained) = mpsc::channel::<()>();
        std::thread::spawn(move || {
            let _open = stderr_open;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("group! {line}");
                err_store.lock().unwrap().push(line);
            }
        });
        std::thread::spawn(move || {
            let _open = stdout_open;
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                eprintln!("group| {line}");
                store.lock().unwrap().push(line.clone());
                if tx.send(line).is_err() {
                    // Nobody is listening any more; keep draining the pipe.
                }
            }
        });
        let mut group = Group {
            child: Some(child),
            addr: "127.0.0.1:1".parse().unwrap(),
            ready: Ready {
                pid: 0,
                tls: false,
                http: "127.0.0.1:1".parse().unwrap(),
                grpc: None,
                http3: None,
                admin: None,
                runtime_dir: PathBuf::new(),
            },
            ready_file: ready_file.clone(),
            runtime_dir,
            lines,
            line_events,
            scratch,
        };
        let patience = self.ready_within;
        match wait_ready(group.child.as_mut().unwrap(), &ready_file, patience) {
            Ok(ready) => {
                group.addr = ready.http;
                group.ready = ready;
                Ok(group)
            }
            Err(err) if err.kind() == std::io::ErrorKind::TimedOut => panic!("{err}"),
            // The supervisor exited (or wrote nonsense): what it printed says why.
            Err(err) => {
                let status = match group.child.as_mut().unwrap().try_wait().unwrap() {
                    Some(status) => status,
                    None => {
                        let _ = group.child.as_mut().unwrap().kill();
                        group.child.as_mut().unwrap().wait().unwrap()
                    }
                };
                group.child = None;
                // The pipes may still be draining into the log.
                let _ = stdout_drained.recv_timeout(PATIENCE);
                let _ = stderr_drained.recv_timeout(PATIENCE);
                let out = group.lines.lock().unwrap().join("\n");
                Err(format!("{err}: {status}\n{out}"))
            }
        }
    }
}

impl Group {
    pub fn builder(tag: &'static str) -> GroupBuilder {
        GroupBuilder {
            data_dir: None,
            config: None,
            config_file: None,
            tag,
            env: Vec::new(),
            runtime_dir: None,
            args: Vec::new(),
            user: None,
            command: "up",
            ready_within: PATIENCE,
        }
    }

    /// Starts the zero-config group.
    pub fn start(tag: &'static str) -> Group {
        Group::builder(tag).start()
    }

    /// Waits for a stdout line containing `needle` (seen before or after the call).
    pub fn wait_line(&mut self, needle: &str) -> String {
        if let Some(line) = self.lines.lock().unwrap().iter().find(|l| l.contains(needle)) {
            return line.clone();
        }
        let deadline = Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.line_events.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => {}
                Err(_) => panic!("no line containing {needle:?} within {PATIENCE:?}"),
            }
        }
    }

    /// Whether any line printed so far contains `needle` (no waiting).
    pub fn has_line(&self, needle: &str) -> bool {
        self.lines.lock().unwrap().iter().any(|l| l.contains(needle))
    }

    /// How many lines printed so far contain `needle` (no waiting).
    pub fn count_lines(&self, needle: &str) -> usize {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }

    /// The first line printed so far that contains `needle` (no waiting;
    /// for `eventually` where the group is shared and cannot be `mut`).
    pub fn line(&self, needle: &str) -> Option<String> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .find(|l| l.contains(needle))
            .cloned()
    }

    pub fn supervisor_pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// `switchyard status --json` for this group.
    pub fn status(&self) -> serde_json::Value {
        let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
            .args(["status", "--json", "--runtime-dir"])
            .arg(&self.runtime_dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "status failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// The pid of the process named `name` (role name or manager name).
    pub fn pid_of(&self, name: &str) -> u32 {
        self.status()["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .and_then(|p| p["pid"].as_u64())
            .unwrap_or_else(|| panic!("no running process named {name}")) as u32
    }

    /// Every pid the status lists.
    pub fn all_pids(&self) -> Vec<u32> {
        self.status()["processes"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|p| p["pid"].as_u64().map(|p| p as u32))
            .collect()
    }

    /// Polls `GET path` until it answers `status` (the group's readiness, as a
    /// client sees it), within [`PATIENCE`].
    #[track_caller]
    pub fn eventually_status(&self, path: &str, status: u16) {
        eventually(&format!("GET {path} answers {status}"), PATIENCE, || {
            match get(self.addr, path) {
                Ok(r) if r.status == status => Ok(()),
                other => Err(other.map(|r| r.status)),
            }
        })
    }

    /// Waits until `name` runs again under a pid other than `old`.
    #[track_caller]
    pub fn eventually_restarted(&self, name: &str, old: u32) {
        eventually(&format!("{name} runs again, not as {old}"), PATIENCE, || {
            let status = self.status();
            let p = status["processes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == name)
                .cloned();
            match p {
                Some(p)
                    if p["state"] == "running" && p["pid"].as_u64().is_some_and(|pid| pid as u32 != old) =>
                {
                    Ok(())
                }
                other => Err(other),
            }
        })
    }

    pub fn kill9(&self, name: &str) -> u32 {
        let pid = self.pid_of(name);
        kill(pid, Signal::SIGKILL);
        pid
    }

    /// Waits for the supervisor to exit on its own (after `switchyard
    /// upgrade`, say), within [`PATIENCE`].
    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().unwrap();
        wait_with_patience(&mut child)
    }

    /// Sends SIGTERM to the supervisor and waits for it to exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        self.stop_with(Signal::SIGTERM)
    }

    /// Sends `signal` to the supervisor and waits for it to exit.
    pub fn stop_with(&mut self, signal: Signal) -> std::process::ExitStatus {
        let mut child = self.child.take().unwrap();
        kill(child.id(), signal);
        wait_with_patience(&mut child)
    }
}

/// Waits for `child` to exit, within [`PATIENCE`] (then kills it and fails).
pub fn wait_with_patience(child: &mut Child) -> std::process::ExitStatus {
    match poll(PATIENCE, || child.try_wait().unwrap().ok_or(())) {
        Ok(status) => status,
        Err(()) => {
            let _ = child.kill();
            panic!("process {} did not exit within {PATIENCE:?}", child.id());
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Not `kill`: a drop must not panic, and the supervisor may be gone.
            let _ = nix::sys::signal::kill(pid(child.id()), Signal::SIGTERM);
            let _ = poll(Duration::from_secs(15), || {
                child.try_wait().ok().flatten().ok_or(())
            });
            // Children die with the supervisor (PR_SET_PDEATHSIG).
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Sends `signal` to `pid`, a process the test knows to be there.
#[track_caller]
pub fn kill(pid: u32, signal: Signal) {
    nix::sys::signal::kill(self::pid(pid), signal)
        .unwrap_or_else(|err| panic!("cannot send {signal} to {pid}: {err}"));
}

fn pid(pid: u32) -> Pid {
    Pid::from_raw(i32::try_from(pid).expect("a pid fits in pid_t"))
}

/// Open descriptors of `pid`.
pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// What each open descriptor of `pid` is (`socket:[…]`, a path, …), for
/// a failure message that says which ones a count did not expect.
pub fn fd_targets(pid: u32) -> Vec<String> {
    let mut fds: Vec<(u32, String)> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_str()?.parse().ok()?;
            let target = std::fs::read_link(e.path()).ok()?;
            Some((n, target.display().to_string()))
        })
        .collect();
    fds.sort();
    fds.into_iter().map(|(n, t)| format!("{n} {t}")).collect()
}

/// Resident memory of `pid`, in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The names in `/dev/shm` (to check that a group leaves nothing there).
pub fn dev_shm_listing() -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// A supervisor `switchyard upgrade` started: told to stop (SIGTERM) and
/// waited for when dropped, whatever the test did meanwhile.
pub struct Upgraded {
    pub pid: u32,
}

impl Drop for Upgraded {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(self::pid(self.pid), Signal::SIGTERM);
        let _ = std::panic::catch_unwind(|| {
            eventually("the new supervisor exits", PATIENCE, || {
                if alive(self.pid) { Err(self.pid) } else { Ok(()) }
            })
        });
    }
}

/// Runs `switchyard upgrade` on the group of `runtime_dir` and returns the
/// new supervisor it started (the pid `upgrade` prints).
#[track_caller]
pub fn upgrade(runtime_dir: &Path) -> Upgraded {
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["upgrade", "--runtime-dir"])
        .arg(runtime_dir)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "upgrade failed: {said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pid = said
        .split("pid ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {said:?}"));
    Upgraded { pid }
}

pub fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "))
}

/// A parsed HTTP/1.1 response.
#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends raw bytes, reads until the server closes, parses the response.
pub fn raw(addr: SocketAddr, request: &[u8]) -> std::io::Result<HttpResponse> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(PATIENCE))?;
    stream.write_all(request)?;
    let mut buf = Vec::new();
    stream.read_to_end(&mut buf)?;
    parse_response(&buf)
}

pub fn parse_response(buf: &[u8]) -> std::io::Result<HttpResponse> {
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_owned());
    let split = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no header end"))?;
    let head = std::str::from_utf8(&buf[..split]).map_err(|_| bad("head not utf-8"))?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no status"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| {
            l.split_once(':')
                .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        })
        .collect();
    let mut body = buf[split + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    if chunked {
        body = dechunk(&body).ok_or_else(|| bad("bad chunked body"))?;
    }
    Ok(HttpResponse {
        status,
        headers,
        body,
    })
}

fn dechunk(mut b: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let end = b.windows(2).position(|w| w == b"\r\n")?;
        let size = usize::from_str_radix(std::str::from_utf8(&b[..end]).ok()?.trim(), 16).ok()?;
        b = &b[end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(b.get(..size)?);
        b = b.get(size + 2..)?;
    }
}

pub fn request(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> std::io::Result<HttpResponse> {
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    if !body.is_empty() {
        req.push_str("content-type: application/json\r\n");
    }
    req.push_str("\r\n");
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    raw(addr, &bytes)
}

/// `method path` with extra header lines and a body (JSON when not empty).
pub fn request_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<HttpResponse> {
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    if !body.is_empty() {
        req.push_str("content-type: application/json\r\n");
    }
    for (name, value) in headers {
        req.push_str(&format!("{name}: {value}\r\n"));
    }
    req.push_str("\r\n");
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    raw(addr, &bytes)
}

impl HttpResponse {
    /// Every value of a header, in order.
    pub fn header_all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
}

/// Every stdout line of the group so far that contains `needle`.
impl Group {
    pub fn lines_with(&self, needle: &str) -> Vec<String> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .cloned()
            .collect()
    }
}

pub fn get(addr: SocketAddr, path: &str) -> std::io::Result<HttpResponse> {
    request(addr, "GET", path, b"")
}
