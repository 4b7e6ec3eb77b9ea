//! An HTTP/3 client's QUIC endpoint, for the tests that speak HTTP/3.

use std::sync::Arc;

use rustls::pki_types::CertificateDer;

/// A client endpoint on an ephemeral loopback port that trusts `ca` alone,
/// speaks TLS 1.3 and offers `h3`.
pub fn h3_client_endpoint(ca: &CertificateDer<'static>) -> quinn::Endpoint {
    h3_client_endpoint_with(ca, |_| {})
}

/// The same, with `tune` applied to its TLS configuration (early data,
/// for one).
pub fn h3_client_endpoint_with(
    ca: &CertificateDer<'static>,
    tune: impl FnOnce(&mut rustls::ClientConfig),
) -> quinn::Endpoint {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    tune(&mut tls);
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    endpoint.set_default_client_config(quinn::ClientConfig::new(Arc::new(quic)));
    endpoint
}
