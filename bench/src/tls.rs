//! TLS for the benches' servers: the baseline's server side and the
//! certificates the suite makes for a run (rcgen). The load generator's
//! client side is `switchyard_loadgen::tls`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use switchyard_loadgen::tls::provider;

pub use switchyard_loadgen::tls::client_config;

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
