//! The access log: one line per HTTP request (`[log] access`), as text
//! or JSON (`[log] format`), on the group's merged output or appended to a
//! file (decision 0057).
//!
//! Lines are made on the request's task and written by one thread per
//! configuration generation, which drains whatever has queued into one
//! write: a slow disk delays the log, never a request. Lines queue without
//! bound only as far as [`MAX_QUEUED`]; past it they are counted and
//! dropped, and the drop is reported once the writer catches up.

use std::io::Write;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use crate::error::Error;

/// Where access lines go (`[log] access`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum AccessTarget {
    /// No access log (the default).
    #[default]
    Off,
    /// The process's standard output, which the supervisor merges into the
    /// group's, prefixed with the process.
    Stdout,
    /// Appended to this file (created 0640 if missing); reopened on
    /// `switchyard reload`, so a rotated file is let go.
    File(PathBuf),
}

/// `[log]` as the listener uses it.
#[derive(Clone, Debug, Default)]
pub struct AccessLogConfig {
    pub target: AccessTarget,
    /// JSON objects rather than text lines.
    pub json: bool,
}

/// Lines made but not yet written past which new ones are dropped.
const MAX_QUEUED: u64 = 65_536;

/// What one request's line says.
pub(crate) struct Entry<'a> {
    pub(crate) client: Option<IpAddr>,
    pub(crate) method: &'a str,
    pub(crate) path: &'a str,
    pub(crate) status: u16,
    /// Body bytes, when known at the head (a streamed body's are not).
    pub(crate) bytes: Option<u64>,
    pub(crate) duration: Duration,
    pub(crate) request_id: Option<&'a str>,
    pub(crate) trace_id: Option<&'a str>,
}

/// The access log of one configuration generation.
pub(crate) struct AccessLog {
    lines: mpsc::Sender<String>,
    json: bool,
    queued: Arc<AtomicU64>,
    dropped: Arc<AtomicU64>,
}

impl AccessLog {
    /// The log `config` asks for, or `None` when it is off. A file that
    /// cannot be opened is an error naming it.
    pub(crate) fn open(config: &AccessLogConfig) -> Result<Option<AccessLog>, Error> {
        let mut out: Box<dyn Write + Send> = match &config.target {
            AccessTarget::Off => return Ok(None),
            AccessTarget::Stdout => Box::new(std::io::stdout()),
            AccessTarget::File(path) => {
                use std::os::unix::fs::OpenOptionsExt;
                let file = std::fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .mode(0o640)
                    .open(path)
                    .map_err(|e| Error::Config(format!("log.access: cannot open {}: {e}", path.display())))?;
                Box::new(file)
            }
        };
        let (lines, rx) = mpsc::channel::<String>();
        let queued = Arc::new(AtomicU64::new(0));
        let dropped = Arc::new(AtomicU64::new(0));
        let (q, d) = (queued.clone(), dropped.clone());
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || {
                let mut batch = String::new();
                // Ends when the generation's last sender is gone.
                while let Ok(line) = rx.recv() {
                    batch.push_str(&line);
                    let mut n = 1;
                    while let Ok(more) = rx.try_recv() {
                        batch.push_str(&more);
                        n += 1;
                    }
                    q.fetch_sub(n, Ordering::Relaxed);
                    // Whole lines in one write: files opened O_APPEND by
                    // several listener processes never interleave them.
                    if let Err(err) = out.write_all(batch.as_bytes()).and_then(|()| out.flush()) {
                        tracing::warn!(%err, "access log not written");
                    }
                    batch.clear();
                    let lost = d.swap(0, Ordering::Relaxed);
                    if lost > 0 {
                        tracing::warn!(lost, "access log lines dropped: the log fell behind");
                    }
                }
            })
            .map_err(Error::Io)?;
        Ok(Some(AccessLog {
            lines,
            json: config.json,
            queued,
            dropped,
        }))
    }

    /// Queues the line of one request.
    pub(crate) fn log(&self, entry: &Entry<'_>) {
        if self.queued.fetch_add(1, Ordering::Relaxed) >= MAX_QUEUED {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let line = if self.json { json(entry) } else { text(entry) };
        if self.lines.send(line).is_err() {
            self.queued.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

fn now() -> String {
    format!("{:.3}", jiff::Timestamp::now())
}

/// `TIME CLIENT "METHOD PATH" STATUS BYTES DURATIONms id=ID trace=TRACE`,
/// a missing value as `-`. What the client chose (method, path, request
/// id) is escaped as nginx does ([`escaped`]), so a line always parses the
/// same way whatever the request held.
fn text(e: &Entry<'_>) -> String {
    use std::fmt::Write;
    let mut line = String::with_capacity(160);
    let _ = write!(line, "{} ", now());
    match e.client {
        Some(ip) => {
            let _ = write!(line, "{ip} ");
        }
        None => line.push_str("- "),
    }
    let _ = write!(
        line,
        "\"{} {}\" {} ",
        Escaped(e.method),
        Escaped(e.path),
        e.status
    );
    match e.bytes {
        Some(b) => {
            let _ = write!(line, "{b} ");
        }
        None => line.push_str("- "),
    }
    let _ = writeln!(
        line,
        "{:.3}ms id={} trace={}",
        e.duration.as_secs_f64() * 1000.0,
        Escaped(e.request_id.unwrap_or("-")),
        Escaped(e.trace_id.unwrap_or("-"))
    );
    line
}

/// A client's text in a text access line: `"`, `\`, spaces, control
/// characters and bytes past ASCII become `\xHH`, as nginx writes them,
/// so a quote in a path cannot end the quoted field early and a line
/// cannot be forged or split.
struct Escaped<'a>(&'a str);

impl std::fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let plain = |b: &u8| *b != b'"' && *b != b'\\' && (0x21..0x7f).contains(b);
        // Runs of plain ASCII go out whole; every other byte, escaped.
        for run in self.0.as_bytes().split_inclusive(|b| !plain(b)) {
            let (last, head) = match run.split_last() {
                Some((last, head)) if !plain(last) => (Some(last), head),
                _ => (None, run),
            };
            f.write_str(std::str::from_utf8(head).unwrap_or_default())?;
            if let Some(b) = last {
                write!(f, "\\x{b:02X}")?;
            }
        }
        Ok(())
    }
}

fn json(e: &Entry<'_>) -> String {
    let mut line = serde_json::json!({
        "time": now(),
        "log": "access",
        "client": e.client.map(|ip| ip.to_string()),
        "method": e.method,
        "path": e.path,
        "status": e.status,
        "bytes": e.bytes,
        "duration_ms": e.duration.as_secs_f64() * 1000.0,
        "request_id": e.request_id,
        "trace_id": e.trace_id,
    })
    .to_string();
    line.push('\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> Entry<'static> {
        Entry {
            client: Some("192.0.2.1".parse().unwrap()),
            method: "GET",
            path: "/hello/a%20b",
            status: 200,
            bytes: Some(17),
            duration: Duration::from_micros(1234),
            request_id: Some("r1"),
            trace_id: None,
        }
    }

    #[test]
    fn lines() {
        let t = text(&entry());
        let (_, rest) = t.split_once(' ').unwrap();
        assert_eq!(
            rest,
            "192.0.2.1 \"GET /hello/a%20b\" 200 17 1.234ms id=r1 trace=-\n"
        );
        let j: serde_json::Value = serde_json::from_str(&json(&entry())).unwrap();
        assert_eq!(j["status"], 200);
        assert_eq!(j["request_id"], "r1");
        assert_eq!(j["trace_id"], serde_json::Value::Null);
        assert!(j["time"].as_str().unwrap().ends_with('Z'));
    }

    /// A quote, a backslash, a space, a newline or a byte past ASCII in
    /// what the client sent cannot break the line's fields.
    #[test]
    fn client_text_is_escaped() {
        let mut e = entry();
        e.path = "/a\"b\\c d\né";
        e.request_id = Some("x\"y");
        let t = text(&e);
        let (_, rest) = t.split_once(' ').unwrap();
        assert_eq!(
            rest,
            "192.0.2.1 \"GET /a\\x22b\\x5Cc\\x20d\\x0A\\xC3\\xA9\" 200 17 1.234ms id=x\\x22y trace=-\n"
        );
        assert_eq!(t.matches('\n').count(), 1);
    }
}
