//! One h2 stream as a byte stream, for tungstenite's client: WebSocket
//! over h2 (RFC 8441) in the tests that speak it.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

pub struct H2Stream {
    pub send: h2::SendStream<Bytes>,
    pub recv: h2::RecvStream,
    pub pending: Bytes,
}

impl AsyncRead for H2Stream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        while self.pending.is_empty() {
            match ready!(self.recv.poll_data(cx)) {
                None => return Poll::Ready(Ok(())),
                Some(Err(e)) => return Poll::Ready(Err(std::io::Error::other(e))),
                Some(Ok(data)) => {
                    let _ = self.recv.flow_control().release_capacity(data.len());
                    self.pending = data;
                }
            }
        }
        let n = self.pending.len().min(buf.remaining());
        buf.put_slice(&self.pending[..n]);
        self.pending.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for H2Stream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.send.reserve_capacity(buf.len());
        let n = match ready!(self.send.poll_capacity(cx)) {
            None => return Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into())),
            Some(Err(e)) => return Poll::Ready(Err(std::io::Error::other(e))),
            Some(Ok(n)) => n.min(buf.len()),
        };
        self.send
            .send_data(Bytes::copy_from_slice(&buf[..n]), false)
            .map_err(std::io::Error::other)?;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let _ = self.send.send_data(Bytes::new(), true);
        Poll::Ready(Ok(()))
    }
}
