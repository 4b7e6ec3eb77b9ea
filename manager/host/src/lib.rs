//! The manager host: the process that runs one manager instance of a plugin.
//!
//! It sits at the end of the data path (listener → broker → router →
//! here): it loads the plugin library ([`loader`]), declares the manager to
//! the router, and turns each batch of frames into one step of the plugin
//! and each output back into frames ([`serve`]); the manager's worker pool
//! (`switchyard-worker`) runs its jobs. Plugins never link this crate: they
//! speak to it only through `switchyard-manager-abi`.
//!
//! # Layout
//! - [`loader`]: opening a library, checking its ABI, creating instances
//!   (all the unsafe code of the host but the watchdog's `_exit`).
//! - [`serve`]: the host loop: router connection, request bookkeeping,
//!   calls, notifications, jobs, timers.
//! - `callbacks`: what the plugin calls back into the host for (log
//!   lines, wake-ups), shared by the loader and the host loop.
//! - `watchdog`: the thread that kills the process when a handler does not
//!   return (`group.handler_timeout_ms`).
//! - [`testing`]: [`Group`](testing::Group), a real group for a plugin's
//!   integration tests.

mod callbacks;
pub mod loader;
mod returns;
pub mod serve;
pub mod testing;
mod watchdog;

pub use loader::{Library, LoadError, Plugin};
pub use serve::{Config, Workers, run};
pub use switchyard_manager_abi as abi;
