//! RFC 9110 details a real client or cache checks, against a real demo
//! group over HTTP/1.1 and h2 (HTTP/3 in tests/http3.rs): a matching
//! `If-None-Match` is a 304 even with a `Range`; a `HEAD` has the
//! `Content-Encoding`, `Vary` and length its `GET` would have; `PUT` with
//! `If-None-Match: *` never overwrites; two `Authorization` headers are a
//! 400, not "the first one wins"; every answer is dated.

mod common;

use bytes::Bytes;
use common::{Group, PATIENCE, request_with};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};

/// What an answer says, whatever the protocol it came by.
struct Answer {
    status: u16,
    headers: http::HeaderMap,
    body: Bytes,
}

/// `GET`-like requests (no body) over h2 with prior knowledge, one
/// connection for all of them.
struct H2(hyper::client::conn::http2::SendRequest<Empty<Bytes>>);

impl H2 {
    async fn connect(group: &Group) -> H2 {
        let tcp = tokio::net::TcpStream::connect(group.addr).await.unwrap();
        let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .expect("h2 handshake");
        tokio::spawn(conn);
        H2(send)
    }

    async fn send(&mut self, method: &str, path: &str, headers: &[(&str, &str)]) -> Answer {
        let mut req = http::Request::builder()
            .method(method)
            .uri(format!("http://localhost{path}"));
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let response = tokio::time::timeout(PATIENCE, self.0.send_request(req.body(Empty::new()).unwrap()))
            .await
            .expect("an h2 answer in time")
            .expect("an h2 answer");
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = tokio::time::timeout(PATIENCE, response.into_body().collect())
            .await
            .expect("the h2 body in time")
            .unwrap()
            .to_bytes();
        Answer {
            status,
            headers,
            body,
        }
    }
}

fn h1(group: &Group, method: &str, path: &str, headers: &[(&str, &str)]) -> Answer {
    let r = request_with(group.addr, method, path, headers, b"").unwrap();
    let mut map = http::HeaderMap::new();
    for (name, value) in &r.headers {
        map.append(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            http::HeaderValue::from_str(value).unwrap(),
        );
    }
    Answer {
        status: r.status,
        headers: map,
        body: Bytes::from(r.body),
    }
}

fn header<'a>(answer: &'a Answer, name: &str) -> Option<&'a str> {
    answer.headers.get(name).map(|v| v.to_str().unwrap())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn a_matching_if_none_match_is_304_even_with_a_range() {
    let group = Group::start("sem-inm-range");
    let first = h1(&group, "GET", "/hello/Ada", &[]);
    let etag = header(&first, "etag").expect("the demo tags /hello").to_owned();
    let mut h2 = None;
    let rt = runtime();
    for protocol in ["h1", "h2"] {
        let mut ask = |headers: &[(&str, &str)]| match protocol {
            "h1" => h1(&group, "GET", "/hello/Ada", headers),
            _ => rt.block_on(async {
                if h2.is_none() {
                    h2 = Some(H2::connect(&group).await);
                }
                h2.as_mut().unwrap().send("GET", "/hello/Ada", headers).await
            }),
        };
        // The client's copy is current: nothing to send, not even a range.
        let r = ask(&[("if-none-match", &etag), ("range", "bytes=0-3")]);
        assert_eq!(r.status, 304, "{protocol}: {:?}", r.body);
        assert!(r.body.is_empty(), "{protocol}");
        assert_eq!(header(&r, "etag"), Some(&*etag), "{protocol}");
        // It is not: the range of the current answer.
        let r = ask(&[("if-none-match", "\"stale\""), ("range", "bytes=0-3")]);
        assert_eq!(r.status, 206, "{protocol}");
        assert_eq!(&r.body[..], b"{\"me", "{protocol}");
        let r = ask(&[
            ("if-modified-since", "Thu, 01 Jan 1970 00:00:00 GMT"),
            ("range", "bytes=1-2"),
        ]);
        assert_eq!((r.status, &r.body[..]), (206, &b"\"m"[..]), "{protocol}");
        // A range alone, as before.
        let r = ask(&[("range", "bytes=0-3")]);
        assert_eq!((r.status, &r.body[..]), (206, &b"{\"me"[..]), "{protocol}");
    }
}

#[test]
fn head_has_the_content_encoding_vary_and_length_of_its_get() {
    let group = Group::start("sem-head");
    let rt = runtime();
    let mut h2 = rt.block_on(H2::connect(&group));
    // /openapi.json is JSON of some tens of KiB: compressed for a client
    // that accepts it; /noop is under the smallest size compressed.
    for (path, gzip) in [("/openapi.json", true), ("/docs", true), ("/noop", false)] {
        for accept in ["gzip", "br", "identity"] {
            let ask = [("accept-encoding", accept)];
            let answers = [
                (
                    "h1",
                    h1(&group, "GET", path, &ask),
                    h1(&group, "HEAD", path, &ask),
                ),
                (
                    "h2",
                    rt.block_on(h2.send("GET", path, &ask)),
                    rt.block_on(h2.send("HEAD", path, &ask)),
                ),
            ];
            for (protocol, get, head) in answers {
                let what = format!("{protocol} HEAD {path} accept-encoding: {accept}");
                assert_eq!((get.status, head.status), (200, 200), "{what}");
                assert!(head.body.is_empty(), "{what}: a HEAD has no body");
                let coded = accept != "identity" && gzip;
                assert_eq!(
                    header(&head, "content-encoding"),
                    coded.then_some(accept),
                    "{what}"
                );
                for name in ["content-encoding", "vary", "content-type", "etag"] {
                    assert_eq!(header(&head, name), header(&get, name), "{what}: {name}");
                }
                // A length, when a HEAD has one, is the GET's number of
                // bytes (RFC 9110 §8.6); a coded GET's is not known
                // before it is sent, so neither has one.
                match header(&head, "content-length") {
                    Some(length) => {
                        assert!(!coded, "{what}: a length for a coded body");
                        assert_eq!(length.parse::<usize>().unwrap(), get.body.len(), "{what}");
                    }
                    None => assert!(coded, "{what}: no length for an identity body"),
                }
                if coded {
                    assert_eq!(header(&get, "content-length"), None, "{what}");
                }
            }
        }
    }
    // HEAD on a streamed body of known length: its length, nothing else.
    let head = h1(&group, "HEAD", "/stream/100000", &[("accept-encoding", "gzip")]);
    assert_eq!(head.status, 200);
    assert_eq!(header(&head, "content-length"), Some("100000"));
    assert!(head.body.is_empty());
}

#[test]
fn put_with_if_none_match_star_never_overwrites() {
    let group = Group::start("sem-note");
    // A body makes `request_with` send it as JSON.
    let put = |text: &str, headers: &[(&str, &str)]| {
        let body = serde_json::json!({ "text": text }).to_string();
        common::request_with(group.addr, "PUT", "/note", headers, body.as_bytes()).unwrap()
    };
    // No note yet: a create-only PUT goes through, and there is one.
    assert_eq!(common::get(group.addr, "/note").unwrap().status, 404);
    let created = put("first", &[("if-none-match", "*")]);
    assert_eq!(created.status, 200, "{}", created.text());
    let etag = created.header("etag").unwrap().to_owned();
    // Now there is: refused, and the note is untouched.
    let again = put("second", &[("if-none-match", "*")]);
    assert_eq!(again.status, 412, "{}", again.text());
    assert!(again.text().contains("If-None-Match"), "{}", again.text());
    let named = put("second", &[("if-none-match", &format!("\"x\", W/{etag}"))]);
    assert_eq!(
        named.status,
        412,
        "a list naming the current tag (weakly): {}",
        named.text()
    );
    assert_eq!(common::get(group.addr, "/note").unwrap().json()["text"], "first");
    // A tag that is not the current one: the write is done.
    let other = put("third", &[("if-none-match", "\"not-it\"")]);
    assert_eq!(other.status, 200, "{}", other.text());
    assert_eq!(common::get(group.addr, "/note").unwrap().json()["text"], "third");
    // If-Match as before: a stale tag is refused.
    assert_eq!(put("fourth", &[("if-match", &etag)]).status, 412);
}

#[test]
fn two_authorization_headers_are_a_400_over_h1_and_h2() {
    let group = Group::start("sem-two-auth");
    let token = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["token", "--sub", "ada"])
        .output()
        .unwrap();
    assert!(token.status.success());
    let bearer = format!("Bearer {}", String::from_utf8(token.stdout).unwrap().trim());
    let rt = runtime();
    let mut h2 = rt.block_on(H2::connect(&group));
    for path in ["/me", "/noop"] {
        let one = [("authorization", bearer.as_str())];
        let two = [
            ("authorization", bearer.as_str()),
            ("authorization", "Bearer forged"),
        ];
        let swapped = [
            ("authorization", "Bearer forged"),
            ("authorization", bearer.as_str()),
        ];
        let answers = [
            (
                "h1",
                h1(&group, "GET", path, &one),
                h1(&group, "GET", path, &two),
                h1(&group, "GET", path, &swapped),
            ),
            (
                "h2",
                rt.block_on(h2.send("GET", path, &one)),
                rt.block_on(h2.send("GET", path, &two)),
                rt.block_on(h2.send("GET", path, &swapped)),
            ),
        ];
        for (protocol, one, two, swapped) in answers {
            assert_eq!(one.status, 200, "{protocol} {path}: one credential");
            for (order, answer) in [("valid first", two), ("valid second", swapped)] {
                assert_eq!(answer.status, 400, "{protocol} {path}: two, {order}");
                let body = String::from_utf8_lossy(&answer.body);
                assert!(body.contains("more than one Authorization header"), "{body}");
            }
        }
    }
    // The group serves on.
    assert_eq!(h1(&group, "GET", "/noop", &[]).status, 200);
}

#[test]
fn answers_are_dated_over_h1_and_h2() {
    let group = Group::start("sem-date");
    let rt = runtime();
    let mut h2 = rt.block_on(H2::connect(&group));
    for path in ["/noop", "/no/such/route", "/health"] {
        for answer in [
            h1(&group, "GET", path, &[]),
            rt.block_on(h2.send("GET", path, &[])),
        ] {
            let date = header(&answer, "date").unwrap_or_else(|| panic!("{path}: no Date"));
            assert!(httpdate_like(date), "{path}: {date}");
        }
    }
}

/// `Wed, 02 Dec 2026 00:48:23 GMT`.
fn httpdate_like(v: &str) -> bool {
    v.len() == 29 && v.ends_with(" GMT") && v.as_bytes()[3] == b','
}
