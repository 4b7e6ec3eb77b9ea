//! The group's private runtime directory (mode 0700): its sockets live here,
//! and `switchyard status` finds the group through it.
//!
//! A directory the group creates is removed whole when it stops. One that
//! existed before (`--runtime-dir`) must already be private to this user:
//! it is used as it is, never quietly re-permissioned, and when the group
//! stops only the files the group made in it are removed. [`RuntimeDir`] is
//! a guard: it cleans up when dropped, on every path out of `up`, unless
//! told to [`keep`](RuntimeDir::keep) it for the group it was handed to.

use std::os::unix::fs::{DirBuilderExt, MetadataExt};
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
    /// We made it, so we remove it whole; otherwise only `owned`.
    created: bool,
    /// The files the group makes in it (sockets).
    owned: Vec<PathBuf>,
    /// Left in place when dropped: removed already, or another group's now.
    kept: bool,
}

/// Creates `path` with mode 0700, or checks that the existing one is a
/// directory (not a symlink to one) of ours that nobody else can enter.
/// Returns whether it was created.
fn private_dir(path: &Path) -> anyhow::Result<bool> {
    let created = match std::fs::DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
        Err(e) => anyhow::bail!("cannot create {}: {e}", path.display()),
    };
    let meta = std::fs::symlink_metadata(path)?;
    if !meta.is_dir() {
        anyhow::bail!("{} is not a directory (a symlink or a file)", path.display());
    }
    if meta.uid() != nix::unistd::geteuid().as_raw() {
        anyhow::bail!("{} belongs to another user", path.display());
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        // The group's sockets would be reachable by others; changing the
        // mode of a directory someone else chose is not ours to do.
        anyhow::bail!(
            "{} is open to other users (mode {mode:04o}): the group's sockets must be private. \
             Make it private (chmod 700 {}) or name a directory that does not exist yet",
            path.display(),
            path.display()
        );
    }
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
        let paths = RuntimePaths::new(&path);
        if std::os::unix::net::UnixStream::connect(paths.control_socket()).is_ok() {
            anyhow::bail!("a group is already running in {}", path.display());
        }
        if !created {
            tracing::info!(dir = %path.display(), "using an existing runtime dir; only the group's own files in it are removed at stop");
        }
        Ok(RuntimeDir {
            owned: vec![
                paths.broker_socket(),
                paths.router_socket(),
                paths.control_socket(),
            ],
            path,
            created,
            kept: false,
        })
    }

    /// Whether the group made the directory (and removes it whole).
    pub(crate) fn created(&self) -> bool {
        self.created
    }

    /// Takes over the removal of the whole directory: an upgrade's new
    /// group, in the directory its predecessor made.
    pub(crate) fn adopt(&mut self) {
        self.created = true;
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn paths(&self) -> RuntimePaths {
        RuntimePaths::new(&self.path)
    }

    /// Records a file a child makes in the directory, for [`Self::remove`].
    pub(crate) fn own(&mut self, path: PathBuf) {
        if self.owned.contains(&path) {
            return;
        }
        self.owned.push(path);
    }

    /// Leaves the directory as it is when dropped: an upgrade handed it to
    /// the new group, or a failed upgrade leaves it to the old one.
    pub(crate) fn keep(&mut self) {
        self.kept = true;
    }

    /// Removes what the group left: the directory if we made it, else the
    /// files we made in it. Once.
    pub(crate) fn remove(&mut self) {
        if std::mem::replace(&mut self.kept, true) {
            return;
        }
        if self.created {
            if let Err(err) = std::fs::remove_dir_all(&self.path) {
                tracing::warn!(%err, dir = %self.path.display(), "cannot remove runtime dir");
            }
            return;
        }
        for file in &self.owned {
            match std::fs::remove_file(file) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => tracing::warn!(%err, file = %file.display(), "cannot remove"),
            }
        }
    }
}

impl Drop for RuntimeDir {
    fn drop(&mut self) {
        self.remove();
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("switchyard-rtdir-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    /// Whatever way `up` leaves (an error returned by `?` included), the
    /// directory it made goes; one kept for another group stays.
    #[test]
    fn a_dropped_guard_removes_what_the_group_made_unless_kept() {
        let made = scratch("guard-made");
        drop(RuntimeDir::prepare(Some(made.clone())).unwrap());
        assert!(!made.exists(), "removed on drop");

        let kept = scratch("guard-kept");
        let mut rt = RuntimeDir::prepare(Some(kept.clone())).unwrap();
        let _broker = bind_unix(&rt.paths().broker_socket()).unwrap();
        rt.keep();
        drop(rt);
        assert!(kept.join("broker.sock").exists(), "kept with its sockets");
        std::fs::remove_dir_all(&kept).unwrap();
    }

    #[test]
    fn an_existing_dir_open_to_others_is_refused_and_left_as_it_was() {
        let dir = scratch("open");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let err = RuntimeDir::prepare(Some(dir.clone())).err().unwrap().to_string();
        assert!(err.contains("mode 0755") && err.contains("chmod 700"), "{err}");
        let mode = std::fs::metadata(&dir).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o755, "the mode was changed");
        std::fs::remove_dir(&dir).unwrap();
    }

    #[test]
    fn a_symlink_is_refused() {
        let dir = scratch("link-target");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let link = scratch("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        let err = RuntimeDir::prepare(Some(link.clone())).err().unwrap().to_string();
        assert!(err.contains("not a directory"), "{err}");
        std::fs::remove_file(&link).unwrap();
        std::fs::remove_dir(&dir).unwrap();
    }

    #[test]
    fn an_existing_private_dir_keeps_everything_but_the_groups_files() {
        let dir = scratch("private");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::write(dir.join("mine.txt"), "keep").unwrap();
        let mut rt = RuntimeDir::prepare(Some(dir.clone())).unwrap();
        rt.own(dir.join("workers-x-0.sock"));
        let _broker = bind_unix(&rt.paths().broker_socket()).unwrap();
        let _workers = bind_unix(&dir.join("workers-x-0.sock")).unwrap();
        rt.remove();
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left, ["mine.txt"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
