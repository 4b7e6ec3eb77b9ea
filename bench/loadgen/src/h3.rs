//! HTTP/3 for the load generator (`--http3`): each client its own QUIC
//! connection (and UDP socket, so that one endpoint's driver task is not
//! the bottleneck of every client), quinn and h3 on the same rustls and
//! ring as the TCP clients.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use bytes::{Buf, Bytes};
use http::{Request, StatusCode};

/// A client's HTTP/3 connection.
pub struct Connection {
    sender: h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>,
    driver: tokio::task::JoinHandle<()>,
    /// Kept so that its socket lives as long as the connection.
    _endpoint: quinn::Endpoint,
}

/// What every connection of a run is made with.
#[derive(Clone)]
pub struct Connector {
    config: quinn::ClientConfig,
    addr: SocketAddr,
    name: String,
}

impl Connector {
    /// QUIC to `addr` (UDP), checking the certificate against `name`, with
    /// `tls` (its ALPN is replaced with `h3`; TLS 1.3 is what QUIC takes).
    pub fn new(tls: &rustls::ClientConfig, addr: SocketAddr, name: &str) -> anyhow::Result<Connector> {
        let mut tls = tls.clone();
        tls.alpn_protocols = vec![b"h3".to_vec()];
        let quic = quinn::crypto::rustls::QuicClientConfig::try_from(Arc::new(tls))
            .context("the TLS settings cannot make QUIC (TLS 1.3 is required)")?;
        Ok(Connector {
            config: quinn::ClientConfig::new(Arc::new(quic)),
            addr,
            name: name.to_owned(),
        })
    }

    /// A new connection: handshake and HTTP/3 set-up.
    pub async fn connect(&self) -> anyhow::Result<Connection> {
        let local: SocketAddr = if self.addr.is_ipv4() {
            "0.0.0.0:0".parse()?
        } else {
            "[::]:0".parse()?
        };
        let mut endpoint = quinn::Endpoint::client(local)?;
        endpoint.set_default_client_config(self.config.clone());
        let quic = endpoint.connect(self.addr, &self.name)?.await?;
        let (mut driver, sender) = h3::client::new(h3_quinn::Connection::new(quic)).await?;
        let driver = tokio::spawn(async move {
            let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
        });
        Ok(Connection {
            sender,
            driver,
            _endpoint: endpoint,
        })
    }
}

impl Connection {
    /// Sends `request` with `body` and reads the answer to its end: the
    /// status, the bytes not kept.
    pub async fn exchange(&mut self, request: Request<()>, body: Bytes) -> anyhow::Result<StatusCode> {
        let mut stream = self.sender.send_request(request).await?;
        if !body.is_empty() {
            stream.send_data(body).await?;
        }
        stream.finish().await?;
        let response = stream.recv_response().await?;
        while let Some(mut chunk) = stream.recv_data().await? {
            let n = chunk.remaining();
            chunk.advance(n);
        }
        Ok(response.status())
    }
}

impl Drop for Connection {
    /// As for the TCP clients: a request cut at the end of a step does not
    /// keep its connection alive.
    fn drop(&mut self) {
        self.driver.abort();
    }
}
