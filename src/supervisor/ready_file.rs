//! `switchyard up --ready-file PATH`: once the group serves, a JSON object
//! naming every door it bound (port 0 resolved) and the supervisor's pid,
//! for scripts and test harnesses (docs/decisions/0150-readiness-file.md).
//!
//! The file appears whole (written beside itself, then renamed) so that a
//! reader that sees it can parse it; it is removed when the supervisor
//! that wrote it exits, unless a newer supervisor (an upgrade) has
//! replaced it since.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// What the file says: the addresses the group answers on.
pub(crate) struct Doors<'a> {
    pub(crate) tls: bool,
    pub(crate) http: SocketAddr,
    pub(crate) grpc: Option<SocketAddr>,
    pub(crate) http3: Option<SocketAddr>,
    pub(crate) admin: Option<SocketAddr>,
    pub(crate) runtime_dir: &'a Path,
}

/// The file's text. The members are documented in docs/configuration.md
/// ("Readiness").
fn render(doors: &Doors<'_>, pid: u32) -> String {
    let scheme = if doors.tls { "https" } else { "http" };
    let addr = |a: Option<SocketAddr>| a.map(|a| a.to_string());
    let json = serde_json::json!({
        "ready": true,
        "pid": pid,
        "scheme": scheme,
        "http": doors.http.to_string(),
        "grpc": addr(doors.grpc),
        "http3": addr(doors.http3),
        "admin": addr(doors.admin),
        "runtime_dir": doors.runtime_dir,
    });
    let mut text = json.to_string();
    text.push('\n');
    text
}

/// Writes `path` as a whole: the text goes to a file beside it, which is
/// then renamed over it.
pub(crate) fn write(path: &Path, doors: &Doors<'_>) -> std::io::Result<()> {
    let mut partial = path.as_os_str().to_owned();
    partial.push(format!(".{}.partial", std::process::id()));
    let partial = PathBuf::from(partial);
    std::fs::write(&partial, render(doors, std::process::id()))?;
    std::fs::rename(&partial, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&partial);
    })
}

/// Removes whatever is at `path` before the group starts.
pub(crate) fn remove_stale(path: &Path) {
    match std::fs::remove_file(path) {
        Ok(()) => tracing::info!(path = %path.display(), "removed a ready file left by an earlier group"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => tracing::warn!(%err, path = %path.display(), "cannot remove an old ready file"),
    }
}

/// Removes `path` if this process wrote it: after an upgrade it names the
/// new supervisor, which keeps it.
pub(crate) fn remove_if_ours(path: &Path) {
    let Ok(text) = std::fs::read_to_string(path) else {
        return;
    };
    let pid = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v["pid"].as_u64());
    if pid == Some(u64::from(std::process::id())) {
        let _ = std::fs::remove_file(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_names_every_door_and_goes_with_its_writer() {
        let dir = std::env::temp_dir().join(format!("switchyard-ready-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ready.json");
        let doors = Doors {
            tls: true,
            http: "127.0.0.1:8443".parse().unwrap(),
            grpc: None,
            http3: Some("127.0.0.1:8443".parse().unwrap()),
            admin: Some("127.0.0.1:9000".parse().unwrap()),
            runtime_dir: Path::new("/run/sy"),
        };
        write(&path, &doors).unwrap();
        let seen: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(seen["ready"], true);
        assert_eq!(seen["pid"], std::process::id());
        assert_eq!(seen["scheme"], "https");
        assert_eq!(seen["http"], "127.0.0.1:8443");
        assert_eq!(seen["grpc"], serde_json::Value::Null);
        assert_eq!(seen["http3"], "127.0.0.1:8443");
        assert_eq!(seen["admin"], "127.0.0.1:9000");
        assert_eq!(seen["runtime_dir"], "/run/sy");
        // Nothing left beside it.
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);

        // Another supervisor's file (an upgrade's) stays.
        std::fs::write(&path, r#"{"pid":1}"#).unwrap();
        remove_if_ours(&path);
        assert!(path.exists());
        write(&path, &doors).unwrap();
        remove_if_ours(&path);
        assert!(!path.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
