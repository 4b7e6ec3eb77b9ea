//! permessage-deflate (RFC 7692) for the listener's WebSockets.
//!
//! tungstenite (0.28, and every release up to 0.30) has no extensions: it
//! refuses any frame with RSV1 set. So the extension sits on either side
//! of it (decision 0098):
//!
//! - In: [`Inflate`] reads the client's frames below tungstenite and hands
//!   it a compressed message as plain frames: the inflated bytes in frames
//!   of at most [`CHUNK`] bytes, masked with a zero key, the last one final.
//!   A message's inflated size is counted as it grows and the read fails
//!   past the message limit ([`Refused::TooBig`], close 1009), so a deflate
//!   bomb costs at most the limit, in memory and in CPU. Control frames and
//!   uncompressed messages pass through untouched.
//! - Out: [`compress`] deflates a message before it is cut into frames; the
//!   first frame carries RSV1, which tungstenite writes as given.
//!
//! The answer always asks `server_no_context_takeover` and
//! `client_no_context_takeover` (RFC 7692 §7.1.1: a server may ask both of
//! any offer): each message is compressed on its own, so no session keeps a
//! compressor or a 32 KiB window between messages, and an idle session
//! costs what it did without the extension. One compressor per thread
//! serves every session of it.

use std::cell::RefCell;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};
use http::{HeaderMap, HeaderValue, header};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_tungstenite::tungstenite::protocol::frame::FrameHeader;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};

use super::refused::Refused;

/// Inflated bytes per frame handed to tungstenite.
pub(crate) const CHUNK: usize = 32 * 1024;
/// Messages shorter than this are sent as they are: deflate's few bytes of
/// framing and the CPU are not worth it.
pub(crate) const MIN_COMPRESS: usize = 128;
/// The empty stored block a sync flush ends with, left off on the wire
/// (RFC 7692 §7.2.1) and put back before inflating (§7.2.2).
const TAIL: [u8; 4] = [0, 0, 0xff, 0xff];
/// Bytes read from the socket at a time.
const READ: usize = 4 * 1024;

/// What a session agreed to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Agreed {
    /// Whether the server's messages may be compressed: not when the
    /// client limited the server's window below the 32 KiB the compressor
    /// uses (`server_max_window_bits` < 15); its messages are then sent
    /// uncompressed, which the extension allows message by message.
    pub(crate) compress_out: bool,
}

/// The first offer of permessage-deflate in `headers` the server accepts,
/// and the `Sec-WebSocket-Extensions` answer to it; none: no extension.
pub(crate) fn negotiate(headers: &HeaderMap) -> Option<(Agreed, HeaderValue)> {
    headers
        .get_all(header::SEC_WEBSOCKET_EXTENSIONS)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .find_map(accept)
}

/// One offer: accepted if it is permessage-deflate with parameters RFC 7692
/// defines, each at most once, with valid values (§7: else declined).
fn accept(offer: &str) -> Option<(Agreed, HeaderValue)> {
    let mut parts = offer.split(';').map(str::trim);
    if !parts.next()?.eq_ignore_ascii_case("permessage-deflate") {
        return None;
    }
    let mut seen: Vec<&str> = Vec::new();
    let mut server_bits = None;
    for param in parts {
        let (name, value) = match param.split_once('=') {
            Some((name, value)) => (name.trim(), Some(value.trim().trim_matches('"'))),
            None => (param, None),
        };
        if seen.contains(&name) {
            return None;
        }
        seen.push(name);
        let bits = |v: &str| {
            v.parse::<u8>()
                .ok()
                .filter(|b| (8..=15).contains(b) && !v.starts_with('0'))
        };
        match (name, value) {
            ("server_no_context_takeover" | "client_no_context_takeover", None) => {}
            ("server_max_window_bits", Some(v)) => server_bits = Some(bits(v)?),
            ("client_max_window_bits", None) => {}
            ("client_max_window_bits", Some(v)) => {
                bits(v)?;
            }
            _ => return None,
        }
    }
    let mut answer =
        String::from("permessage-deflate; server_no_context_takeover; client_no_context_takeover");
    if let Some(bits) = server_bits {
        // Accepting the parameter means naming it back (§7.1.2.1).
        answer.push_str(&format!("; server_max_window_bits={bits}"));
    }
    let agreed = Agreed {
        compress_out: server_bits.is_none_or(|b| b == 15),
    };
    Some((agreed, HeaderValue::from_str(&answer).ok()?))
}

thread_local! {
    /// The thread's compressor, reset for every message.
    static COMPRESSOR: RefCell<Option<Compress>> = const { RefCell::new(None) };
}

/// `payload` deflated as one message (its tail left off), or `None` when it
/// is too small to bother or would not shrink.
pub(crate) fn compress(payload: &[u8]) -> Option<Vec<u8>> {
    if payload.len() < MIN_COMPRESS {
        return None;
    }
    COMPRESSOR.with_borrow_mut(|slot| {
        let c = slot.get_or_insert_with(|| Compress::new(Compression::fast(), false));
        c.reset();
        let (start_in, start_out) = (c.total_in(), c.total_out());
        let mut out = Vec::with_capacity(payload.len() / 2 + 64);
        loop {
            let read = (c.total_in() - start_in) as usize;
            c.compress_vec(&payload[read..], &mut out, FlushCompress::Sync)
                .ok()?;
            let read = (c.total_in() - start_in) as usize;
            // Done when all is in and the flush left room to spare.
            if read == payload.len() && out.len() < out.capacity() {
                break;
            }
            if out.len() >= payload.len() {
                return None;
            }
            out.reserve(out.capacity().max(1024));
        }
        debug_assert_eq!((c.total_out() - start_out) as usize, out.len());
        if !out.ends_with(&TAIL) || out.len() - TAIL.len() >= payload.len() {
            return None;
        }
        out.truncate(out.len() - TAIL.len());
        Some(out)
    })
}

/// Where [`Inflate`] is in the client's byte stream.
enum At {
    /// In a frame header, this much of it seen (at most 14 bytes).
    Header { seen: [u8; 14], len: usize },
    /// In a payload passed through as it is, this many bytes still to pass.
    Pass(u64),
    /// In a compressed message's payload.
    Inflate {
        left: u64,
        mask: [u8; 4],
        /// Payload bytes already unmasked (the mask's phase).
        offset: usize,
        fin: bool,
    },
    /// After a header tungstenite will refuse: the rest passes through.
    Lost,
}

/// A compressed message being inflated.
struct Inflating {
    inflater: Decompress,
    /// Text or binary: the opcode of the first frame handed on.
    opcode: Data,
    /// Whether a frame of it was handed on (the next ones continue it).
    started: bool,
    /// Inflated bytes so far.
    size: usize,
    /// Its final frame has been read whole.
    finishing: bool,
    /// The tail was given to the inflater.
    tail_fed: bool,
    chunk: Vec<u8>,
}

/// A WebSocket's transport as tungstenite reads it: compressed messages
/// inflated (see the module docs); writes pass untouched. Without the
/// extension it is only a pass-through.
pub(crate) struct Inflate<S> {
    inner: S,
    on: bool,
    max_message: usize,
    at: At,
    message: Option<Inflating>,
    /// Bytes read from `inner`, `raw[start..end]` not yet looked at.
    raw: Vec<u8>,
    start: usize,
    end: usize,
    /// Unmasked compressed bytes the inflater has not taken yet.
    pending: Vec<u8>,
    /// Bytes for tungstenite, `out[served..]` not yet read.
    out: Vec<u8>,
    served: usize,
}

impl<S> Inflate<S> {
    /// `on`: the extension was agreed; `max_message`: the largest message,
    /// inflated.
    pub(crate) fn new(inner: S, on: bool, max_message: usize) -> Inflate<S> {
        Inflate {
            inner,
            on,
            max_message,
            at: At::Header {
                seen: [0; 14],
                len: 0,
            },
            message: None,
            raw: if on { vec![0; READ] } else { Vec::new() },
            start: 0,
            end: 0,
            pending: Vec::new(),
            out: Vec::new(),
            served: 0,
        }
    }

    /// Moves the stream on until there are bytes for tungstenite (`false`)
    /// or all that was read is used (`true`: read more).
    fn advance(&mut self) -> Result<bool, Refused> {
        loop {
            if self.served < self.out.len() {
                return Ok(false);
            }
            self.out.clear();
            self.served = 0;
            if let Some(m) = &self.message
                && (!self.pending.is_empty() || m.finishing)
            {
                self.inflate_step()?;
                continue;
            }
            if self.start == self.end {
                return Ok(true);
            }
            self.step_raw()?;
        }
    }

    /// Takes what it can of the raw bytes read.
    fn step_raw(&mut self) -> Result<(), Refused> {
        let bytes = &self.raw[self.start..self.end];
        match &mut self.at {
            At::Lost => {
                self.out.extend_from_slice(bytes);
                self.start = self.end;
            }
            At::Pass(left) => {
                let n = (*left).min(bytes.len() as u64) as usize;
                self.out.extend_from_slice(&bytes[..n]);
                self.start += n;
                *left -= n as u64;
                if *left == 0 {
                    self.at = At::Header {
                        seen: [0; 14],
                        len: 0,
                    };
                }
            }
            At::Inflate {
                left,
                mask,
                offset,
                fin,
            } => {
                let n = (*left).min(bytes.len() as u64) as usize;
                self.pending.extend(
                    bytes[..n]
                        .iter()
                        .enumerate()
                        .map(|(i, b)| b ^ mask[(*offset + i) % 4]),
                );
                *offset += n;
                self.start += n;
                *left -= n as u64;
                if *left == 0 {
                    if *fin && let Some(m) = &mut self.message {
                        m.finishing = true;
                    }
                    self.at = At::Header {
                        seen: [0; 14],
                        len: 0,
                    };
                }
            }
            At::Header { seen, len } => {
                let take = (seen.len() - *len).min(bytes.len());
                seen[*len..*len + take].copy_from_slice(&bytes[..take]);
                let mut cursor = io::Cursor::new(&seen[..*len + take]);
                let (header, payload) = match FrameHeader::parse(&mut cursor) {
                    Ok(Some(parsed)) => parsed,
                    Ok(None) => {
                        *len += take;
                        self.start += take;
                        return Ok(());
                    }
                    Err(_) => {
                        // Malformed: tungstenite reports it.
                        self.out.extend_from_slice(&seen[..*len]);
                        self.at = At::Lost;
                        return Ok(());
                    }
                };
                let header_len = cursor.position() as usize;
                let mut head = [0u8; 14];
                head[..header_len].copy_from_slice(&seen[..header_len]);
                let head = &head[..header_len];
                self.start += header_len - *len;
                let compressed = self.message.is_some();
                let next = match header.opcode {
                    OpCode::Control(_) | OpCode::Data(Data::Continue) if header.rsv1 => {
                        return Err(Refused::Protocol);
                    }
                    // Inflated, it would reach tungstenite masked.
                    OpCode::Data(_) if (header.rsv1 || compressed) && header.mask.is_none() => {
                        return Err(Refused::Protocol);
                    }
                    OpCode::Data(Data::Text | Data::Binary)
                        if header.rsv1 && !compressed && !header.rsv2 && !header.rsv3 =>
                    {
                        let OpCode::Data(opcode) = header.opcode else {
                            unreachable!("matched a data opcode")
                        };
                        self.message = Some(Inflating {
                            inflater: Decompress::new(false),
                            opcode,
                            started: false,
                            size: 0,
                            finishing: false,
                            tail_fed: false,
                            chunk: Vec::new(),
                        });
                        self.inflating(header, payload)
                    }
                    OpCode::Data(Data::Continue) if compressed && !header.rsv2 && !header.rsv3 => {
                        self.inflating(header, payload)
                    }
                    // Everything else as it came: tungstenite checks it.
                    _ => {
                        self.out.extend_from_slice(head);
                        At::Pass(payload)
                    }
                };
                self.at = match next {
                    At::Pass(0) => At::Header {
                        seen: [0; 14],
                        len: 0,
                    },
                    next => next,
                };
            }
        }
        Ok(())
    }

    /// The state for a compressed frame's payload (an empty one is over
    /// at once).
    fn inflating(&mut self, header: FrameHeader, payload: u64) -> At {
        if payload == 0 {
            if header.is_final
                && let Some(m) = &mut self.message
            {
                m.finishing = true;
            }
            return At::Pass(0);
        }
        At::Inflate {
            left: payload,
            mask: header.mask.unwrap_or([0; 4]),
            offset: 0,
            fin: header.is_final,
        }
    }

    /// Inflates some of the pending bytes into one frame for tungstenite,
    /// or ends the message with its final frame.
    fn inflate_step(&mut self) -> Result<(), Refused> {
        let Some(m) = &mut self.message else {
            return Ok(());
        };
        if m.finishing && !m.tail_fed && self.pending.is_empty() {
            self.pending.extend_from_slice(&TAIL);
            m.tail_fed = true;
        }
        m.chunk.clear();
        m.chunk.reserve_exact(CHUNK);
        let (before_in, before_out) = (m.inflater.total_in(), m.inflater.total_out());
        let status = m
            .inflater
            .decompress_vec(&self.pending, &mut m.chunk, FlushDecompress::Sync)
            .map_err(|_| Refused::Corrupt)?;
        let consumed = (m.inflater.total_in() - before_in) as usize;
        let produced = (m.inflater.total_out() - before_out) as usize;
        self.pending.drain(..consumed);
        m.size += produced;
        if m.size > self.max_message {
            return Err(Refused::TooBig);
        }
        if produced > 0 {
            let opcode = if m.started { Data::Continue } else { m.opcode };
            m.started = true;
            push_frame(&mut self.out, opcode, false, &m.chunk);
            return Ok(());
        }
        if !self.pending.is_empty() {
            match (consumed, status) {
                (0, Status::StreamEnd) => self.pending.clear(),
                (0, _) => return Err(Refused::Corrupt),
                _ => return Ok(()),
            }
        }
        if m.finishing && m.tail_fed {
            let opcode = if m.started { Data::Continue } else { m.opcode };
            push_frame(&mut self.out, opcode, true, &[]);
            self.message = None;
            if self.pending.capacity() > READ {
                self.pending = Vec::new();
            }
        }
        Ok(())
    }
}

/// Appends a frame as a client sends it: masked, here with a zero key
/// (the payload as it is).
fn push_frame(out: &mut Vec<u8>, opcode: Data, fin: bool, payload: &[u8]) {
    let code: u8 = OpCode::Data(opcode).into();
    out.push(code | if fin { 0x80 } else { 0 });
    match payload.len() {
        n if n < 126 => out.push(0x80 | n as u8),
        n if n <= u16::MAX as usize => {
            out.push(0x80 | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(0x80 | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(payload);
}

impl<S: AsyncRead + Unpin> AsyncRead for Inflate<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.on {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        }
        loop {
            if this.served < this.out.len() {
                let n = (this.out.len() - this.served).min(buf.remaining());
                buf.put_slice(&this.out[this.served..this.served + n]);
                this.served += n;
                return Poll::Ready(Ok(()));
            }
            match this.advance() {
                Err(refused) => return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, refused))),
                Ok(false) => continue,
                Ok(true) => {
                    let mut read = ReadBuf::new(&mut this.raw);
                    ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
                    let n = read.filled().len();
                    if n == 0 {
                        return Poll::Ready(Ok(()));
                    }
                    (this.start, this.end) = (0, n);
                }
            }
        }
    }
}

// Writes pass through untouched: only what is read is inflated.
super::write_through!(Inflate);

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(value: &str) -> Option<(Agreed, String)> {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::SEC_WEBSOCKET_EXTENSIONS,
            HeaderValue::from_str(value).unwrap(),
        );
        negotiate(&headers).map(|(a, v)| (a, v.to_str().unwrap().to_owned()))
    }

    #[test]
    fn offers() {
        let both = "permessage-deflate; server_no_context_takeover; client_no_context_takeover";
        // What browsers send.
        let (agreed, answer) = offer("permessage-deflate; client_max_window_bits").unwrap();
        assert!(agreed.compress_out);
        assert_eq!(answer, both);
        let (agreed, answer) = offer("permessage-deflate; server_max_window_bits=10").unwrap();
        assert!(!agreed.compress_out);
        assert_eq!(answer, format!("{both}; server_max_window_bits=10"));
        // A declined offer gives way to the next.
        let (_, answer) = offer("permessage-deflate; server_max_window_bits=16, permessage-deflate").unwrap();
        assert_eq!(answer, both);
        for declined in [
            "x-webkit-deflate-frame",
            "permessage-deflate; server_max_window_bits",
            "permessage-deflate; server_max_window_bits=7",
            "permessage-deflate; server_max_window_bits=010",
            "permessage-deflate; client_max_window_bits=16",
            "permessage-deflate; server_no_context_takeover=1",
            "permessage-deflate; server_no_context_takeover; server_no_context_takeover",
            "permessage-deflate; mystery",
        ] {
            assert!(offer(declined).is_none(), "{declined}");
        }
    }

    /// A masked client frame.
    fn frame(first: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![first];
        match payload.len() {
            n if n < 126 => out.push(0x80 | n as u8),
            n if n < 65536 => {
                out.push(0x80 | 126);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                out.push(0x80 | 127);
                out.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        let mask = [7, 1, 9, 3];
        out.extend_from_slice(&mask);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        out
    }

    /// The (first byte, unmasked payload) of each frame `bytes` holds.
    fn frames(mut bytes: &[u8]) -> Vec<(u8, Vec<u8>)> {
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let mut cursor = io::Cursor::new(bytes);
            let (header, len) = FrameHeader::parse(&mut cursor).unwrap().unwrap();
            let mask = header.mask.expect("masked, as from a client");
            let at = cursor.position() as usize;
            let payload = bytes[at..at + len as usize].iter().enumerate();
            out.push((bytes[0], payload.map(|(i, b)| b ^ mask[i % 4]).collect()));
            bytes = &bytes[at + len as usize..];
        }
        out
    }

    /// Runs `input` through an `Inflate`, `piece` bytes at a time.
    fn run(input: &[u8], piece: usize, max: usize) -> Result<Vec<u8>, Refused> {
        let mut inflate = Inflate::new((), true, max);
        let mut out = Vec::new();
        for part in input.chunks(piece) {
            inflate.raw[..part.len()].copy_from_slice(part);
            (inflate.start, inflate.end) = (0, part.len());
            while !inflate.advance()? {
                out.extend_from_slice(&inflate.out[inflate.served..]);
                inflate.served = inflate.out.len();
            }
        }
        Ok(out)
    }

    #[test]
    fn compressed_messages_reach_tungstenite_inflated() {
        let text = "hello, deflate! ".repeat(10_000);
        let z = compress(text.as_bytes()).unwrap();
        assert!(z.len() < text.len() / 20);
        // Split in two frames, a ping between them, then an uncompressed
        // message.
        let (a, b) = z.split_at(z.len() / 2);
        let mut input = frame(0x41, a); // text, RSV1, not final
        input.extend(frame(0x89, b"ping"));
        input.extend(frame(0x80, b)); // continuation, final
        input.extend(frame(0x82, b"raw"));
        for piece in [1, 7, 4096] {
            let out = frames(&run(&input, piece, 1 << 20).unwrap());
            let mut message = Vec::new();
            let mut seen = Vec::new();
            for (first, payload) in out {
                match first & 0x0f {
                    0x1 | 0x0 if first & 0x70 == 0 => {
                        message.extend(payload);
                        if first & 0x80 != 0 {
                            seen.push(("text", std::mem::take(&mut message)));
                        }
                    }
                    0x9 => seen.push(("ping", payload)),
                    0x2 => seen.push(("binary", payload)),
                    other => panic!("opcode {other}"),
                }
            }
            assert_eq!(
                seen,
                vec![
                    ("ping", b"ping".to_vec()),
                    ("text", text.as_bytes().to_vec()),
                    ("binary", b"raw".to_vec()),
                ],
                "piece {piece}"
            );
        }
    }

    #[test]
    fn a_bomb_stops_at_the_limit() {
        let zeros = vec![0u8; 16 << 20];
        let z = compress(&zeros).unwrap();
        assert!(z.len() < zeros.len() / 100, "{} bytes", z.len());
        assert_eq!(run(&frame(0xc2, &z), 4096, 1 << 20), Err(Refused::TooBig));
    }

    #[test]
    fn misuse_is_refused() {
        // RSV1 on a control frame, and garbage as deflate data.
        assert_eq!(run(&frame(0xc9, b"x"), 4096, 1024), Err(Refused::Protocol));
        assert_eq!(run(&frame(0xc1, &[0xff; 40]), 4096, 1024), Err(Refused::Corrupt));
    }

    #[test]
    fn small_or_incompressible_messages_go_as_they_are() {
        assert!(compress(b"short").is_none());
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        let noise: Vec<u8> = (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        assert!(compress(&noise).is_none());
    }
}
