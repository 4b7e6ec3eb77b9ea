//! Scratch directories for groups and router rigs, removed when dropped.

use std::fs::Permissions;
use std::os::unix::fs::PermissionsExt;

use anyhow::Context;
use tempfile::TempDir;

/// A fresh directory under the system's temp dir, private to this user.
/// Short names on purpose: Unix socket paths inside it must stay under the
/// kernel's 108 bytes.
pub(crate) fn scratch(label: &str) -> anyhow::Result<TempDir> {
    tempfile::Builder::new()
        .prefix(&format!("sy-suite-{label}-"))
        .permissions(Permissions::from_mode(0o700))
        .tempdir()
        .with_context(|| format!("cannot create a scratch directory for {label}"))
}
