//! `switchyard new NAME`: a plugin crate that builds and serves.
//!
//! Its layout is the one examples/tickets grows from (tests/scaffold.rs
//! checks the two agree): `Cargo.toml`, `switchyard.toml`, `README.md`,
//! `src/lib.rs` with the handler style of docs/writing-managers.md, and
//! `templates/` for its HTML pages.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The SDK crate the scaffold depends on by default (the SDK is not on
/// crates.io yet): this checkout's `manager/sdk/`.
pub(crate) const SDK_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/manager/sdk");

/// Where the new crate gets `switchyard-manager` from.
pub(crate) enum Sdk {
    /// A directory (written relative to the new crate, so that the two can
    /// move together, e.g. in one repository).
    Path(PathBuf),
    /// A version from a registry.
    Version(String),
    /// A git repository.
    Git(String),
}

impl Sdk {
    /// The dependency's value in the new crate's `Cargo.toml`.
    fn dependency(&self, crate_dir: &Path) -> std::io::Result<String> {
        Ok(match self {
            Sdk::Version(version) => format!("{version:?}"),
            Sdk::Git(url) => format!("{{ git = {url:?} }}"),
            Sdk::Path(path) => {
                let sdk = std::path::absolute(path)?;
                if !sdk.join("Cargo.toml").is_file() {
                    return Err(std::io::Error::other(format!(
                        "{} is not the switchyard-manager crate (no Cargo.toml)",
                        sdk.display()
                    )));
                }
                let from = std::path::absolute(crate_dir)?;
                format!("{{ path = {:?} }}", relative(&sdk, &from).display().to_string())
            }
        })
    }
}

/// `to` as a path relative to the directory `from` (both absolute).
fn relative(to: &Path, from: &Path) -> PathBuf {
    let to: Vec<_> = to.components().collect();
    let from: Vec<_> = from.components().collect();
    let common = to.iter().zip(&from).take_while(|(a, b)| a == b).count();
    // Only the root in common: an absolute path reads better than ../../..
    if common <= 1 {
        return to.iter().collect();
    }
    let mut path: PathBuf = from[common..]
        .iter()
        .map(|_| std::path::Component::ParentDir)
        .collect();
    path.extend(&to[common..]);
    path
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
        && name.len() <= 64
}

pub(crate) fn main(target: &Path, sdk: Sdk) -> ExitCode {
    let Some(name) = target.file_name().and_then(|n| n.to_str()).map(str::to_owned) else {
        eprintln!("switchyard new: give a directory name, e.g. `switchyard new my-manager`");
        return ExitCode::from(crate::EXIT_CONFIG);
    };
    if !valid_name(&name) {
        eprintln!(
            "switchyard new: `{name}` is not a valid crate name (lowercase letters, digits, `-`, `_`; starting with a letter)"
        );
        return ExitCode::from(crate::EXIT_CONFIG);
    }
    if target.exists() {
        eprintln!(
            "switchyard new: {} already exists; nothing was written",
            target.display()
        );
        return ExitCode::FAILURE;
    }
    let written = sdk.dependency(target).and_then(|sdk| write(target, &name, &sdk));
    match written {
        Ok(()) => {
            println!("Created plugin crate `{name}` in {}", target.display());
            println!();
            println!("  cd {} && cargo test", target.display());
            println!("  switchyard dev        # builds it, serves it, rebuilds and reloads it on each save");
            println!("  curl http://127.0.0.1:8080/{name}/hello/world");
            println!();
            println!("(`switchyard` on PATH: `cargo install --path <switchyard checkout> --locked`.)");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("switchyard new: {err}");
            let _ = std::fs::remove_dir_all(target);
            ExitCode::FAILURE
        }
    }
}

fn write(dir: &Path, name: &str, sdk: &str) -> std::io::Result<()> {
    let lib = name.replace('-', "_");
    std::fs::create_dir_all(dir.join("src"))?;
    std::fs::create_dir_all(dir.join("templates"))?;
    std::fs::write(
        dir.join("Cargo.toml"),
        format!(
            r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2024"
publish = false

[lib]
# cdylib: the plugin `switchyard up` loads; rlib: lets tests link it.
crate-type = ["cdylib", "rlib"]

[dependencies]
# The SDK: a path, a version or a git repository (`switchyard new --help`).
switchyard-manager = {sdk}
serde = {{ version = "1", features = ["derive"] }}
serde_json = "1"

# A workspace of its own, even when created inside another one.
[workspace]
"#
        ),
    )?;
    std::fs::write(dir.join(".gitignore"), "/target\n")?;
    std::fs::write(
        dir.join("switchyard.toml"),
        format!(
            r#"# `switchyard dev` builds the plugin and serves it (the debug build, rebuilt
# on each save). In production: `cargo build --release`, this path
# pointed at target/release/, and `switchyard up -c switchyard.toml`.
[listener]
bind = "127.0.0.1:8080"

[[managers]]
name = "{name}"
plugin = "target/debug/lib{lib}.so"
# Its HTML pages (`#[event(template = "...")]`).
templates = "templates"
# instances = 1
[managers.config]
greeting = "Hello"
"#
        ),
    )?;
    std::fs::write(
        dir.join("src/lib.rs"),
        format!(
            r#"//! The `{name}` manager: a Switchyard plugin.

use serde::{{Deserialize, Serialize}};
use switchyard_manager::{{Config, Context, Error, Event, Manager, Registry, Reply, State, tracing}};

/// `GET /{name}/hello/{{who}}`: the event the listener builds from the
/// request. `reply` names what its handler returns (and what `cx.call` of
/// it gives another manager); a browser (`Accept: text/html`) gets the
/// reply rendered by `templates/hello.html`.
#[derive(Debug, Serialize, Deserialize, Event)]
#[event(
    name = "{name}.Hello",
    http = "GET /{name}/hello/{{who}}",
    template = "hello.html",
    reply = Greeting
)]
pub struct Hello {{
    #[validate(length(min = 1, max = 64))]
    pub who: String,
    /// Request context is a field: `#[from(..)]` both declares it (only
    /// what is declared travels) and reads it. Also `cookie = ".."`,
    /// `scope = ".."`, `method`, `path`, `client`, `identity`.
    #[from(header = "user-agent")]
    pub agent: Option<String>,
}}

/// The reply, as JSON to HTTP clients.
#[derive(Debug, Serialize, Deserialize, Reply)]
pub struct Greeting {{
    pub message: String,
    pub count: u64,
}}

/// How many greetings so far. No HTTP route: `public` lets WebSocket and
/// gRPC clients send it (`{{"type": "{name}.Count"}}` on `/ws`).
#[derive(Debug, Serialize, Deserialize, Event)]
#[event(name = "{name}.Count", public, reply = Counted)]
pub struct Count {{}}

/// Starts the count again. Neither a route nor `public`: internal, so
/// only the group's other managers may send it (`cx.call`); clients get
/// 404 as for a type no manager declares.
#[derive(Debug, Serialize, Deserialize, Event)]
#[event(name = "{name}.Reset", reply = Counted)]
pub struct Reset {{}}

/// The count, as a reply.
#[derive(Debug, Serialize, Deserialize, Reply)]
pub struct Counted {{
    pub count: u64,
}}

/// `[managers.config]` in switchyard.toml; every key has a default.
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {{
    pub greeting: String,
}}

impl Default for Settings {{
    fn default() -> Self {{
        Settings {{ greeting: "Hello".to_owned() }}
    }}
}}

/// State lives across requests; handlers run one at a time.
pub struct {type_name} {{
    greeting: String,
    count: u64,
}}

impl Manager for {type_name} {{
    const NAME: &'static str = "{name}";

    fn create(config: &Config) -> Result<Self, Error> {{
        let settings: Settings = config.get_or_default()?;
        Ok({type_name} {{ greeting: settings.greeting, count: 0 }})
    }}

    fn register(r: &mut Registry<Self>) {{
        // One way for every handler, sync or async.
        r.handle(Self::hello).handle(Self::count).handle(Self::reset);
    }}
}}

impl {type_name} {{
    /// A handler with the state to itself.
    fn hello(&mut self, ev: Hello, _: &mut Context) -> Result<Greeting, Error> {{
        self.count += 1;
        // In the group's log with the request's id and trace id.
        tracing::info!(agent = ?ev.agent, "greeting {{}}", ev.who);
        Ok(Greeting {{ message: format!("{{}}, {{}}!", self.greeting, ev.who), count: self.count }})
    }}

    /// An `async fn` with `State<Self>` and `Context`: it may `.await` a
    /// `cx.call(..)`, a database query (sqlx, tokio-postgres), an HTTP
    /// request (reqwest) or a tokio timer, and the manager's other requests
    /// go on meanwhile. Registered as the others are.
    async fn count(state: State<Self>, _: Count, _: Context) -> Result<Counted, Error> {{
        Ok(Counted {{ count: state.with(|m| m.count) }})
    }}

    fn reset(&mut self, _: Reset, _: &mut Context) -> Result<Counted, Error> {{
        self.count = 0;
        Ok(Counted {{ count: 0 }})
    }}
}}

switchyard_manager::export_manager!({type_name});

#[cfg(test)]
mod tests {{
    use super::*;
    use switchyard_manager::testing::TestManager;

    #[test]
    fn greets_and_counts() {{
        let mut m = TestManager::<{type_name}>::with_config(serde_json::json!({{"greeting": "Hi"}}));
        let r = m.http::<Hello>(&[("who", "Ada")], "", b"");
        assert_eq!(r.status, 200);
        let greeting: Greeting = r.json();
        assert_eq!((greeting.message.as_str(), greeting.count), ("Hi, Ada!", 1));
        // Invalid input: 422 naming the field.
        let r = m.http::<Hello>(&[("who", "")], "", b"");
        assert_eq!(r.status, 422);
        assert!(r.text().contains("\"field\":\"who\""));
    }}
}}
"#,
            type_name = type_name(name),
        ),
    )?;
    std::fs::write(
        dir.join("templates/hello.html"),
        r#"<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>{{ message }}</title></head>
<body>
<h1>{{ message }}</h1>
<p>Greeting number {{ count }}.</p>
</body>
</html>
"#,
    )?;
    std::fs::write(
        dir.join("README.md"),
        format!(
            r#"# {name}

A Switchyard plugin: the `{name}` manager.

```sh
cargo test                                   # its unit tests
switchyard dev                               # builds it, serves it on :8080, rebuilds and reloads it on each save
curl http://127.0.0.1:8080/{name}/hello/world
```

- `src/lib.rs`: the events (`#[derive(Event)]`, each with its route and
  reply), the replies, the manager's state and its handlers.
- `switchyard.toml`: the group that serves it; `[managers.config]` is
  what `create` reads.
- `templates/`: the HTML pages of events with `template = "..."`.

How to grow it (a database, calls to other managers, notifications,
jobs): docs/writing-managers.md of the Switchyard checkout, and
examples/tickets there, a support desk on PostgreSQL built from this
layout.
"#
        ),
    )?;
    Ok(())
}

/// `my-manager` → `MyManager`.
fn type_name(name: &str) -> String {
    name.split(['-', '_'])
        .filter(|p| !p.is_empty())
        .map(|p| {
            let mut c = p.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(valid_name("my-manager") && valid_name("a1_b"));
        assert!(!valid_name("My") && !valid_name("1a") && !valid_name("") && !valid_name("a/b"));
        assert_eq!(type_name("my-manager"), "MyManager");
        assert_eq!(type_name("orders"), "Orders");
    }

    #[test]
    fn sdk_paths_are_written_relative_to_the_new_crate() {
        assert_eq!(
            relative(
                Path::new("/src/switchyard/manager/sdk"),
                Path::new("/src/plugins/mine")
            ),
            PathBuf::from("../../switchyard/manager/sdk")
        );
        assert_eq!(
            relative(Path::new("/opt/sdk"), Path::new("/home/me/mine")),
            PathBuf::from("/opt/sdk")
        );
        let dir = Path::new("/tmp/x");
        assert_eq!(Sdk::Version("0.1".into()).dependency(dir).unwrap(), "\"0.1\"");
        assert_eq!(
            Sdk::Git("https://example.org/s.git".into())
                .dependency(dir)
                .unwrap(),
            "{ git = \"https://example.org/s.git\" }"
        );
    }
}
