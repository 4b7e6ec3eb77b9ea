//! The control socket in a group's runtime directory, and its clients:
//! `switchyard status` (the process tree), `reload` and `upgrade`.
//!
//! The protocol is one JSON line each way, so `socat` works as a client
//! too:
//! - `{"cmd":"status"}` → `{"processes":[...]}`;
//! - `{"cmd":"reload"}` → `{"reloaded":{...}}` once applied, or
//!   `{"error":"...","kind":"invalid"|"failed"|"busy"}`;
//! - `{"cmd":"upgrade"}` → `{"upgraded":{"pid":N}}` once the new group
//!   serves, or `{"error":"..."}`.
//!
//! A request line longer than `supervision::MAX_LINE` bytes (64 KiB) ends
//! the connection.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use futures_util::StreamExt;
use switchyard_proto::process::RuntimePaths;
use switchyard_proto::supervision::{line_error, lines};
use switchyard_proto::transport::PeerPolicy;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot};

use crate::supervisor::events::{Event, ProcessInfo, ReloadError, Request};
use crate::supervisor::reload::ReloadReport;
use crate::supervisor::runtime_dir;

#[derive(serde::Serialize, serde::Deserialize)]
struct StatusReply {
    processes: Vec<ProcessInfo>,
}

/// Serves the control socket for the life of the supervisor.
pub(crate) async fn serve(socket: std::os::unix::net::UnixListener, events: mpsc::UnboundedSender<Event>) {
    let listener = match socket
        .set_nonblocking(true)
        .and_then(|_| tokio::net::UnixListener::from_std(socket))
    {
        Ok(l) => l,
        Err(err) => return tracing::error!(%err, "control socket unusable"),
    };
    let policy = PeerPolicy {
        supervisor: None,
        ..PeerPolicy::for_group()
    };
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        if let Err(err) = policy.check(&stream) {
            tracing::warn!(%err, "refusing control connection");
            continue;
        }
        let events = events.clone();
        tokio::spawn(async move {
            let (read, mut write) = stream.into_split();
            let mut requests = lines(read);
            while let Some(line) = requests.next().await {
                let line = match line {
                    Ok(line) => line,
                    Err(err) => {
                        tracing::warn!(err = line_error(&err), "dropping a control connection");
                        let _ = write.write_all(b"{\"error\":\"request line too long\"}\n").await;
                        break;
                    }
                };
                let reply = match serde_json::from_str::<serde_json::Value>(&line) {
                    Ok(v) if v["cmd"] == "status" => {
                        let (tx, rx) = oneshot::channel();
                        let _ = events.send(Event::Status(tx));
                        match rx.await {
                            Ok(processes) => serde_json::to_string(&StatusReply { processes }),
                            Err(_) => Ok(r#"{"error":"supervisor is stopping"}"#.to_owned()),
                        }
                    }
                    Ok(v) if v["cmd"] == "reload" => {
                        let (tx, rx) = oneshot::channel();
                        let _ = events.send(Event::Control(Request::Reload(tx)));
                        Ok(match rx.await {
                            Ok(Ok(report)) => serde_json::json!({ "reloaded": report }),
                            Ok(Err(err)) => {
                                let kind = match err {
                                    ReloadError::Invalid(_) => "invalid",
                                    ReloadError::Failed(_) => "failed",
                                    ReloadError::Busy(_) => "busy",
                                };
                                serde_json::json!({ "error": err.to_string(), "kind": kind })
                            }
                            Err(_) => {
                                serde_json::json!({ "error": "the supervisor is stopping", "kind": "failed" })
                            }
                        }
                        .to_string())
                    }
                    Ok(v) if v["cmd"] == "upgrade" => {
                        let (tx, rx) = oneshot::channel();
                        let _ = events.send(Event::Control(Request::Upgrade(tx)));
                        Ok(match rx.await {
                            Ok(Ok(pid)) => serde_json::json!({ "upgraded": { "pid": pid } }),
                            Ok(Err(err)) => serde_json::json!({ "error": err }),
                            Err(_) => serde_json::json!({ "error": "the supervisor is stopping" }),
                        }
                        .to_string())
                    }
                    _ => Ok(r#"{"error":"unknown command"}"#.to_owned()),
                };
                let mut reply = reply.unwrap_or_default();
                reply.push('\n');
                if write.write_all(reply.as_bytes()).await.is_err() {
                    break;
                }
            }
        });
    }
}

fn find_group(requested: Option<PathBuf>) -> Result<PathBuf, String> {
    if let Some(dir) = requested {
        return Ok(dir);
    }
    let base = runtime_dir::default_base();
    let live: Vec<PathBuf> = std::fs::read_dir(&base)
        .map_err(|_| format!("no running group found (nothing in {})", base.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|dir| {
            std::os::unix::net::UnixStream::connect(RuntimePaths::new(dir).control_socket()).is_ok()
        })
        .collect();
    match live.len() {
        0 => Err(format!("no running group found in {}", base.display())),
        1 => Ok(live.into_iter().next().unwrap_or_default()),
        _ => Err(format!(
            "several groups are running; pick one with --runtime-dir:\n{}",
            live.iter()
                .map(|p| format!("  {}", p.display()))
                .collect::<Vec<_>>()
                .join("\n")
        )),
    }
}

/// Sends one command line to the group in `dir` and reads its answer,
/// waiting at most `patience` (none: as long as it takes).
fn ask<T: serde::de::DeserializeOwned>(
    dir: &std::path::Path,
    command: &str,
    patience: Option<Duration>,
) -> std::io::Result<T> {
    let mut stream = std::os::unix::net::UnixStream::connect(RuntimePaths::new(dir).control_socket())?;
    stream.set_read_timeout(patience)?;
    stream.write_all(format!("{{\"cmd\":\"{command}\"}}\n").as_bytes())?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line)?;
    if line.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the supervisor closed the connection without an answer",
        ));
    }
    serde_json::from_str(&line).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

fn query(dir: &std::path::Path) -> std::io::Result<StatusReply> {
    ask(dir, "status", Some(Duration::from_secs(5)))
}

/// Finds the group, or says why not (exit 1).
fn group_dir(command: &str, runtime_dir: Option<PathBuf>) -> Result<PathBuf, ExitCode> {
    find_group(runtime_dir).map_err(|msg| {
        eprintln!("switchyard {command}: {msg}");
        ExitCode::FAILURE
    })
}

#[derive(serde::Deserialize)]
struct ControlAnswer<T> {
    #[serde(default = "Option::default")]
    reloaded: Option<T>,
    #[serde(default = "Option::default")]
    upgraded: Option<T>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    kind: Option<String>,
}

/// `switchyard reload`: exit 0 once applied, 64 when the configuration is
/// invalid (the group runs on unchanged), 1 when it could not be applied.
pub(crate) fn reload(runtime_dir: Option<PathBuf>) -> ExitCode {
    let dir = match group_dir("reload", runtime_dir) {
        Ok(d) => d,
        Err(code) => return code,
    };
    // A reload starts and drains processes: it takes what it takes, each
    // step bounded by the group's own timeouts.
    match ask::<ControlAnswer<ReloadReport>>(&dir, "reload", None) {
        Ok(ControlAnswer {
            reloaded: Some(report),
            ..
        }) => {
            println!("{}", report.describe());
            ExitCode::SUCCESS
        }
        Ok(answer) => {
            let err = answer.error.unwrap_or_else(|| "no answer".to_owned());
            eprintln!("switchyard reload: refused; the group runs on unchanged:\n{err}");
            if answer.kind.as_deref() == Some("invalid") {
                ExitCode::from(crate::EXIT_CONFIG)
            } else {
                ExitCode::FAILURE
            }
        }
        Err(err) => {
            eprintln!(
                "switchyard reload: cannot reach the group in {}: {err}",
                dir.display()
            );
            ExitCode::FAILURE
        }
    }
}

/// Reloads the group in `dir` and returns what changed (`switchyard dev`
/// after a rebuild), or why it did not.
pub(crate) fn request_reload(dir: &std::path::Path) -> Result<ReloadReport, String> {
    match ask::<ControlAnswer<ReloadReport>>(dir, "reload", None) {
        Ok(ControlAnswer {
            reloaded: Some(report),
            ..
        }) => Ok(report),
        Ok(answer) => Err(answer.error.unwrap_or_else(|| "no answer".to_owned())),
        Err(err) => Err(format!("cannot reach the group in {}: {err}", dir.display())),
    }
}

#[derive(serde::Deserialize)]
struct Upgraded {
    pid: u32,
}

/// `switchyard upgrade`: exit 0 once the new group serves (the old one
/// drains on its own), 1 when the new one did not start (the old one
/// serves on).
pub(crate) fn upgrade(runtime_dir: Option<PathBuf>) -> ExitCode {
    let dir = match group_dir("upgrade", runtime_dir) {
        Ok(d) => d,
        Err(code) => return code,
    };
    match ask::<ControlAnswer<Upgraded>>(&dir, "upgrade", None) {
        Ok(ControlAnswer {
            upgraded: Some(Upgraded { pid }),
            ..
        }) => {
            println!("upgraded: the new supervisor (pid {pid}) serves; the old group drains and exits");
            ExitCode::SUCCESS
        }
        Ok(answer) => {
            let err = answer.error.unwrap_or_else(|| "no answer".to_owned());
            eprintln!("switchyard upgrade: {err}; the running group serves on");
            ExitCode::FAILURE
        }
        Err(err) => {
            eprintln!(
                "switchyard upgrade: cannot reach the group in {}: {err}",
                dir.display()
            );
            ExitCode::FAILURE
        }
    }
}

pub(crate) fn main(json: bool, runtime_dir: Option<PathBuf>) -> ExitCode {
    let dir = match find_group(runtime_dir) {
        Ok(d) => d,
        Err(msg) => {
            eprintln!("switchyard status: {msg}");
            return ExitCode::FAILURE;
        }
    };
    let reply = match query(&dir) {
        Ok(r) => r,
        Err(err) => {
            eprintln!(
                "switchyard status: cannot reach the group in {}: {err}",
                dir.display()
            );
            return ExitCode::FAILURE;
        }
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&reply).unwrap_or_default());
    } else {
        println!(
            "{:<12} {:<12} {:>4} {:>8} {:<13} {:>8} {:>10} {:>9} {:>7}  WORKERS",
            "ROLE", "NAME", "INST", "PID", "STATE", "RESTARTS", "UPTIME", "IN-FLIGHT", "QUEUED"
        );
        for p in &reply.processes {
            println!(
                "{:<12} {:<12} {:>4} {:>8} {:<13} {:>8} {:>9.1}s {:>9} {:>7}  {}",
                p.role,
                p.name,
                p.instance,
                p.pid.map_or("-".to_owned(), |p| p.to_string()),
                p.state,
                p.restarts,
                p.uptime_ms as f64 / 1000.0,
                p.load.in_flight,
                p.load.queued,
                match (&p.workers, p.load.cluster) {
                    (Some(w), _) => format!("{} x{} (queue {})", w.kind, w.size, w.queue),
                    (None, Some(link)) => format!(
                        "cluster {} ({} peer groups)",
                        serde_json::to_value(link.state)
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_owned))
                            .unwrap_or_default(),
                        link.peers
                    ),
                    (None, None) => String::new(),
                }
            );
        }
    }
    ExitCode::SUCCESS
}
