//! The built-in managers: the Store (shared key/value state) and the
//! Scheduler (timed events), on one SQLite database in the group's data
//! directory, or, when the group is clustered, in JetStream buckets every
//! group shares (decisions 0135, 0140).
//!
//! They are managers like any other, written against the SDK: the
//! `switchyard` binary links this crate and runs each in a manager process
//! of its own (`[[managers]] builtin = "store"`), supervised and restarted
//! like a plugin, reached through the router by every manager and by
//! WebSocket and gRPC clients. Their protocol — the events and replies —
//! is defined once, in `switchyard-events` (re-exported by the SDK as
//! `switchyard_manager::store`, `switchyard_manager::scheduler`, decision
//! 0144); this crate only serves it. The data
//! lives in the database, not in memory, so millions of keys or jobs take
//! flat memory and survive a `kill -9` and a restart of the group.
//!
//! # Layout
//! - `db`: opening the shared database (lock, WAL, durability, schema).
//! - `store`: the `store` manager.
//! - `scheduler`: the `scheduler` manager and its timing;
//!   `scheduler/jetstream`: its jobs in a bucket, fired by a lease's holder.
//! - `nats`: the link to JetStream both keep when clustered.
//! - this file: the error type, settings parsing, and [`vtable`], the
//!   table the binary hands to the manager host.

#![forbid(unsafe_code)]

mod db;
mod nats;
pub mod scheduler;
pub mod store;

use std::path::PathBuf;

pub use scheduler::Scheduler;
pub use store::Store;

/// The names a `[[managers]]` entry's `builtin` key takes.
pub const BUILTINS: &[&str] = &[
    <Store as switchyard_manager::Manager>::NAME,
    <Scheduler as switchyard_manager::Manager>::NAME,
];

/// The config key the supervisor fills in with the group's data directory.
pub const DATA_DIR_KEY: &str = "data_dir";

/// The Store's `builtin` name.
pub const STORE: &str = <Store as switchyard_manager::Manager>::NAME;

/// The config key the supervisor fills in with `[cluster]`, when the group
/// has one: the JetStream back end connects through it.
pub const CLUSTER_KEY: &str = "cluster";

/// Why a built-in cannot start.
#[derive(Debug, thiserror::Error)]
pub enum BuiltinError {
    #[error("data directory {dir}: {message}")]
    DataDir { dir: PathBuf, message: String },
    #[error(
        "data directory {dir} is in use by another {role} (another group, or another instance, holds {dir}/{role}.lock); give each group its own --data-dir"
    )]
    InUse { dir: PathBuf, role: String },
    #[error("cannot use the database {path}: {message}")]
    Database { path: PathBuf, message: String },
    #[error("config.{key}: {message}")]
    Config { key: String, message: String },
}

impl From<BuiltinError> for switchyard_manager::Error {
    fn from(e: BuiltinError) -> Self {
        switchyard_manager::Error::internal(e.to_string())
    }
}

/// A manager's `config` table as `T`, a mismatch naming the key.
pub(crate) fn settings<T: serde::de::DeserializeOwned>(value: &serde_json::Value) -> Result<T, BuiltinError> {
    let value = if value.is_null() {
        serde_json::Value::Object(Default::default())
    } else {
        value.clone()
    };
    serde_path_to_error::deserialize(value).map_err(|e| BuiltinError::Config {
        key: e.path().to_string(),
        message: e.into_inner().to_string(),
    })
}

/// Checks a positive setting.
pub(crate) fn positive(key: &str, value: u64) -> Result<(), BuiltinError> {
    if value == 0 {
        return Err(BuiltinError::Config {
            key: key.to_owned(),
            message: "must be positive".to_owned(),
        });
    }
    Ok(())
}

static MANAGERS: &[switchyard_manager::abi::ManagerEntry] = &[
    switchyard_manager::export::entry::<Store>(),
    switchyard_manager::export::entry::<Scheduler>(),
];

static VTABLE: switchyard_manager::abi::VTable = switchyard_manager::abi::VTable {
    abi_version: switchyard_manager::abi::ABI_VERSION,
    panic_strategy: switchyard_manager::abi::panic_strategy!(),
    managers: MANAGERS.as_ptr(),
    manager_count: MANAGERS.len(),
    free: switchyard_manager::abi::free_buffer,
};

/// The built-ins' table of manager types, for `Library::linked`. Not
/// exported under the plugin symbol names: the binary links the demo's
/// table too, and this crate is never a loadable plugin.
pub extern "C" fn vtable() -> *const switchyard_manager::abi::VTable {
    &VTABLE
}
