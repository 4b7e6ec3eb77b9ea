//! Why a WebSocket read was refused, and the limit it names: below both
//! readers that refuse (`frames`' guard and `deflate`'s inflater), so
//! neither imports the other for it; `ws` maps each to its close code.

use std::io;

/// Empty continuation frames one message may carry; more fail the read.
pub(crate) const MAX_EMPTY_FRAGMENTS: u32 = 16;

/// The read errors the frame guard (`frames`) and the inflater (`deflate`)
/// fail with.
#[derive(Debug, thiserror::Error, PartialEq, Eq, Clone, Copy)]
pub(crate) enum Refused {
    #[error("more than {MAX_EMPTY_FRAGMENTS} empty continuation frames in one message")]
    EmptyFragments,
    #[error("a message was not finished within its deadline")]
    Unfinished,
    /// permessage-deflate: a message inflates past the message limit.
    #[error("a compressed message inflates past the message limit")]
    TooBig,
    /// permessage-deflate: a compressed message that does not inflate.
    #[error("a compressed message is not valid deflate data")]
    Corrupt,
    /// permessage-deflate: RSV1 where the extension does not allow it, or
    /// a compressed frame unmasked.
    #[error("a frame the compression extension does not allow")]
    Protocol,
}

/// Which of these refusals a read error is, if any.
pub(crate) fn refusal(err: &io::Error) -> Option<Refused> {
    err.get_ref()?.downcast_ref::<Refused>().copied()
}
