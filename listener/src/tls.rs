//! TLS on the listener's ports: HTTPS (ALPN `h2` and `http/1.1`), gRPC over
//! TLS and `wss://`, with optional client certificates (mTLS).
//!
//! Certificates are read from PEM files into a rustls `ServerConfig`
//! ([`load`]); the accept loop hands each new connection the config current
//! when it was accepted, so a reload that re-reads the files changes what
//! new handshakes present while established connections keep theirs
//! (docs/decisions/0050-tls.md). The crypto provider is `ring`, chosen
//! explicitly rather than installed process-wide; TLS 1.2 and 1.3 only.
//!
//! The handshake runs in the connection's own task, under the same sweeper
//! as a plaintext connection's first request: a client that stalls its
//! handshake is closed after `idle_timeout` of silence, and at the latest
//! after `idle_timeout + header_read_timeout`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::Error;

/// `[listener.tls]`: where the certificate, its key and (for mTLS) the CA
/// bundle live. Paths are read at start and again on every reload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsConfig {
    /// PEM certificate chain: the server's certificate first, then its
    /// intermediates.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of the first certificate.
    pub key: PathBuf,
    /// PEM bundle of the CAs whose client certificates are accepted; none:
    /// no client certificates are asked for.
    pub client_ca: Option<PathBuf>,
    /// With `client_ca`: whether a client must present a certificate
    /// (`true`) or may connect without one (a certificate it does present
    /// must still verify).
    pub client_cert_required: bool,
}

/// The protocols offered in ALPN, in order of preference.
pub const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

fn tls_error(path: &Path, what: &str, err: impl std::fmt::Display) -> Error {
    Error::Tls(format!("{what} {}: {err}", path.display()))
}

fn certificates(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, Error> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| tls_error(path, what, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls_error(path, what, e))?;
    if certs.is_empty() {
        return Err(tls_error(path, what, "no PEM certificate in the file"));
    }
    Ok(certs)
}

/// Reads the files `tls` names and builds the server side of TLS: ALPN,
/// TLS 1.2+, client verification when a CA bundle is given. Fails with a
/// message naming the file and what is wrong with it (unreadable, not PEM,
/// a key that does not match the certificate, a CA bundle with no usable
/// certificate).
pub fn load(tls: &TlsConfig) -> Result<Arc<ServerConfig>, Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = certificates(&tls.cert, "cert: cannot read the certificate chain")?;
    let key = PrivateKeyDer::from_pem_file(&tls.key)
        .map_err(|e| tls_error(&tls.key, "key: cannot read the private key", e))?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| Error::Tls(format!("TLS versions: {e}")))?;
    let builder = match &tls.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in certificates(ca, "client_ca: cannot read the CA bundle")? {
                roots
                    .add(cert)
                    .map_err(|e| tls_error(ca, "client_ca: unusable CA certificate in", e))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = if tls.client_cert_required {
                verifier
            } else {
                verifier.allow_unauthenticated()
            };
            let verifier = verifier
                .build()
                .map_err(|e| tls_error(ca, "client_ca: cannot verify clients with", e))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    // with_single_cert also checks that the key belongs to the certificate.
    let mut config = builder.with_single_cert(chain, key).map_err(|e| {
        Error::Tls(format!(
            "cert/key: {} and {} do not make a usable pair: {e}",
            tls.cert.display(),
            tls.key.display()
        ))
    })?;
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}
