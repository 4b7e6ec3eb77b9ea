//! Request bodies as the listener's code reads them: decoded by their
//! `Content-Encoding` (tower-http's request decompression) and bounded in
//! how far they may expand.
//!
//! The body limits (`max_body_bytes`, `max_upload_bytes`) count decoded
//! bytes, so a body is cut as soon as it passes its route's limit. That
//! alone lets a few hundred KB of zstd cost seconds of CPU on an upload
//! route whose limit is gigabytes; so the decoded bytes are also held to
//! `compression.max_decode_ratio` times the bytes received, once past
//! [`RATIO_FLOOR`]. The reader of a body that breaks either bound answers
//! 413 ([`is_expanded`]).

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tower_http::decompression::DecompressionBody;

use crate::incoming::{BodyError, Incoming};

/// Decoded bytes a body may reach whatever its ratio: small bodies of
/// repetitive JSON compress far beyond any sane ratio and cost nothing.
pub(crate) const RATIO_FLOOR: u64 = 1024 * 1024;

/// A request body as the listener's code reads it: decoded by its
/// `Content-Encoding` (the middleware's request decoding) as it is read,
/// and bounded in how far it expands.
pub(crate) type RequestBody = Decoded;

/// The request body as it came off the connection, its bytes counted.
pub(crate) struct Counted {
    inner: Incoming,
    received: u64,
}

impl Counted {
    pub(crate) fn new(inner: Incoming) -> Counted {
        Counted { inner, received: 0 }
    }
}

impl Body for Counted {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        if let Some(Ok(frame)) = &frame
            && let Some(data) = frame.data_ref()
        {
            this.received += data.len() as u64;
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Why a decoded body was refused.
#[derive(Debug, thiserror::Error)]
#[error("the request body expands more than {ratio} times when decoded")]
pub(crate) struct Expanded {
    pub(crate) ratio: u32,
}

/// Whether a body read failed because the body expanded too far (413).
pub(crate) fn is_expanded(err: &BodyError) -> Option<&Expanded> {
    err.downcast_ref::<Expanded>()
}

/// A request body, decoded as it is read and bounded in expansion.
pub(crate) struct Decoded {
    inner: DecompressionBody<Counted>,
    decoded: u64,
    max_ratio: u32,
    refused: bool,
}

impl Decoded {
    pub(crate) fn new(inner: DecompressionBody<Counted>, max_ratio: u32) -> Decoded {
        Decoded {
            inner,
            decoded: 0,
            max_ratio,
            refused: false,
        }
    }
}

impl Body for Decoded {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        if this.refused {
            return Poll::Ready(None);
        }
        let frame = match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            None => return Poll::Ready(None),
            Some(Err(err)) => return Poll::Ready(Some(Err(err))),
            Some(Ok(frame)) => frame,
        };
        if let Some(data) = frame.data_ref() {
            this.decoded += data.len() as u64;
            let received = this.inner.get_ref().received;
            if this.decoded > RATIO_FLOOR && this.decoded > received.saturating_mul(u64::from(this.max_ratio))
            {
                this.refused = true;
                return Poll::Ready(Some(Err(Box::new(Expanded {
                    ratio: this.max_ratio,
                }))));
            }
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.refused || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
