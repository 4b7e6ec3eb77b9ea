//! The group's private runtime directory (mode 0700): its sockets live here,
//! and `switchyard status` finds the group through it.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use switchyard_proto::process::RuntimePaths;

/// The directory under which groups without `--runtime-dir` get theirs.
pub(crate) fn default_base() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir).join("switchyard"),
        _ => std::env::temp_dir().join(format!("switchyard-{}", nix::unistd::geteuid())),
    }
}

pub(crate) struct RuntimeDir {
    path: PathBuf,
    /// We made it, so we remove it whole; otherwise only our sockets.
    created: bool,
}

fn private_dir(path: &Path) -> anyhow::Result<bool> {
    let created = match std::fs::DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
        Err(e) => anyhow::bail!("cannot create {}: {e}", path.display()),
    };
    let meta = std::fs::metadata(path)?;
    if !meta.is_dir() {
        anyhow::bail!("{} is not a directory", path.display());
    }
    if meta.uid() != nix::unistd::geteuid().as_raw() {
        anyhow::bail!("{} belongs to another user", path.display());
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))?;
    Ok(created)
}

impl RuntimeDir {
    pub(crate) fn prepare(requested: Option<PathBuf>) -> anyhow::Result<RuntimeDir> {
        let path = match requested {
            Some(p) => p,
            None => {
                let base = default_base();
                if let Some(parent) = base.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                private_dir(&base)?;
                base.join(std::process::id().to_string())
            }
        };
        if let Some(parent) = path.parent()
            && !parent.as_os_str().is_empty()
        {
            std::fs::create_dir_all(parent)?;
        }
        let created = private_dir(&path)?;
        let control = RuntimePaths::new(&path).control_socket();
        if std::os::unix::net::UnixStream::connect(&control).is_ok() {
            anyhow::bail!("a group is already running in {}", path.display());
        }
        Ok(RuntimeDir { path, created })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn paths(&self) -> RuntimePaths {
        RuntimePaths::new(&self.path)
    }

    /// Removes what the group left: the directory if we made it, else our sockets.
    pub(crate) fn remove(&self) {
        if self.created {
            if let Err(err) = std::fs::remove_dir_all(&self.path) {
                tracing::warn!(%err, dir = %self.path.display(), "cannot remove runtime dir");
            }
        } else {
            let p = self.paths();
            for sock in [p.broker_socket(), p.router_socket(), p.control_socket()] {
                let _ = std::fs::remove_file(sock);
            }
        }
    }
}

/// Binds a Unix listening socket at `path`, replacing a stale socket file.
pub(crate) fn bind_unix(path: &Path) -> anyhow::Result<std::os::unix::net::UnixListener> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => anyhow::bail!("cannot remove stale {}: {e}", path.display()),
    }
    std::os::unix::net::UnixListener::bind(path)
        .map_err(|e| anyhow::anyhow!("cannot bind {}: {e}", path.display()))
}
