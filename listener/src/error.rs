//! The listener's one error type: what stops it, or refuses a
//! configuration before it is used.

/// Errors that stop the listener.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("listener socket: {0}")]
    Io(#[from] std::io::Error),
    #[error("invalid listener configuration: {0}")]
    Config(String),
    /// A certificate, key or CA bundle that cannot be used; the message
    /// names the file.
    #[error("TLS: {0}")]
    Tls(String),
}
