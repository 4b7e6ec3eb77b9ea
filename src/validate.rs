//! Checking the configured plugins without running them in the supervisor.
//!
//! Opening a plugin runs its code (its initialisers, then the manager's
//! `create`), and code that crashes, hangs or corrupts memory must not do
//! so in the process that supervises the group. `switchyard check` and
//! `up` therefore hand the checks to a short-lived child, the hidden
//! `__validate` command of this same binary: it opens each library, checks
//! its ABI and manager names, creates each manager once with its
//! configuration ([`CreateArgs::validation`]), reports, and exits. The
//! supervisor reads the report, and turns a crash or a hang (past the start
//! timeout) into a configuration error naming the manager.
//!
//! The report travels on the child's original stdout, one JSON line per
//! step; the child points its own fd 1 at stderr first, so whatever a
//! plugin prints cannot forge a report line.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use switchyard_manager_host::abi::messages::CreateArgs;
use switchyard_proto::api::{Catalog, ManagerDoc};

use crate::config::{Config, ConfigError};

/// One manager to check.
#[derive(Debug, Serialize, Deserialize)]
struct Check {
    /// Its index in `managers`, for the key of a problem.
    index: usize,
    name: String,
    plugin: Option<PathBuf>,
    kind: String,
    /// `manager` when the type was named explicitly, else `name`.
    kind_key: String,
    /// A built-in manager (the binary's own table, not a plugin).
    #[serde(default)]
    builtin: bool,
    config_json: String,
}

/// A line of the child's report.
#[derive(Debug, Serialize, Deserialize)]
enum Report {
    /// About to open the plugin of check `index` (its code runs now).
    Loading(usize),
    /// About to create the manager of check `index`.
    Creating(usize),
    /// Check `index` is over, with these problems.
    Done(usize, Vec<String>),
    /// What the manager of check `index` declared, its types described
    /// (the group's API description, apidoc.rs).
    Described(usize, ManagerDoc),
}

/// Reads and validates `path`, the plugins too (in a child process, as
/// below), reporting every problem at once.
pub(crate) fn load(path: &Path) -> Result<Config, ConfigError> {
    let mut config = Config::read(path)?;
    let mut problems = match config.validate() {
        Ok(()) => Vec::new(),
        Err(ConfigError::Invalid(text)) => text.lines().map(str::to_owned).collect(),
        Err(other) => return Err(other),
    };
    let (found, catalog) = plugins(&config, Duration::from_millis(config.group.start_timeout_ms));
    problems.extend(found);
    config.catalog = std::sync::Arc::new(catalog);
    if problems.is_empty() {
        Ok(config)
    } else {
        Err(ConfigError::Invalid(problems.join("\n")))
    }
}

/// Checks every configured manager's plugin in a child process, and returns
/// the problems, each naming its key, and what the managers declared (in
/// the order of `managers`). A child that crashes or does not finish
/// within `timeout` is a problem of the manager it was checking.
pub(crate) fn plugins(config: &Config, timeout: Duration) -> (Vec<String>, Catalog) {
    let checks: Vec<Check> = config
        .managers
        .iter()
        .enumerate()
        .map(|(index, m)| Check {
            index,
            name: m.name.clone(),
            plugin: m.plugin.clone(),
            kind: m.kind().to_owned(),
            kind_key: if m.builtin.is_some() {
                "builtin"
            } else if m.manager.is_some() {
                "manager"
            } else {
                "name"
            }
            .to_owned(),
            builtin: m.builtin.is_some(),
            config_json: serde_json::to_string(&m.config).unwrap_or_default(),
        })
        .collect();
    let mut catalog = Catalog::default();
    match run_child(&checks, config, timeout, &mut catalog) {
        Ok(problems) => (problems, catalog),
        Err(problem) => (vec![problem], catalog),
    }
}

fn run_child(
    checks: &[Check],
    config: &Config,
    timeout: Duration,
    catalog: &mut Catalog,
) -> Result<Vec<String>, String> {
    let exe =
        std::env::current_exe().map_err(|e| format!("cannot find this program to check plugins: {e}"))?;
    let input = serde_json::to_string(&(
        checks,
        config.group.shm_threshold_bytes,
        config.group.shm_budget_bytes,
    ))
    .map_err(|e| e.to_string())?;
    // The plugins run in it: the same environment as the group's children.
    let mut child = Command::new(exe)
        .env_clear()
        .envs(crate::hardening::child_env(
            std::env::vars_os(),
            &config.group.pass_env,
        ))
        .arg("__validate")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start the plugin check: {e}"))?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    let stdout = child.stdout.take().expect("piped stdout");
    // Writing may fail if the child died at once; its exit status says why.
    let _ = stdin.write_all(input.as_bytes());
    drop(stdin);
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });

    let deadline = Instant::now() + timeout;
    let mut problems = Vec::new();
    // What the child was doing last, for a crash or a hang.
    let mut doing: Option<Report> = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => match serde_json::from_str::<Report>(&line) {
                Ok(Report::Done(_, found)) => {
                    problems.extend(found);
                    doing = None;
                }
                Ok(Report::Described(_, manager)) => catalog.managers.push(manager),
                Ok(step) => doing = Some(step),
                Err(_) => {}
            },
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                let what = describe(checks, doing.as_ref());
                return Err(format!(
                    "{what} did not finish within {} ms (group.start_timeout_ms): it hangs",
                    timeout.as_millis()
                ));
            }
        }
    }
    let status = child.wait().map_err(|e| e.to_string())?;
    if !status.success() || doing.is_some() {
        let what = describe(checks, doing.as_ref());
        return Err(format!(
            "{what} crashed the process that checks plugins ({})",
            exit_reason(status)
        ));
    }
    Ok(problems)
}

/// "managers[1].plugin: loading /x.so" for the step the child was on.
fn describe(checks: &[Check], doing: Option<&Report>) -> String {
    let check = |index: usize| checks.iter().find(|c| c.index == index);
    match doing {
        Some(Report::Loading(i)) => match check(*i).and_then(|c| c.plugin.as_ref()) {
            Some(path) => format!("managers[{i}].plugin: loading {}", path.display()),
            None => format!("managers[{i}].plugin: loading the built-in plugin"),
        },
        Some(Report::Creating(i)) => {
            let kind = check(*i).map_or("?", |c| c.kind.as_str());
            format!("managers[{i}].config: creating manager `{kind}`")
        }
        _ => "managers: checking the plugins".to_owned(),
    }
}

fn exit_reason(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status.signal() {
        Some(signal) => match nix::sys::signal::Signal::try_from(signal) {
            Ok(name) => format!("killed by {name}"),
            Err(_) => format!("killed by signal {signal}"),
        },
        None => status.to_string(),
    }
}

/// The `__validate` child: reads the checks on stdin, reports on stdout.
pub(crate) fn child_main() -> ExitCode {
    // It holds every manager's configuration while their plugins load.
    if let Err(err) = crate::hardening::not_dumpable() {
        eprintln!("switchyard: cannot make the plugin check non-dumpable: {err}");
        return ExitCode::FAILURE;
    }
    // The report keeps the real stdout; fd 1 becomes stderr, so a plugin's
    // prints go to the log, not into the report.
    let report = match nix::unistd::dup(std::io::stdout())
        .and_then(|report| nix::unistd::dup2_stdout(std::io::stderr()).map(|()| report))
    {
        Ok(fd) => std::fs::File::from(fd),
        Err(err) => {
            eprintln!("switchyard: cannot set up the plugin check: {err}");
            return ExitCode::FAILURE;
        }
    };
    let mut report = std::io::LineWriter::new(report);
    let mut send = |line: Report| {
        let text = serde_json::to_string(&line).expect("report lines encode");
        let _ = writeln!(report, "{text}");
    };
    let (checks, shm_threshold, shm_budget): (Vec<Check>, usize, u64) =
        match serde_json::from_reader(std::io::stdin()) {
            Ok(input) => input,
            Err(err) => {
                eprintln!("switchyard: bad plugin check input: {err}");
                return ExitCode::FAILURE;
            }
        };
    for check in checks {
        let i = check.index;
        send(Report::Loading(i));
        let library = match crate::config::open_manager_library(check.plugin.as_deref(), check.builtin) {
            Ok(library) => library,
            Err(err) => {
                send(Report::Done(i, vec![format!("managers[{i}].plugin: {err}")]));
                continue;
            }
        };
        let kinds = library.kinds();
        if !kinds.contains(&check.kind) {
            send(Report::Done(
                i,
                vec![format!(
                    "managers[{i}].{}: the plugin has no manager `{}` (it has: {})",
                    check.kind_key,
                    check.kind,
                    kinds.join(", ")
                )],
            ));
            continue;
        }
        send(Report::Creating(i));
        let args = CreateArgs {
            name: check.name.clone(),
            instance: 0,
            config_json: check.config_json.clone(),
            expose_errors: true,
            shm_threshold: shm_threshold as u64,
            shm_budget,
            validation: true,
        };
        let problems = match library.instantiate(&check.kind, &args) {
            // Destroyed at once: it was made only to be checked.
            Ok((plugin, description)) => {
                drop(plugin);
                send(Report::Described(
                    i,
                    ManagerDoc {
                        name: check.name.clone(),
                        kind: description.kind,
                        handles: description.handles,
                        types: description.types,
                    },
                ));
                Vec::new()
            }
            Err(err) => vec![format!("managers[{i}].config: {err}")],
        };
        send(Report::Done(i, problems));
    }
    ExitCode::SUCCESS
}

/// What each `[[auth.rules]]` entry covers, on every transport, given the
/// routes the managers declared: `switchyard check` prints it, so an
/// operator sees which events a `prefix` rule reaches over WebSocket and
/// gRPC (decision 0105).
pub(crate) fn rule_coverage(config: &Config) -> Vec<String> {
    let routes: Vec<(String, String, String)> = config
        .catalog
        .managers
        .iter()
        .flat_map(|m| m.handles.iter())
        .filter_map(|h| {
            h.route
                .as_ref()
                .map(|r| (r.method.clone(), r.path.clone(), h.name.clone()))
        })
        .collect();
    switchyard_listener::describe_rules(&config.middleware().auth, &routes)
}
