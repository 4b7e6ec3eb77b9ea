//! What tungstenite does not bound on the way in and out of a WebSocket.
//!
//! In: a fragmented message may go on forever with empty continuation
//! frames (each adds nothing to the message, so the size limit never
//! trips, and a core is kept busy parsing them). [`FrameGuard`] reads the
//! frame headers as the bytes pass, with tungstenite's own parser, and
//! fails the read past [`MAX_EMPTY_FRAGMENTS`] in one message. A message
//! may also be left unfinished while the client answers pings, which would
//! hold its partial bytes for the life of the connection: the guard gives
//! each message a deadline from its first header to the end of its last
//! frame, and fails the read once it passes.
//!
//! Out: tungstenite writes whole frames into its write buffer, so the
//! buffer's bound must exceed the largest frame; [`fragments`] cuts
//! outgoing messages into frames of at most [`FRAGMENT`] bytes, which lets
//! the bound stay small. Past it, tungstenite keeps only the latest pong
//! (RFC 6455 allows answering the most recent ping alone), so a client that
//! pings and never reads cannot grow it.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

// The runtime's clock, so that a test with paused time moves it
// (docs/decisions/0151-which-clock.md).
use tokio::time::Instant;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::{Frame, FrameHeader};

pub(crate) use super::refused::MAX_EMPTY_FRAGMENTS;
use super::refused::Refused;

/// The largest frame the listener writes.
pub(crate) const FRAGMENT: usize = 64 * 1024;

/// Where the guard is in the byte stream.
enum At {
    /// In a frame header, this much of it seen (at most 14 bytes).
    Header { seen: [u8; 14], len: usize },
    /// In a payload, this many bytes still to pass; `last` when it is the
    /// final frame of a data message.
    Payload { left: u64, last: bool },
    /// After a header tungstenite will refuse: nothing more to follow.
    Lost,
}

/// A WebSocket's transport, read through a frame-header counter (see the
/// module docs); writes pass untouched.
pub(crate) struct FrameGuard<S> {
    inner: S,
    at: At,
    /// Empty continuation frames in the current message.
    empty: u32,
    /// How long a message may take from its first header to its end.
    message_timeout: Duration,
    /// The current message's deadline; `None` between messages.
    due: Option<Instant>,
    /// The timer of `due`, made only for a message that spans reads.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> FrameGuard<S> {
    pub(crate) fn new(inner: S, message_timeout: Duration) -> FrameGuard<S> {
        FrameGuard {
            inner,
            at: At::Header {
                seen: [0; 14],
                len: 0,
            },
            empty: 0,
            message_timeout,
            due: None,
            timer: None,
        }
    }

    fn message_started(&mut self) {
        if self.due.is_none() {
            self.due = Some(Instant::now() + self.message_timeout);
        }
    }

    /// Whether the current message's deadline has passed; arms its timer
    /// (the task is woken when it passes, even if the client sends nothing).
    fn overdue(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(due) = self.due else {
            self.timer = None;
            return false;
        };
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
        timer.as_mut().poll(cx).is_ready()
    }

    /// Follows the frames through `bytes`, just read.
    fn observe(&mut self, mut bytes: &[u8]) -> Result<(), Refused> {
        while !bytes.is_empty() {
            match &mut self.at {
                At::Lost => return Ok(()),
                At::Payload { left, last } => {
                    let n = (*left).min(bytes.len() as u64);
                    *left -= n;
                    bytes = &bytes[n as usize..];
                    if *left == 0 {
                        if *last {
                            self.due = None;
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
                            bytes = &bytes[take..];
                            continue;
                        }
                        // Malformed: tungstenite reports it.
                        Err(_) => {
                            self.at = At::Lost;
                            return Ok(());
                        }
                    };
                    // The header ended inside what was taken: the rest is
                    // payload (or the next header).
                    let used = cursor.position() as usize - *len;
                    bytes = &bytes[used..];
                    let data = matches!(header.opcode, OpCode::Data(_));
                    match header.opcode {
                        OpCode::Data(Data::Continue) if payload == 0 && !header.is_final => {
                            self.empty += 1;
                            if self.empty > MAX_EMPTY_FRAGMENTS {
                                return Err(Refused::EmptyFragments);
                            }
                        }
                        OpCode::Data(Data::Text | Data::Binary) => {
                            self.empty = 0;
                            self.message_started();
                        }
                        _ => {}
                    }
                    let last = data && header.is_final;
                    self.at = if payload == 0 {
                        if last {
                            self.due = None;
                        }
                        At::Header {
                            seen: [0; 14],
                            len: 0,
                        }
                    } else {
                        At::Payload { left: payload, last }
                    };
                }
            }
        }
        Ok(())
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for FrameGuard<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        match &polled {
            Poll::Ready(Ok(())) => {
                if let Err(err) = this.observe(&buf.filled()[before..]) {
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, err)));
                }
            }
            // Only a read that waits on the client can be late: bytes the
            // client sent while the session was busy elsewhere are not.
            Poll::Pending if this.overdue(cx) => {
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, Refused::Unfinished)));
            }
            _ => {}
        }
        polled
    }
}

// Writes pass through untouched: only what is read is checked.
super::write_through!(FrameGuard);

/// `message` as the frames the listener writes: deflated first when
/// `compress` (permessage-deflate agreed) and it shrinks, the first frame
/// then marked RSV1; itself when small and not compressed, else fragments
/// of at most [`FRAGMENT`] bytes (a text message's fragments may split a
/// character; only the whole message must be UTF-8).
pub(crate) fn fragments(message: Message, compress: bool) -> Vec<Message> {
    let (opcode, payload): (Data, Bytes) = match &message {
        Message::Text(text) => (Data::Text, text.clone().into()),
        Message::Binary(bytes) => (Data::Binary, bytes.clone()),
        _ => return vec![message],
    };
    let deflated = compress
        .then(|| super::deflate::compress(&payload))
        .flatten()
        .map(Bytes::from);
    let rsv1 = deflated.is_some();
    let payload = match deflated {
        Some(deflated) => deflated,
        None if payload.len() <= FRAGMENT => return vec![message],
        None => payload,
    };
    let count = payload.len().div_ceil(FRAGMENT).max(1);
    (0..count)
        .map(|i| {
            let piece = payload.slice(i * FRAGMENT..((i + 1) * FRAGMENT).min(payload.len()));
            let opcode = if i == 0 { opcode } else { Data::Continue };
            let mut frame = Frame::message(piece, OpCode::Data(opcode), i + 1 == count);
            frame.header_mut().rsv1 = rsv1 && i == 0;
            Message::Frame(frame)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A masked client frame.
    fn frame(opcode: u8, fin: bool, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![opcode | if fin { 0x80 } else { 0 }];
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
        out.extend_from_slice(&[1, 2, 3, 4]);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ [1, 2, 3, 4][i % 4]));
        out
    }

    fn guard() -> FrameGuard<()> {
        FrameGuard::new((), Duration::from_secs(3600))
    }

    /// On paused time: a message that spans reads must end within
    /// `message_timeout` of its first header, even if the client then
    /// sends nothing; between messages a session may wait as long as it likes.
    #[tokio::test(start_paused = true)]
    async fn a_message_left_unfinished_times_out_at_its_deadline() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let timeout = Duration::from_secs(30);
        let (mut client, server) = tokio::io::duplex(1024);
        let mut guard = FrameGuard::new(server, timeout);
        let mut buf = [0u8; 1024];

        // A whole message, then silence: no deadline runs.
        client.write_all(&frame(0x1, true, b"whole")).await.unwrap();
        assert!(guard.read(&mut buf).await.unwrap() > 0);
        let quiet = tokio::time::timeout(timeout * 4, guard.read(&mut buf)).await;
        assert!(quiet.is_err(), "an idle session between messages is not late");

        // The first fragment of a message, then silence.
        let began = Instant::now();
        client.write_all(&frame(0x1, false, b"half")).await.unwrap();
        assert!(guard.read(&mut buf).await.unwrap() > 0);
        let late = guard.read(&mut buf).await.unwrap_err();
        assert_eq!(late.kind(), io::ErrorKind::TimedOut);
        let waited = began.elapsed();
        assert!(
            waited >= timeout && waited < timeout + Duration::from_millis(2),
            "{waited:?}"
        );
    }

    #[test]
    fn empty_fragments_are_bounded_per_message() {
        let mut g = guard();
        g.observe(&frame(0x1, false, b"a")).unwrap();
        for _ in 0..MAX_EMPTY_FRAGMENTS {
            g.observe(&frame(0x0, false, b"")).unwrap();
        }
        // Control frames in between change nothing.
        g.observe(&frame(0x9, true, b"ping")).unwrap();
        assert!(g.observe(&frame(0x0, false, b"")).is_err());

        // A new message starts the count again; non-empty fragments and an
        // empty final one do not count.
        let mut g = guard();
        for _ in 0..3 {
            g.observe(&frame(0x2, false, &[0; 200])).unwrap();
            for _ in 0..MAX_EMPTY_FRAGMENTS {
                g.observe(&frame(0x0, false, b"")).unwrap();
            }
            g.observe(&frame(0x0, false, &[1; 70_000])).unwrap();
            g.observe(&frame(0x0, true, b"")).unwrap();
        }
    }

    #[test]
    fn headers_and_payloads_split_anywhere_are_followed() {
        let mut stream = frame(0x1, false, &[9; 300]);
        for _ in 0..=MAX_EMPTY_FRAGMENTS {
            stream.extend(frame(0x0, false, b""));
        }
        // One byte at a time: the error comes on the last empty frame.
        let mut g = guard();
        let last = stream.len() - 1;
        for (i, b) in stream.iter().enumerate() {
            let result = g.observe(std::slice::from_ref(b));
            assert_eq!(result.is_err(), i == last, "at byte {i}");
            if result.is_err() {
                break;
            }
        }
    }

    #[test]
    fn large_messages_leave_in_fragments() {
        let text = "é".repeat(FRAGMENT); // 2 bytes each: 2 fragments
        let frames = fragments(Message::text(text.clone()), false);
        assert_eq!(frames.len(), 2);
        let mut joined = Vec::new();
        for (i, f) in frames.into_iter().enumerate() {
            let Message::Frame(f) = f else { panic!("a frame") };
            let h = f.header();
            assert_eq!(h.is_final, i == 1);
            let expected = if i == 0 { Data::Text } else { Data::Continue };
            assert_eq!(h.opcode, OpCode::Data(expected));
            joined.extend_from_slice(f.payload());
        }
        assert_eq!(joined, text.as_bytes());
        assert!(matches!(
            &fragments(Message::text("small"), false)[..],
            [Message::Text(_)]
        ));
    }
}
