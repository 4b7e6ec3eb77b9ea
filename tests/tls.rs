//! TLS on the listener's port (`[listener.tls]`), with certificates made at
//! test time (rcgen): HTTPS with ALPN for h2 and http/1.1, `wss://`, gRPC
//! over TLS, client certificates (mTLS) — a wrong one refused while the
//! group serves on — and a reload that swaps the certificate while an
//! established connection keeps serving.

mod common;

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use common::*;
use futures_util::{SinkExt, StreamExt};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// A CA that signs certificates for the test.
struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Ca { issuer }
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    fn der(&self) -> CertificateDer<'static> {
        self.issuer.der().clone()
    }

    /// A leaf certificate for `names`, with its key, as PEM.
    fn leaf(&self, names: &[&str]) -> (String, String) {
        let params = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// The first certificate of a PEM text, as DER.
fn der_of(pem: &str) -> CertificateDer<'static> {
    use rustls::pki_types::pem::PemObject;
    CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
}

/// A client that trusts `ca`, offers `alpn`, and presents `identity`.
fn connector(ca: &Ca, alpn: &[&[u8]], identity: Option<(String, String)>) -> TlsConnector {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => builder
            .with_client_auth_cert(
                vec![der_of(&cert)],
                PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
            )
            .unwrap(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    TlsConnector::from(Arc::new(config))
}

async fn tls(g: &Group, connector: &TlsConnector) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(g.addr).await?;
    connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
}

/// The certificate the server presented on `stream`.
fn presented(stream: &TlsStream<TcpStream>) -> CertificateDer<'static> {
    stream.get_ref().1.peer_certificates().unwrap()[0]
        .clone()
        .into_owned()
}

async fn within<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(PATIENCE, f).await.expect("in time")
}

/// An HTTP/1.1 connection over `stream`: its sender.
async fn http1(stream: TlsStream<TcpStream>) -> hyper::client::conn::http1::SendRequest<Empty<Bytes>> {
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender
}

async fn get1(
    sender: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    path: &str,
) -> hyper::Result<(u16, String)> {
    sender.ready().await?;
    let req = http::Request::get(path)
        .header("host", "localhost")
        .body(Empty::new())
        .unwrap();
    let resp = sender.send_request(req).await?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

fn tls_config(cert: &Path, key: &Path, extra: &str) -> String {
    format!(
        "[listener.tls]\ncert = \"{}\"\nkey = \"{}\"\n{extra}\n\
         [[managers]]\nname = \"basics\"\n",
        cert.display(),
        key.display()
    )
}

// Several threads: the group's drop blocks one while client connection
// tasks run on another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_negotiates_h2_and_http1_and_serves_websockets() {
    let dir = scratch_dir("tls-files");
    let ca = Ca::new("switchyard test CA");
    let (cert, key) = ca.leaf(&["localhost", "127.0.0.1"]);
    let cert_path = write(dir.path(), "server.pem", &cert);
    let key_path = write(dir.path(), "server.key", &key);
    let mut g = Group::builder("tls-alpn")
        .config(&tls_config(&cert_path, &key_path, ""))
        .start();
    assert!(
        g.wait_line("switchyard listening on https://")
            .contains("https://")
    );

    // ALPN h2: the server picks h2, and h2 serves.
    let stream = within(tls(&g, &connector(&ca, &[b"h2", b"http/1.1"], None)))
        .await
        .unwrap();
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    assert_eq!(presented(&stream), der_of(&cert));
    let (mut h2, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let resp = within(
        h2.send_request(
            http::Request::get("https://localhost/hello/Ada")
                .body(Empty::<Bytes>::new())
                .unwrap(),
        ),
    )
    .await
    .unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_2);
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], br#"{"message":"Hello, Ada!"}"#);

    // ALPN http/1.1 only: HTTP/1.1.
    let stream = within(tls(&g, &connector(&ca, &[b"http/1.1"], None)))
        .await
        .unwrap();
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let mut h1 = http1(stream).await;
    assert_eq!(within(get1(&mut h1, "/noop")).await.unwrap().0, 200);

    // wss://: a WebSocket upgrade over TLS.
    let stream = within(tls(&g, &connector(&ca, &[b"http/1.1"], None)))
        .await
        .unwrap();
    let (mut ws, _) = within(tokio_tungstenite::client_async(
        format!("wss://localhost:{}/ws/echo", g.addr.port()),
        stream,
    ))
    .await
    .unwrap();
    ws.send(tokio_tungstenite::tungstenite::Message::text("over tls"))
        .await
        .unwrap();
    let echoed = within(ws.next()).await.unwrap().unwrap();
    assert_eq!(echoed.into_text().unwrap().as_str(), "over tls");

    // Plaintext on the TLS port is no request: the group serves on.
    let plain = get(g.addr, "/noop");
    assert!(plain.is_err() || plain.is_ok_and(|r| r.status >= 400));
    let stream = within(tls(&g, &connector(&ca, &[b"http/1.1"], None)))
        .await
        .unwrap();
    let mut h1 = http1(stream).await;
    assert_eq!(within(get1(&mut h1, "/noop")).await.unwrap().0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_over_tls() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;

    let dir = scratch_dir("tls-files");
    let ca = Ca::new("switchyard test CA");
    let (cert, key) = ca.leaf(&["localhost"]);
    let cert_path = write(dir.path(), "server.pem", &cert);
    let key_path = write(dir.path(), "server.key", &key);
    let g = Group::builder("tls-grpc")
        .config(&tls_config(&cert_path, &key_path, ""))
        .start();
    let addr = g.addr;
    let tls_client = connector(&ca, &[b"h2"], None);
    // tonic's own channel, over a TLS stream this test makes.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://localhost:{}", addr.port()))
        .unwrap()
        .connect_with_connector(tower_service(move |_uri: http::Uri| {
            let tls_client = tls_client.clone();
            async move {
                let tcp = TcpStream::connect(addr).await?;
                let stream = tls_client
                    .connect(ServerName::try_from("localhost").unwrap(), tcp)
                    .await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    let status = within(health.check(HealthCheckRequest {
        service: "switchyard.manager.basics".into(),
    }))
    .await
    .unwrap()
    .into_inner();
    assert_eq!(status.status, ServingStatus::Serving as i32);
}

/// A connector for tonic (a `tower::Service<Uri>`) from a closure.
#[derive(Clone)]
struct ServiceFn<F>(F);

fn tower_service<F>(f: F) -> ServiceFn<F> {
    ServiceFn(f)
}

impl<F, Fut, T> tonic::codegen::Service<http::Uri> for ServiceFn<F>
where
    F: FnMut(http::Uri) -> Fut,
    Fut: std::future::Future<Output = std::io::Result<T>>,
{
    type Response = T;
    type Error = std::io::Error;
    type Future = Fut;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Fut {
        (self.0)(uri)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_from_another_ca_are_refused() {
    let dir = scratch_dir("tls-files");
    let server_ca = Ca::new("server CA");
    let client_ca = Ca::new("client CA");
    let stranger_ca = Ca::new("stranger CA");
    let (cert, key) = server_ca.leaf(&["localhost"]);
    let cert_path = write(dir.path(), "server.pem", &cert);
    let key_path = write(dir.path(), "server.key", &key);
    let ca_path = write(dir.path(), "clients.pem", &client_ca.pem());
    let g = Group::builder("tls-mtls")
        .config(&tls_config(
            &cert_path,
            &key_path,
            &format!("client_ca = \"{}\"", ca_path.display()),
        ))
        .start();

    let good = connector(&server_ca, &[b"http/1.1"], Some(client_ca.leaf(&["client"])));
    let mut h1 = http1(within(tls(&g, &good)).await.unwrap()).await;
    assert_eq!(within(get1(&mut h1, "/noop")).await.unwrap().0, 200);

    // A certificate from a CA the server does not trust, and none at all.
    // Under TLS 1.3 the client finishes its side before the server has
    // checked its certificate: the refusal arrives as the first read.
    for (what, client) in [
        (
            "a stranger's certificate",
            connector(&server_ca, &[b"http/1.1"], Some(stranger_ca.leaf(&["client"]))),
        ),
        ("no certificate", connector(&server_ca, &[b"http/1.1"], None)),
    ] {
        let refused = async {
            let stream = tls(&g, &client).await?;
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(std::io::Error::other)?;
            tokio::spawn(conn);
            get1(&mut sender, "/noop").await.map_err(std::io::Error::other)
        };
        let outcome = within(refused).await;
        assert!(outcome.is_err(), "{what} was let in: {outcome:?}");
    }

    // The group serves on.
    let mut h1 = http1(within(tls(&g, &good)).await.unwrap()).await;
    assert_eq!(within(get1(&mut h1, "/noop")).await.unwrap().0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_swaps_the_certificate_while_a_connection_stays_open() {
    let dir = scratch_dir("tls-files");
    let ca = Ca::new("switchyard test CA");
    let (first, first_key) = ca.leaf(&["localhost"]);
    let cert_path = write(dir.path(), "server.pem", &first);
    let key_path = write(dir.path(), "server.key", &first_key);
    let g = Group::builder("tls-reload")
        .config(&tls_config(&cert_path, &key_path, ""))
        .start();
    let client = connector(&ca, &[b"http/1.1"], None);

    let open = within(tls(&g, &client)).await.unwrap();
    assert_eq!(presented(&open), der_of(&first));
    let mut kept = http1(open).await;
    assert_eq!(within(get1(&mut kept, "/noop")).await.unwrap().0, 200);

    // A renewed certificate, written where the configuration points.
    let (second, second_key) = ca.leaf(&["localhost"]);
    write(dir.path(), "server.pem", &second);
    write(dir.path(), "server.key", &second_key);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["reload", "--runtime-dir"])
        .arg(&g.runtime_dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "reload failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("1 listener process"), "{said}");

    // New handshakes present the new certificate ...
    let fresh = within(tls(&g, &client)).await.unwrap();
    assert_eq!(presented(&fresh), der_of(&second));
    let mut fresh = http1(fresh).await;
    assert_eq!(within(get1(&mut fresh, "/noop")).await.unwrap().0, 200);
    // ... and the connection made before the reload still serves.
    assert_eq!(within(get1(&mut kept, "/hello/Bo")).await.unwrap().0, 200);

    // A key that does not match its certificate is refused by reload, and
    // the group keeps the certificate it has.
    let (_, stray_key) = ca.leaf(&["localhost"]);
    write(dir.path(), "server.key", &stray_key);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["reload", "--runtime-dir"])
        .arg(&g.runtime_dir)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(64),
        "an invalid configuration is a usage error"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("listener.tls.cert/key"), "{err}");
    let again = within(tls(&g, &client)).await.unwrap();
    assert_eq!(presented(&again), der_of(&second));
}
