//! `switchyard new`: the generated crate builds, its test passes, and
//! `switchyard dev` serves it (ignored by default: it compiles a crate
//! from scratch, a few minutes; CI runs it with `--run-ignored`). And
//! examples/tickets is what the scaffold grows into: the same layout, the
//! same handler style, and a README that walks from one to the other.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Every file under `dir`, relative to it.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap().map(Result::unwrap) {
            let path = entry.path();
            if path.is_dir() {
                todo.push(path);
            } else {
                out.push(path.strip_prefix(dir).unwrap().to_owned());
            }
        }
    }
    out.sort();
    out
}

/// What a handler written today uses, and what it no longer needs
/// (docs/writing-managers.md, decision 0125).
const CURRENT_STYLE: &[&str] = &["r.handle(", "reply = ", "#[from(", "tracing::", "async fn "];
const OLD_STYLE: &[&str] = &[
    "request_async",
    "r.request(",
    "cx.log(",
    "cx.log_at(",
    "cx.header(",
    "request(headers",
    "request(identity",
    "impl Reply + use<>",
    "is_null()",
];

fn assert_current_style(what: &str, source: &str) {
    for want in CURRENT_STYLE {
        assert!(source.contains(want), "{what} does not use `{want}`");
    }
    for old in OLD_STYLE {
        assert!(!source.contains(old), "{what} still uses `{old}`");
    }
}

#[test]
fn the_tickets_example_grows_from_the_scaffold() {
    let base = scratch_dir("scaffold-layout");
    let crate_dir = base.path().join("tickets");
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .arg("new")
        .arg(&crate_dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("switchyard dev"), "{said}");

    // Each file and directory the scaffold writes, the example has (it
    // adds its own: migrations, more templates, more modules).
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/tickets");
    let scaffolded = files(&crate_dir);
    for file in &scaffolded {
        if file == Path::new(".gitignore") {
            continue;
        }
        let there = match file.parent() {
            Some(dir) if dir == Path::new("templates") => example.join(dir),
            _ => example.join(file),
        };
        assert!(
            there.exists(),
            "`switchyard new` writes {} but examples/tickets has no {}",
            file.display(),
            there.display()
        );
    }
    assert!(
        scaffolded.contains(&PathBuf::from("templates/hello.html")),
        "{scaffolded:?}"
    );

    // The same way of writing a handler in both.
    let generated = std::fs::read_to_string(crate_dir.join("src/lib.rs")).unwrap();
    assert_current_style("the scaffold's src/lib.rs", &generated);
    assert!(generated.contains("get_or_default"));
    let tickets = std::fs::read_to_string(example.join("src/lib.rs")).unwrap();
    assert_current_style("examples/tickets/src/lib.rs", &tickets);
    // Both serve what `switchyard dev` builds from their switchyard.toml:
    // a plugin in a cargo target directory.
    for config in [crate_dir.join("switchyard.toml"), example.join("switchyard.toml")] {
        let text = std::fs::read_to_string(&config).unwrap();
        assert!(
            text.lines()
                .any(|l| l.starts_with("plugin = ") && l.contains("target/")),
            "{}: {text}",
            config.display()
        );
    }

    // The README walks from `switchyard new` to `switchyard dev`, and
    // names the two commands that run the finished example and its test.
    let readme = std::fs::read_to_string(example.join("README.md")).unwrap();
    for step in [
        "cargo run --release -- new tickets",
        "cargo add ",
        "switchyard dev",
        "cargo run --release -- dev -c examples/tickets/switchyard.toml",
        "cargo nextest run -p switchyard --test tickets",
    ] {
        assert!(readme.contains(step), "examples/tickets/README.md lacks `{step}`");
    }
    // Its dependencies are what the README's `cargo add` adds.
    let manifest = std::fs::read_to_string(example.join("Cargo.toml")).unwrap();
    let add = readme
        .lines()
        .find(|l| l.trim_start().starts_with("cargo add "))
        .unwrap();
    for dependency in ["tokio-postgres", "deadpool-postgres", "reqwest", "tokio"] {
        assert!(manifest.contains(dependency), "{manifest}");
        assert!(add.contains(dependency), "{add}");
    }
}

#[test]
#[ignore = "builds a fresh crate from scratch (a few minutes); run by .ci/run"]
fn a_new_plugin_builds_tests_and_serves() {
    let base = scratch_dir("scaffold");
    let crate_dir = base.path().join("my-plugin");
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .arg("new")
        .arg(&crate_dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Refuses to overwrite.
    let again = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .arg("new")
        .arg(&crate_dir)
        .output()
        .unwrap();
    assert!(!again.status.success());

    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let target = crate_dir.join("target");
    let status = Command::new(&cargo)
        .args(["test", "--quiet"])
        .current_dir(&crate_dir)
        .env("CARGO_TARGET_DIR", &target)
        .status()
        .unwrap();
    assert!(status.success(), "cargo test failed in the generated crate");

    // `switchyard dev` builds the plugin (no `cargo build` of ours) and
    // serves it, as the crate's README says.
    let mut g = Group::builder("scaffold-up")
        .dev()
        .config_file(&crate_dir.join("switchyard.toml"))
        .env("CARGO_TARGET_DIR", &target.display().to_string())
        .ready_within(Duration::from_secs(600))
        .start();
    g.wait_line("switchyard dev: watching");
    let r = get(g.addr, "/my-plugin/hello/world").unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.text(), r#"{"message":"Hello, world!","count":1}"#);
    let page = request_with(
        g.addr,
        "GET",
        "/my-plugin/hello/Ada",
        &[("accept", "text/html")],
        b"",
    )
    .unwrap();
    assert_eq!(page.status, 200, "{}", page.text());
    assert!(page.text().contains("<h1>Hello, Ada!</h1>"), "{}", page.text());

    // The template shows both kinds of event: `Count` is public (no
    // route, `#[event(public)]`), `Reset` internal (decision 0108).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let ws = switchyard_client::Client::connect(&format!("ws://{}/ws", g.addr))
            .await
            .unwrap();
        // Two greetings so far: the JSON one and the page.
        let count: serde_json::Value = ws.call("my-plugin.Count", &serde_json::json!({})).await.unwrap();
        assert_eq!(count["count"], 2);
        match ws
            .call::<_, serde_json::Value>("my-plugin.Reset", &serde_json::json!({}))
            .await
        {
            Err(switchyard_client::ClientError::Status { status: 404, .. }) => {}
            other => panic!("an internal event answered a client: {other:?}"),
        }
    });
}
