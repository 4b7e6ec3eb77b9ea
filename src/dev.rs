//! `switchyard dev`: the group of `up`, plus a watcher of the plugin crates
//! its configuration names. A crate whose sources change is rebuilt with
//! cargo and its managers replaced by the ordinary reload (the supervisor's
//! control socket, as `switchyard reload` asks), so no request fails; a
//! build that fails prints cargo's errors and leaves the running build
//! serving (decision 0130).
//!
//! Which crate builds a plugin: the `.so` sits in a cargo target directory
//! (`<target>/<profile>/lib<name>.so`); `cargo metadata`, run next to the
//! configuration file and next to that target directory, names the
//! package whose `cdylib` target is `<name>`. A plugin no crate of those
//! workspaces builds into that place is served but not watched.
//!
//! The watcher polls: every [`POLL`] it lists the crate's files (not
//! `target/` nor hidden directories) with their sizes and modification
//! times, and builds once a change has been quiet for one poll.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use crate::config::Config;

/// How often the watched crates are scanned.
pub(crate) const POLL: Duration = Duration::from_millis(300);

/// Files scanned per crate at most: a crate directory that holds more (a
/// data directory checked in beside it) is watched in its first files.
const MAX_FILES: usize = 20_000;

/// One watched crate and the managers its plugin serves.
#[derive(Clone, Debug)]
pub(crate) struct Watched {
    /// The package's name (`cargo build -p`).
    pub(crate) package: String,
    /// The directory of its `Cargo.toml`.
    pub(crate) dir: PathBuf,
    /// The cargo profile that built the plugin (`dev`, `release`, ...).
    pub(crate) profile: String,
    /// The managers that load its library.
    pub(crate) managers: Vec<String>,
}

/// What `switchyard dev` watches, decided before the group starts.
static ARMED: Mutex<Option<Vec<Watched>>> = Mutex::new(None);

/// Finds the crates of `config`'s plugins; prints a note for each plugin
/// that is not watched, and what is.
pub(crate) fn arm(config: &Config, config_path: Option<&Path>) {
    let mut watched: Vec<Watched> = Vec::new();
    for m in &config.managers {
        let Some(plugin) = m.plugin.as_deref() else {
            continue;
        };
        match crate_of(plugin, config_path) {
            Ok(found) => match watched.iter_mut().find(|w| w.dir == found.dir) {
                Some(w) => w.managers.push(m.name.clone()),
                None => watched.push(Watched {
                    managers: vec![m.name.clone()],
                    ..found
                }),
            },
            Err(why) => eprintln!(
                "switchyard dev: manager `{}`: {}: not watched: {why}",
                m.name,
                plugin.display()
            ),
        }
    }
    if watched.is_empty() {
        eprintln!("switchyard dev: no plugin crate to watch; serving as `up` would");
    }
    *ARMED.lock().unwrap_or_else(|p| p.into_inner()) = Some(watched);
}

/// Builds the plugin crates of the configuration at `config_path` before
/// it is checked (which loads their libraries), cargo's progress on the
/// terminal: `switchyard dev` in a crate just made by `switchyard new`
/// serves it with no build of its own. A crate that does not build is
/// said so; the check that follows then reports its missing library, or
/// the group serves the build it had.
pub(crate) fn build_first(config_path: Option<&Path>) {
    let Some(path) = config_path else {
        return;
    };
    let Ok(config) = Config::read(path) else {
        return;
    };
    let mut built: Vec<PathBuf> = Vec::new();
    for plugin in config.managers.iter().filter_map(|m| m.plugin.as_deref()) {
        let Ok(w) = crate_of(plugin, Some(path)) else {
            continue;
        };
        if built.contains(&w.dir) {
            continue;
        }
        eprintln!("switchyard dev: building `{}` ({})", w.package, w.profile);
        let status = cargo()
            .args(["build", "-p", &w.package, "--profile", &w.profile])
            .current_dir(&w.dir)
            .status();
        match status {
            Ok(s) if s.success() => {}
            Ok(_) => eprintln!(
                "switchyard dev: building `{}` failed (its errors above)",
                w.package
            ),
            Err(err) => eprintln!("switchyard dev: cannot run cargo: {err}"),
        }
        built.push(w.dir);
    }
}

/// Starts the watcher, if `switchyard dev` armed one, once the group in
/// `runtime_dir` serves.
pub(crate) fn start(runtime_dir: &Path) {
    let Some(watched) = ARMED.lock().unwrap_or_else(|p| p.into_inner()).take() else {
        return;
    };
    if watched.is_empty() {
        return;
    }
    let runtime_dir = runtime_dir.to_owned();
    let spawned = std::thread::Builder::new()
        .name("dev-watch".to_owned())
        .spawn(move || watch(watched, &runtime_dir));
    if let Err(err) = spawned {
        tracing::error!(%err, "switchyard dev: cannot start the watcher");
    }
}

/// The package that builds `plugin`, found by `cargo metadata`.
fn crate_of(plugin: &Path, config_path: Option<&Path>) -> Result<Watched, String> {
    let file = plugin.file_name().and_then(|f| f.to_str()).unwrap_or_default();
    let lib = file
        .strip_prefix("lib")
        .and_then(|f| f.strip_suffix(".so"))
        .ok_or("not a `lib<name>.so` cargo builds")?;
    let profile_dir = plugin.parent().ok_or("no directory")?;
    let target_dir = profile_dir.parent().ok_or("not in a cargo target directory")?;
    let profile = match profile_dir.file_name().and_then(|f| f.to_str()) {
        Some("debug") => "dev".to_owned(),
        Some(other) => other.to_owned(),
        None => return Err("not in a cargo target directory".to_owned()),
    };
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(dir) = config_path.and_then(Path::parent) {
        candidates.push(if dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir.to_owned()
        });
    }
    if let Some(root) = target_dir.parent() {
        candidates.push(root.to_owned());
    }
    // Not built yet (a fresh crate): its target directory may not exist.
    let want_target = std::fs::canonicalize(target_dir)
        .or_else(|_| std::path::absolute(target_dir))
        .map_err(|e| format!("{}: {e}", target_dir.display()))?;
    let mut last = String::from("no cargo workspace next to the configuration or the target directory");
    for dir in candidates {
        match metadata(&dir) {
            Ok(meta) => {
                let in_target = meta["target_directory"]
                    .as_str()
                    .and_then(|t| std::fs::canonicalize(t).or_else(|_| std::path::absolute(t)).ok())
                    .is_some_and(|t| t == want_target);
                let package = meta["packages"].as_array().into_iter().flatten().find(|p| {
                    p["targets"].as_array().into_iter().flatten().any(|t| {
                        t["name"].as_str().map(|n| n.replace('-', "_")).as_deref() == Some(lib)
                            && t["kind"]
                                .as_array()
                                .is_some_and(|k| k.iter().any(|k| k == "cdylib"))
                    })
                });
                match (package, in_target) {
                    (Some(p), true) => {
                        let manifest = PathBuf::from(p["manifest_path"].as_str().unwrap_or_default());
                        return Ok(Watched {
                            package: p["name"].as_str().unwrap_or_default().to_owned(),
                            dir: manifest.parent().map(Path::to_owned).unwrap_or_default(),
                            profile,
                            managers: Vec::new(),
                        });
                    }
                    (Some(_), false) => {
                        last = format!(
                            "the workspace in {} builds into {}, not {}",
                            dir.display(),
                            meta["target_directory"].as_str().unwrap_or("?"),
                            target_dir.display()
                        );
                    }
                    (None, _) => last = format!("no crate in {} has the cdylib `{lib}`", dir.display()),
                }
            }
            Err(err) => last = err,
        }
    }
    Err(last)
}

/// `cargo metadata --no-deps` of the workspace around `dir`.
fn metadata(dir: &Path) -> Result<serde_json::Value, String> {
    let out = cargo()
        .args(["metadata", "--no-deps", "--format-version", "1", "--offline"])
        .current_dir(dir)
        .output()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "cargo metadata in {}: {}",
            dir.display(),
            err.lines().next().unwrap_or("failed")
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("cargo metadata: {e}"))
}

/// The cargo that runs this command (`$CARGO` under cargo), else the one
/// on `PATH`.
fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// A crate's files, by path: size and modification time.
type Snapshot = BTreeMap<PathBuf, (u64, Option<SystemTime>)>;

fn snapshot(dir: &Path) -> Snapshot {
    let mut files = Snapshot::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(at) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&at) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            // Build output, version control, editors' swap directories.
            if name.starts_with('.') || (at == dir && name == "target") {
                continue;
            }
            let Ok(kind) = entry.file_type() else { continue };
            if kind.is_dir() {
                stack.push(entry.path());
            } else if let Ok(meta) = entry.metadata() {
                files.insert(entry.path(), (meta.len(), meta.modified().ok()));
                if files.len() >= MAX_FILES {
                    return files;
                }
            }
        }
    }
    files
}

/// The watcher's loop: scan, build a crate whose change has settled,
/// reload the group. Runs until the process exits.
fn watch(watched: Vec<Watched>, runtime_dir: &Path) {
    let mut seen: Vec<Snapshot> = watched.iter().map(|w| snapshot(&w.dir)).collect();
    // After the first scan: an edit made once this is printed is seen.
    for w in &watched {
        tracing::info!(
            package = %w.package,
            dir = %w.dir.display(),
            managers = %w.managers.join(", "),
            "switchyard dev: watching"
        );
    }
    let mut pending = vec![false; watched.len()];
    loop {
        std::thread::sleep(POLL);
        for (i, w) in watched.iter().enumerate() {
            let now = snapshot(&w.dir);
            if now != seen[i] {
                // Changed during this poll: wait until it settles (an
                // editor's save, a `git checkout`).
                seen[i] = now;
                pending[i] = true;
                continue;
            }
            if !pending[i] {
                continue;
            }
            pending[i] = false;
            let built = build(w);
            // What the build itself wrote (a `Cargo.lock` it updated) is
            // no change of the developer's.
            seen[i] = snapshot(&w.dir);
            if built {
                reload(w, runtime_dir);
            }
        }
    }
}

/// `cargo build -p <package>` in its profile; prints the compiler's
/// output when it fails. Whether the build succeeded.
fn build(w: &Watched) -> bool {
    tracing::info!(package = %w.package, "switchyard dev: a source changed; building");
    let mut cmd = cargo();
    cmd.args([
        "build",
        "--color",
        "never",
        "-p",
        &w.package,
        "--profile",
        &w.profile,
    ])
    .current_dir(&w.dir);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        use std::os::unix::process::CommandExt;
        // A build still running when the group stops ends with it.
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    let out = match cmd.output() {
        Ok(out) => out,
        Err(err) => {
            tracing::error!(%err, "switchyard dev: cannot run cargo");
            return false;
        }
    };
    if out.status.success() {
        return true;
    }
    // The compiler's own text, as a terminal shows it, on stderr: the
    // group serves on with the build it has.
    eprintln!(
        "switchyard dev: building `{}` failed; the running build serves on:\n{}",
        w.package,
        String::from_utf8_lossy(&out.stderr).trim_end()
    );
    tracing::error!(package = %w.package, "switchyard dev: the build failed (its errors above); nothing reloaded");
    false
}

/// Asks the supervisor to reload, as `switchyard reload` does.
fn reload(w: &Watched, runtime_dir: &Path) {
    match crate::status::request_reload(runtime_dir) {
        Ok(report) => tracing::info!(
            package = %w.package,
            "switchyard dev: rebuilt; {}",
            report.describe().replace('\n', "; ")
        ),
        Err(err) => {
            tracing::error!(package = %w.package, "switchyard dev: rebuilt, but the reload failed: {err}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_sees_sources_not_build_output_or_hidden_directories() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for (path, text) in [
            ("Cargo.toml", "[package]"),
            ("src/lib.rs", "fn a() {}"),
            ("src/nested/mod.rs", ""),
            ("target/debug/libx.so", "binary"),
            (".git/HEAD", "ref"),
        ] {
            let path = root.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        let before = snapshot(root);
        let names: Vec<String> = before
            .keys()
            .map(|p| p.strip_prefix(root).unwrap().display().to_string())
            .collect();
        assert_eq!(names, ["Cargo.toml", "src/lib.rs", "src/nested/mod.rs"]);
        // Build output changes nothing; a source edit does.
        std::fs::write(root.join("target/debug/libx.so"), "rebuilt binary").unwrap();
        assert_eq!(snapshot(root), before);
        std::fs::write(root.join("src/lib.rs"), "fn a() { b() }").unwrap();
        assert_ne!(snapshot(root), before);
    }

    #[test]
    fn a_plugin_outside_a_cargo_target_directory_is_not_watched() {
        let err = crate_of(Path::new("/opt/plugins/greeter.so"), None).unwrap_err();
        assert!(err.contains("lib<name>.so"), "{err}");
    }
}
