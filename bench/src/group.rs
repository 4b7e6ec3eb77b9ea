//! A group started by a benchmark binary: `switchyard up` waited on through
//! its `--ready-file` (decision 0150), never through its human output.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use anyhow::Context;
use switchyard_manager_host::testing::wait_ready;

/// How long a group may take to serve: its children start one after the
/// other, each with `start_timeout_ms` (10 s by default).
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Spawns `command`, a `switchyard up` given `--ready-file ready_file`,
/// and returns it with its listener's address once it serves. A group
/// that does not serve within a minute is killed.
pub fn spawn_ready(command: &mut Command, ready_file: &Path) -> anyhow::Result<(Child, SocketAddr)> {
    let mut child = command
        .spawn()
        .with_context(|| format!("cannot run {}", command.get_program().to_string_lossy()))?;
    match wait_ready(&mut child, ready_file, READY_TIMEOUT) {
        Ok(ready) => Ok((child, ready.http)),
        Err(err) => {
            let _ = child.kill();
            let _ = child.wait();
            anyhow::bail!("the group did not become ready: {err}")
        }
    }
}
