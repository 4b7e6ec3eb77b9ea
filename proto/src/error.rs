use std::io;

/// Errors of the wire layer: bad bytes from a peer, or a broken connection.
///
/// A decode error is the peer's fault and closes only that connection; an
/// I/O error means the connection is gone and a reconnect may help.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The peer announced a frame longer than the configured maximum.
    #[error("frame of {len} bytes exceeds the maximum of {max} bytes")]
    FrameTooLarge { len: usize, max: usize },
    /// A frame's structure is inconsistent (header longer than the frame).
    #[error("malformed frame: {0}")]
    Malformed(&'static str),
    /// The peer attached descriptors no frame claims, or claimed some it
    /// did not send (the connection is closed; the descriptors with it).
    #[error("descriptors out of place: {0}")]
    Descriptors(String),
    /// The bincode body of a frame could not be decoded.
    #[error("undecodable frame body: {0}")]
    Decode(String),
    /// A value could not be encoded (never expected for our own types).
    #[error("could not encode value: {0}")]
    Encode(String),
    /// The connection ended in the middle of a frame.
    #[error("connection closed mid-frame ({0} bytes buffered)")]
    Truncated(usize),
    /// The peer is not allowed on this socket.
    #[error("peer refused: {0}")]
    PeerRefused(String),
    /// The far end of a connection or queue is gone.
    #[error("connection closed")]
    Closed,
    /// Creating or mapping a shared-memory body would exceed the budget.
    #[error("shared-memory budget exhausted ({len} more bytes would pass {budget})")]
    ShmBudget { len: u64, budget: u64 },
    /// A streaming pipe ended before its end: the other side gave up or
    /// its process died.
    #[error("stream aborted: {0}")]
    PipeAborted(&'static str),
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
