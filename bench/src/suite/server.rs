//! The servers a scenario measures, as processes of their own: a Switchyard
//! group (`switchyard up`) or the baseline (`switchyard-baseline`). A group
//! says that it serves, and where, in its `--ready-file` (decision 0150);
//! the baseline, which has no such file, prints `listening on http://ADDR`.
//! Both stop on SIGTERM.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use switchyard_manager_host::testing::wait_ready;
use tempfile::TempDir;

use super::tmp::scratch;

/// How long a server may take to say that it serves. A group's children each
/// get `start_timeout_ms` (10 s by default) and start one after the other.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long SIGTERM gets before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// Lines of a server's stdout and stderr kept for error messages.
const TAIL_LINES: usize = 30;

/// The baseline's readiness line: followed by `://ADDR` or `s://ADDR` (HTTPS).
const READY_MARK: &str = "listening on http";

/// How a server tells that it serves.
pub(crate) enum Readiness {
    /// The JSON file of `switchyard up --ready-file FILE`.
    File(PathBuf),
    /// The baseline's `listening on http://ADDR` line on stdout.
    Line,
}

enum Event {
    /// The address, and whether it serves HTTPS.
    Ready(SocketAddr, bool),
    Exited(std::io::Result<ExitStatus>),
}

/// The last lines of a stream.
#[derive(Clone, Default)]
struct Tail(Arc<Mutex<VecDeque<String>>>);

impl Tail {
    fn push(&self, line: String) {
        let mut lines = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if lines.len() == TAIL_LINES {
            lines.pop_front();
        }
        lines.push_back(line);
    }

    fn text(&self) -> String {
        let lines = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        lines.iter().map(|l| format!("  | {l}\n")).collect()
    }
}

/// A running server process.
pub(crate) struct Server {
    label: String,
    pid: i32,
    addr: SocketAddr,
    /// It serves HTTPS.
    https: bool,
    events: mpsc::Receiver<Event>,
    stdout: Tail,
    stderr: Tail,
    exited: bool,
}

impl Server {
    /// Starts `command` and waits, at most [`READY_TIMEOUT`], until it
    /// says, as `readiness` has it, that it serves.
    pub(crate) fn start(label: &str, mut command: Command, readiness: Readiness) -> anyhow::Result<Server> {
        // If the suite dies (a panic, a SIGKILL), its servers must not live
        // on holding cores that the next run would then measure against.
        // (The signal follows the thread that forked: the suite starts its
        // servers from its main thread, which lives as long as the suite.)
        // SAFETY: the closure runs between fork and exec and only makes one
        // async-signal-safe system call.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start {label} ({:?})", command.get_program()))?;
        let pid = i32::try_from(child.id()).context("pid out of range")?;
        let (tx, events) = mpsc::channel();
        let (stdout, stderr) = (Tail::default(), Tail::default());
        // Both pipes are drained for the server's whole life: a group logs
        // every child's lines to its stdout, and a full pipe would block it.
        let out = child.stdout.take().context("no stdout pipe")?;
        let ready = tx.clone();
        let tail = stdout.clone();
        let scan = matches!(readiness, Readiness::Line);
        std::thread::spawn(move || {
            let mut sent = !scan;
            for line in lines(out) {
                if !sent && let Some(addr) = ready_addr(&line) {
                    let https = line.contains("listening on https://");
                    sent = ready.send(Event::Ready(addr, https)).is_ok();
                }
                tail.push(line);
            }
        });
        let err = child.stderr.take().context("no stderr pipe")?;
        let tail = stderr.clone();
        std::thread::spawn(move || lines(err).for_each(|line| tail.push(line)));
        // Waited on before the waiter thread takes the child: the wait
        // watches the child's exit as well as the file.
        let from_file = match &readiness {
            Readiness::File(path) => Some(wait_ready(&mut child, path, READY_TIMEOUT)),
            Readiness::Line => None,
        };
        // `wait_ready` reaped a child that exited: no signal may go to its pid.
        let exited = matches!(child.try_wait(), Ok(Some(_)));
        // The waiter owns the child: it reaps it as soon as it exits, and
        // tells whoever is waiting for the address or for the end.
        std::thread::spawn(move || {
            let _ = tx.send(Event::Exited(child.wait()));
        });

        let mut server = Server {
            label: label.to_owned(),
            pid,
            addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            https: false,
            events,
            stdout,
            stderr,
            exited: false,
        };
        match from_file {
            Some(Ok(ready)) => {
                server.addr = ready.http;
                server.https = ready.tls;
                return Ok(server);
            }
            Some(Err(err)) => {
                if exited {
                    server.exited = true;
                } else {
                    let _ = server.stop();
                }
                bail!("{label} did not become ready: {err}{}", server.output())
            }
            None => {}
        }
        match server.events.recv_timeout(READY_TIMEOUT) {
            Ok(Event::Ready(addr, https)) => {
                server.addr = addr;
                server.https = https;
                Ok(server)
            }
            Ok(Event::Exited(status)) => {
                server.exited = true;
                bail!(
                    "{label} exited before it was ready ({}){}",
                    describe(&status),
                    server.output()
                )
            }
            Err(_) => {
                let _ = server.stop();
                bail!(
                    "{label} printed no \"{READY_MARK}\" line within {} s{}",
                    READY_TIMEOUT.as_secs(),
                    server.output()
                )
            }
        }
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub(crate) fn url(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// SIGTERM, then up to [`STOP_TIMEOUT`] for the server to exit, then
    /// SIGKILL to it and its descendants. Fails when the server did not exit
    /// cleanly on SIGTERM.
    pub(crate) fn stop(&mut self) -> anyhow::Result<()> {
        if self.exited {
            return Ok(());
        }
        // The pid cannot have been reused: the child is reaped only by our
        // waiter thread, which reports it, and we have not seen that report.
        let _ = kill(Pid::from_raw(self.pid), Signal::SIGTERM);
        if let Some(status) = self.wait_exit(STOP_TIMEOUT) {
            return match status {
                Ok(status) if status.success() => Ok(()),
                status => bail!(
                    "{} exited with {} on SIGTERM{}",
                    self.label,
                    describe(&status),
                    self.output()
                ),
            };
        }
        // Its children die with it (the supervisor sets PR_SET_PDEATHSIG),
        // but a child that is itself stuck is caught here too.
        let mut doomed = descendants(self.pid);
        doomed.push(self.pid);
        for pid in doomed {
            // As above; descendants were read while the server lived.
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        let _ = self.wait_exit(Duration::from_secs(5));
        // Whatever became of it, a second SIGTERM from `drop` would not help.
        self.exited = true;
        bail!(
            "{} ignored SIGTERM for {} s and was killed{}",
            self.label,
            STOP_TIMEOUT.as_secs(),
            self.output()
        )
    }

    fn wait_exit(&mut self, patience: Duration) -> Option<std::io::Result<ExitStatus>> {
        let deadline = Instant::now() + patience;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(Event::Exited(status)) => {
                    self.exited = true;
                    return Some(status);
                }
                Ok(Event::Ready(..)) => continue,
                Err(mpsc::RecvTimeoutError::Timeout) => return None,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    self.exited = true;
                    return Some(Err(std::io::Error::other("the waiter thread is gone")));
                }
            }
        }
    }

    /// The tails of stdout and stderr, for an error message.
    fn output(&self) -> String {
        let (out, err) = (self.stdout.text(), self.stderr.text());
        let mut text = String::new();
        if !out.is_empty() {
            text.push_str(&format!("\n  last lines of stdout:\n{out}"));
        }
        if !err.is_empty() {
            text.push_str(&format!("\n  last lines of stderr:\n{err}"));
        }
        text
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Err(err) = self.stop() {
            eprintln!("suite: {err:#}");
        }
    }
}

/// The lines of a stream, lossily decoded, until its end or an error.
fn lines(stream: impl Read) -> impl Iterator<Item = String> {
    BufReader::new(stream)
        .split(b'\n')
        .map_while(Result::ok)
        .map(|line| String::from_utf8_lossy(&line).trim_end().to_owned())
}

/// The address of a `... listening on http://ADDR ...` (or `https://`) line.
fn ready_addr(line: &str) -> Option<SocketAddr> {
    let rest = &line[line.find(READY_MARK)? + READY_MARK.len()..];
    let rest = rest.strip_prefix("s").unwrap_or(rest).strip_prefix("://")?;
    let end = rest
        .find(|c: char| c.is_whitespace() || c == '/')
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

fn describe(status: &std::io::Result<ExitStatus>) -> String {
    match status {
        Ok(status) => status.to_string(),
        Err(err) => format!("unknown status: {err}"),
    }
}

/// Every descendant of `root`, from the parent pids in /proc.
fn descendants(root: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let parents: Vec<(i32, i32)> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // The command name may hold spaces and parentheses: count from its end.
            let ppid = stat
                .get(stat.rfind(')')? + 2..)?
                .split(' ')
                .nth(1)?
                .parse()
                .ok()?;
            Some((pid, ppid))
        })
        .collect();
    let mut found = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for &(pid, _) in parents.iter().filter(|&&(_, ppid)| ppid == parent) {
            found.push(pid);
            frontier.push(pid);
        }
    }
    found
}

/// A Switchyard group started by the suite: `switchyard up` on an
/// ephemeral port with a runtime directory (and configuration file) of its
/// own, removed when the group is dropped.
pub(crate) struct Group {
    // Declared first: the group stops before its directory goes.
    pub(crate) server: Server,
    exe: PathBuf,
    dir: TempDir,
}

impl Group {
    /// `config`: a `switchyard.toml` to start with; `None` for the defaults.
    pub(crate) fn start(exe: &Path, config: Option<&str>) -> anyhow::Result<Group> {
        let dir = scratch("group")?;
        let ready_file = dir.path().join("ready.json");
        let mut command = Command::new(exe);
        command
            .arg("up")
            .args(["--bind", "127.0.0.1:0", "--runtime-dir"])
            .arg(dir.path().join("rt"))
            .arg("--ready-file")
            .arg(&ready_file);
        if let Some(config) = config {
            let file = dir.path().join("switchyard.toml");
            std::fs::write(&file, config).with_context(|| format!("cannot write {}", file.display()))?;
            command.arg("-c").arg(file);
        }
        let server = Server::start("switchyard", command, Readiness::File(ready_file))?;
        Ok(Group {
            server,
            exe: exe.to_owned(),
            dir,
        })
    }

    /// `switchyard status --json` of this group.
    pub(crate) fn status(&self) -> anyhow::Result<Status> {
        let output = Command::new(&self.exe)
            .args(["status", "--json", "--runtime-dir"])
            .arg(self.dir.path().join("rt"))
            .output()
            .context("cannot run switchyard status")?;
        if !output.status.success() {
            bail!(
                "switchyard status failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        serde_json::from_slice(&output.stdout).context("cannot parse switchyard status --json")
    }
}

/// Validates `config` with `switchyard check`: `Err` carries its message,
/// which names the key a build does not know.
pub(crate) fn check_config(exe: &Path, config: &str) -> anyhow::Result<Result<(), String>> {
    let dir = scratch("check")?;
    let file = dir.path().join("switchyard.toml");
    std::fs::write(&file, config).with_context(|| format!("cannot write {}", file.display()))?;
    let output = Command::new(exe)
        .args(["check", "-c"])
        .arg(&file)
        .output()
        .context("cannot run switchyard check")?;
    Ok(if output.status.success() {
        Ok(())
    } else {
        let message = String::from_utf8_lossy(&output.stderr);
        // The temporary file's path says nothing to the reader.
        Err(message
            .trim()
            .replace(&file.display().to_string(), "switchyard.toml"))
    })
}

/// A bearer token from `switchyard token` for a group of `config`;
/// `Err` with its message when this build cannot make one.
pub(crate) fn token(exe: &Path, config: &str, sub: &str) -> anyhow::Result<Result<String, String>> {
    let dir = scratch("token")?;
    let file = dir.path().join("switchyard.toml");
    std::fs::write(&file, config).with_context(|| format!("cannot write {}", file.display()))?;
    let output = Command::new(exe)
        .args(["token", "--sub", sub, "--ttl-s", "86400", "-c"])
        .arg(&file)
        .output()
        .context("cannot run switchyard token")?;
    Ok(if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).trim().to_owned())
    })
}

/// `switchyard status --json`.
#[derive(Clone, Debug, Deserialize)]
pub(crate) struct Status {
    pub(crate) processes: Vec<ProcessInfo>,
}

#[derive(Clone, Debug, Deserialize)]
pub(crate) struct ProcessInfo {
    pub(crate) role: String,
    pub(crate) name: String,
    pub(crate) pid: Option<u32>,
    #[serde(default)]
    pub(crate) workers: Option<Pool>,
}

/// A worker pool, as `status` shows it and as `[managers.workers]` sets it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pool {
    pub kind: String,
    pub size: usize,
    pub queue: usize,
}

impl Status {
    /// The name of the manager whose process (or worker process) has `pid`.
    pub(crate) fn manager_of(&self, pid: u32) -> Option<&str> {
        self.processes
            .iter()
            .find(|p| p.pid == Some(pid) && matches!(p.role.as_str(), "manager" | "worker"))
            .map(|p| p.name.as_str())
    }

    /// The managers as `[[managers]]` entries that start the same group:
    /// one per name, in order, with its instance count and worker pool.
    pub(crate) fn managers(&self) -> Vec<ManagerEntry> {
        let mut entries: Vec<ManagerEntry> = Vec::new();
        for p in self.processes.iter().filter(|p| p.role == "manager") {
            match entries.iter_mut().find(|e| e.name == p.name) {
                Some(entry) => entry.instances += 1,
                None => entries.push(ManagerEntry {
                    name: p.name.clone(),
                    instances: 1,
                    workers: p.workers.clone(),
                }),
            }
        }
        entries
    }
}

/// One `[[managers]]` entry of a generated configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ManagerEntry {
    pub name: String,
    pub instances: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workers: Option<Pool>,
}

/// A `switchyard.toml` that runs `managers` and sets nothing else.
pub fn config_toml(managers: &[ManagerEntry]) -> anyhow::Result<String> {
    #[derive(Serialize)]
    struct Config<'a> {
        managers: &'a [ManagerEntry],
    }
    toml::to_string(&Config { managers }).context("cannot write the configuration")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_lines_of_both_servers() {
        assert_eq!(
            ready_addr("switchyard listening on http://127.0.0.1:33155 (runtime dir /tmp/x/rt)"),
            Some(SocketAddr::from(([127, 0, 0, 1], 33155)))
        );
        assert_eq!(
            ready_addr("listening on http://127.0.0.1:8080"),
            Some(SocketAddr::from(([127, 0, 0, 1], 8080)))
        );
        assert_eq!(
            ready_addr("listener[1] | accepting connections addr=127.0.0.1:1"),
            None
        );
        assert_eq!(ready_addr("listening on http://nowhere"), None);
        assert_eq!(
            ready_addr("switchyard listening on https://127.0.0.1:9 (runtime dir /x)"),
            Some(SocketAddr::from(([127, 0, 0, 1], 9)))
        );
    }

    fn status() -> Status {
        let json = r#"{"processes": [
            {"role": "supervisor", "name": "supervisor", "instance": 0, "pid": 10, "state": "running", "restarts": 0, "uptime_ms": 5},
            {"role": "router", "name": "router", "instance": 0, "pid": 11, "state": "running", "restarts": 0, "uptime_ms": 5},
            {"role": "manager", "name": "basics", "instance": 0, "pid": 12, "state": "running", "restarts": 0, "uptime_ms": 5,
             "workers": {"kind": "thread", "size": 4, "queue": 256}},
            {"role": "manager", "name": "compute", "instance": 0, "pid": 13, "state": "running", "restarts": 0, "uptime_ms": 5,
             "workers": {"kind": "process", "size": 2, "queue": 256}},
            {"role": "manager", "name": "compute", "instance": 1, "pid": 14, "state": "running", "restarts": 0, "uptime_ms": 5,
             "workers": {"kind": "process", "size": 2, "queue": 256}},
            {"role": "worker", "name": "compute", "instance": 0, "pid": 15, "state": "running", "restarts": 0, "uptime_ms": 5},
            {"role": "listener", "name": "listener", "instance": 0, "pid": null, "state": "backoff", "restarts": 1, "uptime_ms": 0}
        ]}"#;
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn status_names_the_manager_of_a_pid() {
        let status = status();
        assert_eq!(status.manager_of(12), Some("basics"));
        assert_eq!(status.manager_of(14), Some("compute"));
        assert_eq!(
            status.manager_of(15),
            Some("compute"),
            "a worker belongs to its manager"
        );
        assert_eq!(status.manager_of(11), None, "the router is no manager");
        assert_eq!(status.manager_of(99), None);
    }

    #[test]
    fn configuration_mirrors_the_running_managers() {
        let mut managers = status().managers();
        let process_pool = Pool {
            kind: "process".to_owned(),
            size: 2,
            queue: 256,
        };
        assert_eq!(
            managers,
            [
                ManagerEntry {
                    name: "basics".to_owned(),
                    instances: 1,
                    workers: Some(Pool {
                        kind: "thread".to_owned(),
                        size: 4,
                        queue: 256
                    }),
                },
                ManagerEntry {
                    name: "compute".to_owned(),
                    instances: 2,
                    workers: Some(process_pool),
                },
            ]
        );
        managers[0].workers = None;
        let toml = config_toml(&managers).unwrap();
        assert_eq!(
            toml,
            "[[managers]]\nname = \"basics\"\ninstances = 1\n\n\
             [[managers]]\nname = \"compute\"\ninstances = 2\n\n\
             [managers.workers]\nkind = \"process\"\nsize = 2\nqueue = 256\n"
        );
        // And it reads back as the same tables.
        let back: toml::Table = toml.parse().unwrap();
        assert_eq!(back["managers"].as_array().unwrap().len(), 2);
        assert_eq!(back["managers"][1]["workers"]["kind"].as_str(), Some("process"));
    }

    #[test]
    fn descendants_of_a_process_without_children() {
        assert!(descendants(i32::MAX).is_empty());
    }
}
