//! The NATS bridge: joins Switchyard groups on several machines.
//!
//! It runs inside the router process (docs/decisions/0070-cluster-bridge-in-the-router.md),
//! on its own tasks, at the far end of the router's port to other groups
//! (`switchyard_proto::remote`; the server's `roles.rs` connects the two,
//! so this crate and the router never name each other). The router hands
//! it what no local manager serves (requests, responses to requests that
//! came from NATS, every notification emitted here) and gets back what the cluster sends (responses to its
//! calls, calls for the types it serves, notifications emitted elsewhere,
//! the HTTP routes other groups declare). It never holds the router's table
//! lock and the router never waits on NATS: a frame for the bridge is
//! queued, and a full queue or a lost link is an immediate 503.
//!
//! What it owns: the NATS connection (reconnects with back-off,
//! resubscribes), the subjects (every one under the cluster name), the
//! conversion of envelopes to NATS messages and back (shared-memory bodies
//! copied in, up to the server's `max_payload`), and the replies owed to
//! other groups. What it does not: choosing local or remote (the router's
//! table does, local first), deadlines of local requests (the router's
//! sweeper).
//!
//! # Layout
//! - [`config`]: `[cluster]` (URLs, credentials, name, shared types) and
//!   its validation.
//! - `wire`: envelope ↔ NATS message (headers and body).
//! - [`bridge`]: the connection, the subscriptions and the tasks that move
//!   frames between the router and NATS.

#![forbid(unsafe_code)]

pub mod bridge;
pub mod config;
mod wire;

pub use bridge::{HEARTBEAT, options, probe, start};
pub use config::Config;

/// Why the bridge could not start or connect.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server turned the credentials down: a configuration error, not
    /// something a retry fixes.
    #[error(
        "cluster: the NATS server refused the credentials ({0}); check cluster.user/password, cluster.token or cluster.nkey_seed_file"
    )]
    Refused(String),
    /// The server could not be reached (or TLS failed): the bridge keeps
    /// trying in the background.
    #[error("cluster: NATS not reachable: {0}")]
    Unreachable(String),
    /// A file the configuration names could not be read.
    #[error("cluster: {0}")]
    Config(String),
}
