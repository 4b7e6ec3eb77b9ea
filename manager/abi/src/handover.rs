//! How shared-memory descriptors change hands across the boundary.
//!
//! Host and plugin live in one process, so a descriptor number means the
//! same thing on both sides. A message that carries one ([`RawStream`],
//! [`RawBody`]) carries its ownership: the sender gives it up with a
//! `release_*` function, and the receiver takes it back exactly once with
//! an `adopt_*` function. A message that is dropped unread leaks its
//! descriptors rather than risk closing a number twice.

use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd};

use switchyard_proto::{Payload, ShmBody, StreamHandle};

use crate::messages::{RawBody, RawStream};

/// Gives up a pipe's descriptors for a message; they must be adopted with
/// [`adopt_stream`] exactly once on the other side.
pub fn release_stream(handle: StreamHandle) -> std::io::Result<RawStream> {
    let (ring, wake, length) = handle.into_parts().map_err(std::io::Error::other)?;
    Ok(RawStream {
        ring: ring.into_raw_fd(),
        wake: wake.into_raw_fd(),
        length,
    })
}

/// Gives up a duplicate of a shared-memory body's descriptor (the pool, or
/// the plugin's shared body, keeps its own) for a response body.
pub fn release_body(body: &ShmBody) -> std::io::Result<RawBody> {
    let fd = body.fd_clone().map_err(std::io::Error::other)?.into_raw_fd();
    let len = body.len();
    Ok(if body.is_pooled() {
        RawBody::Pooled { fd, len }
    } else {
        RawBody::Sealed { fd, len }
    })
}

/// Takes ownership of a response body released by [`release_stream`] or
/// [`release_body`]; a sealed one must be sealed.
pub fn adopt_body(raw: RawBody) -> switchyard_proto::Result<Payload> {
    match raw {
        RawBody::Stream(raw) => Ok(Payload::Stream(adopt_stream(raw))),
        RawBody::Pooled { fd, len } => {
            // SAFETY: as in `adopt_stream`: released once, adopted once.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            ShmBody::adopt_pooled(fd, len).map(Payload::Shm)
        }
        RawBody::Sealed { fd, len } => {
            // SAFETY: as in `adopt_stream`: released once, adopted once.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            ShmBody::adopt(fd, len).map(Payload::Shm)
        }
    }
}

/// Takes ownership of descriptors released by [`release_stream`].
pub fn adopt_stream(raw: RawStream) -> StreamHandle {
    // SAFETY: `raw` came from `release_stream` in this process, and the
    // message carrying it is consumed once: nothing else owns or closes
    // these descriptors.
    let (ring, wake) = unsafe { (OwnedFd::from_raw_fd(raw.ring), OwnedFd::from_raw_fd(raw.wake)) };
    StreamHandle::from_parts(ring, wake, raw.length)
}
