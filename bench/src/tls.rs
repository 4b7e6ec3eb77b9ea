//! TLS for the benches: the load generator's client side (a CA to trust, or
//! no verification), the baseline's server side, and the certificates the
//! suite makes for a run (rcgen). rustls on `ring`, as the listener.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A client that trusts the CAs in `cacert`, or (`insecure`) any
/// certificate, offering `alpn`.
pub fn client_config(
    cacert: Option<&Path>,
    insecure: bool,
    alpn: &[&[u8]],
) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS versions")?;
    let mut config = if insecure {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Unverified(provider())))
            .with_no_client_auth()
    } else {
        let path = cacert.context("an https URL needs --cacert FILE (the CA to trust) or --insecure")?;
        let mut roots = rustls::RootCertStore::empty();
        for cert in
            CertificateDer::pem_file_iter(path).with_context(|| format!("cannot read {}", path.display()))?
        {
            roots
                .add(cert.with_context(|| format!("bad PEM in {}", path.display()))?)
                .with_context(|| format!("unusable CA certificate in {}", path.display()))?;
        }
        anyhow::ensure!(!roots.is_empty(), "no certificate in {}", path.display());
        builder.with_root_certificates(roots).with_no_client_auth()
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// `--insecure`: accepts whatever certificate the server shows (the
/// handshake's signatures are still checked, so the cost measured is a
/// real handshake's).
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The baseline's server side: the certificate chain and key in PEM files,
/// ALPN h2 and http/1.1, as the listener configures it.
pub fn server_config(cert: &Path, key: &Path) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let chain = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("cannot read {}", cert.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("bad PEM in {}", cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(key).with_context(|| format!("cannot read {}", key.display()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .context("TLS versions")?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .context("the certificate and key do not make a pair")?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A CA and a server certificate for `localhost` and 127.0.0.1 it signed,
/// written to `dir`, as the suite's TLS scenario uses them.
pub struct TestCertificates {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TestCertificates {
    pub fn create(dir: &Path) -> anyhow::Result<TestCertificates> {
        use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate()?)?;
        let key = KeyPair::generate()?;
        let leaf = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])?
            .signed_by(&key, &ca)?;
        let files = TestCertificates {
            ca: dir.join("ca.pem"),
            cert: dir.join("server.pem"),
            key: dir.join("server.key"),
        };
        std::fs::write(&files.ca, ca.pem())?;
        std::fs::write(&files.cert, leaf.pem())?;
        std::fs::write(&files.key, key.serialize_pem())?;
        Ok(files)
    }
}
