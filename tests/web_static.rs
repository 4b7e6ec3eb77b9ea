//! `[[static]]` mounts against the real group (docs/web.md, decision
//! 0067): validators and 304s, ranges with `If-Range`, precompressed
//! siblings, MIME types, `HEAD`, index files, and every way out of a mount
//! the issue names, one by one.

mod common;

use std::io::Write;
use std::path::Path;

use common::{Group, HttpResponse, raw, request_with};

/// A request with raw header lines, the path sent byte for byte.
fn ask(group: &Group, method: &str, path: &str, headers: &[(&str, &str)]) -> HttpResponse {
    request_with(group.addr, method, path, headers, b"").unwrap()
}

fn get(group: &Group, path: &str, headers: &[(&str, &str)]) -> HttpResponse {
    ask(group, "GET", path, headers)
}

const SECRET: &str = "outside-the-mount-secret";

/// The tree served: `root/` (mounted at `/s/`) beside `outside/`, whose
/// content must never be served.
fn tree(base: &Path) {
    let root = base.join("root");
    let outside = base.join("outside");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::create_dir_all(root.join("plain")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), SECRET).unwrap();
    std::fs::write(root.join("a.txt"), "0123456789abcdefghij").unwrap();
    std::fs::write(root.join("Upper.TXT"), "upper").unwrap();
    std::fs::write(root.join(".secret"), SECRET).unwrap();
    std::fs::write(root.join("sub/index.html"), "<p>index</p>").unwrap();
    std::fs::write(root.join("plain/x.txt"), "x").unwrap();
    std::fs::write(root.join("plain/long.txt"), "compressible text\n".repeat(300)).unwrap();
    std::fs::write(root.join("img.png"), b"\x89PNG\r\n\x1a\n").unwrap();
    std::fs::write(root.join("blob.unknownext"), b"?").unwrap();
    let css = "body { color: red; }\n".repeat(20);
    std::fs::write(root.join("style.css"), &css).unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(css.as_bytes()).unwrap();
    std::fs::write(root.join("style.css.gz"), gz.finish().unwrap()).unwrap();
    let mut br = Vec::new();
    brotli::BrotliCompress(&mut css.as_bytes(), &mut br, &Default::default()).unwrap();
    std::fs::write(root.join("style.css.br"), br).unwrap();
    // 3 MiB: streamed in chunks, never read whole.
    let big: Vec<u8> = (0..3u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(root.join("big.bin"), big).unwrap();
    std::os::unix::fs::symlink("a.txt", root.join("link_in")).unwrap();
    std::os::unix::fs::symlink(outside.join("secret.txt"), root.join("link_out")).unwrap();
    std::os::unix::fs::symlink("../outside", root.join("dir_out")).unwrap();
    std::os::unix::fs::symlink("/etc", root.join("etc")).unwrap();
}

fn start(base: &Path) -> Group {
    tree(base);
    let config = format!(
        r#"
[[static]]
prefix = "/s/"
dir = "{root}"
index = "index.html"
cache_control = "public, max-age=60"

[[static]]
prefix = "/plain/"
dir = "{plain}"
precompressed = false
"#,
        root = base.join("root").display(),
        plain = base.join("root/plain").display(),
    );
    Group::builder("web-static").config(&config).start()
}

#[test]
fn files_validators_ranges_and_codings() {
    let scratch = common::scratch_dir("web-static-tree");
    let group = start(scratch.path());

    // A plain file: body, type, validators, cache-control.
    let r = get(&group, "/s/a.txt", &[]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.text(), "0123456789abcdefghij");
    assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));
    assert_eq!(r.header("cache-control"), Some("public, max-age=60"));
    assert_eq!(r.header("accept-ranges"), Some("bytes"));
    let etag = r.header("etag").expect("an ETag").to_owned();
    let modified = r.header("last-modified").expect("a Last-Modified").to_owned();

    // Revalidation: 304 with the validators, no body.
    for headers in [
        vec![("if-none-match", etag.as_str())],
        vec![("if-none-match", &*format!("\"other\", W/{etag}"))],
        vec![("if-modified-since", modified.as_str())],
    ] {
        let r = get(&group, "/s/a.txt", &headers);
        assert_eq!(r.status, 304, "{headers:?}");
        assert!(r.body.is_empty());
        assert_eq!(r.header("etag"), Some(etag.as_str()));
    }
    // If-None-Match wins over If-Modified-Since; a stale date is a 200.
    let r = get(
        &group,
        "/s/a.txt",
        &[("if-none-match", "\"stale\""), ("if-modified-since", &modified)],
    );
    assert_eq!(r.status, 200);
    let r = get(
        &group,
        "/s/a.txt",
        &[("if-modified-since", "Thu, 01 Jan 1998 00:00:00 GMT")],
    );
    assert_eq!(r.status, 200);
    // A failed If-Match is 412.
    assert_eq!(get(&group, "/s/a.txt", &[("if-match", "\"stale\"")]).status, 412);
    assert_eq!(get(&group, "/s/a.txt", &[("if-match", &etag)]).status, 200);

    // Ranges: 206, suffix, 416 with the length, several ranges → whole.
    let r = get(&group, "/s/a.txt", &[("range", "bytes=0-9")]);
    assert_eq!((r.status, r.text().as_str()), (206, "0123456789"));
    assert_eq!(r.header("content-range"), Some("bytes 0-9/20"));
    let r = get(&group, "/s/a.txt", &[("range", "bytes=-5")]);
    assert_eq!((r.status, r.text().as_str()), (206, "fghij"));
    let r = get(&group, "/s/a.txt", &[("range", "bytes=100-200")]);
    assert_eq!(r.status, 416);
    assert_eq!(r.header("content-range"), Some("bytes */20"));
    assert_eq!(get(&group, "/s/a.txt", &[("range", "bytes=0-1,4-5")]).status, 200);

    // If-Range: the range only while the validator names this file.
    let r = get(&group, "/s/a.txt", &[("range", "bytes=0-3"), ("if-range", &etag)]);
    assert_eq!((r.status, r.text().as_str()), (206, "0123"));
    let r = get(
        &group,
        "/s/a.txt",
        &[("range", "bytes=0-3"), ("if-range", "\"changed\"")],
    );
    assert_eq!((r.status, r.text().as_str()), (200, "0123456789abcdefghij"));
    let weak = format!("W/{etag}");
    let r = get(&group, "/s/a.txt", &[("range", "bytes=0-3"), ("if-range", &weak)]);
    assert_eq!(r.status, 200, "a weak tag never validates a range");
    let r = get(
        &group,
        "/s/a.txt",
        &[("range", "bytes=0-3"), ("if-range", &modified)],
    );
    assert_eq!(r.status, 206);
    let r = get(
        &group,
        "/s/a.txt",
        &[
            ("range", "bytes=0-3"),
            ("if-range", "Thu, 01 Jan 1998 00:00:00 GMT"),
        ],
    );
    assert_eq!(r.status, 200);

    // HEAD: the headers and length of GET, no body.
    let r = ask(&group, "HEAD", "/s/a.txt", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length"), Some("20"));
    assert!(r.body.is_empty());
    // Read-only.
    let r = ask(&group, "POST", "/s/a.txt", &[]);
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("GET, HEAD, OPTIONS"));

    // Precompressed siblings by Accept-Encoding, br first; each its own tag.
    let css = get(&group, "/s/style.css", &[]);
    assert_eq!(css.header("content-encoding"), None);
    assert_eq!(css.header("content-type"), Some("text/css; charset=utf-8"));
    assert_eq!(css.header("vary"), Some("accept-encoding"));
    let gz = get(&group, "/s/style.css", &[("accept-encoding", "gzip")]);
    assert_eq!(gz.header("content-encoding"), Some("gzip"));
    let mut plain = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz.body[..]), &mut plain).unwrap();
    assert_eq!(plain, css.body);
    assert_ne!(gz.header("etag"), css.header("etag"));
    let br = get(&group, "/s/style.css", &[("accept-encoding", "gzip, br")]);
    assert_eq!(br.header("content-encoding"), Some("br"));
    let r = get(&group, "/s/style.css", &[("accept-encoding", "gzip;q=0, br;q=0")]);
    assert_eq!(r.header("content-encoding"), None);
    // A range is cut from the file itself.
    let r = get(
        &group,
        "/s/style.css",
        &[("accept-encoding", "gzip"), ("range", "bytes=0-3")],
    );
    assert_eq!((r.status, r.header("content-encoding")), (206, None));
    assert_eq!(r.text(), "body");
    // A 304 for the gzip variant's own tag.
    let r = get(
        &group,
        "/s/style.css",
        &[
            ("accept-encoding", "gzip"),
            ("if-none-match", gz.header("etag").unwrap()),
        ],
    );
    assert_eq!(r.status, 304);
    // A mount without precompression serves the file as it is.
    let r = get(&group, "/plain/x.txt", &[("accept-encoding", "gzip")]);
    assert_eq!((r.status, r.header("vary")), (200, None));
    // What the compression middleware encodes on the fly is other bytes:
    // its tag is made weak, so it revalidates but never validates a range.
    let identity = get(&group, "/plain/long.txt", &[]);
    let strong = identity.header("etag").unwrap().to_owned();
    let r = get(&group, "/plain/long.txt", &[("accept-encoding", "gzip")]);
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    assert_eq!(r.header("etag"), Some(&*format!("W/{strong}")));
    let r = get(
        &group,
        "/plain/long.txt",
        &[
            ("accept-encoding", "gzip"),
            ("if-none-match", &format!("W/{strong}")),
        ],
    );
    assert_eq!(r.status, 304);

    // Media types by extension.
    assert_eq!(
        get(&group, "/s/img.png", &[]).header("content-type"),
        Some("image/png")
    );
    assert_eq!(
        get(&group, "/s/blob.unknownext", &[]).header("content-type"),
        Some("application/octet-stream")
    );

    // Index files; a mount without one lists nothing.
    assert_eq!(get(&group, "/s/sub/", &[]).text(), "<p>index</p>");
    assert_eq!(get(&group, "/s/sub", &[]).text(), "<p>index</p>");
    assert_eq!(get(&group, "/plain/", &[]).status, 404);
    let r = get(&group, "/s/", &[]);
    assert_eq!(
        (r.status, r.header("content-type")),
        (404, Some("application/problem+json"))
    );

    // A large file streams whole, and a range from its middle is exact.
    let big = std::fs::read(scratch.path().join("root/big.bin")).unwrap();
    let r = get(&group, "/s/big.bin", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length"), Some(&*big.len().to_string()));
    assert!(r.body == big, "the large file came back different");
    let r = get(&group, "/s/big.bin", &[("range", "bytes=1000000-2500000")]);
    assert_eq!(r.status, 206);
    assert!(
        r.body == big[1_000_000..=2_500_000],
        "the range came back different"
    );

    // A symlink that stays inside the mount is followed.
    assert_eq!(get(&group, "/s/link_in", &[]).text(), "0123456789abcdefghij");
    // Names are used as they are: no case folding.
    assert_eq!(get(&group, "/s/Upper.TXT", &[]).status, 200);
    assert_eq!(get(&group, "/s/upper.txt", &[]).status, 404);
    assert_eq!(get(&group, "/s/A.TXT", &[]).status, 404);
}

#[test]
fn nothing_outside_a_mount_is_served() {
    let scratch = common::scratch_dir("web-static-attack");
    let group = start(scratch.path());
    // Sent byte for byte: no client normalises these away.
    let attacks = [
        "/s/../outside/secret.txt",
        "/s/sub/../../outside/secret.txt",
        "/s/%2e%2e/outside/secret.txt",
        "/s/%2E%2E/outside/secret.txt",
        "/s/.%2e/outside/secret.txt",
        "/s/%2e%2e%2foutside%2fsecret.txt",
        "/s/..%2foutside%2fsecret.txt",
        "/s/..%2Foutside%2Fsecret.txt",
        "/s/..%5coutside%5csecret.txt",
        "/s/%2e%2e%5coutside%5csecret.txt",
        "/s/a.txt%00.png",
        "/s/%00",
        "/s//etc/passwd",
        "/s/%2fetc%2fpasswd",
        "/s/link_out",
        "/s/dir_out/secret.txt",
        "/s/etc/passwd",
        "/s/.secret",
        "/s/%2esecret",
        "/s/./a.txt",
    ];
    for path in attacks {
        let r = get(&group, path, &[]);
        // An encoded `/`, `\` or NUL is refused before any mount sees the
        // path (400, decision 0104); the rest find no file (404).
        assert!(matches!(r.status, 400 | 404), "{path}: {}", r.text());
        assert!(!r.text().contains(SECRET), "{path} leaked the secret");
        assert!(!r.text().contains("root:"), "{path} leaked /etc/passwd");
    }
    // A backslash is not even a valid request-target: refused before any
    // file is looked at (hyper's 400), never served.
    for path in ["/s/..\\outside\\secret.txt", "/s/a\\..\\..\\outside\\secret.txt"] {
        let request = format!("GET {path} HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n");
        match raw(group.addr, request.as_bytes()) {
            Ok(r) => {
                assert!(matches!(r.status, 400 | 404), "{path}: {}", r.status);
                assert!(!r.text().contains(SECRET), "{path} leaked the secret");
            }
            // Closed without an answer: nothing was served either.
            Err(err) => assert!(err.kind() != std::io::ErrorKind::TimedOut, "{path}: {err}"),
        }
    }
    // And the group goes on serving.
    assert_eq!(get(&group, "/s/a.txt", &[]).status, 200);
    assert_eq!(get(&group, "/health", &[]).status, 200);
}

#[test]
fn a_bad_mount_is_refused_naming_the_key() {
    let scratch = common::scratch_dir("web-static-bad");
    let config = format!(
        "[[static]]\nprefix = \"static\"\ndir = \"{0}\"\n\n[[static]]\nprefix = \"/x/\"\ndir = \"{0}/missing\"\n\n\
         [[static]]\nprefix = \"/\"\ndir = \"{0}\"\n",
        scratch.path().display(),
    );
    let out = match Group::builder("web-static-bad").config(&config).try_start() {
        Ok(_) => panic!("a group with bad mounts started"),
        Err(out) => out,
    };
    assert!(out.contains("static[0].prefix"), "{out}");
    assert!(out.contains("static[1].dir"), "{out}");
    assert!(out.contains("static[2].prefix"), "{out}");
}

/// The demo's `/static/` mount, as the issue describes it.
#[test]
fn the_demo_mount() {
    let group = Group::start("web-static-demo");
    let r = get(&group, "/static/demo.css", &[]);
    assert_eq!(r.status, 200);
    let etag = r.header("etag").unwrap().to_owned();
    let gz = get(&group, "/static/demo.css", &[("accept-encoding", "gzip")]);
    assert_eq!(gz.header("content-encoding"), Some("gzip"));
    assert_eq!(
        get(&group, "/static/demo.css", &[("if-none-match", &etag)]).status,
        304
    );
    let r = get(&group, "/static/demo.css", &[("range", "bytes=0-9")]);
    assert_eq!((r.status, r.body.len()), (206, 10));
    assert_eq!(get(&group, "/static/../Cargo.toml", &[]).status, 404);
    assert_eq!(get(&group, "/static/%2e%2e/Cargo.toml", &[]).status, 404);
    assert_eq!(
        get(&group, "/static/", &[]).header("content-type"),
        Some("text/html; charset=utf-8")
    );
}
