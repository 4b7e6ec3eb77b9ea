//! Plugins are checked where their code cannot hurt the supervisor: in a
//! short-lived child. A plugin that aborts or hangs while loading, a
//! configuration its manager rejects, a plugin built with
//! `panic = "abort"`: each is a configuration error (exit 64) naming the
//! key, and the supervisor never maps a plugin library.

mod common;

use std::process::Command;

use common::*;

/// The fault is chosen by an environment variable, which reaches the
/// plugin only when the group passes it (`group.pass_env`, decision 0101).
const FAULT_PASSES: &str = "[group]\npass_env = [\"SWITCHYARD_FIXTURE_FAULT\"]\n";

fn faulty_config(plugin: &std::path::Path, extra: &str) -> String {
    format!(
        "{extra}\n[[managers]]\nname = \"basics\"\n[[managers]]\nname = \"faulty\"\nplugin = \"{}\"\n",
        plugin.display()
    )
}

fn refused(out: &str) {
    assert!(
        out.contains("exit status: 64"),
        "exit code 64 (configuration error): {out}"
    );
    assert!(
        !out.contains("started role"),
        "no process of the group was started: {out}"
    );
}

#[test]
fn a_plugin_that_aborts_while_loading_is_a_configuration_error() {
    let plugin = plugin("switchyard-fixture-faulty-load");
    let out = Group::builder("abort-on-load")
        .config(&faulty_config(&plugin, FAULT_PASSES))
        .env("SWITCHYARD_FIXTURE_FAULT", "abort")
        .try_start()
        .err()
        .expect("a group whose plugin aborts on load started");
    refused(&out);
    assert!(
        out.contains(&format!(
            "managers[1].plugin: loading {} crashed the process that checks plugins (killed by SIGABRT)",
            plugin.display()
        )),
        "names the plugin and the crash: {out}"
    );
}

#[test]
fn a_plugin_that_hangs_while_loading_is_refused_within_the_start_timeout() {
    let plugin = plugin("switchyard-fixture-faulty-load");
    let out = Group::builder("hang-on-load")
        .config(&faulty_config(
            &plugin,
            &format!("{FAULT_PASSES}start_timeout_ms = 1500\n"),
        ))
        .env("SWITCHYARD_FIXTURE_FAULT", "hang")
        .try_start()
        .err()
        .expect("a group whose plugin hangs on load started");
    refused(&out);
    assert!(
        out.contains(&format!(
            "managers[1].plugin: loading {} did not finish within 1500 ms (group.start_timeout_ms): it hangs",
            plugin.display()
        )),
        "names the plugin and the timeout: {out}"
    );
}

#[test]
fn the_supervisor_never_maps_a_plugin_library() {
    let plugin = plugin("switchyard-fixture-faulty-load");
    let g = Group::builder("maps").config(&faulty_config(&plugin, "")).start();
    let file = plugin.file_name().unwrap().to_string_lossy().into_owned();
    let maps = |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    // The manager that serves the plugin maps it: the check can see it.
    assert!(
        maps(g.pid_of("faulty")).contains(&file),
        "the manager maps {file}"
    );
    assert!(
        !maps(g.supervisor_pid()).contains(&file),
        "the supervisor mapped the plugin {file}"
    );
}

fn check(config: &str, tag: &str) -> (Option<i32>, String) {
    let dir = scratch_dir(tag);
    let path = dir.path().join("switchyard.toml");
    std::fs::write(&path, config).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .arg("check")
        .arg("-c")
        .arg(&path)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

#[test]
fn check_creates_each_manager_with_its_configuration() {
    let (code, out) = check(
        "[[managers]]\nname = \"ticker\"\n[managers.config]\ninterval_ms = 0\n",
        "check-config",
    );
    assert_eq!(code, Some(64), "{out}");
    assert!(
        out.contains("managers[0].config: manager `ticker` failed to start:"),
        "names the key and the manager: {out}"
    );
    let (code, out) = check(
        "[[managers]]\nname = \"ticker\"\n[managers.config]\ninterval_ms = 250\n",
        "check-ok",
    );
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains(": ok"), "{out}");
}

#[test]
fn a_plugin_built_with_panic_abort_is_refused() {
    // The plugin crate alone is built with panic=abort (its dependencies are
    // shared with the ordinary build), as a release profile with
    // `panic = "abort"` would build it.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_switchyard"));
    let profile_dir = bin.parent().unwrap();
    let mut cmd = Command::new(cargo);
    cmd.args([
        "rustc",
        "--quiet",
        "--lib",
        "-p",
        "switchyard-fixture-panic-abort",
    ])
    .current_dir(env!("CARGO_MANIFEST_DIR"));
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    let status = cmd.args(["--", "-C", "panic=abort"]).status().unwrap();
    assert!(status.success(), "building the panic=abort fixture failed");
    let plugin = profile_dir.join("libswitchyard_fixture_panic_abort.so");
    let (code, out) = check(
        &format!(
            "[[managers]]\nname = \"aborting\"\nplugin = \"{}\"\n",
            plugin.display()
        ),
        "check-panic-abort",
    );
    assert_eq!(code, Some(64), "{out}");
    assert!(
        out.contains("managers[0].plugin: plugin") && out.contains("was built with `panic = \"abort\"`"),
        "says why: {out}"
    );
}
