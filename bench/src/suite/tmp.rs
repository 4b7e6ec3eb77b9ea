//! Scratch directories for groups and router rigs, removed when dropped.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::Context;

pub(crate) struct TempDir(PathBuf);

impl TempDir {
    /// A fresh directory under the system's temp dir, private to this user.
    /// Short names on purpose: Unix socket paths inside it must stay under
    /// the kernel's 108 bytes.
    pub(crate) fn new(label: &str) -> anyhow::Result<TempDir> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "sy-suite-{}-{}-{label}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        Ok(TempDir(path))
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
