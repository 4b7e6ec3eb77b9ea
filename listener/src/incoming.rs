//! A request body as it arrives, whichever transport carries it: hyper's
//! (HTTP/1.1, h2) or an HTTP/3 request stream. Everything past the accept
//! (middleware, dispatch, the leaves) reads this one type, so an HTTP/3
//! request takes exactly the path a TCP one does.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use http::HeaderMap;
use http_body::{Frame, SizeHint};

/// The receiving half of an HTTP/3 request stream.
pub(crate) type H3Recv = h3::server::RequestStream<h3_quinn::RecvStream, Bytes>;

/// Why a request body could not be read (the client's doing: a reset
/// stream, a malformed frame, a closed connection).
pub(crate) type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// A request body from either transport.
pub(crate) enum Incoming {
    /// HTTP/1.1 or h2, from hyper.
    Tcp(hyper::body::Incoming),
    /// HTTP/3.
    H3(H3Body),
}

/// An HTTP/3 request body: DATA frames, then the trailers, if any.
pub(crate) struct H3Body {
    recv: H3Recv,
    /// The request's `content-length`, for the size hint.
    length: Option<u64>,
    /// Bytes handed on so far.
    read: u64,
    state: H3State,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum H3State {
    Data,
    Trailers,
    Done,
}

impl H3Body {
    /// The body of a request whose head said `headers`; `empty` when the
    /// stream already ended with the head.
    pub(crate) fn new(recv: H3Recv, headers: &HeaderMap) -> H3Body {
        let length = headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        H3Body {
            recv,
            length,
            read: 0,
            state: if length == Some(0) {
                H3State::Trailers
            } else {
                H3State::Data
            },
        }
    }
}

impl http_body::Body for Incoming {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            Incoming::Tcp(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
            Incoming::H3(body) => body.poll(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Incoming::Tcp(body) => body.is_end_stream(),
            Incoming::H3(body) => body.state == H3State::Done,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Incoming::Tcp(body) => body.size_hint(),
            Incoming::H3(body) => match body.length {
                Some(length) => SizeHint::with_exact(length.saturating_sub(body.read)),
                None => SizeHint::default(),
            },
        }
    }
}

impl H3Body {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        loop {
            match self.state {
                H3State::Data => match ready!(self.recv.poll_recv_data(cx)) {
                    Ok(Some(mut data)) => {
                        let data = data.copy_to_bytes(data.remaining());
                        self.read += data.len() as u64;
                        if self.length.is_some_and(|length| self.read > length) {
                            self.state = H3State::Done;
                            return Poll::Ready(Some(Err(
                                "request body longer than its content-length".into()
                            )));
                        }
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                    Ok(None) => self.state = H3State::Trailers,
                    Err(err) => {
                        self.state = H3State::Done;
                        return Poll::Ready(Some(Err(err.into())));
                    }
                },
                H3State::Trailers => {
                    let trailers = ready!(self.recv.poll_recv_trailers(cx));
                    self.state = H3State::Done;
                    if self.length.is_some_and(|length| self.read < length) {
                        return Poll::Ready(Some(Err("request body shorter than its content-length".into())));
                    }
                    return match trailers {
                        Ok(Some(trailers)) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
                        Ok(None) => Poll::Ready(None),
                        Err(err) => Poll::Ready(Some(Err(err.into()))),
                    };
                }
                H3State::Done => return Poll::Ready(None),
            }
        }
    }
}
