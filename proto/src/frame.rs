//! Frames: how envelopes are laid out on a byte stream.
//!
//! ```text
//! u32 LE  frame length (bytes after this field)
//! u32 LE  header length; its top bit (FD_MARK) set: descriptors attached here
//! header  bincode of the envelope without its inline payload
//! payload the inline payload bytes, raw
//! ```
//!
//! Descriptors (`SCM_RIGHTS`) travel out of band, attached by the writer to
//! the first byte of a batch; that batch's first frame carries
//! [`FD_MARK`], and its frames claim the descriptors in order. The mark is
//! what lets a reader tell which descriptors belong to which frames
//! (`transport::FrameReader`): without it, a descriptor a peer attached to
//! a frame that claims none would shift onto the next frame that does.
//!
//! The payload is not bincode-encoded: the writer hands it to the kernel as
//! its own `IoSlice`, and the reader returns it as a `Bytes` slice of the
//! receive buffer, so no hop copies a body to forward it.
//!
//! Parsing is two-phase: [`check`] says whether a whole frame is buffered
//! without allocating, and [`parse`] runs only on a whole frame.

use bytes::{BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};

use std::collections::VecDeque;
use std::os::fd::OwnedFd;

use crate::event::{Deadline, Envelope, EventType, Kind, Meta, Origin, Payload, RequestContext};
use crate::pipe::StreamHandle;
use crate::shm::ShmBody;
use crate::{Error, Result, codec};

/// Default maximum frame size: bodies larger than this go through shared
/// memory (decision 0007) or, past a segment, a pipe (decision 0010).
pub const DEFAULT_MAX_FRAME: usize = 1024 * 1024;

/// Bytes of the two length fields.
pub const PREFIX_LEN: usize = 8;

/// The top bit of the header-length field: the frame opens a batch whose
/// descriptors were attached to its first byte. Header lengths stay below it.
pub const FD_MARK: u32 = 1 << 31;

/// Sets [`FD_MARK`] on the frame that starts `frame` (its prefix at least).
pub fn mark_descriptors(frame: &mut [u8]) {
    if frame.len() >= PREFIX_LEN {
        let word = u32::from_le_bytes([frame[4], frame[5], frame[6], frame[7]]) | FD_MARK;
        frame[4..8].copy_from_slice(&word.to_le_bytes());
    }
}

/// Whether the whole frame at the start of `frame` carries [`FD_MARK`].
pub fn is_marked(frame: &[u8]) -> bool {
    frame.len() >= PREFIX_LEN && u32::from_le_bytes([frame[4], frame[5], frame[6], frame[7]]) & FD_MARK != 0
}

#[derive(Serialize)]
struct HeaderRef<'a> {
    event_type: EventType,
    kind: Kind,
    correlation: u64,
    origin: Origin,
    deadline: Deadline,
    status: u16,
    token: u64,
    meta: &'a Meta,
    body: BodyHead,
    // Last: a header from a build without it ends early and is refused
    // (decision 0146).
    context: &'a RequestContext,
}

/// Where the body is. Shared-memory bodies and pipes have their descriptors
/// out of band, in the order of their frames.
#[derive(Serialize, Deserialize)]
enum BodyHead {
    /// Inline bytes after the header.
    Inline,
    /// A sealed memfd of this many bytes (one descriptor).
    Shm(u64),
    /// A body of this many bytes in a reusable pool segment (one descriptor).
    Pooled(u64),
    /// A streaming pipe of this length if known (two descriptors: ring, wake).
    Stream(Option<u64>),
}

// Field order and types must match `HeaderRef`: bincode is positional.
#[derive(Deserialize)]
struct HeaderOwned {
    event_type: EventType,
    kind: Kind,
    correlation: u64,
    origin: Origin,
    deadline: Deadline,
    status: u16,
    token: u64,
    meta: Meta,
    body: BodyHead,
    context: RequestContext,
}

/// A header buffer's first size: a request's header with its context.
const HEADER_SCRATCH_START: usize = 256;
/// A header buffer grown past this (a frame with huge meta) is let go.
const HEADER_SCRATCH_KEEP: usize = 64 * 1024;

thread_local! {
    static HEADER_SCRATCH: std::cell::RefCell<Vec<u8>> =
        std::cell::RefCell::new(Vec::with_capacity(HEADER_SCRATCH_START));
}

/// Appends the prefix and header of `env` to `out`, and returns the inline
/// payload that must follow them on the wire.
pub fn encode_head<'e>(env: &'e Envelope, out: &mut BytesMut, max: usize) -> Result<&'e [u8]> {
    let (body, payload): (BodyHead, &[u8]) = match &env.payload {
        Payload::Inline(b) => (BodyHead::Inline, b),
        Payload::Shm(body) if body.is_pooled() => (BodyHead::Pooled(body.len()), &[]),
        Payload::Shm(body) => (BodyHead::Shm(body.len()), &[]),
        Payload::Stream(handle) => (BodyHead::Stream(handle.length()), &[]),
    };
    let head = HeaderRef {
        event_type: env.event_type,
        kind: env.kind,
        correlation: env.correlation,
        origin: env.origin,
        deadline: env.deadline,
        status: env.status,
        token: env.token,
        meta: &env.meta,
        body,
        context: &env.context,
    };
    let start = out.len();
    out.put_bytes(0, PREFIX_LEN);
    // Encoded into this thread's reused buffer: no allocation, and no
    // growth when the request's context makes the header pass a fresh
    // buffer's size. (Encoding straight into `out` through an `io::Write`
    // adapter costs more per field than `Vec`'s own writer.) Copied into
    // `out` only once it is known to fit.
    let encoded = HEADER_SCRATCH.with_borrow_mut(|header| {
        header.clear();
        let fits = codec::encode_into(&head, header).and_then(|()| {
            let frame_len = 4 + header.len() + payload.len();
            if frame_len + 4 > max || header.len() >= FD_MARK as usize || frame_len > u32::MAX as usize {
                return Err(Error::FrameTooLarge {
                    len: frame_len + 4,
                    max,
                });
            }
            out.extend_from_slice(header);
            Ok((header.len(), frame_len))
        });
        if header.capacity() > HEADER_SCRATCH_KEEP {
            *header = Vec::with_capacity(HEADER_SCRATCH_START);
        }
        fits
    });
    let (header_len, frame_len) = match encoded {
        Ok(lengths) => lengths,
        Err(err) => {
            out.truncate(start);
            return Err(err);
        }
    };
    out[start..start + 4].copy_from_slice(&(frame_len as u32).to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&(header_len as u32).to_le_bytes());
    Ok(payload)
}

/// Whether `env` encodes to a frame of at most `max` bytes: what a writer
/// would otherwise drop with a log line, for a sender that must say no.
pub fn fits(env: &Envelope, max: usize) -> bool {
    encode_head(env, &mut BytesMut::new(), max).is_ok()
}

/// Encodes a whole frame into one buffer (tests, control messages).
pub fn encode(env: &Envelope, max: usize) -> Result<BytesMut> {
    let mut out = BytesMut::new();
    let payload = encode_head(env, &mut out, max)?;
    out.extend_from_slice(payload);
    Ok(out)
}

/// Whether `buf` starts with a whole frame: `Ok(Some(len))` with its total
/// length, `Ok(None)` when more bytes are needed, an error when the declared
/// length is over `max` or too short to hold a header.
pub fn check(buf: &[u8], max: usize) -> Result<Option<usize>> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let frame_len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    let total = frame_len + 4;
    if total > max {
        return Err(Error::FrameTooLarge { len: total, max });
    }
    if frame_len < 4 {
        return Err(Error::Malformed("frame shorter than its header length field"));
    }
    Ok((buf.len() >= total).then_some(total))
}

/// Parses one whole frame (as delimited by [`check`]). An inline payload is
/// a zero-copy slice of `frame`; a shared-memory one takes the next
/// descriptor from `fds`: the caller passes only those this frame may
/// claim (its batch's, not yet claimed). [`FD_MARK`] is the caller's to
/// act on; here it is ignored.
pub fn parse(frame: Bytes, fds: &mut VecDeque<OwnedFd>) -> Result<Envelope> {
    if frame.len() < PREFIX_LEN {
        return Err(Error::Malformed("frame shorter than its prefix"));
    }
    let header_len = (u32::from_le_bytes([frame[4], frame[5], frame[6], frame[7]]) & !FD_MARK) as usize;
    let header_end = PREFIX_LEN
        .checked_add(header_len)
        .filter(|&end| end <= frame.len())
        .ok_or(Error::Malformed("header longer than frame"))?;
    let head: HeaderOwned = codec::decode(&frame[PREFIX_LEN..header_end])?;
    let payload = match head.body {
        BodyHead::Inline => Payload::Inline(frame.slice(header_end..)),
        _ if header_end != frame.len() => return Err(Error::Malformed("shm frame with inline bytes")),
        BodyHead::Shm(len) => {
            let fd = fds
                .pop_front()
                .ok_or(Error::Malformed("shm frame without a descriptor"))?;
            Payload::Shm(ShmBody::adopt(fd, len)?)
        }
        BodyHead::Pooled(len) => {
            let fd = fds
                .pop_front()
                .ok_or(Error::Malformed("shm frame without a descriptor"))?;
            Payload::Shm(ShmBody::adopt_pooled(fd, len)?)
        }
        BodyHead::Stream(length) => {
            let (Some(ring), Some(wake)) = (fds.pop_front(), fds.pop_front()) else {
                return Err(Error::Malformed("stream frame without its two descriptors"));
            };
            Payload::Stream(StreamHandle::from_parts(ring, wake, length))
        }
    };
    Ok(Envelope {
        event_type: head.event_type,
        kind: head.kind,
        correlation: head.correlation,
        origin: head.origin,
        deadline: head.deadline,
        status: head.status,
        token: head.token,
        context: head.context,
        meta: head.meta,
        payload,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(body: &[u8]) -> Envelope {
        let mut env = Envelope::request(EventType::of("demo.Echo"), 7, Bytes::copy_from_slice(body));
        env.origin = Origin::Pipe(3);
        env.deadline = Deadline(123);
        env.meta.push("content-type", "application/json");
        env.meta.push("p.name", "world");
        env
    }

    fn one(buf: &[u8]) -> Result<Envelope> {
        let len = check(buf, DEFAULT_MAX_FRAME)?.expect("whole frame");
        assert_eq!(len, buf.len());
        parse(Bytes::copy_from_slice(buf), &mut VecDeque::new())
    }

    #[test]
    fn round_trip_inline_and_shm() {
        for body in [&b""[..], b"x", &[0u8; 70_000]] {
            let env = sample(body);
            assert_eq!(one(&encode(&env, DEFAULT_MAX_FRAME).unwrap()).unwrap(), env);
        }
        let mut env = sample(b"");
        let body = ShmBody::create(&[7u8; 100_000]).unwrap();
        env.payload = Payload::Shm(body.clone());
        env.kind = Kind::Response;
        env.status = 200;
        let bytes = encode(&env, DEFAULT_MAX_FRAME).unwrap();
        // Without its descriptor the frame is refused ...
        assert!(one(&bytes).is_err());
        // ... with it, the body reads back.
        let mut fds = VecDeque::from([body.fd().try_clone_to_owned().unwrap()]);
        let back = parse(bytes.freeze(), &mut fds).unwrap();
        assert_eq!(back.payload.into_bytes().unwrap().as_ref(), &[7u8; 100_000][..]);
    }

    #[test]
    fn over_limit_is_refused_both_ways() {
        let env = sample(&[1u8; 2048]);
        assert!(matches!(encode(&env, 1024), Err(Error::FrameTooLarge { .. })));
        let bytes = encode(&env, DEFAULT_MAX_FRAME).unwrap();
        assert!(matches!(check(&bytes, 1024), Err(Error::FrameTooLarge { .. })));
        // A declared length of 4 GiB is refused before any buffering.
        assert!(check(&[0xff, 0xff, 0xff, 0xff], DEFAULT_MAX_FRAME).is_err());
    }

    #[test]
    fn headers_share_a_reused_buffer_and_a_refused_one_leaves_nothing() {
        // A header too big for the buffer's first size, one past what it
        // keeps, then ordinary ones: each frame holds its own header only.
        let mut big = sample(b"big");
        big.meta.push("x-long", "v".repeat(HEADER_SCRATCH_KEEP + 1));
        let mut out = BytesMut::new();
        for env in [sample(b"a"), big.clone(), sample(b"b"), sample(b"")] {
            out.clear();
            let payload = encode_head(&env, &mut out, DEFAULT_MAX_FRAME).unwrap();
            out.extend_from_slice(payload);
            assert_eq!(one(&out).unwrap(), env);
        }
        // Refused for its size: `out` is as it was, and the next frame
        // appended after it reads back whole.
        let mut out = BytesMut::from(&b"kept"[..]);
        assert!(matches!(
            encode_head(&big, &mut out, 1024),
            Err(Error::FrameTooLarge { .. })
        ));
        assert_eq!(&out[..], b"kept");
        let env = sample(b"after");
        let payload = encode_head(&env, &mut out, DEFAULT_MAX_FRAME).unwrap();
        out.extend_from_slice(payload);
        assert_eq!(one(&out[4..]).unwrap(), env);
    }

    #[test]
    fn truncated_frames_are_incomplete_not_errors() {
        let bytes = encode(&sample(b"hello"), DEFAULT_MAX_FRAME).unwrap();
        for cut in 0..bytes.len() {
            assert_eq!(
                check(&bytes[..cut], DEFAULT_MAX_FRAME).unwrap(),
                None,
                "cut {cut}"
            );
        }
    }

    #[test]
    fn inconsistent_lengths_are_errors() {
        let mut bytes = encode(&sample(b"hello"), DEFAULT_MAX_FRAME).unwrap();
        bytes[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            parse(bytes.freeze(), &mut VecDeque::new()),
            Err(Error::Malformed(_))
        ));
        assert!(check(&[2, 0, 0, 0, 0, 0], DEFAULT_MAX_FRAME).is_err());
    }

    #[test]
    fn garbage_never_panics() {
        let mut seed = 0x2545f4914f6cdd1du64;
        for len in 8..600usize {
            let mut bytes: Vec<u8> = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed as u8
                })
                .collect();
            bytes[0..4].copy_from_slice(&((len - 4) as u32).to_le_bytes());
            let hl = (seed as usize) % len;
            bytes[4..8].copy_from_slice(&(hl as u32).to_le_bytes());
            if let Ok(Some(n)) = check(&bytes, DEFAULT_MAX_FRAME) {
                let _ = parse(Bytes::copy_from_slice(&bytes[..n]), &mut VecDeque::new());
            }
        }
    }

    #[test]
    fn corrupted_valid_frames_never_panic() {
        let good = encode(&sample(b"payload"), DEFAULT_MAX_FRAME).unwrap();
        for i in PREFIX_LEN..good.len() {
            for flip in [0x01u8, 0x80, 0xff] {
                let mut bad = good.clone();
                bad[i] ^= flip;
                let _ = parse(bad.freeze(), &mut VecDeque::new());
            }
        }
    }
}
