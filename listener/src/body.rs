//! Response bodies: whole, or read from a manager's pipe as the client
//! takes them; and which part of a body a `Range` header asks for.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http_body::{Frame, SizeHint};
use http_body_util::{Either, Full};
use switchyard_proto::Error;
use switchyard_proto::pipe::{self, AsyncPipe};

/// A whole body, or one streamed from a manager's pipe.
pub(crate) type Body = Either<Full<Bytes>, PipeBody>;

/// A response body read from a pipe. Dropping it (the client went away)
/// closes the pipe, and the producer's next write fails.
pub(crate) struct PipeBody {
    pub(crate) pipe: AsyncPipe,
    /// Bytes to discard first (the start of a range).
    pub(crate) skip: u64,
    /// Bytes still to deliver, when the length is known.
    pub(crate) remaining: Option<u64>,
    /// A range ends before the stream does: stop there without error.
    pub(crate) truncate: bool,
}

impl http_body::Body for PipeBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let this = self.get_mut();
        loop {
            if this.remaining == Some(0) {
                return Poll::Ready(None);
            }
            let mut chunk = match this.pipe.poll_read(cx, pipe::DEFAULT_CAPACITY) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(err)) => return Poll::Ready(Some(Err(err))),
                Poll::Ready(Ok(chunk)) => chunk,
            };
            if chunk.is_empty() {
                // A known length not reached is a broken stream, not an end.
                return Poll::Ready(
                    this.remaining
                        .map(|_| Err(Error::PipeAborted("the stream was shorter than announced"))),
                );
            }
            if this.skip > 0 {
                let n = this.skip.min(chunk.len() as u64);
                chunk.advance(n as usize);
                this.skip -= n;
                if chunk.is_empty() {
                    continue;
                }
            }
            if let Some(remaining) = &mut this.remaining {
                if chunk.len() as u64 > *remaining {
                    if !this.truncate {
                        return Poll::Ready(Some(Err(Error::PipeAborted(
                            "the stream was longer than announced",
                        ))));
                    }
                    chunk.truncate(*remaining as usize);
                }
                *remaining -= chunk.len() as u64;
            }
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == Some(0)
    }

    fn size_hint(&self) -> SizeHint {
        // Exact when known: hyper then sends Content-Length, else chunked.
        self.remaining.map(SizeHint::with_exact).unwrap_or_default()
    }
}

/// What a `Range` header asks of a body of `len` bytes.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum RangeAsk {
    /// One satisfiable range, inclusive.
    Bytes(u64, u64),
    /// A single range that lies outside the body.
    Unsatisfiable,
    /// Not a single byte range we serve (several ranges, other units,
    /// garbage): the whole body is served, as RFC 9110 allows.
    Ignore,
}

/// Reads a `Range` header for a body of `len` bytes.
///
/// Hand-written rather than taken from `http-range-header` (0.4.2), whose
/// answers to the cases tested below were measured and differ: it refuses a
/// suffix longer than the body (`bytes=-500` of 100 bytes is the whole body
/// by RFC 9110 §14.1.2), gives `bytes=9-1` (garbage: ignored) and
/// `bytes=100-` of 100 bytes (416) the same error, so the two cannot be
/// told apart, and satisfies `bytes=0-0` of an empty body (a slice past its
/// end).
pub(crate) fn parse_range(header: &str, len: u64) -> RangeAsk {
    let Some(spec) = header.trim().strip_prefix("bytes=") else {
        return RangeAsk::Ignore;
    };
    if spec.contains(',') {
        return RangeAsk::Ignore;
    }
    let Some((first, last)) = spec.trim().split_once('-') else {
        return RangeAsk::Ignore;
    };
    let (first, last) = (first.trim(), last.trim());
    match (first.parse::<u64>(), last.parse::<u64>()) {
        // bytes=a-b
        (Ok(a), Ok(b)) if a <= b => {
            if a >= len {
                RangeAsk::Unsatisfiable
            } else {
                RangeAsk::Bytes(a, b.min(len - 1))
            }
        }
        // bytes=a-
        (Ok(a), Err(_)) if last.is_empty() => {
            if a >= len {
                RangeAsk::Unsatisfiable
            } else {
                RangeAsk::Bytes(a, len - 1)
            }
        }
        // bytes=-n: the last n bytes
        (Err(_), Ok(n)) if first.is_empty() => {
            if n == 0 || len == 0 {
                RangeAsk::Unsatisfiable
            } else {
                RangeAsk::Bytes(len.saturating_sub(n), len - 1)
            }
        }
        _ => RangeAsk::Ignore,
    }
}

#[cfg(test)]
mod tests {
    use super::{RangeAsk, parse_range};

    #[test]
    fn ranges() {
        assert_eq!(parse_range("bytes=0-9", 100), RangeAsk::Bytes(0, 9));
        assert_eq!(parse_range("bytes=90-200", 100), RangeAsk::Bytes(90, 99));
        assert_eq!(parse_range("bytes=50-", 100), RangeAsk::Bytes(50, 99));
        assert_eq!(parse_range("bytes=-10", 100), RangeAsk::Bytes(90, 99));
        assert_eq!(parse_range("bytes=-500", 100), RangeAsk::Bytes(0, 99));
        assert_eq!(parse_range("bytes=100-", 100), RangeAsk::Unsatisfiable);
        assert_eq!(parse_range("bytes=-0", 100), RangeAsk::Unsatisfiable);
        assert_eq!(parse_range("bytes=0-1,5-6", 100), RangeAsk::Ignore);
        assert_eq!(parse_range("items=0-1", 100), RangeAsk::Ignore);
        assert_eq!(parse_range("bytes=9-1", 100), RangeAsk::Ignore);
        assert_eq!(parse_range("bytes=x-y", 100), RangeAsk::Ignore);
        assert_eq!(parse_range("bytes=0-0", 0), RangeAsk::Unsatisfiable);
        assert_eq!(parse_range("bytes=-5", 0), RangeAsk::Unsatisfiable);
    }
}
