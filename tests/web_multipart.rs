//! `multipart/form-data` uploads against the real group (docs/web.md,
//! decision 0068): fields into the event, files streamed to the handler,
//! limits as 413, and nothing left behind by a cancelled upload or a
//! killed manager.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::path::Path;

use common::{Group, HttpResponse, PATIENCE, eventually};
use sha2::Digest;

const BOUNDARY: &str = "----switchyard-test-boundary-7d1";

/// One part: (field name, file name, content type, bytes).
type PartSpec<'a> = (&'a str, Option<&'a str>, Option<&'a str>, &'a [u8]);

fn form(parts: &[PartSpec<'_>]) -> Vec<u8> {
    let mut body = Vec::new();
    for (name, filename, content_type, bytes) in parts {
        body.extend_from_slice(format!("--{BOUNDARY}\r\n").as_bytes());
        let mut disposition = format!("Content-Disposition: form-data; name=\"{name}\"");
        if let Some(f) = filename {
            disposition.push_str(&format!("; filename=\"{f}\""));
        }
        body.extend_from_slice(disposition.as_bytes());
        body.extend_from_slice(b"\r\n");
        if let Some(ct) = content_type {
            body.extend_from_slice(format!("Content-Type: {ct}\r\n").as_bytes());
        }
        body.extend_from_slice(b"\r\n");
        body.extend_from_slice(bytes);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{BOUNDARY}--\r\n").as_bytes());
    body
}

fn post(group: &Group, content_type: &str, body: &[u8]) -> HttpResponse {
    let head = format!(
        "POST /files HTTP/1.1\r\nhost: t\r\nconnection: close\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body);
    common::raw(group.addr, &bytes).unwrap()
}

fn multipart() -> String {
    format!("multipart/form-data; boundary={BOUNDARY}")
}

fn sha256(bytes: &[u8]) -> String {
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The group, with temporary files (if anything made one) kept in `tmp`.
fn start(tag: &'static str, tmp: &Path) -> Group {
    Group::builder(tag)
        .env("TMPDIR", &tmp.display().to_string())
        .start()
}

#[test]
fn fields_and_files_with_limits() {
    let tmp = common::scratch_dir("web-multipart-tmp");
    let group = start("web-multipart", tmp.path());
    let small = b"hello world".as_slice();
    let large: Vec<u8> = (0..5u32 << 20).map(|i| (i % 253) as u8).collect();
    let body = form(&[
        ("note", None, None, b"two files"),
        ("file", Some("a.txt"), Some("text/plain"), small),
        ("file", Some("big.bin"), Some("application/octet-stream"), &large),
    ]);
    let r = post(&group, &multipart(), &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let answer = r.json();
    assert_eq!(answer["note"], "two files");
    let files = answer["files"].as_array().unwrap();
    assert_eq!(files.len(), 2);
    assert_eq!(files[0]["field"], "file");
    assert_eq!(files[0]["filename"], "a.txt");
    assert_eq!(files[0]["content_type"], "text/plain");
    assert_eq!(files[0]["length"], 11);
    assert_eq!(files[0]["sha256"], sha256(small));
    assert_eq!(files[1]["filename"], "big.bin");
    assert_eq!(files[1]["length"], large.len());
    assert_eq!(files[1]["sha256"], sha256(&large));

    // The event's validation applies to the form's fields.
    let long_note = "n".repeat(300);
    let r = post(
        &group,
        &multipart(),
        &form(&[("note", None, None, long_note.as_bytes())]),
    );
    assert_eq!(r.status, 422, "{}", r.text());

    // Limits: a part over 8 MiB, a text field over 64 KiB, too many parts.
    let huge = vec![7u8; 9 << 20];
    let r = post(
        &group,
        &multipart(),
        &form(&[("file", Some("huge"), None, &huge)]),
    );
    assert_eq!(r.status, 413, "{}", r.text());
    let big_field = vec![b'x'; 70 << 10];
    let r = post(&group, &multipart(), &form(&[("note", None, None, &big_field)]));
    assert_eq!(r.status, 413, "{}", r.text());
    let many: Vec<PartSpec<'_>> = (0..40).map(|_| ("f", Some("x"), None, b"x".as_slice())).collect();
    let r = post(&group, &multipart(), &form(&many));
    assert_eq!(r.status, 413, "{}", r.text());

    // Not multipart: 415; cut short: 400.
    let r = post(&group, "application/json", b"{}");
    assert_eq!(r.status, 415, "{}", r.text());
    let mut cut = form(&[("file", Some("a"), None, b"abc")]);
    cut.truncate(cut.len() - 10);
    let r = post(&group, &multipart(), &cut);
    assert_eq!(r.status, 400, "{}", r.text());

    // Nothing was written to disk along the way.
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    assert_eq!(
        post(&group, &multipart(), &form(&[("note", None, None, b"ok")])).status,
        200
    );
}

/// Starts an upload of `declared` bytes, sends `sent` of them, and leaves.
fn abandon_upload(group: &Group, declared: usize, sent: usize) {
    let mut stream = TcpStream::connect(group.addr).unwrap();
    let head = format!(
        "POST /files HTTP/1.1\r\nhost: t\r\ncontent-type: {}\r\ncontent-length: {declared}\r\n\r\n",
        multipart()
    );
    stream.write_all(head.as_bytes()).unwrap();
    let mut body = form(&[("file", Some("partial.bin"), None, &vec![1u8; declared])]);
    body.truncate(sent);
    stream.write_all(&body).unwrap();
    drop(stream);
}

#[test]
fn a_cancelled_upload_leaves_nothing_behind() {
    let tmp = common::scratch_dir("web-multipart-cancel-tmp");
    let group = start("web-multipart-cancel", tmp.path());
    let basics = group.pid_of("basics");
    // A whole upload first, so that what a first upload sets up for good
    // (a thread, a pipe pool) is in the baseline.
    assert_eq!(
        post(&group, &multipart(), &form(&[("file", Some("a"), None, b"abc")])).status,
        200
    );
    let baseline = common::open_fds(basics);
    let shm_before = common::dev_shm_listing();

    for _ in 0..3 {
        abandon_upload(&group, 6 << 20, 2 << 20);
    }
    // The upload pipes close with their requests: the manager's
    // descriptors come back to where they were.
    eventually("the manager's descriptors back to the baseline", PATIENCE, || {
        let now = common::open_fds(basics);
        if now <= baseline { Ok(()) } else { Err(now) }
    });
    assert_eq!(
        std::fs::read_dir(tmp.path()).unwrap().count(),
        0,
        "a temporary file was left"
    );
    let shm_after = common::dev_shm_listing();
    assert!(
        shm_after.iter().all(|name| shm_before.contains(name)),
        "new names in /dev/shm: {shm_after:?}"
    );
    assert_eq!(
        post(&group, &multipart(), &form(&[("file", Some("a"), None, b"abc")])).status,
        200
    );
}

#[test]
fn a_killed_manager_mid_upload_leaves_nothing_behind() {
    let tmp = common::scratch_dir("web-multipart-kill-tmp");
    let group = start("web-multipart-kill", tmp.path());
    let shm_before = common::dev_shm_listing();
    let mut stream = TcpStream::connect(group.addr).unwrap();
    let declared = 6 << 20;
    let head = format!(
        "POST /files HTTP/1.1\r\nhost: t\r\ncontent-type: {}\r\ncontent-length: {declared}\r\n\r\n",
        multipart()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream
        .write_all(&form(&[("file", Some("x"), None, &[0u8; 1 << 20])])[..1 << 20])
        .unwrap();
    let old = group.kill9("basics");
    group.eventually_restarted("basics", old);
    drop(stream);
    assert_eq!(
        std::fs::read_dir(tmp.path()).unwrap().count(),
        0,
        "a temporary file was left"
    );
    let shm_after = common::dev_shm_listing();
    assert!(
        shm_after.iter().all(|name| shm_before.contains(name)),
        "new names in /dev/shm: {shm_after:?}"
    );
    group.eventually_status("/hello/again", 200);
    assert_eq!(
        post(&group, &multipart(), &form(&[("file", Some("a"), None, b"abc")])).status,
        200
    );
}

/// A preamble, or a part's header block, that never ends is refused at
/// 16 KiB: before, multer buffered it (and searched it again per chunk)
/// up to the whole upload limit, 4 GiB by default. The manager's memory
/// stays where it was through 64 MiB of either.
#[test]
fn endless_preambles_and_part_headers_are_refused_with_memory_flat() {
    let tmp = tempfile::tempdir().unwrap();
    let group = start("multipart-flood", tmp.path());
    let basics = group.pid_of("basics");
    // Warm: the first upload's thread and buffers are part of the baseline.
    assert_eq!(
        post(&group, &multipart(), &form(&[("note", None, None, b"ok")])).status,
        200
    );
    let baseline = common::rss_kib(basics);
    let flood = vec![b'a'; 64 << 20];
    let r = post_refused(&group, &flood);
    assert_eq!(r.status, 413, "{}", r.text());
    assert!(
        r.text().contains("preamble is longer than 16384 bytes"),
        "{}",
        r.text()
    );
    let mut headers =
        format!("--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"a\"\r\nx-pad: ").into_bytes();
    headers.extend_from_slice(&flood);
    let r = post_refused(&group, &headers);
    assert_eq!(r.status, 413, "{}", r.text());
    assert!(
        r.text().contains("header block is longer than 16384 bytes"),
        "{}",
        r.text()
    );
    let grown = common::rss_kib(basics).saturating_sub(baseline);
    assert!(grown < 16 << 10, "the manager grew by {grown} KiB");
    assert_eq!(
        post(&group, &multipart(), &form(&[("note", None, None, b"ok")])).status,
        200
    );
}

/// Posts a large form that the group answers before reading it all: the
/// body is written from another thread (a write the server's early close
/// cuts off is expected), and the answer read as it comes.
fn post_refused(group: &Group, body: &[u8]) -> HttpResponse {
    use std::io::Read;
    let mut stream = TcpStream::connect(group.addr).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let head = format!(
        "POST /files HTTP/1.1\r\nhost: t\r\nconnection: close\r\ncontent-type: {}\r\ncontent-length: {}\r\n\r\n",
        multipart(),
        body.len()
    );
    let mut writer = stream.try_clone().unwrap();
    let body = body.to_vec();
    let sending = std::thread::spawn(move || {
        let _ = writer
            .write_all(head.as_bytes())
            .and_then(|()| writer.write_all(&body));
    });
    let mut answer = Vec::new();
    let mut buf = [0u8; 16 << 10];
    // Up to the end, or a reset once the answer is in (the server closed
    // with our bytes unread).
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(_) if !answer.is_empty() => break,
            Err(err) => panic!("no answer: {err}"),
        }
    }
    let _ = stream.shutdown(std::net::Shutdown::Both);
    sending.join().unwrap();
    common::parse_response(&answer).unwrap()
}
