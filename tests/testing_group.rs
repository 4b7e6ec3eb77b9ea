//! `switchyard_manager_host::testing::Group::start_crate`, as a plugin's own
//! integration test uses it: it builds the crate under test in the test's
//! profile and serves that build, whatever path its switchyard.toml names.

use std::io::Read;

use switchyard_manager_host::testing::Group;

#[test]
fn start_crate_serves_the_plugin_just_built() {
    // The plugin's test finds `switchyard` on PATH or here.
    // SAFETY: the only test of this binary, run before it starts a thread.
    unsafe { std::env::set_var("SWITCHYARD_BIN", env!("CARGO_BIN_EXE_switchyard")) };
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
