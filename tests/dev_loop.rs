//! `switchyard dev`: a plugin crate edited while the group serves is
//! rebuilt and reloaded by the same supervisor, with no failed request;
//! an edit that does not compile prints the compiler's error and leaves
//! the previous build serving (decision 0130).
//!
//! The crate is written into a scratch directory under the workspace's
//! target dir and builds into the workspace's target dir, with the
//! workspace's `Cargo.lock` and profile, so that its dependencies (the
//! SDK and what it uses) are the ones already compiled: only the small
//! crate itself is compiled, three times: by `dev` before the group
//! starts, then after each edit.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;

/// A build of the small crate on a loaded machine: generous, but bounded.
const BUILD_PATIENCE: Duration = Duration::from_secs(300);

const PACKAGE: &str = "switchyard-dev-loop-fixture";

fn manifest() -> String {
    format!(
        r#"[package]
name = "{PACKAGE}"
version = "0.1.0"
edition = "2024"
publish = false

[lib]
crate-type = ["cdylib"]

[dependencies]
switchyard-manager = {{ path = "{sdk}" }}
serde = {{ version = "1", features = ["derive"] }}

# The workspace's profile, so the compiled dependencies are reused.
[profile.dev]
debug = "line-tables-only"

# A workspace of its own, not a member of the one around the target dir.
[workspace]
"#,
        sdk = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("manager/sdk")
            .display()
    )
}

/// The crate's source, answering `GET /answer` with `said`; `extra` is
/// pasted into the handler (a compile error, for one edit).
fn source(said: &str, extra: &str) -> String {
    format!(
        r#"use serde::{{Deserialize, Serialize}};
use switchyard_manager::{{Config, Context, Error, Event, Manager, Registry, Reply}};

#[derive(Deserialize, Serialize, Event)]
#[event(name = "dev.Answer", http = "GET /answer")]
pub struct Answer {{}}

#[derive(Serialize, Deserialize, Reply)]
pub struct Said {{
    pub said: String,
}}

pub struct Answering;

impl Manager for Answering {{
    const NAME: &'static str = "answering";
    fn create(_: &Config) -> Result<Self, Error> {{
        Ok(Answering)
    }}
    fn register(r: &mut Registry<Self>) {{
        r.handle(Self::answer);
    }}
}}

impl Answering {{
    fn answer(&mut self, _: Answer, _: &mut Context) -> Result<Said, Error> {{
        {extra}
        Ok(Said {{ said: "{said}".to_owned() }})
    }}
}}

switchyard_manager::export_managers!(Answering);
"#
    )
}

/// The target dir the binary under test was built in, and its profile's
/// directory name.
fn target_dir() -> (PathBuf, String) {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_switchyard"));
    let profile_dir = bin.parent().unwrap();
    (
        profile_dir.parent().unwrap().to_owned(),
        profile_dir.file_name().unwrap().to_string_lossy().into_owned(),
    )
}

fn said(g: &Group) -> Result<String, String> {
    let r = get(g.addr, "/answer").map_err(|e| e.to_string())?;
    if r.status != 200 {
        return Err(format!("{} {}", r.status, r.text()));
    }
    Ok(r.json()["said"].as_str().unwrap_or_default().to_owned())
}

#[test]
fn an_edited_plugin_is_rebuilt_and_reloaded_and_a_broken_edit_leaves_the_old_build_serving() {
    let (target, profile) = target_dir();
    let scratch = tempfile::Builder::new()
        .prefix("dev-loop-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let dir = scratch.path();
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::write(dir.join("Cargo.toml"), manifest()).unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.lock"),
        dir.join("Cargo.lock"),
    )
    .unwrap();
    let lib = dir.join("src/lib.rs");
    std::fs::write(&lib, source("first", "")).unwrap();

    // Not built: `dev` builds it before the group starts, as in a crate
    // just made by `switchyard new`.
    let plugin = target
        .join(&profile)
        .join(format!("lib{}.so", PACKAGE.replace('-', "_")));
    let _ = std::fs::remove_file(&plugin);
    let config = dir.join("switchyard.toml");
    std::fs::write(
        &config,
        format!(
            "[[managers]]\nname = \"answering\"\nplugin = \"{}\"\n",
            plugin.display()
        ),
    )
    .unwrap();

    let mut g = Group::builder("dev-loop")
        .dev()
        .config_file(&config)
        .env("CARGO_TARGET_DIR", &target.display().to_string())
        .env("CARGO_NET_OFFLINE", "true")
        .ready_within(BUILD_PATIENCE)
        .start();
    assert!(g.has_line(&format!("switchyard dev: building `{PACKAGE}`")));
    assert!(plugin.exists(), "{}", plugin.display());
    g.wait_line("switchyard dev: watching");
    assert_eq!(said(&g).unwrap(), "first");
    let supervisor = g.supervisor_pid();
    let old_manager = g.pid_of("answering");

    // Requests all along: not one may fail.
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (addr, stop) = (g.addr, stop.clone());
        std::thread::spawn(move || {
            let mut failures = Vec::new();
            let mut answered = 0u64;
            while !stop.load(Ordering::Relaxed) {
                match get(addr, "/answer") {
                    Ok(r) if r.status == 200 => answered += 1,
                    Ok(r) => failures.push(format!("{} {}", r.status, r.text())),
                    Err(err) => failures.push(err.to_string()),
                }
            }
            (answered, failures)
        })
    };

    // An edit: the new answer, from the same supervisor.
    std::fs::write(&lib, source("second build", "")).unwrap();
    eventually("the edited answer", BUILD_PATIENCE, || match said(&g) {
        Ok(s) if s == "second build" => Ok(()),
        other => Err(other),
    });
    assert_eq!(g.supervisor_pid(), supervisor, "the group was restarted");
    assert!(alive(supervisor));
    g.wait_line("switchyard dev: rebuilt; reloaded: replaced answering");
    eventually("the old instance exits", PATIENCE, || {
        if alive(old_manager) {
            Err(old_manager)
        } else {
            Ok(())
        }
    });

    // An edit that does not compile: the error is printed, the last good
    // build serves on.
    std::fs::write(&lib, source("third", "let broken: u32 = \"not a number\";")).unwrap();
    eventually("the compiler's error", BUILD_PATIENCE, || {
        if g.has_line("error[E0308]") {
            Ok(())
        } else {
            Err("not yet")
        }
    });
    g.wait_line("the build failed");
    assert!(g.has_line("the running build serves on"));
    assert_eq!(said(&g).unwrap(), "second build");
    assert_eq!(g.supervisor_pid(), supervisor);

    stop.store(true, Ordering::Relaxed);
    let (answered, failures) = load.join().unwrap();
    assert!(answered > 0);
    assert!(
        failures.is_empty(),
        "failed requests during the reloads: {failures:?}"
    );
}
