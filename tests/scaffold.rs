//! `switchyard new`: the generated crate builds, its test passes, and the
//! group serves it. Ignored by default (it compiles a crate from scratch,
//! about a minute); CI runs it with `--run-ignored`.

mod common;

use common::*;
use std::process::Command;

#[test]
#[ignore = "builds a fresh crate in release mode (~1 min); run by .ci/run"]
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
    for args in [&["test", "--quiet"][..], &["build", "--release", "--quiet"]] {
        let status = Command::new(&cargo)
            .args(args)
            .current_dir(&crate_dir)
            .env_remove("CARGO_TARGET_DIR")
            .status()
            .unwrap();
        assert!(status.success(), "cargo {args:?} failed in the generated crate");
    }

    let g = Group::builder("scaffold-up")
        .config_file(&crate_dir.join("switchyard.toml"))
        .start();
    let r = get(g.addr, "/my-plugin/hello/world").unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.text(), r#"{"message":"Hello, world!","count":1}"#);

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
        let count: serde_json::Value = ws.call("my-plugin.Count", &serde_json::json!({})).await.unwrap();
        assert_eq!(count["count"], 1);
        match ws
            .call::<_, serde_json::Value>("my-plugin.Reset", &serde_json::json!({}))
            .await
        {
            Err(switchyard_client::ClientError::Status { status: 404, .. }) => {}
            other => panic!("an internal event answered a client: {other:?}"),
        }
    });
}
