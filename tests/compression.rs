//! Compression against a real group: JSON answers above the threshold come
//! gzip, br or zstd encoded as the client accepts (and decode to the same
//! bytes), small ones and unaccepted ones stay as they are; request bodies
//! sent gzip, br or zstd encoded reach the handler decoded, an unknown
//! encoding gets 415, and a small gzip body that inflates past the body
//! limit (a zip bomb) gets 413 while the group keeps serving.

mod common;

use std::io::{Read, Write};

use common::*;

const CONFIG: &str = "[[managers]]\nname = \"basics\"\n\n[[managers]]\nname = \"payload\"\n\n[listener]\nmax_body_bytes = 1048576\n";

fn post(addr: std::net::SocketAddr, path: &str, headers: &[(&str, &str)], body: &[u8]) -> HttpResponse {
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    raw(addr, &bytes).unwrap()
}

/// A JSON document of about `n` bytes that compresses well.
fn json_of(n: usize) -> Vec<u8> {
    let items: Vec<serde_json::Value> = (0..n / 40)
        .map(|i| serde_json::json!({"id": i, "name": "item", "ok": true}))
        .collect();
    serde_json::to_vec(&items).unwrap()
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

fn decode(encoding: &str, bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    match encoding {
        "gzip" => {
            flate2::read::GzDecoder::new(bytes).read_to_end(&mut out).unwrap();
        }
        "br" => {
            brotli::Decompressor::new(bytes, 4096)
                .read_to_end(&mut out)
                .unwrap();
        }
        "zstd" => out = zstd::decode_all(bytes).unwrap(),
        other => panic!("unexpected encoding {other}"),
    }
    out
}

fn encode(encoding: &str, bytes: &[u8]) -> Vec<u8> {
    match encoding {
        "gzip" => gzip(bytes),
        "br" => {
            let mut out = Vec::new();
            {
                let mut w = brotli::CompressorWriter::new(&mut out, 4096, 5, 22);
                w.write_all(bytes).unwrap();
            }
            out
        }
        "zstd" => zstd::encode_all(bytes, 3).unwrap(),
        other => panic!("unexpected encoding {other}"),
    }
}

#[test]
fn answers_are_compressed_as_the_client_accepts() {
    let g = Group::builder("compress-out").config(CONFIG).start();
    let doc = json_of(100 * 1024);
    for encoding in ["gzip", "br", "zstd"] {
        let r = post(g.addr, "/echo", &[("accept-encoding", encoding)], &doc);
        assert_eq!(r.status, 200, "{encoding}");
        assert_eq!(r.header("content-encoding"), Some(encoding));
        assert!(r.body.len() < doc.len() / 4, "{encoding}: {} bytes", r.body.len());
        let vary = r.header("vary").unwrap_or_default().to_ascii_lowercase();
        assert!(vary.contains("accept-encoding"), "{vary}");
        let plain = decode(encoding, &r.body);
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&plain).unwrap(),
            serde_json::from_slice::<serde_json::Value>(&doc).unwrap(),
            "{encoding}"
        );
    }
    // Not accepted, or below the threshold (1 KiB): as it is.
    let r = post(g.addr, "/echo", &[], &doc);
    assert!(r.header("content-encoding").is_none());
    let small = br#"{"a":1}"#;
    let r = post(g.addr, "/echo", &[("accept-encoding", "gzip")], small);
    assert!(r.header("content-encoding").is_none());
    // Not a compressible type: bytes stay as they are.
    let r = get_accepting(g.addr, "/payload/65536", "gzip");
    assert_eq!(r.status, 200);
    assert!(r.header("content-encoding").is_none());
    assert_eq!(r.body.len(), 65536);
}

fn get_accepting(addr: std::net::SocketAddr, path: &str, encoding: &str) -> HttpResponse {
    let req = format!(
        "GET {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\naccept-encoding: {encoding}\r\n\r\n"
    );
    raw(addr, req.as_bytes()).unwrap()
}

#[test]
fn encoded_bodies_are_decoded_and_bombs_refused() {
    let g = Group::builder("compress-in").config(CONFIG).start();
    let doc = json_of(20 * 1024);
    for encoding in ["gzip", "br", "zstd"] {
        let body = encode(encoding, &doc);
        let r = post(g.addr, "/echo", &[("content-encoding", encoding)], &body);
        assert_eq!(r.status, 200, "{encoding}: {}", r.text());
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&r.body).unwrap(),
            serde_json::from_slice::<serde_json::Value>(&doc).unwrap(),
            "{encoding}"
        );
    }
    let r = post(g.addr, "/echo", &[("content-encoding", "lzma")], &doc);
    assert_eq!(r.status, 415, "{}", r.text());
    // Garbage that claims to be gzip: a 400, not a crash.
    let r = post(
        g.addr,
        "/echo",
        &[("content-encoding", "gzip")],
        b"not gzip at all",
    );
    assert_eq!(r.status, 400, "{}", r.text());

    // A zip bomb: 16 MiB of zeros in about 16 KiB of gzip. The limit
    // (1 MiB) counts decoded bytes, so it stops at 1 MiB.
    let bomb = gzip(&vec![0u8; 16 << 20]);
    assert!(bomb.len() < 64 * 1024, "{} bytes", bomb.len());
    let listener = g.pid_of("listener");
    let r = post(g.addr, "/echo", &[("content-encoding", "gzip")], &bomb);
    assert_eq!(r.status, 413, "{}", r.text());
    assert!(r.text().contains("1048576"), "{}", r.text());
    // The listener never held the inflated body.
    assert!(rss_kib(listener) < 256 * 1024, "{} KiB", rss_kib(listener));
    g.eventually_status("/health", 200);
    let r = post(g.addr, "/echo", &[], br#"{"still":"serving"}"#);
    assert_eq!(r.status, 200);
}
