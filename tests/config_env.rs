//! Configuration keys overridden by environment variables
//! (`SWITCHYARD_SECTION__KEY`, docs/configuration.md): over the file, over the
//! built-in demo configuration, and a bad one refused naming the variable.

mod common;

use common::{Group, request, request_with};

#[test]
fn a_variable_overrides_the_demo_configuration() {
    let group = Group::builder("env-demo")
        .env("SWITCHYARD_REQUEST_ID__HEADER", "x-correlation-id")
        .start();
    let reply = request_with(group.addr, "GET", "/noop", &[], b"").unwrap();
    assert_eq!(reply.status, 200);
    assert!(reply.header("x-correlation-id").is_some(), "{reply:?}");
    assert!(reply.header("x-request-id").is_none(), "{reply:?}");
}

#[test]
fn a_variable_overrides_the_file() {
    let group = Group::builder("env-file")
        .config("[listener]\nmax_body_bytes = 1048576\n")
        .env("SWITCHYARD_LISTENER__MAX_BODY_BYTES", "64")
        .start();
    let reply = request(group.addr, "POST", "/echo", &[b'x'; 200]).unwrap();
    assert_eq!(reply.status, 413, "{}", reply.text());
    let reply = request(group.addr, "POST", "/echo", b"{\"n\":1}").unwrap();
    assert_ne!(reply.status, 413, "{}", reply.text());
}

#[test]
fn a_bad_variable_is_refused_naming_it() {
    let dir = common::scratch_dir("env-bad");
    let path = dir.path().join("switchyard.toml");
    std::fs::write(&path, "[listener]\nmax_body_bytes = 1024\n").unwrap();
    for (name, value, says) in [
        ("SWITCHYARD_LISTENER__BND", "1", "bnd"),
        ("SWITCHYARD_LISTENER__MAX_BODY_BYTES", "lots", "max_body_bytes"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
            .args(["check", "-c"])
            .arg(&path)
            .env(name, value)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(64), "{text}");
        assert!(text.contains(name) && text.contains(says), "{text}");
    }
}
