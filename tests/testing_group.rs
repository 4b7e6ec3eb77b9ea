//! `switchyard_manager_host::testing::Group::start_crate`, as a plugin's own
//! integration test uses it: it builds the crate under test in the test's
//! profile and serves that build, whatever path its switchyard.toml names;
//! and `Group::start` under `[listener.tls]`, which it waits on through the
//! readiness file and speaks HTTPS to.

use std::io::Read;

use switchyard_manager_host::testing::Group;

/// The plugin's test finds `switchyard` on PATH or here.
fn point_at_the_binary() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    // SAFETY: nextest runs each test in a process of its own, and this runs
    // before the test starts a thread; under `cargo test` the `Once` keeps
    // it to the first call, before either test has started the group.
    ONCE.call_once(|| unsafe { std::env::set_var("SWITCHYARD_BIN", env!("CARGO_BIN_EXE_switchyard")) });
}

#[test]
fn start_crate_serves_the_plugin_just_built() {
    point_at_the_binary();
    let shop = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/shop");
    let group = Group::start_crate(shop).unwrap();
    let (status, body) = group.get("/inventory/apple").unwrap();
    assert_eq!(
        (status, body.as_str()),
        (200, r#"{"sku":"apple","available":10}"#)
    );

    // The shop's switchyard.toml names target/release; the group serves the
    // build of this test's own profile instead.
    let profile_dir = std::path::Path::new(env!("CARGO_BIN_EXE_switchyard"))
        .parent()
        .unwrap();
    let fresh = profile_dir.join("libswitchyard_example_shop.so");
    let mut status = String::new();
    std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["status", "--json", "--runtime-dir"])
        .arg(group.runtime_dir())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap()
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut status)
        .unwrap();
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    let orders = status["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "orders")
        .and_then(|p| p["pid"].as_u64())
        .expect("orders runs");
    let maps = std::fs::read_to_string(format!("/proc/{orders}/maps")).unwrap();
    assert!(
        maps.contains(&*fresh.to_string_lossy()),
        "orders serves {}:\n{maps}",
        fresh.display()
    );
}

#[test]
fn start_serves_https_under_listener_tls() {
    point_at_the_binary();
    let dir = tempfile::tempdir().unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    std::fs::write(dir.path().join("cert.pem"), cert.cert.pem()).unwrap();
    std::fs::write(dir.path().join("key.pem"), cert.signing_key.serialize_pem()).unwrap();
    let config = dir.path().join("switchyard.toml");
    std::fs::write(
        &config,
        "[listener.tls]\ncert = \"cert.pem\"\nkey = \"key.pem\"\n\n[[managers]]\nname = \"basics\"\n",
    )
    .unwrap();
    let group = Group::start(&config).unwrap();
    let ready = group.ready();
    assert!(ready.tls, "{ready:?}");
    assert_eq!(ready.http, group.addr);
    assert_eq!(ready.runtime_dir, group.runtime_dir());
    let (status, body) = group.get("/hello/Ada").unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("Ada"), "{body}");
}
