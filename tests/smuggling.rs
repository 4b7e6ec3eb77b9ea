//! A request-smuggling corpus over raw TCP. Each entry is a request whose
//! framing (where it ends) or `Host` is in doubt, followed on the same
//! connection by a pipelined `GET /hello/smuggled`. The listener must answer
//! the first with its one status and close the connection: the pipelined
//! request is never executed, whatever a proxy in front made of the bytes.

mod common;

use std::io::{Read, Write};

use common::*;

/// Sent after each entry; its answer would contain "smuggled".
const PIPELINED: &str = "GET /hello/smuggled HTTP/1.1\r\nhost: t\r\n\r\n";

/// (name, request, the status it must get).
const CORPUS: &[(&str, &str, u16)] = &[
    (
        "identity before chunked",
        "POST /echo HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n\
         transfer-encoding: identity, chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        400,
    ),
    (
        "chunked twice in one line",
        "POST /echo HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n\
         transfer-encoding: chunked, chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        400,
    ),
    (
        "Transfer-Encoding over two lines",
        "POST /echo HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n\
         transfer-encoding: identity\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        400,
    ),
    (
        "chunked on two lines",
        "POST /echo HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n\
         transfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        400,
    ),
    (
        "gzip then chunked on two lines",
        "POST /echo HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n\
         transfer-encoding: gzip\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        400,
    ),
    (
        "chunked not last",
        "POST /echo HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked, identity\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        400,
    ),
    (
        "unknown coding",
        "POST /echo HTTP/1.1\r\nhost: t\r\ntransfer-encoding: xchunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        400,
    ),
    (
        "Transfer-Encoding folded over two lines",
        "POST /echo HTTP/1.1\r\nhost: t\r\ntransfer-encoding:\r\n chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        400,
    ),
    (
        "space before the colon",
        "POST /echo HTTP/1.1\r\nhost: t\r\ntransfer-encoding : chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        400,
    ),
    (
        "Transfer-Encoding in HTTP/1.0",
        "POST /echo HTTP/1.0\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        400,
    ),
    (
        "two different Content-Lengths",
        "POST /echo HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n\
         content-length: 2\r\ncontent-length: 40\r\n\r\n{}",
        400,
    ),
    (
        "a Content-Length list",
        "POST /echo HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: 2, 40\r\n\r\n{}",
        400,
    ),
    (
        "a signed Content-Length",
        "POST /echo HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: +2\r\n\r\n{}",
        400,
    ),
    (
        "a chunk size that overflows",
        "POST /echo HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n\
         fffffffffffffffff2\r\n{}\r\n0\r\n\r\n",
        400,
    ),
    // hyper frames it by Transfer-Encoding (RFC 9112 §6.3) and closes the
    // connection after the answer: served once, nothing after it.
    (
        "Content-Length and Transfer-Encoding",
        "POST /echo HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: 40\r\n\
         transfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        200,
    ),
    ("no Host in HTTP/1.1", "GET /noop HTTP/1.1\r\n\r\n", 400),
    (
        "two Host headers",
        "GET /noop HTTP/1.1\r\nhost: a\r\nhost: b\r\n\r\n",
        400,
    ),
    (
        "the same Host twice",
        "GET /noop HTTP/1.1\r\nhost: a\r\nhost: a\r\n\r\n",
        400,
    ),
];

/// Sends `request` and the pipelined one, reads until the server closes.
fn exchange(g: &Group, request: &str) -> String {
    let mut s = std::net::TcpStream::connect(g.addr).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    s.write_all(format!("{request}{PIPELINED}").as_bytes()).unwrap();
    let mut got = Vec::new();
    match s.read_to_end(&mut got) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("the connection was not closed: {e}"),
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// The statuses of the answers in what the server sent, one after the
/// other (each framed by its Content-Length; the last may run to the end).
fn answers(got: &str) -> Vec<u16> {
    let mut rest = got.as_bytes();
    let mut statuses = Vec::new();
    while let Ok(r) = parse_response(rest) {
        statuses.push(r.status);
        let head = rest.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        let Some(len) = r.header("content-length").and_then(|l| l.parse::<usize>().ok()) else {
            break;
        };
        rest = &rest[(head + len).min(rest.len())..];
    }
    statuses
}

#[test]
fn doubtful_framing_gets_400_and_nothing_after_it_runs() {
    let g = Group::start("smuggling");
    let mut failures = Vec::new();
    for (name, request, status) in CORPUS {
        let got = exchange(&g, request);
        let statuses = answers(&got);
        if statuses != [*status] || got.contains("smuggled") {
            failures.push(format!(
                "{name}: want one {status} and a close, got {statuses:?}:\n{got}"
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n\n"));
    assert_eq!(get(g.addr, "/noop").unwrap().status, 200);
}

#[test]
fn well_framed_pipelined_requests_all_run() {
    // The control: the same connection with sound framing serves both.
    let g = Group::start("smuggling-control");
    let got = exchange(
        &g,
        "POST /echo HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n\
         transfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\nGET /noop HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n",
    );
    assert_eq!(answers(&got), [200, 200], "{got}");
}

#[test]
fn a_nul_in_a_path_parameter_gets_400() {
    let g = Group::start("nul-param");
    let r = get(g.addr, "/hello/Ada%00.txt").unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("NUL"), "{}", r.text());
    // Escapes that decode to anything else still reach the handler.
    let r = get(g.addr, "/hello/Ada%20Lovelace").unwrap();
    assert_eq!(r.status, 200);
    assert!(r.text().contains("Ada Lovelace"), "{}", r.text());
}
