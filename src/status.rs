//! `switchyard status`: ask a running group's supervisor, over the control
//! socket in its runtime directory, for its process tree.
//!
//! The protocol is one JSON line each way: `{"cmd":"status"}` →
//! `{"processes":[...]}`, so `socat` works as a client too. A request line
//! longer than `supervision::MAX_LINE` bytes (64 KiB) ends the connection.

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

use crate::supervisor::{Event, ProcessInfo, runtime_dir};

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

fn query(dir: &std::path::Path) -> std::io::Result<StatusReply> {
    let mut stream = std::os::unix::net::UnixStream::connect(RuntimePaths::new(dir).control_socket())?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(b"{\"cmd\":\"status\"}\n")?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line)?;
    serde_json::from_str(&line).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
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
                p.workers.as_ref().map_or(String::new(), |w| format!(
                    "{} x{} (queue {})",
                    w.kind, w.size, w.queue
                ))
            );
        }
    }
    ExitCode::SUCCESS
}
