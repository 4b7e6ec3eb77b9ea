//! The largest gRPC message a client may send, enforced as soon as a
//! message's length prefix arrives: over it, the call fails with
//! `RESOURCE_EXHAUSTED`, the code the gRPC spec gives an exceeded
//! receive limit (tonic's own check answers `OUT_OF_RANGE`).

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use tonic::Status;

/// The largest message received, as gRPC implementations default to
/// (and tonic's decoders, which stay a backstop).
pub(crate) const MAX_MESSAGE: usize = 4 << 20;

/// The 5-byte prefix of every gRPC message: compression flag, length.
const PREFIX: usize = 5;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A request body whose messages are checked against [`MAX_MESSAGE`] as
/// they stream in; the first one over it ends the body with a
/// `RESOURCE_EXHAUSTED` status, which tonic's decoder passes on as is.
pub(crate) struct Limited<B> {
    /// Boxed: the decompressing bodies are not `Unpin`.
    inner: Pin<Box<B>>,
    /// The prefix bytes read so far of the next message.
    prefix: [u8; PREFIX],
    have: usize,
    /// The bytes of the current message still to come.
    left: usize,
    failed: bool,
}

impl<B> Limited<B> {
    pub(crate) fn new(inner: B) -> Limited<B> {
        Limited {
            inner: Box::pin(inner),
            prefix: [0; PREFIX],
            have: 0,
            left: 0,
            failed: false,
        }
    }

    /// Follows the message framing through `data`; the status when a
    /// message announces more than the limit.
    fn scan(&mut self, mut data: &[u8]) -> Result<(), Status> {
        while !data.is_empty() {
            if self.left > 0 {
                let n = self.left.min(data.len());
                self.left -= n;
                data.advance(n);
                continue;
            }
            let n = (PREFIX - self.have).min(data.len());
            self.prefix[self.have..self.have + n].copy_from_slice(&data[..n]);
            self.have += n;
            data.advance(n);
            if self.have == PREFIX {
                self.have = 0;
                let len =
                    u32::from_be_bytes([self.prefix[1], self.prefix[2], self.prefix[3], self.prefix[4]]);
                let len = len as usize;
                if len > MAX_MESSAGE {
                    return Err(Status::resource_exhausted(format!(
                        "the message is {len} bytes; at most {MAX_MESSAGE} are accepted"
                    )));
                }
                self.left = len;
            }
        }
        Ok(())
    }
}

impl<B> Body for Limited<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.failed {
            return Poll::Ready(None);
        }
        let frame = match ready!(self.inner.as_mut().poll_frame(cx)) {
            Some(Ok(frame)) => frame,
            Some(Err(err)) => return Poll::Ready(Some(Err(err.into()))),
            None => return Poll::Ready(None),
        };
        if let Some(data) = frame.data_ref()
            && let Err(status) = self.scan(data)
        {
            self.failed = true;
            return Poll::Ready(Some(Err(Box::new(status))));
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(len: u32) -> Vec<u8> {
        let mut m = vec![0];
        m.extend_from_slice(&len.to_be_bytes());
        m
    }

    #[test]
    fn messages_are_followed_across_chunks() {
        let mut limited = Limited::new(());
        let mut stream = message(3);
        stream.extend_from_slice(b"abc");
        stream.extend(message(MAX_MESSAGE as u32));
        // Byte by byte: prefixes split anywhere are still read right.
        for b in &stream {
            limited.scan(std::slice::from_ref(b)).unwrap();
        }
        assert_eq!(limited.left, MAX_MESSAGE);
        limited.scan(&vec![0; MAX_MESSAGE]).unwrap();
        let err = limited.scan(&message(MAX_MESSAGE as u32 + 1)).unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
    }
}
