//! The group's API description on the supervisor's side: the `[api]`
//! settings, the catalog of event types the validation child gathered
//! from the plugins (the supervisor itself never opens one), handed to
//! the listeners through a file in the runtime directory, and
//! `switchyard openapi`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use switchyard_proto::api::Catalog;

use crate::config::Config;

/// The catalog's file in the runtime directory (0700): the listeners read
/// it with each configuration generation. A file, not the spec: a
/// reconfiguration travels on a control line capped at 64 KiB, which a
/// large API's schemas could pass.
const CATALOG_FILE: &str = "api-catalog.json";

/// Gathers the catalog of a configuration that was not loaded from a file
/// (the demo group: its plugins are built in, and `validate::load` did not
/// run the validation child). Problems were already reported or cannot
/// happen for the built-in table; a failure leaves the catalog empty.
pub(crate) fn gather(config: &mut Config) {
    if config.api.enabled() && config.catalog.managers.is_empty() {
        let (problems, catalog) =
            crate::validate::plugins(config, Duration::from_millis(config.group.start_timeout_ms));
        for p in problems {
            tracing::warn!("api description: {p}");
        }
        config.catalog = Arc::new(catalog);
    }
}

/// Writes `config`'s catalog where the listeners of runtime directory
/// `dir` read it; replaced whole (rename), so a reader never sees half.
/// Returns the file, which the group removes when it stops.
pub(crate) fn publish(config: &Config, dir: &Path) -> std::io::Result<PathBuf> {
    let path = dir.join(CATALOG_FILE);
    let text = serde_json::to_vec(&*config.catalog).map_err(std::io::Error::other)?;
    if std::fs::read(&path).is_ok_and(|old| old == text) {
        return Ok(path);
    }
    let temporary = dir.join(format!("{CATALOG_FILE}.new"));
    let written = std::fs::write(&temporary, text).and_then(|()| std::fs::rename(&temporary, &path));
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written.map(|()| path)
}

/// The catalog the supervisor published in `dir` (empty if none).
pub(crate) fn read(dir: &Path) -> Arc<Catalog> {
    match std::fs::read(dir.join(CATALOG_FILE)) {
        Ok(bytes) => Arc::new(serde_json::from_slice(&bytes).unwrap_or_else(|err| {
            tracing::warn!("the API catalog is unreadable ({err}); /openapi.json and /docs list no route");
            Catalog::default()
        })),
        Err(_) => Arc::default(),
    }
}

/// The configuration at `path` (the demo's without), with its catalog.
fn load_with_catalog(path: Option<&Path>) -> Result<Config, ExitCode> {
    let mut config = crate::load_config(path)?;
    if path.is_none() {
        gather(&mut config);
    }
    Ok(config)
}

/// `switchyard proto [-c FILE] [--out DIR]`.
pub(crate) fn proto_main(path: Option<&Path>, out: Option<&Path>) -> ExitCode {
    let config = match load_with_catalog(path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    // What the listener serves: internal types left out (decision 0108).
    let catalog = switchyard_listener::api::for_clients(&config.catalog, &config.auth.expose);
    let (files, _) = switchyard_listener::api::proto::files(&catalog);
    for file in &files {
        match out {
            Some(dir) => {
                let target = dir.join(&file.path);
                let written = target
                    .parent()
                    .map_or(Ok(()), std::fs::create_dir_all)
                    .and_then(|()| std::fs::write(&target, &file.text));
                if let Err(err) = written {
                    eprintln!("switchyard proto: {}: {err}", target.display());
                    return ExitCode::FAILURE;
                }
                println!("{}", target.display());
            }
            None => println!("// ---- {}\n{}", file.path, file.text),
        }
    }
    ExitCode::SUCCESS
}

/// `switchyard openapi [-c FILE]`.
pub(crate) fn openapi_main(path: Option<&Path>) -> ExitCode {
    let config = match load_with_catalog(path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let settings = config.api.to_listener(config.catalog.clone());
    let catalog = switchyard_listener::api::for_clients(&config.catalog, &config.auth.expose);
    let document = switchyard_listener::api::openapi_document(&catalog, &settings, &config.auth);
    match serde_json::to_string_pretty(&document) {
        Ok(text) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("switchyard openapi: {err}");
            ExitCode::FAILURE
        }
    }
}
