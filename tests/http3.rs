//! HTTP/3 against a real group (`[listener.http3]`, certificates made at
//! test time), with a real client (quinn + h3): the same answers as over
//! TCP for a GET, a POST with a body, a streamed upload, a 404 and a 413;
//! a streamed 64 MiB download; `Alt-Svc` on TCP replies; a flood of
//! Initials that never complete their handshakes, after which new clients
//! get a Retry and still connect (and, before address validation, the
//! server never sends more than three times what it received); a drain on
//! SIGTERM that finishes the request in flight and closes with GOAWAY.
//! UDP relays on loopback stand between client and group where a test
//! must see or drop packets.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use bytes::{Buf, Bytes};
use common::*;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::CertificateDer;
use tokio::net::UdpSocket;

/// A CA and a leaf for `localhost`, as files in `dir`; `names` more SANs
/// make the certificate (and the server's first flight) larger.
fn certificates(
    dir: &Path,
    extra_names: usize,
) -> (CertificateDer<'static>, std::path::PathBuf, std::path::PathBuf) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "http3 test CA");
    let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    let mut names = vec!["localhost".to_owned()];
    names.extend((0..extra_names).map(|i| format!("padding-{i}.switchyard.invalid")));
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(names)
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let cert_path = dir.join("cert.pem");
    let key_path = dir.join("key.pem");
    std::fs::write(&cert_path, cert.pem() + &issuer.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    (issuer.der().clone(), cert_path, key_path)
}

struct H3Group {
    group: Group,
    udp: SocketAddr,
    ca: CertificateDer<'static>,
    _dir: tempfile::TempDir,
}

/// The configuration file's text: `extra` first, then TLS with the files
/// in `dir`, then `[listener.http3]` with `http3`.
fn config_text(dir: &Path, http3: &str, extra: &str) -> String {
    format!(
        "{extra}\n[listener.tls]\ncert = \"{}\"\nkey = \"{}\"\n\n[listener.http3]\nenabled = true\n{http3}\n",
        dir.join("cert.pem").display(),
        dir.join("key.pem").display()
    )
}

fn start(tag: &'static str, http3: &str, extra: &str, extra_names: usize) -> H3Group {
    start_logging(tag, http3, extra, extra_names, "info")
}

fn start_logging(tag: &'static str, http3: &str, extra: &str, extra_names: usize, log: &str) -> H3Group {
    let dir = scratch_dir(tag);
    let (ca, _, _) = certificates(dir.path(), extra_names);
    let file = dir.path().join("switchyard.toml");
    std::fs::write(&file, config_text(dir.path(), http3, extra)).unwrap();
    let mut group = Group::builder(tag)
        .config_file(&file)
        .env("SWITCHYARD_LOG", log)
        .start();
    let line = group.wait_line("HTTP/3 listening on udp ");
    let udp = line.rsplit(' ').next().unwrap().parse().unwrap();
    H3Group {
        group,
        udp,
        ca,
        _dir: dir,
    }
}

type Sender = h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>;

/// An HTTP/3 connection to `at`: its request sender, and its driver, which
/// ends with the connection's close.
async fn connect(
    endpoint: &quinn::Endpoint,
    at: SocketAddr,
) -> (Sender, tokio::task::JoinHandle<h3::error::ConnectionError>) {
    let quic = tokio::time::timeout(PATIENCE, endpoint.connect(at, "localhost").unwrap())
        .await
        .expect("QUIC handshake in time")
        .expect("QUIC handshake");
    let (mut driver, sender) = h3::client::new(h3_quinn::Connection::new(quic)).await.unwrap();
    let driver = tokio::spawn(async move { std::future::poll_fn(|cx| driver.poll_close(cx)).await });
    (sender, driver)
}

struct Answer {
    status: u16,
    headers: http::HeaderMap,
    body: Vec<u8>,
}

async fn send(sender: &mut Sender, method: &str, path: &str, body: &[u8]) -> Answer {
    answer(begin(sender, method, path, body).await).await
}

type Stream = h3::client::RequestStream<h3_quinn::BidiStream<Bytes>, Bytes>;

/// Sends a request, its body and its end; the answer is read by [`answer`].
async fn begin(sender: &mut Sender, method: &str, path: &str, body: &[u8]) -> Stream {
    let req = http::Request::builder()
        .method(method)
        .uri(format!("https://localhost{path}"))
        .header("content-length", body.len())
        .body(())
        .unwrap();
    let mut stream = sender.send_request(req).await.unwrap();
    for chunk in body.chunks(256 * 1024) {
        // The server may answer (413) and stop reading before the end.
        if stream.send_data(Bytes::copy_from_slice(chunk)).await.is_err() {
            break;
        }
    }
    let _ = stream.finish().await;
    stream
}

async fn answer(mut stream: Stream) -> Answer {
    let response = tokio::time::timeout(PATIENCE, stream.recv_response())
        .await
        .expect("answer in time")
        .unwrap();
    let mut body = Vec::new();
    while let Some(mut chunk) = tokio::time::timeout(PATIENCE, stream.recv_data())
        .await
        .expect("body in time")
        .unwrap()
    {
        let n = chunk.remaining();
        body.extend_from_slice(&chunk.copy_to_bytes(n));
    }
    Answer {
        status: response.status().as_u16(),
        headers: response.headers().clone(),
        body,
    }
}

/// The same request over TCP (HTTPS, HTTP/1.1): status, body, `Alt-Svc`.
async fn tcp(g: &H3Group, method: &str, path: &str, body: &[u8]) -> (u16, String, Option<String>) {
    use http_body_util::{BodyExt, Full};
    let mut roots = rustls::RootCertStore::empty();
    roots.add(g.ca.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = tokio::net::TcpStream::connect(g.group.addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let stream = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "localhost")
        .body(Full::new(Bytes::copy_from_slice(body)))
        .unwrap();
    let response = tokio::time::timeout(PATIENCE, sender.send_request(req))
        .await
        .unwrap()
        .unwrap();
    let status = response.status().as_u16();
    let alt_svc = response
        .headers()
        .get("alt-svc")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned(), alt_svc)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_answers_as_over_tcp() {
    let g = start("h3-basics", "", "[listener]\nmax_body_bytes = 100000\n", 0);
    let endpoint = common::quic::h3_client_endpoint(&g.ca);
    let (mut h3, _driver) = connect(&endpoint, g.udp).await;

    let noop = send(&mut h3, "GET", "/noop", b"").await;
    assert_eq!(noop.status, 200);
    let (status, tcp_body, alt_svc) = tcp(&g, "GET", "/noop", b"").await;
    assert_eq!((status, tcp_body.as_bytes()), (200, &noop.body[..]));
    // Every TCP reply advertises the UDP port.
    assert_eq!(
        alt_svc.as_deref(),
        Some(&*format!("h3=\":{}\"; ma=86400", g.udp.port()))
    );
    assert!(
        noop.headers.get("alt-svc").is_none(),
        "not advertised over HTTP/3 itself"
    );

    let hello = send(&mut h3, "GET", "/hello/quic", b"").await;
    assert_eq!(hello.status, 200);
    assert_eq!(hello.body, tcp(&g, "GET", "/hello/quic", b"").await.1.as_bytes());

    // A POST's body reaches the handler whole (inline and through shm).
    for size in [5, 90_000] {
        let body: Vec<u8> = (0..size).map(|i| (i % 253) as u8).collect();
        let echoed = send(&mut h3, "POST", "/echo-bytes", &body).await;
        assert_eq!(echoed.status, 200);
        assert_eq!(echoed.body, body, "{size} bytes echoed");
    }
    // A streamed upload (a body past max_body_bytes is fine on an upload route).
    let upload: Vec<u8> = (0..3_000_000u32).map(|i| (i % 241) as u8).collect();
    let uploaded = send(&mut h3, "POST", "/upload", &upload).await;
    assert_eq!(
        uploaded.status,
        200,
        "{}",
        String::from_utf8_lossy(&uploaded.body)
    );
    let json: serde_json::Value = serde_json::from_slice(&uploaded.body).unwrap();
    assert_eq!(json["length"], 3_000_000);
    use sha2::Digest;
    let digest: String = sha2::Sha256::digest(&upload)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(json["sha256"], digest);

    // The failure answers are the listener's own, as over TCP.
    let missing = send(&mut h3, "GET", "/no/such/route", b"").await;
    assert_eq!(missing.status, 404);
    let (status, tcp_body, _) = tcp(&g, "GET", "/no/such/route", b"").await;
    assert_eq!(status, 404);
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&missing.body).unwrap()["detail"],
        serde_json::from_str::<serde_json::Value>(&tcp_body).unwrap()["detail"]
    );
    let big = vec![b'x'; 150_000];
    let too_large = send(&mut h3, "POST", "/echo-bytes", &big).await;
    assert_eq!(too_large.status, 413);
    assert!(String::from_utf8_lossy(&too_large.body).contains("larger than 100000 bytes"));
    let wrong_method = send(&mut h3, "DELETE", "/noop", b"").await;
    assert_eq!(wrong_method.status, 405);
    assert_eq!(wrong_method.headers.get("allow").unwrap(), "GET, HEAD, OPTIONS");

    // The connection still serves after its failures.
    assert_eq!(send(&mut h3, "GET", "/health", b"").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_64_mib_download() {
    let g = start("h3-download", "", "", 0);
    let endpoint = common::quic::h3_client_endpoint(&g.ca);
    let (mut h3, _driver) = connect(&endpoint, g.udp).await;
    const SIZE: u64 = 64 << 20;
    let req = http::Request::get(format!("https://localhost/stream/{SIZE}"))
        .body(())
        .unwrap();
    let mut stream = h3.send_request(req).await.unwrap();
    stream.finish().await.unwrap();
    let response = tokio::time::timeout(PATIENCE, stream.recv_response())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-length"], SIZE.to_string().as_str());
    let mut at = 0u64;
    while let Some(mut chunk) = tokio::time::timeout(PATIENCE, stream.recv_data())
        .await
        .unwrap()
        .unwrap()
    {
        while chunk.has_remaining() {
            let piece = chunk.chunk();
            for (i, b) in piece.iter().enumerate() {
                // demo's `stream_byte`: a lost, repeated or reordered chunk shows.
                assert_eq!(*b as u64, (at + i as u64) % 251, "byte {}", at + i as u64);
            }
            at += piece.len() as u64;
            let n = piece.len();
            chunk.advance(n);
        }
    }
    assert_eq!(at, SIZE);
}

/// What a relay saw.
#[derive(Default)]
struct Seen {
    /// Bytes from the client, and from the server, so far.
    client_bytes: usize,
    server_bytes: usize,
    /// Server datagrams that were a Retry (long header, type 3).
    retries: usize,
    /// The largest server_bytes / client_bytes seen at any moment.
    worst_ratio: f64,
}

/// A UDP relay on loopback between one client endpoint and `server`.
/// With `answer = false` the server's datagrams are counted and dropped:
/// the client's handshakes never complete, as from spoofed addresses.
async fn relay(server: SocketAddr, answer: bool) -> (SocketAddr, Arc<Mutex<Seen>>) {
    relay_holding(server, answer, None, None).await
}

/// [`relay`], holding the client's Handshake packets (its Finished) back
/// until `hold` says `true`: what it sent in 0-RTT reaches the server, and
/// is answered, before the handshake can complete, however slow the
/// machine. With `start`, nothing the client sends goes on until `start`
/// says `true`: whatever the client writes meanwhile can only leave in
/// early data, since no answer can have completed its handshake.
async fn relay_holding(
    server: SocketAddr,
    answer: bool,
    hold: Option<tokio::sync::watch::Receiver<bool>>,
    mut start: Option<tokio::sync::watch::Receiver<bool>>,
) -> (SocketAddr, Arc<Mutex<Seen>>) {
    let front = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let back = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
    back.connect(server).await.unwrap();
    let at = front.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let record = seen.clone();
    tokio::spawn(async move {
        let mut client = None;
        let mut sent = 0u64;
        let (mut a, mut b) = (vec![0u8; 65536], vec![0u8; 65536]);
        // Client datagrams waiting for `start`, in order.
        let mut waiting: Vec<Vec<u8>> = Vec::new();
        // Sends one client datagram on. The handshake's end may ride any
        // datagram, coalesced behind an Initial ACK or behind 0-RTT
        // packets: what comes before it goes on now, it and the rest wait.
        let forward = async |datagram: &[u8], sent: &mut u64| {
            *sent += 1;
            let from = hold.as_ref().and_then(|_| held_from(datagram, *sent == 1));
            if let (Some(from), Some(mut held)) = (from, hold.clone()) {
                if from > 0 {
                    let _ = back.send(&datagram[..from]).await;
                }
                let (back, datagram) = (back.clone(), datagram[from..].to_vec());
                tokio::spawn(async move {
                    if held.wait_for(|released| *released).await.is_ok() {
                        let _ = back.send(&datagram).await;
                    }
                });
                return;
            }
            let _ = back.send(datagram).await;
        };
        loop {
            let started = start.as_ref().is_none_or(|s| *s.borrow());
            tokio::select! {
                changed = async { start.as_mut().unwrap().changed().await }, if !started => {
                    if changed.is_err() {
                        start = None;
                    }
                    if start.as_ref().is_none_or(|s| *s.borrow()) {
                        for datagram in std::mem::take(&mut waiting) {
                            forward(&datagram, &mut sent).await;
                        }
                    }
                }
                got = front.recv_from(&mut a) => {
                    let Ok((n, from)) = got else { return };
                    client = Some(from);
                    record.lock().unwrap().client_bytes += n;
                    if started {
                        forward(&a[..n], &mut sent).await;
                    } else {
                        waiting.push(a[..n].to_vec());
                    }
                }
                got = back.recv(&mut b) => {
                    let Ok(n) = got else { return };
                    {
                        let mut seen = record.lock().unwrap();
                        seen.server_bytes += n;
                        if b[0] & 0x80 != 0 && b[0] & 0x30 == RETRY {
                            seen.retries += 1;
                        }
                        let ratio = seen.server_bytes as f64 / seen.client_bytes.max(1) as f64;
                        seen.worst_ratio = seen.worst_ratio.max(ratio);
                    }
                    if answer && let Some(client) = client {
                        let _ = front.send_to(&b[..n], client).await;
                    }
                }
            }
        }
    });
    (at, seen)
}

/// Where the part of a client's datagram that ends the handshake begins:
/// its first Handshake packet (long header, type 2), or an Initial after
/// the first flight (which may carry it coalesced behind an ACK); `None`
/// when it has neither. Coalesced long-header packets are walked by their
/// length fields (RFC 9000 §17.2); a short-header packet runs to the end.
fn held_from(datagram: &[u8], first_flight: bool) -> Option<usize> {
    let mut at = 0;
    while at < datagram.len() {
        if datagram[at] & 0x80 == 0 {
            return None;
        }
        // The type is bits 4-5; bit 6, the fixed bit, may be greased
        // (RFC 9287), and quinn greases it once the peer allows.
        let kind = datagram[at] & 0x30;
        if kind == HANDSHAKE || (kind == INITIAL && !first_flight) {
            return Some(at);
        }
        at += long_packet_len(&datagram[at..])?;
    }
    None
}

/// Long-header packet types (RFC 9000 §17.2), bits 4-5 of the first byte.
const INITIAL: u8 = 0x00;
const HANDSHAKE: u8 = 0x20;
const RETRY: u8 = 0x30;

/// The length of the long-header packet at the start of `packet`.
fn long_packet_len(packet: &[u8]) -> Option<usize> {
    fn varint(b: &[u8]) -> Option<(usize, usize)> {
        let size = 1usize << (b.first()? >> 6);
        let mut value = (b[0] & 0x3f) as usize;
        for byte in b.get(1..size)? {
            value = (value << 8) | *byte as usize;
        }
        Some((value, size))
    }
    let dcid = *packet.get(5)? as usize;
    let mut at = 6 + dcid;
    let scid = *packet.get(at)? as usize;
    at += 1 + scid;
    if packet[0] & 0x30 == INITIAL {
        // An Initial carries a token.
        let (token, size) = varint(packet.get(at..)?)?;
        at += size + token;
    }
    let (length, size) = varint(packet.get(at..)?)?;
    Some(at + size + length).filter(|end| *end <= packet.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_initials_is_answered_with_retry() {
    // A certificate of ~12 KB: the server's first flight is far more than
    // three times a client's first Initial.
    let g = start(
        "h3-retry",
        "retry = \"auto\"\nretry_threshold = 4\nidle_timeout_ms = 60000\n",
        "[listener]\nidle_timeout_ms = 60000\nheader_read_timeout_ms = 60000\n",
        300,
    );
    let endpoint = common::quic::h3_client_endpoint(&g.ca);

    // Before the flood: no Retry, the extra round trip is spared.
    let (calm, calm_seen) = relay(g.udp, true).await;
    let (mut h3, _driver) = connect(&endpoint, calm).await;
    assert_eq!(send(&mut h3, "GET", "/noop", b"").await.status, 200);
    assert_eq!(calm_seen.lock().unwrap().retries, 0);

    // The flood: Initials whose senders never answer.
    let (dark, dark_seen) = relay(g.udp, false).await;
    let flood = common::quic::h3_client_endpoint(&g.ca);
    let mut pending = Vec::new();
    for _ in 0..8 {
        let connecting = flood.connect(dark, "localhost").unwrap();
        pending.push(tokio::spawn(async move {
            let _ = connecting.await;
        }));
    }
    // Until the address is validated, the server sends at most three
    // times what it received (RFC 9000 §8.1).
    let patience = tokio::time::Instant::now() + PATIENCE;
    loop {
        {
            let seen = dark_seen.lock().unwrap();
            if seen.server_bytes > 0 && seen.client_bytes >= 8 * 1200 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < patience,
                "the flood: {} bytes in, {} out",
                seen.client_bytes,
                seen.server_bytes
            );
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    {
        let seen = dark_seen.lock().unwrap();
        assert!(
            seen.worst_ratio <= 3.0,
            "amplification: {} bytes out for {} in (worst {:.2}x)",
            seen.server_bytes,
            seen.client_bytes,
            seen.worst_ratio
        );
    }

    // Now a new client must prove its address first, and still gets in.
    let mut retried = false;
    for _ in 0..50 {
        let (front, seen) = relay(g.udp, true).await;
        let (mut h3, _driver) = connect(&endpoint, front).await;
        assert_eq!(send(&mut h3, "GET", "/noop", b"").await.status, 200);
        if seen.lock().unwrap().retries > 0 {
            retried = true;
            break;
        }
        // The flood's handshakes may not all be counted yet.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(retried, "a Retry once the flood's handshakes pile up");
    for p in pending {
        p.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_the_request_in_flight_then_goaway() {
    let mut g = start("h3-drain", "", "", 0);
    let endpoint = common::quic::h3_client_endpoint(&g.ca);
    let (mut h3, driver) = connect(&endpoint, g.udp).await;
    assert_eq!(send(&mut h3, "GET", "/noop", b"").await.status, 200);
    let req = http::Request::get("https://localhost/sleep/1500")
        .body(())
        .unwrap();
    let mut slow = h3.send_request(req).await.unwrap();
    slow.finish().await.unwrap();
    // The request is in the manager's hands before the signal.
    g.group.wait_line("sleeping 1500 ms");
    kill(g.group.supervisor_pid(), Signal::SIGTERM);
    let response = tokio::time::timeout(PATIENCE, slow.recv_response())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(response.status(), 200, "the request in flight is answered");
    let mut body = Vec::new();
    while let Some(mut chunk) = slow.recv_data().await.unwrap() {
        let n = chunk.remaining();
        body.extend_from_slice(&chunk.copy_to_bytes(n));
    }
    assert!(String::from_utf8_lossy(&body).contains("1500"));
    // Then the server closes the connection gracefully (GOAWAY, H3_NO_ERROR).
    let closed = tokio::time::timeout(PATIENCE, driver)
        .await
        .expect("closed in time")
        .unwrap();
    assert!(closed.is_h3_no_error(), "closed with {closed}");
    assert!(g.group.wait_exit().success());
}

/// A client that can resume and send early data.
fn resuming_endpoint(ca: &CertificateDer<'static>) -> quinn::Endpoint {
    common::quic::h3_client_endpoint_with(ca, |tls| tls.enable_early_data = true)
}

/// Connects once to `at` (for a session ticket), then again to `again`
/// with 0-RTT: the second connection's sender, or none when the client may
/// not send early data; with it, the future that resolves once the
/// handshake is complete, and the connection (for its statistics).
async fn early(
    endpoint: &quinn::Endpoint,
    at: SocketAddr,
    again: SocketAddr,
) -> Option<(
    Sender,
    tokio::task::JoinHandle<h3::error::ConnectionError>,
    quinn::ZeroRttAccepted,
    quinn::Connection,
)> {
    let (mut first, _driver) = connect(endpoint, at).await;
    // An answer: the tickets came with or before it.
    assert_eq!(send(&mut first, "GET", "/noop", b"").await.status, 200);
    drop(first);
    let connecting = endpoint.connect(again, "localhost").unwrap();
    let (quic, accepted) = connecting.into_0rtt().ok()?;
    let (mut driver, sender) = h3::client::new(h3_quinn::Connection::new(quic.clone()))
        .await
        .unwrap();
    let driver = tokio::spawn(async move { std::future::poll_fn(|cx| driver.poll_close(cx)).await });
    Some((sender, driver, accepted, quic))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_rtt_is_off_unless_asked_and_then_only_for_safe_methods() {
    // Off by default: the tickets do not allow early data.
    let off = start("h3-0rtt-off", "", "", 0);
    let endpoint = resuming_endpoint(&off.ca);
    assert!(
        early(&endpoint, off.udp, off.udp).await.is_none(),
        "no 0-RTT by default"
    );
    drop(off);

    let on = start("h3-0rtt-on", "zero_rtt = true", "", 0);
    let endpoint = resuming_endpoint(&on.ca);
    let (release, held) = tokio::sync::watch::channel(false);
    let (go, start) = tokio::sync::watch::channel(false);
    let (slow_finish, _) = relay_holding(on.udp, true, Some(held), Some(start)).await;
    let (mut h3, _driver, handshake, quic) = early(&endpoint, on.udp, slow_finish)
        .await
        .expect("0-RTT offered");
    // Written while nothing of this connection has reached the server: the
    // client cannot complete its handshake before they are out, so they
    // leave in early data, however slow the machine. Out means sent by the
    // connection's driver, which the writes woke: a datagram sent since
    // they began says it has run (it may have sent only part of them).
    let before = quic.stats().udp_tx.datagrams;
    let mut second = h3.clone();
    let post = begin(&mut second, "POST", "/echo-bytes", b"replayable").await;
    let get = begin(&mut h3, "GET", "/noop", b"").await;
    let deadline = std::time::Instant::now() + PATIENCE;
    tokio::task::yield_now().await;
    while quic.stats().udp_tx.datagrams == before && std::time::Instant::now() < deadline {
        tokio::task::yield_now().await;
    }
    go.send(true).unwrap();
    let (post, get) = tokio::join!(answer(post), answer(get));
    assert_eq!(get.status, 200, "a safe method is served from early data");
    assert_eq!(
        post.status,
        425,
        "an unsafe one is not: {}",
        String::from_utf8_lossy(&post.body)
    );
    // After the handshake the same POST goes through: the relay lets the
    // handshake's end go now, and it is waited for.
    release.send(true).unwrap();
    tokio::time::timeout(PATIENCE, handshake)
        .await
        .expect("the handshake completes in time");
    // The client's handshake can end before the server has read the
    // client's Finished; a request that arrives first is still early and
    // answered 425, which RFC 8470 tells the client to retry: so it does.
    let deadline = std::time::Instant::now() + PATIENCE;
    let again = loop {
        let again = send(&mut h3, "POST", "/echo-bytes", b"replayable").await;
        if again.status != 425 || std::time::Instant::now() > deadline {
            break again;
        }
        tokio::task::yield_now().await;
    };
    assert_eq!((again.status, &again.body[..]), (200, &b"replayable"[..]));
}

fn reload(g: &H3Group) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["reload", "--runtime-dir"])
        .arg(&g.group.runtime_dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "reload: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_changes_quic_settings_and_certificates_for_new_connections() {
    let g = start("h3-reload", "alt_svc_max_age_s = 100", "", 0);
    let old_ca = g.ca.clone();
    let old_endpoint = common::quic::h3_client_endpoint(&old_ca);
    let (mut established, _driver) = connect(&old_endpoint, g.udp).await;
    assert_eq!(send(&mut established, "GET", "/noop", b"").await.status, 200);
    assert_eq!(
        tcp(&g, "GET", "/noop", b"").await.2.as_deref(),
        Some(&*format!("h3=\":{}\"; ma=100", g.udp.port()))
    );

    // A new certificate (from a new CA) and a new max age.
    let dir = g._dir.path();
    let (new_ca, _, _) = certificates(dir, 0);
    std::fs::write(
        dir.join("switchyard.toml"),
        config_text(dir, "alt_svc_max_age_s = 200", ""),
    )
    .unwrap();
    reload(&g);

    let fresh = H3Group {
        ca: new_ca.clone(),
        ..g
    };
    assert_eq!(
        tcp(&fresh, "GET", "/noop", b"").await.2.as_deref(),
        Some(&*format!("h3=\":{}\"; ma=200", fresh.udp.port()))
    );
    // New QUIC handshakes present the new certificate...
    let (mut renewed, _d) = connect(&common::quic::h3_client_endpoint(&new_ca), fresh.udp).await;
    assert_eq!(send(&mut renewed, "GET", "/noop", b"").await.status, 200);
    let refused = old_endpoint.connect(fresh.udp, "localhost").unwrap().await;
    assert!(refused.is_err(), "the old CA no longer verifies new handshakes");
    // ...while the established connection serves on with its own.
    assert_eq!(send(&mut established, "GET", "/noop", b"").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_listener_comes_back_on_its_socket_and_no_connection_is_lost() {
    let g = start("h3-workers", "", "[listener]\nworkers = 2\n", 0);
    let endpoint = common::quic::h3_client_endpoint(&g.ca);
    let (mut h3, _driver) = connect(&endpoint, g.udp).await;
    assert_eq!(send(&mut h3, "GET", "/noop", b"").await.status, 200);
    let listener_0 = || -> Option<u32> {
        g.group.status()["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "listener" && p["instance"] == 0 && p["state"] == "running")
            .and_then(|p| p["pid"].as_u64())
            .map(|pid| pid as u32)
    };
    let old = listener_0().expect("listener 0 runs");
    kill(old, Signal::SIGKILL);
    // New connections at once: those steered to the dead process's socket
    // wait in it (the supervisor holds it) and are served by its
    // replacement; the others by the live process. None is refused.
    let connections: Vec<_> = (0..12)
        .map(|_| {
            let fresh = common::quic::h3_client_endpoint(&g.ca);
            let at = g.udp;
            tokio::spawn(async move {
                let (mut sender, _driver) = connect(&fresh, at).await;
                send(&mut sender, "GET", "/noop", b"").await.status
            })
        })
        .collect();
    assert_eq!(tcp(&g, "GET", "/noop", b"").await.0, 200, "TCP serves meanwhile");
    for connection in connections {
        assert_eq!(connection.await.unwrap(), 200);
    }
    eventually("listener 0 runs again", PATIENCE, || match listener_0() {
        Some(pid) if pid != old => Ok(()),
        other => Err(other),
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_stalled_connections_are_closed_as_over_tcp() {
    let g = start(
        "h3-sweep",
        "",
        // Long enough that a slow handshake on a loaded machine is not idle.
        "[listener]\nidle_timeout_ms = 2000\nwrite_stall_timeout_ms = 500\n",
        0,
    );
    let endpoint = common::quic::h3_client_endpoint(&g.ca);
    // Idle after one request: a GOAWAY, then a clean close.
    let (mut idle, idle_driver) = connect(&endpoint, g.udp).await;
    assert_eq!(send(&mut idle, "GET", "/noop", b"").await.status, 200);
    let closed = tokio::time::timeout(PATIENCE, idle_driver)
        .await
        .expect("idle closed")
        .unwrap();
    assert!(closed.is_h3_no_error(), "{closed}");

    // A download its client stops reading: the connection is closed once
    // nothing moves for write_stall_timeout_ms, and the group serves on.
    let (mut stalled, stalled_driver) = connect(&endpoint, g.udp).await;
    let req = http::Request::get("https://localhost/stream/67108864")
        .body(())
        .unwrap();
    let mut stream = stalled.send_request(req).await.unwrap();
    stream.finish().await.unwrap();
    let response = tokio::time::timeout(PATIENCE, stream.recv_response())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(response.status(), 200);
    // Nothing read from here on: the flow-control windows fill up.
    tokio::time::timeout(PATIENCE, stalled_driver)
        .await
        .expect("stalled closed")
        .unwrap();
    let (mut next, _d) = connect(&endpoint, g.udp).await;
    assert_eq!(send(&mut next, "GET", "/noop", b"").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_hands_the_udp_socket_to_the_new_group() {
    // Two listener processes: both UDP sockets go over, in steering order.
    let mut g = start("h3-upgrade", "", "[listener]\nworkers = 2\n", 0);
    let endpoint = common::quic::h3_client_endpoint(&g.ca);
    let (mut before, _driver) = connect(&endpoint, g.udp).await;
    assert_eq!(send(&mut before, "GET", "/noop", b"").await.status, 200);
    let _new_group = common::upgrade(&g.group.runtime_dir);
    assert!(g.group.wait_exit().success(), "the old group exits cleanly");
    // The port never closed: new HTTP/3 connections reach the new group,
    // on either socket.
    for _ in 0..8 {
        let fresh = common::quic::h3_client_endpoint(&g.ca);
        let (mut after, _driver) = connect(&fresh, g.udp).await;
        assert_eq!(send(&mut after, "GET", "/noop", b"").await.status, 200);
    }
    let (status, _, alt_svc) = tcp(&g, "GET", "/noop", b"").await;
    assert_eq!(status, 200);
    assert_eq!(
        alt_svc.as_deref(),
        Some(&*format!("h3=\":{}\"; ma=86400", g.udp.port()))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listener_processes_share_the_port_and_a_migrating_client_stays_with_its_own() {
    let g = start_logging(
        "h3-steer",
        "",
        "[listener]\nworkers = 2\n",
        0,
        "info,switchyard_listener::http3=debug",
    );
    let mut clients = Vec::new();
    for _ in 0..16 {
        let endpoint = common::quic::h3_client_endpoint(&g.ca);
        let (mut h3, driver) = connect(&endpoint, g.udp).await;
        assert_eq!(send(&mut h3, "GET", "/noop", b"").await.status, 200);
        clients.push((endpoint, h3, driver));
    }
    // A client whose address changes (NAT rebinding, another network)
    // keeps its connection: its packets still reach the process that
    // holds it, which the kernel's hash of the new address would not.
    for (endpoint, h3, _) in &mut clients {
        endpoint
            .rebind(std::net::UdpSocket::bind("127.0.0.1:0").unwrap())
            .unwrap();
        assert_eq!(send(h3, "GET", "/noop", b"").await.status, 200, "after migrating");
    }
    // Both listener processes took connections (16 random first ids:
    // all on one process would happen once in 32768 runs).
    let lines = g.group.lines_with("HTTP/3 connection established");
    let processes: std::collections::HashSet<&str> =
        lines.iter().filter_map(|l| l.split(" |").next()).collect();
    assert_eq!(processes.len(), 2, "{processes:?}");
}

/// `send` with request headers and no body.
async fn send_headers(sender: &mut Sender, method: &str, path: &str, headers: &[(&str, &str)]) -> Answer {
    let mut req = http::Request::builder()
        .method(method)
        .uri(format!("https://localhost{path}"));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let mut stream = sender.send_request(req.body(()).unwrap()).await.unwrap();
    let _ = stream.finish().await;
    let response = tokio::time::timeout(PATIENCE, stream.recv_response())
        .await
        .expect("answer in time")
        .unwrap();
    let mut body = Vec::new();
    while let Some(mut chunk) = tokio::time::timeout(PATIENCE, stream.recv_data())
        .await
        .expect("body in time")
        .unwrap()
    {
        let n = chunk.remaining();
        body.extend_from_slice(&chunk.copy_to_bytes(n));
    }
    Answer {
        status: response.status().as_u16(),
        headers: response.headers().clone(),
        body,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_are_dated_a_head_is_its_gets_headers_and_two_credentials_are_refused() {
    // An API key (sha256("test")) so that credentials are looked at.
    let auth = "[auth.api_keys]\n[[auth.api_keys.keys]]\nname = \"ops\"\nsha256 = \"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\"\n";
    let g = start("h3-semantics", "", auth, 0);
    let endpoint = common::quic::h3_client_endpoint(&g.ca);
    let (mut h3, _driver) = connect(&endpoint, g.udp).await;

    // Every answer is dated (RFC 9110 §6.6.1), the listener's own too.
    for path in ["/noop", "/no/such/route"] {
        let answer = send_headers(&mut h3, "GET", path, &[]).await;
        let date = answer
            .headers
            .get("date")
            .unwrap_or_else(|| panic!("{path}: no Date"));
        assert!(date.to_str().unwrap().ends_with(" GMT"), "{date:?}");
    }

    // HEAD: the GET's Content-Encoding and Vary, no body, and no length
    // the GET does not have.
    for accept in ["gzip", "identity"] {
        let ask = [("accept-encoding", accept)];
        let get = send_headers(&mut h3, "GET", "/openapi.json", &ask).await;
        let head = send_headers(&mut h3, "HEAD", "/openapi.json", &ask).await;
        assert_eq!((get.status, head.status), (200, 200));
        assert!(head.body.is_empty(), "{accept}: a HEAD has no body");
        for name in ["content-encoding", "vary", "content-type"] {
            assert_eq!(head.headers.get(name), get.headers.get(name), "{accept}: {name}");
        }
        match accept {
            "gzip" => {
                assert_eq!(head.headers.get("content-encoding").unwrap(), "gzip");
                assert!(head.headers.get("content-length").is_none(), "{:?}", head.headers);
            }
            _ => assert_eq!(
                head.headers.get("content-length").unwrap().to_str().unwrap(),
                get.body.len().to_string()
            ),
        }
    }

    // Two credentials: 400, whichever comes first.
    let one = send_headers(&mut h3, "GET", "/noop", &[("x-api-key", "test")]).await;
    assert_eq!(one.status, 200);
    for two in [
        [("authorization", "Bearer a"), ("authorization", "Bearer b")],
        [("x-api-key", "test"), ("x-api-key", "forged")],
    ] {
        let refused = send_headers(&mut h3, "GET", "/noop", &two).await;
        assert_eq!(refused.status, 400, "{two:?}");
        assert!(
            String::from_utf8_lossy(&refused.body).contains("more than one"),
            "{}",
            String::from_utf8_lossy(&refused.body)
        );
    }
    assert_eq!(send_headers(&mut h3, "GET", "/noop", &[]).await.status, 200);
}

/// A client whose QUIC connection goes away before its answer: its
/// request is dropped, and so cancelled through the group, as a TCP
/// client's that hangs up.
// Several threads: the harness's blocking waits must not stop the QUIC
// client's tasks from sending the request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_whose_connection_closes_cancels_its_request() {
    let mut g = start_logging("h3-cancel", "", "", 0, "info,switchyard_manager_host=debug");
    let endpoint = common::quic::h3_client_endpoint(&g.ca);
    let (mut h3, _driver) = connect(&endpoint, g.udp).await;
    let req = http::Request::get("https://localhost/sleep/20000")
        .body(())
        .unwrap();
    let mut slow = h3.send_request(req).await.unwrap();
    slow.finish().await.unwrap();
    g.group.wait_line("sleeping 20000 ms");
    endpoint.close(0u32.into(), b"gone");
    g.group.wait_line("request cancelled; dropping its handler");
}
