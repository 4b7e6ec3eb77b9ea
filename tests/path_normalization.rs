//! Paths normalized once (decision 0104), against a real group: a rule on
//! a static mount's directory (`/files/private`) and one on a route's
//! parameter value (`/hello/admin`) hold for every percent-encoded
//! spelling of the paths they protect. A property test sends random
//! spellings (each character as it is, or escaped in either case; a `/`
//! as it is or `%2F`) without a credential: each is refused (401 by the
//! rule, or 400 for an encoded `/`) and none reaches the file or the
//! handler. With a token the same spellings reach them, which shows they
//! name what the rule protects.

mod common;

use common::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

const SECRET: &str = "only-for-identified-callers";
const KEY: &str = "path-normalization-test-secret-32b!";

fn group(base: &std::path::Path) -> Group {
    std::fs::create_dir_all(base.join("files/private")).unwrap();
    std::fs::write(base.join("files/private/secret.txt"), SECRET).unwrap();
    std::fs::write(base.join("files/public.txt"), "public").unwrap();
    let config = format!(
        r#"[[managers]]
name = "basics"

[[static]]
prefix = "/files/"
dir = "{dir}"

[auth.jwt]
algorithms = ["HS256"]
secret = "{KEY}"

[[auth.rules]]
prefix = "/files/private"

[[auth.rules]]
prefix = "/hello/admin"
"#,
        dir = base.join("files").display()
    );
    Group::builder("path-normalization").config(&config).start()
}

fn bearer() -> String {
    let claims = serde_json::json!({
        "sub": "ada",
        "exp": jsonwebtoken::get_current_timestamp() + 600,
    });
    let token = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(KEY.as_bytes()),
    )
    .unwrap();
    format!("Bearer {token}")
}

/// `path` with each character spelled as `how` says: 0 as it is, 1 as a
/// lower-case escape, 2 as an upper-case one.
fn spell(path: &str, how: &[u8]) -> String {
    let mut out = String::new();
    for (i, c) in path.chars().enumerate() {
        // The leading `/` stays: it is the request target's.
        match how.get(i).copied().filter(|_| i > 0).unwrap_or(0) {
            0 => out.push(c),
            1 => out.push_str(&format!("%{:02x}", c as u32)),
            _ => out.push_str(&format!("%{:02X}", c as u32)),
        }
    }
    out
}

fn spellings(path: &'static str) -> impl Strategy<Value = String> {
    proptest::collection::vec(0u8..3, path.len()).prop_map(move |how| spell(path, &how))
}

#[test]
fn no_spelling_of_a_protected_path_gets_past_its_rule() {
    let scratch = scratch_dir("path-normalization");
    let g = group(scratch.path());
    let addr = g.addr;

    // Before normalization, these two reached the file and the handler.
    assert_eq!(get(addr, "/files/%70rivate/secret.txt").unwrap().status, 401);
    assert_eq!(get(addr, "/hello/%61dmin").unwrap().status, 401);
    // Unprotected neighbours are served as before.
    assert_eq!(get(addr, "/files/public.txt").unwrap().text(), "public");
    assert_eq!(get(addr, "/files/%70ublic.txt").unwrap().text(), "public");
    assert_eq!(get(addr, "/hello/bob").unwrap().status, 200);
    // Encoded separators and NUL: 400, saying why.
    for (path, why) in [
        ("/files%2Fprivate/secret.txt", "%2F"),
        ("/files/private%2fsecret.txt", "%2F"),
        ("/files/private%5csecret.txt", "%5C"),
        ("/hello/admin%00", "%00"),
        ("/hello/adm%zzin", "two hex digits"),
    ] {
        let r = get(addr, path).unwrap();
        assert_eq!(r.status, 400, "{path}: {}", r.text());
        assert_eq!(
            r.header("content-type"),
            Some("application/problem+json"),
            "{path}"
        );
        assert!(r.text().contains(why), "{path}: {}", r.text());
    }

    let token = bearer();
    let mut runner = TestRunner::new(Config {
        cases: 48,
        failure_persistence: None,
        ..Config::default()
    });
    for (protected, reached) in [
        ("/files/private/secret.txt", SECRET),
        ("/hello/admin", "Hello, admin"),
    ] {
        runner
            .run(&spellings(protected), |path| {
                let anonymous = get(addr, &path).unwrap();
                prop_assert!(
                    matches!(anonymous.status, 400 | 401),
                    "{path}: {} {}",
                    anonymous.status,
                    anonymous.text()
                );
                prop_assert!(!anonymous.text().contains(reached), "{path} reached it");
                // The spelling names the protected resource: with a
                // credential it is there (unless it encoded a `/`).
                let known = request_with(addr, "GET", &path, &[("authorization", &token)], b"").unwrap();
                if anonymous.status == 401 {
                    prop_assert_eq!(known.status, 200, "{}: {}", path, known.text());
                    prop_assert!(known.text().contains(reached), "{path}: {}", known.text());
                }
                Ok(())
            })
            .unwrap();
    }
}
