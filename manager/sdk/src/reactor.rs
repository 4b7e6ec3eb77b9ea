//! The tokio runtime a plugin's libraries find (decision 0120).
//!
//! A plugin is a library with its own copy of tokio: the manager host's
//! runtime, in the host's copy, is invisible to it, so sqlx, reqwest,
//! tokio-postgres or a plain `tokio::time::sleep` would panic ("there is no
//! reactor running"). The SDK therefore owns one current-thread runtime per
//! plugin library, driven by a thread of its own (`plugin-io`, parked in
//! `epoll_wait` while nothing is due), and enters its context while it
//! creates managers, steps them (handlers, their futures, timers,
//! notifications), runs jobs and drops them. Futures stay on the host's
//! thread and the executor of `runtime.rs`; a socket or timer that becomes
//! ready wakes them through the SDK's cross-thread waker, which asks the
//! host for a step. Tasks a library spawns itself (a pool's connection
//! upkeep, hyper's connection tasks) run on the driver thread.

use std::sync::OnceLock;

use tokio::runtime::{Builder, EnterGuard, Handle};

/// The name of the thread that drives the plugin's runtime.
const DRIVER_THREAD: &str = "plugin-io";

/// The plugin's runtime, started at the first call; `None` if it could not
/// be (no thread or no epoll instance to be had): handlers that do not use
/// tokio are served anyway, and those that do panic as they would have.
fn handle() -> Option<&'static Handle> {
    static HANDLE: OnceLock<Option<Handle>> = OnceLock::new();
    HANDLE.get_or_init(start).as_ref()
}

fn start() -> Option<Handle> {
    // `enable_all` turns on the I/O and time drivers when some crate of
    // the plugin enabled tokio's `net` or `time` (cargo unifies the
    // features of the plugin's one tokio); the SDK itself asks only `rt`.
    let runtime = Builder::new_current_thread().enable_all().build().ok()?;
    let handle = runtime.handle().clone();
    // Never joined, never dropped: the library stays loaded until the
    // process exits (the host never unloads a plugin), and so does this.
    std::thread::Builder::new()
        .name(DRIVER_THREAD.into())
        .stack_size(256 * 1024)
        .spawn(move || runtime.block_on(std::future::pending::<()>()))
        .ok()?;
    Some(handle)
}

/// Enters the plugin's runtime on this thread until the guard is dropped.
/// Cheap (a thread-local swap), so it is taken per step, not per process.
pub(crate) fn enter() -> Option<EnterGuard<'static>> {
    handle().map(Handle::enter)
}
