//! Sending and receiving file descriptors with stream bytes (`SCM_RIGHTS`),
//! and the 16-byte [`Record`]s a ring link's socket carries them with.
//! The only unsafe code of the transport.

use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use bytes::BytesMut;

use crate::{Error, Result};

/// Most descriptors one `sendmsg` carries; the reader's control buffer fits
/// this many (the kernel never merges two messages' descriptors into one read).
pub(crate) const MAX_FDS: usize = 32;

/// `sendmsg` of `slices` with `fds` attached to its first byte. Returns the
/// bytes written (at least 1 when it succeeds: the descriptors went with them).
pub(crate) fn send(socket: RawFd, slices: &[IoSlice<'_>], fds: &[RawFd]) -> io::Result<usize> {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    let cmsgs = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &cmsgs };
    sendmsg::<()>(socket, slices, cmsgs, MsgFlags::MSG_NOSIGNAL, None).map_err(io::Error::from)
}

/// One `recvmsg` into `buf`'s spare capacity; received descriptors are
/// appended to `fds` in order. Returns the bytes read (0 at end of stream).
///
/// Linux hands over a message's descriptors with the read that takes its
/// first byte and ends that read with the message, so the descriptors of one
/// read all came with one `sendmsg`, whose first byte is among the bytes read
/// (bytes of earlier messages may come before it). More than [`MAX_FDS`] in
/// one message is an error (the kernel closes those that do not fit).
pub(crate) fn recv(socket: RawFd, buf: &mut BytesMut, fds: &mut Vec<OwnedFd>) -> io::Result<usize> {
    const SPACE: usize = cmsg_space(MAX_FDS);
    // u64 elements keep the control buffer aligned for cmsghdr.
    let mut control = [0u64; SPACE.div_ceil(8)];
    let spare = buf.spare_capacity_mut();
    let mut iov = libc::iovec {
        iov_base: spare.as_mut_ptr().cast(),
        iov_len: spare.len(),
    };
    // SAFETY: msghdr is plain old data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: iov points at `spare`, writable for its length; the control
    // buffer is writable for msg_controllen bytes; both outlive the call.
    let n = unsafe { libc::recvmsg(socket, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: CMSG_* walk the control buffer the kernel just filled, within
    // msg_controllen; each SCM_RIGHTS payload is an array of fresh
    // descriptors now owned by this process, adopted exactly once.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                let count =
                    ((*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<RawFd>();
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
        // SAFETY (set_len): the kernel initialised the first `n` spare bytes.
        buf.set_len(buf.len() + n as usize);
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "peer sent more descriptors than one read takes",
        ));
    }
    Ok(n as usize)
}

const fn align(n: usize) -> usize {
    (n + std::mem::size_of::<usize>() - 1) & !(std::mem::size_of::<usize>() - 1)
}

/// CMSG_SPACE by its definition (libc's is not usable in a const): header
/// plus data, each aligned to the pointer size.
const fn cmsg_space(fds: usize) -> usize {
    align(std::mem::size_of::<libc::cmsghdr>()) + align(fds * std::mem::size_of::<RawFd>())
}

/// A message on a ring link's socket: 16 bytes, descriptors attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Record {
    /// The sender's outgoing ring: its memfd and wake socket attached.
    Hello { capacity: u64 },
    /// Descriptors of the marked frame starting at stream byte `offset` of
    /// the sender's ring.
    Descriptors { offset: u64, count: u8 },
}

pub(crate) const RECORD_LEN: usize = 16;
pub(crate) const TAG_HELLO: u8 = 0xA1;
pub(crate) const TAG_DESCRIPTORS: u8 = 0xD5;

impl Record {
    pub(crate) fn encode(self) -> [u8; RECORD_LEN] {
        let mut out = [0u8; RECORD_LEN];
        match self {
            Record::Hello { capacity } => {
                out[0] = TAG_HELLO;
                out[8..].copy_from_slice(&capacity.to_le_bytes());
            }
            Record::Descriptors { offset, count } => {
                out[0] = TAG_DESCRIPTORS;
                out[1] = count;
                out[8..].copy_from_slice(&offset.to_le_bytes());
            }
        }
        out
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Record> {
        if bytes.len() != RECORD_LEN || bytes[2..8].iter().any(|&b| b != 0) {
            return Err(Error::Malformed("bad link record"));
        }
        let value = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
        match (bytes[0], bytes[1]) {
            (TAG_HELLO, 0) => Ok(Record::Hello { capacity: value }),
            (TAG_DESCRIPTORS, count) if count > 0 => Ok(Record::Descriptors { offset: value, count }),
            _ => Err(Error::Malformed("unknown link record")),
        }
    }
}

/// Receives the next descriptor record waiting on a ring link's socket,
/// without blocking: (offset of its frame, descriptors), or `None` when
/// none is queued. The writer sends a frame's record before the frame's
/// first byte enters the ring, so when a reader meets a marked frame its
/// record is already queued here.
///
/// One record per call, so a reader takes only the records of frames it
/// has reached: the rest stay in the socket, whose full buffer holds the
/// writer back, instead of piling up in the reader.
pub(crate) fn receive_record(socket: BorrowedFd<'_>) -> Result<Option<(u64, Vec<OwnedFd>)>> {
    let mut buf = BytesMut::with_capacity(RECORD_LEN);
    let mut fds = Vec::new();
    // Linux ends a read after a message that carries descriptors, and
    // every record carries some: one record per read.
    match recv(socket.as_raw_fd(), &mut buf, &mut fds) {
        Ok(0) => return Ok(None),
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => {
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    }
    match Record::decode(&buf)? {
        Record::Descriptors { offset, count } if fds.len() == count as usize => Ok(Some((offset, fds))),
        Record::Descriptors { .. } => Err(Error::Descriptors(
            "a descriptor record came with another number of descriptors".into(),
        )),
        Record::Hello { .. } => Err(Error::Malformed("a second ring hand-over")),
    }
}
