//! QUIC for HTTP/3: the UDP endpoint, its TLS and transport settings, and
//! who gets past the first packet.
//!
//! The endpoint (quinn) uses the same certificates as the TCP port's TLS
//! ([`crate::tls::load`]), TLS 1.3 only as QUIC requires, ALPN `h3`, on the
//! same `ring` provider. Its transport limits come from `[listener.http3]`:
//! concurrent request streams, per-stream and per-connection flow-control
//! windows, idle timeout. A reload swaps the TLS and transport settings for
//! new connections while keeping the retry-token key, so a token issued
//! just before a reload is still good after it.
//!
//! When several listener processes share the port, each issues connection
//! ids whose first byte names it ([`Steering`]), which the supervisor's BPF
//! program reads to steer every datagram to its process's socket
//! (docs/decisions/0076-quic-steered-by-connection-id.md).
//!
//! Address validation (docs/decisions/0077-quic-hardening.md): an Initial
//! from an address not yet validated is answered with a Retry when
//! `retry = "always"`, or with `retry = "auto"` once `retry_threshold`
//! handshakes are in progress (a flood of Initials from spoofed addresses
//! never completes them); a client that comes back with the token has
//! proved its address. Before validation quinn never sends more than three
//! times what it received from an address (RFC 9000 §8.1).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use quinn::VarInt;

use crate::error::Error;
use crate::tls::TlsConfig;

/// `[listener.http3]`: HTTP/3 on a UDP port beside the TCP one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Http3Config {
    /// The UDP port clients are told about in `Alt-Svc`; 0: the TCP
    /// port's number (where the supervisor binds it by default).
    pub port: u16,
    /// How long a client may remember the `Alt-Svc` advertisement
    /// (`alt_svc_max_age`, seconds; default 86400).
    pub alt_svc_max_age: Duration,
    /// Request streams one connection may have open at once
    /// (`max_concurrent_streams`; default 100). More wait for credit.
    pub max_concurrent_streams: u32,
    /// Bytes a client may send on one request stream before the listener
    /// reads them (`stream_window`, bytes; default 1 MiB).
    pub stream_window: u32,
    /// Bytes a client may send on all streams of a connection before the
    /// listener reads them (`connection_window`, bytes; default 4 MiB).
    pub connection_window: u32,
    /// Response bytes quinn buffers per connection for a client that has
    /// not acknowledged them (`send_window`, bytes; default 4 MiB).
    pub send_window: u32,
    /// A connection that exchanges no packet for this long is closed
    /// (`idle_timeout_ms`; default 30 s). Apart from it the listener's own
    /// `idle_timeout` closes a connection with no request in progress, as
    /// over TCP.
    pub idle_timeout: Duration,
    /// When an Initial gets a Retry (`retry`, `retry_threshold`).
    pub retry: Retry,
    /// Accept 0-RTT requests of safe methods (`zero_rtt`; default off):
    /// GET, HEAD and OPTIONS sent in early data are served, anything else
    /// sent in early data gets 425 Too Early.
    pub zero_rtt: bool,
    /// Which of the listener processes sharing the UDP port this one is
    /// (set by the process, not the configuration); none: the only one.
    pub steering: Option<Steering>,
}

/// This process's place among the listener processes that share HTTP/3's
/// port: the supervisor's BPF program sends a datagram to the socket of
/// index `cid[0] % count`, so every connection id issued here has a first
/// byte with that remainder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Steering {
    /// This process's index, below `count`.
    pub index: u32,
    /// The number of processes (sockets) sharing the port; at most 64.
    pub count: u32,
}

/// Connection ids of 8 bytes from the TLS provider's secure random source,
/// whose first byte names this process ([`Steering`]).
struct SteeredIds {
    steering: Steering,
}

impl quinn::ConnectionIdGenerator for SteeredIds {
    fn generate_cid(&mut self) -> quinn::ConnectionId {
        let mut bytes = [0u8; 8];
        let random = rustls::crypto::ring::default_provider().secure_random;
        if random.fill(&mut bytes).is_err() {
            // The system's random source failed: ids must still be unique.
            bytes = fastrand::u64(..).to_le_bytes();
        }
        let Steering { index, count } = self.steering;
        // Any multiple of `count` that keeps the byte a byte, plus the index.
        let spread = (256 / count).max(1);
        bytes[0] = (index + count * (u32::from(bytes[0]) % spread)) as u8;
        quinn::ConnectionId::new(&bytes)
    }

    fn cid_len(&self) -> usize {
        8
    }

    fn cid_lifetime(&self) -> Option<Duration> {
        None
    }
}

/// The endpoint's settings: connection ids steered to this process when
/// it shares the port.
pub(crate) fn endpoint_config(http3: &Http3Config) -> quinn::EndpointConfig {
    let mut config = quinn::EndpointConfig::default();
    if let Some(steering) = http3.steering.filter(|s| s.count > 1) {
        config.cid_generator(move || Box::new(SteeredIds { steering }));
    }
    config
}

/// When a client must prove its address with a retry token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    /// Every new connection (one more round trip for every client).
    Always,
    /// Once this many handshakes are in progress in this process.
    Above(usize),
    /// Never (a flood of Initials is then met only by the amplification
    /// limit and `max_connections`).
    Never,
}

impl Default for Http3Config {
    fn default() -> Self {
        Http3Config {
            port: 0,
            alt_svc_max_age: Duration::from_secs(86_400),
            max_concurrent_streams: 100,
            stream_window: 1 << 20,
            connection_window: 4 << 20,
            send_window: 4 << 20,
            idle_timeout: Duration::from_secs(30),
            retry: Retry::Above(64),
            zero_rtt: false,
            steering: None,
        }
    }
}

impl Http3Config {
    /// Checks the values, naming the key of a bad one.
    pub fn check(&self) -> Result<(), String> {
        let key = |k: &str| format!("listener.http3.{k}");
        if self.max_concurrent_streams == 0 {
            return Err(format!("{}: must be at least 1", key("max_concurrent_streams")));
        }
        for (name, value) in [
            ("stream_window", self.stream_window),
            ("connection_window", self.connection_window),
            ("send_window", self.send_window),
        ] {
            if value < 16 * 1024 {
                return Err(format!("{}: must be at least 16384 bytes", key(name)));
            }
        }
        if self.stream_window > self.connection_window {
            return Err(format!(
                "{}: must not exceed {} ({} > {})",
                key("stream_window"),
                key("connection_window"),
                self.stream_window,
                self.connection_window
            ));
        }
        if self.idle_timeout < Duration::from_millis(100) || self.idle_timeout > Duration::from_secs(3600) {
            return Err(format!(
                "{}: must be between 100 and 3600000",
                key("idle_timeout_ms")
            ));
        }
        if self.retry == Retry::Above(0) {
            return Err(format!(
                "{}: must be at least 1 (or retry = \"always\")",
                key("retry_threshold")
            ));
        }
        Ok(())
    }

    /// The `Alt-Svc` value advertising this endpoint.
    pub(crate) fn alt_svc(&self) -> http::HeaderValue {
        let value = format!("h3=\":{}\"; ma={}", self.port, self.alt_svc_max_age.as_secs());
        http::HeaderValue::from_str(&value).expect("digits and ASCII only")
    }
}

/// The QUIC server settings `http3` and `tls` make: TLS 1.3 with ALPN
/// `h3` on the TCP port's certificates, the transport limits, and `base`'s
/// retry-token key when there is a running endpoint (a reload).
pub(crate) fn server_config(
    http3: &Http3Config,
    tls: &TlsConfig,
    base: Option<&quinn::ServerConfig>,
) -> Result<quinn::ServerConfig, Error> {
    let mut rustls = (*crate::tls::load(tls)?).clone();
    rustls.alpn_protocols = vec![b"h3".to_vec()];
    // QUIC takes 0 or all (RFC 9001 §4.6.1); without it no client gets to
    // send early data at all.
    rustls.max_early_data_size = if http3.zero_rtt { u32::MAX } else { 0 };
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(Arc::new(rustls))
        .map_err(|e| Error::Tls(format!("listener.http3: the certificates cannot serve QUIC: {e}")))?;
    let mut transport = quinn::TransportConfig::default();
    transport
        .max_concurrent_bidi_streams(VarInt::from_u32(http3.max_concurrent_streams))
        // The client's control and QPACK streams (RFC 9114 §6.2), and a
        // little room for extensions it may open.
        .max_concurrent_uni_streams(VarInt::from_u32(8))
        .stream_receive_window(VarInt::from_u32(http3.stream_window))
        .receive_window(VarInt::from_u32(http3.connection_window))
        .send_window(u64::from(http3.send_window))
        .max_idle_timeout(Some(
            quinn::IdleTimeout::try_from(http3.idle_timeout).expect("checked: at most an hour"),
        ));
    let mut server = match base {
        Some(base) => {
            let mut server = base.clone();
            server.crypto = Arc::new(crypto);
            server
        }
        None => quinn::ServerConfig::with_crypto(Arc::new(crypto)),
    };
    server.transport_config(Arc::new(transport));
    Ok(server)
}

/// Handshakes in progress in this process (accepted Initials whose
/// connection is not established yet): what `retry = "auto"` watches.
#[derive(Default)]
pub(crate) struct Handshakes {
    in_progress: AtomicUsize,
}

/// What to do with a new connection's first packet.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Accept,
    Retry,
}

impl Handshakes {
    /// Whether an Initial from an address in `validated` state is accepted
    /// or must first come back with a retry token.
    pub(crate) fn verdict(&self, retry: Retry, validated: bool, may_retry: bool) -> Verdict {
        if validated || !may_retry {
            return Verdict::Accept;
        }
        match retry {
            Retry::Always => Verdict::Retry,
            Retry::Above(n) if self.in_progress.load(Ordering::Relaxed) >= n => Verdict::Retry,
            Retry::Above(_) | Retry::Never => Verdict::Accept,
        }
    }

    /// Counts one handshake until the guard is dropped.
    pub(crate) fn start(self: &Arc<Self>) -> HandshakeGuard {
        self.in_progress.fetch_add(1, Ordering::Relaxed);
        HandshakeGuard(self.clone())
    }
}

/// One handshake in progress.
pub(crate) struct HandshakeGuard(Arc<Handshakes>);

impl Drop for HandshakeGuard {
    fn drop(&mut self) {
        self.0.in_progress.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_verdicts() {
        let h = Arc::new(Handshakes::default());
        assert_eq!(h.verdict(Retry::Above(2), false, true), Verdict::Accept);
        let _a = h.start();
        let b = h.start();
        assert_eq!(h.verdict(Retry::Above(2), false, true), Verdict::Retry);
        // A client back with its token, or one that already had a Retry.
        assert_eq!(h.verdict(Retry::Above(2), true, true), Verdict::Accept);
        assert_eq!(h.verdict(Retry::Above(2), false, false), Verdict::Accept);
        assert_eq!(h.verdict(Retry::Never, false, true), Verdict::Accept);
        drop(b);
        assert_eq!(h.verdict(Retry::Above(2), false, true), Verdict::Accept);
        assert_eq!(h.verdict(Retry::Always, false, true), Verdict::Retry);
    }

    #[test]
    fn steered_ids_name_their_process() {
        use quinn::ConnectionIdGenerator;
        for count in [2, 3, 7, 64] {
            for index in 0..count {
                let mut ids = SteeredIds {
                    steering: Steering { index, count },
                };
                let mut firsts = std::collections::HashSet::new();
                for _ in 0..200 {
                    let id = ids.generate_cid();
                    assert_eq!(id.len(), 8);
                    assert_eq!(u32::from(id[0]) % count, index, "{count} processes");
                    firsts.insert(id[0]);
                }
                // The rest of the byte is still random.
                assert!(count == 64 || firsts.len() > 1);
            }
        }
    }

    #[test]
    fn checks_name_the_key() {
        let ok = Http3Config::default();
        assert!(ok.check().is_ok());
        let bad = Http3Config {
            stream_window: 8 << 20,
            ..ok.clone()
        };
        assert!(bad.check().unwrap_err().contains("listener.http3.stream_window"));
        let bad = Http3Config {
            retry: Retry::Above(0),
            ..ok.clone()
        };
        assert!(
            bad.check()
                .unwrap_err()
                .contains("listener.http3.retry_threshold")
        );
        assert_eq!(
            Http3Config { port: 8443, ..ok }.alt_svc(),
            "h3=\":8443\"; ma=86400"
        );
    }
}
