//! `switchyard`: the command line and the supervisor of a process group.
//!
//! One binary ships the whole group: `switchyard up` runs the supervisor,
//! which re-executes this binary with the hidden `__role` argument once per
//! child (broker, router, each manager, listener).
//!
//! # Layout
//! - `admin`: the admin endpoint: `/metrics` and the dashboard.
//! - `config`: `switchyard.toml`.
//! - `hardening`: what keeps one process's secrets from another: the
//!   children's allow-listed environment, non-dumpable processes.
//! - `roles`: the entry of each child process.
//! - `supervisor`: spawning, watching, restarting and stopping children.
//! - `status`: the control socket, and its clients `switchyard status`,
//!   `reload` and `upgrade`.
//! - `token`: `switchyard token`, a development bearer token.
//! - `dev`: `switchyard dev`, the group plus a watcher that rebuilds and
//!   reloads changed plugin crates.
//! - `apidoc`: `[api]`, the catalog of the plugins' event types handed to
//!   the listeners, and `switchyard openapi`.

/// Every process of the group is this binary: one allocator for all of
/// them. mimalloc, because the request path allocates and frees many
/// small buffers across threads (decision 0087).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Gives the memory this thread's heap and the process's arenas hold free
/// back to the system now. mimalloc purges freed pages only when a later
/// allocation or free comes by once the purge delay is over: a process that
/// allocates a burst and then idles, as the supervisor after its start,
/// keeps part of the burst resident (0.5 MiB of its 4.8 measured, decision
/// 0159).
pub(crate) fn give_back_free_memory() {
    // SAFETY: mi_collect takes a flag and only touches mimalloc's own state.
    unsafe { libmimalloc_sys::mi_collect(true) };
}

mod admin;
mod apidoc;
mod config;
mod dev;
mod hardening;
mod inherit;
mod roles;
mod scaffold;
mod status;
mod supervisor;
mod token;
mod validate;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Exit code for a configuration error (EX_USAGE).
const EXIT_CONFIG: u8 = 64;

#[derive(Parser)]
#[command(
    name = "switchyard",
    version,
    about = "Multi-process event-routing application server"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start the process group and serve until SIGTERM or SIGINT.
    Up {
        /// Configuration file (default: built-in demo configuration).
        #[arg(short, long)]
        config: Option<PathBuf>,
        /// Listen address, overriding the configuration: `HOST:PORT` with
        /// an IP address or a host name (port 0: any free port).
        #[arg(long, value_parser = config::resolve_bind)]
        bind: Option<std::net::SocketAddr>,
        /// Directory for the group's sockets (default: a fresh private one).
        #[arg(long)]
        runtime_dir: Option<PathBuf>,
        /// Serve the admin endpoint (`/metrics`, the dashboard) here,
        /// overriding `admin.bind`: `HOST:PORT` (port 0: any free port,
        /// printed as `admin on http://ADDR`).
        #[arg(long, value_parser = config::resolve_bind)]
        admin_bind: Option<std::net::SocketAddr>,
        /// Directory of the built-in Store's and Scheduler's database,
        /// overriding `data.dir` (default: see docs/configuration.md).
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Once the group serves, write this file (atomically) as JSON:
        /// the pid and every bound address (`http`, `grpc`, `http3`,
        /// `admin`). Removed on exit. Under systemd, `NOTIFY_SOCKET` also
        /// gets `READY=1`.
        #[arg(long)]
        ready_file: Option<PathBuf>,
        /// Internal (`switchyard upgrade`): the socket the upgrading
        /// supervisor hands its listening sockets over.
        #[arg(long, hide = true)]
        upgrade_fd: Option<i32>,
    },
    /// Run the group as `up` does, and watch the plugin crates its
    /// configuration names: a changed crate is rebuilt with cargo and its
    /// managers reloaded without failing a request; a build error is
    /// printed and the running build serves on (docs/writing-managers.md,
    /// "The development loop").
    Dev {
        /// Configuration file (default: `switchyard.toml` in the current
        /// directory when there is one, else the built-in demo).
        #[arg(short, long)]
        config: Option<PathBuf>,
        /// Listen address, overriding the configuration (port 0: any free port).
        #[arg(long, value_parser = config::resolve_bind)]
        bind: Option<std::net::SocketAddr>,
        /// Directory for the group's sockets (default: a fresh private one).
        #[arg(long)]
        runtime_dir: Option<PathBuf>,
        /// Directory of the built-in Store's and Scheduler's database.
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Once the group serves, write this file as JSON (as `up` does).
        #[arg(long)]
        ready_file: Option<PathBuf>,
    },
    /// Re-read the configuration of a running group and apply it without
    /// failing a request (also SIGHUP): changed managers are replaced
    /// instance by instance, the listener's limits and certificates change
    /// live. An invalid configuration is refused; the group runs on.
    Reload {
        /// The group's runtime directory (default: the only running group).
        #[arg(long)]
        runtime_dir: Option<PathBuf>,
    },
    /// Hand the listening sockets to a new supervisor started from the
    /// binary on disk; this group then drains and exits.
    Upgrade {
        /// The group's runtime directory (default: the only running group).
        #[arg(long)]
        runtime_dir: Option<PathBuf>,
    },
    /// Show the processes of a running group.
    Status {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// The group's runtime directory (default: the only running group).
        #[arg(long)]
        runtime_dir: Option<PathBuf>,
    },
    /// Create a manager plugin crate that builds and serves.
    New {
        /// Directory to create; its name is the crate's and the manager's.
        path: PathBuf,
        /// Depend on the `switchyard-manager` SDK at this path (written
        /// relative to the new crate; default: this build's SDK).
        #[arg(long, conflicts_with_all = ["sdk_version", "sdk_git"])]
        sdk: Option<PathBuf>,
        /// Depend on this version of `switchyard-manager` from a registry.
        #[arg(long, conflicts_with = "sdk_git")]
        sdk_version: Option<String>,
        /// Depend on `switchyard-manager` from this git repository.
        #[arg(long)]
        sdk_git: Option<String>,
    },
    /// Load a running server step by step: req/s, latency, errors, where it
    /// breaks and where it saturates (see bench/README.md). The scenario
    /// suite against the in-process baseline is `switchyard-suite`.
    Bench(Box<switchyard_loadgen::Options>),
    /// Print a bearer token for the demo's `GET /me` (development only:
    /// signed with the HMAC secret of the configuration's `[auth.jwt]`,
    /// by default the demo's public development key).
    Token {
        /// The token's subject (`sub`).
        #[arg(long)]
        sub: String,
        /// Seconds until the token expires.
        #[arg(long, default_value_t = 3600)]
        ttl_s: u64,
        /// A role the token carries (repeatable), in the `roles` claim.
        #[arg(long = "role")]
        roles: Vec<String>,
        /// The configuration whose `[auth.jwt]` secret signs (default: the
        /// demo group's).
        #[arg(short, long)]
        config: Option<PathBuf>,
    },
    /// Print the OpenAPI 3.1 document of a configuration's group (what
    /// its `GET /openapi.json` serves) without starting it. The plugins
    /// are opened in a short-lived child process, as `check` does.
    Openapi {
        /// Configuration file (default: built-in demo configuration).
        #[arg(short, long)]
        config: Option<PathBuf>,
    },
    /// Write the `.proto` files of a configuration's typed gRPC services
    /// (one service per manager, one rpc per event: docs/grpc.md) without
    /// starting the group; to stdout, or one file per package under
    /// `--out`.
    Proto {
        /// Configuration file (default: built-in demo configuration).
        #[arg(short, long)]
        config: Option<PathBuf>,
        /// Directory to write `demo/v1/api.proto` and the others into.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Move the built-in Store's keys between back ends (docs/store.md):
    /// `export` writes every live key as a JSON line, `import` sets them.
    Store {
        #[command(subcommand)]
        action: StoreAction,
    },
    /// Validate a configuration file and exit.
    Check {
        #[arg(short, long)]
        config: PathBuf,
    },
    /// Internal: check the plugins of a configuration (see `validate`).
    #[command(name = "__validate", hide = true)]
    Validate,
    /// Internal: run one role of the group.
    #[command(name = "__role", hide = true)]
    Role {
        role: roles::Role,
        #[arg(long)]
        name: String,
        #[arg(long, default_value_t = 0)]
        instance: u32,
    },
}

#[derive(Subcommand)]
enum StoreAction {
    /// Write the Store's live keys as JSON lines (`{"key", "value",
    /// "expires_at_ms"}`), in key order, to stdout or `--file`.
    Export(StoreArgs),
    /// Set the keys of JSON lines (as `export` writes them) from stdin or
    /// `--file`; a SQLite store must not be running.
    Import(StoreArgs),
}

#[derive(clap::Args)]
struct StoreArgs {
    /// Configuration file (default: built-in demo configuration).
    #[arg(short, long)]
    config: Option<PathBuf>,
    /// The data directory, overriding `data.dir`.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// `sqlite` or `jetstream`, overriding the Store's `backend`.
    #[arg(long)]
    backend: Option<String>,
    /// Read or write this file instead of stdin / stdout.
    #[arg(long)]
    file: Option<PathBuf>,
}

/// `switchyard store export|import`.
fn store_transfer(action: StoreAction) -> ExitCode {
    let (export, args) = match action {
        StoreAction::Export(a) => (true, a),
        StoreAction::Import(a) => (false, a),
    };
    let mut loaded = match load_config(args.config.as_deref()) {
        Ok(c) => c,
        Err(code) => return code,
    };
    if let Err(err) = loaded.prepare_data_dir(args.data_dir) {
        eprintln!("switchyard: {err}");
        return ExitCode::from(EXIT_CONFIG);
    }
    let Some(store) = loaded
        .managers
        .iter()
        .find(|m| m.builtin.as_deref() == Some(switchyard_builtin::STORE))
    else {
        eprintln!("switchyard: the configuration runs no built-in store");
        return ExitCode::from(EXIT_CONFIG);
    };
    let json = match loaded
        .manager_config_json(store)
        .map_err(|e| e.to_string())
        .and_then(|j| serde_json::from_str::<serde_json::Value>(&j).map_err(|e| e.to_string()))
    {
        Ok(j) => j,
        Err(err) => {
            eprintln!("switchyard: {err}");
            return ExitCode::FAILURE;
        }
    };
    let backend = args.backend.as_deref();
    let moved = if export {
        let out: Result<Box<dyn std::io::Write>, _> = match &args.file {
            Some(p) => std::fs::File::create(p)
                .map(|f| Box::new(std::io::BufWriter::new(f)) as Box<dyn std::io::Write>),
            None => Ok(Box::new(std::io::BufWriter::new(std::io::stdout().lock()))),
        };
        out.map_err(|e| e.to_string()).and_then(|mut out| {
            let n = switchyard_builtin::store::transfer::export(&json, backend, &mut out)
                .map_err(|e| e.to_string())?;
            out.flush().map_err(|e| e.to_string())?;
            Ok(n)
        })
    } else {
        let input: Result<Box<dyn std::io::BufRead>, _> = match &args.file {
            Some(p) => std::fs::File::open(p)
                .map(|f| Box::new(std::io::BufReader::new(f)) as Box<dyn std::io::BufRead>),
            None => Ok(Box::new(std::io::stdin().lock())),
        };
        input.map_err(|e| e.to_string()).and_then(|mut input| {
            switchyard_builtin::store::transfer::import(&json, backend, &mut input).map_err(|e| e.to_string())
        })
    };
    match moved {
        Ok(n) => {
            eprintln!(
                "switchyard: {} {n} keys",
                if export { "exported" } else { "imported" }
            );
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!(
                "switchyard: store {}: {err}",
                if export { "export" } else { "import" }
            );
            ExitCode::FAILURE
        }
    }
}

/// A command whose reader goes away (`switchyard status | head -1`) ends
/// quietly, as any Unix tool does, instead of panicking on the failed
/// write: the default action of SIGPIPE, which Rust's runtime ignores.
/// Not for the group's own processes, which must outlive a closed socket.
fn quiet_on_closed_output() {
    // SAFETY: restoring a signal's default disposition, before any thread
    // is started; no handler is installed.
    let _ = unsafe {
        nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGPIPE,
            nix::sys::signal::SigHandler::SigDfl,
        )
    };
}

fn load_config(path: Option<&std::path::Path>) -> Result<config::Config, ExitCode> {
    let loaded = match path {
        Some(p) => validate::load(p),
        None => config::Config::demo(),
    };
    loaded.map_err(|err| {
        eprintln!("switchyard: configuration error:\n{err}");
        ExitCode::from(EXIT_CONFIG)
    })
}

/// The configuration `up` and `dev` serve, or the exit code of why not
/// (64 for an invalid one); the descriptor limit raised for the group.
fn load_or_exit(source: &supervisor::Source) -> Result<config::Config, ExitCode> {
    let config = source.load_for_start().map_err(|err| {
        eprintln!("switchyard: {err}");
        match err {
            supervisor::SourceError::Config(_) => ExitCode::from(EXIT_CONFIG),
            supervisor::SourceError::DataDir(_) => ExitCode::FAILURE,
        }
    })?;
    // The default soft limit (often 1024) is far below what a listener's
    // connections need; the children inherit this one.
    if let Err(err) = switchyard_proto::accept::raise_nofile_limit() {
        eprintln!("switchyard: cannot raise the descriptor limit: {err}");
    }
    Ok(config)
}

/// Adopts the handover socket an upgrading supervisor left at `fd`.
fn inherited_handover(fd: i32) -> Result<std::os::fd::OwnedFd, ExitCode> {
    inherit::adopt(fd).map_err(|err| {
        eprintln!("switchyard: no handover socket at fd {fd}: {err}");
        ExitCode::FAILURE
    })
}

fn main() -> ExitCode {
    // First, before the heap grows. A kernel without the setting serves
    // with huge pages as before.
    let _ = hardening::no_huge_pages();
    let cli = Cli::parse();
    if !matches!(
        cli.command,
        Command::Up { .. } | Command::Dev { .. } | Command::Role { .. } | Command::Validate
    ) {
        quiet_on_closed_output();
    }
    match cli.command {
        Command::Up {
            config,
            bind,
            runtime_dir,
            data_dir,
            admin_bind,
            upgrade_fd,
            ready_file,
        } => {
            // First, so that a failure below still closes it (the old
            // supervisor then reads end-of-file and serves on).
            let handover = match upgrade_fd.map(inherited_handover).transpose() {
                Ok(h) => h,
                Err(code) => return code,
            };
            let source = supervisor::Source {
                path: config,
                bind,
                data_dir,
                admin_bind,
                admin_bound: None,
                ready_file,
            };
            match load_or_exit(&source) {
                Ok(config) => supervisor::main(config, source, runtime_dir, handover),
                Err(code) => code,
            }
        }
        Command::Dev {
            config,
            bind,
            runtime_dir,
            data_dir,
            ready_file,
        } => {
            let config = config.or_else(|| {
                let here = PathBuf::from("switchyard.toml");
                here.exists().then_some(here)
            });
            let source = supervisor::Source {
                path: config,
                bind,
                data_dir,
                admin_bind: None,
                admin_bound: None,
                ready_file,
            };
            // The plugins are built before the configuration is checked
            // (which loads them): a fresh `switchyard new` crate serves
            // without a `cargo build` of its own.
            dev::build_first(source.path.as_deref());
            match load_or_exit(&source) {
                Ok(loaded) => {
                    dev::arm(&loaded, source.path.as_deref());
                    supervisor::main(loaded, source, runtime_dir, None)
                }
                Err(code) => code,
            }
        }
        Command::Status { json, runtime_dir } => status::main(json, runtime_dir),
        Command::Reload { runtime_dir } => status::reload(runtime_dir),
        Command::Upgrade { runtime_dir } => status::upgrade(runtime_dir),
        Command::New {
            path,
            sdk,
            sdk_version,
            sdk_git,
        } => {
            let sdk = match (sdk, sdk_version, sdk_git) {
                (_, Some(version), _) => scaffold::Sdk::Version(version),
                (_, _, Some(url)) => scaffold::Sdk::Git(url),
                (Some(path), _, _) => scaffold::Sdk::Path(path),
                (None, None, None) => scaffold::Sdk::Path(PathBuf::from(scaffold::SDK_PATH)),
            };
            scaffold::main(&path, sdk)
        }
        Command::Bench(options) => switchyard_loadgen::main(*options),
        Command::Token {
            sub,
            ttl_s,
            roles,
            config,
        } => {
            if config.is_none()
                && let Err(err) = token::demo_key_is_meant()
            {
                eprintln!("switchyard token: {err}");
                return ExitCode::from(EXIT_CONFIG);
            }
            let source = match &config {
                Some(path) => path.display().to_string(),
                None => "the demo group's configuration (its key is public)".to_owned(),
            };
            let config = match load_config(config.as_deref()) {
                Ok(c) => c,
                Err(code) => return code,
            };
            match token::sign(&config, &sub, &roles, ttl_s) {
                Ok((token, alg)) => {
                    eprintln!("switchyard token: signed with the {alg:?} secret of {source}");
                    println!("{token}");
                    ExitCode::SUCCESS
                }
                Err(err) => {
                    eprintln!("switchyard token: {err}");
                    ExitCode::from(EXIT_CONFIG)
                }
            }
        }
        Command::Store { action } => store_transfer(action),
        Command::Check { config } => match load_config(Some(&config)) {
            Ok(loaded) => {
                for line in validate::rule_coverage(&loaded) {
                    println!("{line}");
                }
                for note in switchyard_listener::middleware_check_notes(&loaded.middleware()) {
                    println!("note: {note}");
                }
                println!("{}: ok", config.display());
                ExitCode::SUCCESS
            }
            Err(code) => code,
        },
        Command::Openapi { config } => apidoc::openapi_main(config.as_deref()),
        Command::Proto { config, out } => apidoc::proto_main(config.as_deref(), out.as_deref()),
        Command::Validate => validate::child_main(),
        Command::Role { role, name, instance } => roles::main(role, name, instance),
    }
}
