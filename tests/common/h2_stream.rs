//! One h2 stream as a byte stream, for tungstenite's client: WebSocket
//! over h2 (RFC 8441) in the tests that speak it; and an h2 connection
//! ready for extended CONNECT.

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

/// An h2 connection to `addr` whose server SETTINGS (extended CONNECT
/// among them) have been seen: they come before the answer to a first
/// `GET /health`, which must be 200.
pub async fn h2_ready(addr: std::net::SocketAddr) -> h2::client::SendRequest<Bytes> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut client = tokio::time::timeout(super::PATIENCE, client.ready())
        .await
        .expect("h2 ready in time")
        .unwrap();
    let get = http::Request::get("http://localhost/health").body(()).unwrap();
    let (response, _) = client.send_request(get, true).unwrap();
    let response = tokio::time::timeout(super::PATIENCE, response)
        .await
        .expect("an answer in time")
        .unwrap();
    assert_eq!(response.status(), 200);
    client
}
