//! A real group for integration tests of a plugin: the `switchyard` binary
//! started on an ephemeral port with a private runtime directory, waited on
//! until it reports ready (`--ready-file`, read by [`wait_ready`]), stopped
//! with SIGTERM when dropped. Under `[listener.tls]` it speaks HTTPS.
//!
//! [`wait_ready`] is also the readiness wait of the server's own
//! integration tests: one harness, one way to know the group serves.
//!
//! [`Group::start_crate`] builds the plugin crate under test first (in the
//! test's own profile) and serves that build, so an edited handler is what
//! answers; [`Group::start`] serves a configuration as it is.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A running group.
///
/// ```no_run
/// use switchyard_manager_host::testing::Group;
///
/// // Builds this crate's plugin, then serves its switchyard.toml with it.
/// // `switchyard` is found through $SWITCHYARD_BIN, then $PATH.
/// let group = Group::start_crate(env!("CARGO_MANIFEST_DIR")).unwrap();
/// let (status, body) = group.get("/my-plugin/hello/world").unwrap();
/// assert_eq!(status, 200, "{body}");
/// ```
pub struct Group {
    child: Child,
    /// Where the group listens (HTTPS under `[listener.tls]`).
    pub addr: SocketAddr,
    ready: Ready,
    runtime_dir: PathBuf,
    ready_file: PathBuf,
    /// Every line the group printed so far is collected here as it arrives.
    lines: mpsc::Receiver<String>,
}

/// The `switchyard` binary: `$SWITCHYARD_BIN`, else the first on `$PATH`.
fn switchyard_bin() -> std::io::Result<PathBuf> {
    if let Some(bin) = std::env::var_os("SWITCHYARD_BIN") {
        return Ok(PathBuf::from(bin));
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("switchyard"))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "cannot find the `switchyard` binary: install it with `cargo install --path <switchyard checkout>` \
                 (it goes to ~/.cargo/bin, which must be on PATH), or set SWITCHYARD_BIN to its path",
            )
        })
}

/// The cargo profile the running test was built in (`target/<dir>/deps/`),
/// so the plugin is built the same way.
fn test_profile() -> String {
    let dir = std::env::current_exe().ok().and_then(|exe| {
        Some(
            exe.parent()?
                .parent()?
                .file_name()?
                .to_string_lossy()
                .into_owned(),
        )
    });
    match dir.as_deref() {
        None | Some("debug") => "dev".to_owned(),
        Some(other) => other.to_owned(),
    }
}

/// Builds the library of the crate at `manifest_dir` and returns the
/// plugin file cargo made (`lib<name>.so`).
fn build_plugin(manifest_dir: &Path) -> std::io::Result<PathBuf> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .args(["build", "--lib", "--message-format=json", "--profile"])
        .arg(test_profile())
        .arg("--manifest-path")
        .arg(manifest_dir.join("Cargo.toml"))
        .stderr(Stdio::inherit())
        .output()?;
    if !output.status.success() {
        return Err(std::io::Error::other(format!(
            "building the plugin in {} failed ({})",
            manifest_dir.display(),
            output.status
        )));
    }
    // The last cdylib artifact cargo reports is this crate's own library.
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .rev()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|message| {
            message["reason"] == "compiler-artifact"
                && message["target"]["kind"]
                    .as_array()
                    .is_some_and(|kinds| kinds.iter().any(|k| k == "cdylib"))
        })
        .find_map(|message| {
            message["filenames"]
                .as_array()?
                .iter()
                .filter_map(|f| f.as_str())
                .find(|f| f.ends_with(".so"))
                .map(PathBuf::from)
        })
        .ok_or_else(|| {
            std::io::Error::other(format!(
                "{} builds no plugin: its [lib] needs crate-type = [\"cdylib\", \"rlib\"]",
                manifest_dir.display()
            ))
        })
}

impl Group {
    /// Builds the plugin crate at `manifest_dir` (pass
    /// `env!("CARGO_MANIFEST_DIR")`) in the test's profile, then starts its
    /// `switchyard.toml` with every manager whose plugin is this crate's
    /// library (`lib<name>.so`, wherever the file says it is) served from
    /// that fresh build.
    pub fn start_crate(manifest_dir: impl AsRef<Path>) -> std::io::Result<Group> {
        let dir = manifest_dir.as_ref();
        let built = build_plugin(dir)?;
        let file_name = built.file_name().map(|n| n.to_owned());
        let config_path = dir.join("switchyard.toml");
        let text = std::fs::read_to_string(&config_path).map_err(|e| {
            std::io::Error::new(e.kind(), format!("cannot read {}: {e}", config_path.display()))
        })?;
        // Line by line, so that the rest of the file (comments, order,
        // relative paths) stays as it is.
        let rewritten: Vec<String> = text
            .lines()
            .map(|line| {
                let key = line.trim_start();
                let points_here = key.starts_with("plugin")
                    && key["plugin".len()..].trim_start().starts_with('=')
                    && file_name
                        .as_ref()
                        .is_some_and(|name| line.contains(&*name.to_string_lossy()));
                if points_here {
                    format!("plugin = {:?}", built.display().to_string())
                } else {
                    line.to_owned()
                }
            })
            .collect();
        // Next to the original, so its relative paths still resolve.
        let copy = dir.join(format!(".switchyard-test-{}.toml", std::process::id()));
        std::fs::write(&copy, rewritten.join("\n"))?;
        let started = Group::start(&copy);
        let _ = std::fs::remove_file(&copy);
        started
    }

    /// Starts `switchyard up -c config` and waits (at most 60 s) until it is ready.
    pub fn start(config: &Path) -> std::io::Result<Group> {
        let bin = switchyard_bin()?;
        static STARTED: AtomicU32 = AtomicU32::new(0);
        let runtime_dir = std::env::temp_dir().join(format!(
            "switchyard-test-{}-{}",
            std::process::id(),
            STARTED.fetch_add(1, Ordering::Relaxed)
        ));
        // Beside the runtime directory, not in it: the supervisor makes
        // that one itself and removes it on exit.
        let mut ready_file = runtime_dir.clone().into_os_string();
        ready_file.push(".ready.json");
        let ready_file = PathBuf::from(ready_file);
        let mut child = Command::new(&bin)
            .args(["up", "--bind", "127.0.0.1:0", "-c"])
            .arg(config)
            .arg("--runtime-dir")
            .arg(&runtime_dir)
            .arg("--ready-file")
            .arg(&ready_file)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| std::io::Error::new(e.kind(), format!("cannot run {}: {e}", bin.display())))?;
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                eprintln!("group| {line}");
                let _ = tx.send(line);
            }
        });
        match wait_ready(&mut child, &ready_file, Duration::from_secs(60)) {
            Ok(ready) => Ok(Group {
                child,
                addr: ready.http,
                ready,
                runtime_dir,
                ready_file,
                lines,
            }),
            Err(err) => {
                let _ = child.kill();
                let _ = child.wait();
                let _ = std::fs::remove_file(&ready_file);
                Err(err)
            }
        }
    }

    /// What the group announced when it became ready: every address it
    /// bound, whether it speaks TLS, its supervisor's pid.
    pub fn ready(&self) -> &Ready {
        &self.ready
    }

    /// `GET path` → (status, body), on a fresh connection.
    pub fn get(&self, path: &str) -> std::io::Result<(u16, String)> {
        self.request("GET", path, "")
    }

    /// A request with a JSON body → (status, body); over TLS when the group
    /// serves HTTPS.
    pub fn request(&self, method: &str, path: &str, json: &str) -> std::io::Result<(u16, String)> {
        let mut stream = TcpStream::connect(self.addr)?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        let content_type = if json.is_empty() {
            ""
        } else {
            "content-type: application/json\r\n"
        };
        let head = format!(
            "{method} {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n{content_type}content-length: {}\r\n\r\n",
            json.len()
        );
        let mut raw = Vec::new();
        if self.ready.tls {
            let mut session = tls::client()?;
            let mut tls = rustls::Stream::new(&mut session, &mut stream);
            tls.write_all(head.as_bytes())?;
            tls.write_all(json.as_bytes())?;
            tls::read_to_end(&mut tls, &mut raw)?;
        } else {
            stream.write_all(head.as_bytes())?;
            stream.write_all(json.as_bytes())?;
            stream.read_to_end(&mut raw)?;
        }
        let text = String::from_utf8_lossy(&raw);
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        Ok((status, body.to_owned()))
    }

    /// The group's private runtime directory (for `switchyard status
    /// --runtime-dir`).
    pub fn runtime_dir(&self) -> &Path {
        &self.runtime_dir
    }

    /// Lines printed since the last call (logs of every process).
    pub fn drain_lines(&self) -> Vec<String> {
        self.lines.try_iter().collect()
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(15);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.runtime_dir);
        // Gone already unless the group had to be killed.
        let _ = std::fs::remove_file(&self.ready_file);
    }
}

/// What `switchyard up --ready-file PATH` writes once the group serves
/// (docs/decisions/0150-readiness-file.md).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ready {
    /// The supervisor's pid.
    pub pid: u32,
    /// `[listener.tls]` is on: `http` and `grpc` speak HTTPS.
    pub tls: bool,
    /// The listener's address.
    pub http: SocketAddr,
    /// `listener.grpc_bind`, when set.
    pub grpc: Option<SocketAddr>,
    /// HTTP/3's UDP address, when on.
    pub http3: Option<SocketAddr>,
    /// The admin endpoint, when on.
    pub admin: Option<SocketAddr>,
    /// The group's runtime directory.
    pub runtime_dir: PathBuf,
}

impl Ready {
    /// Parses the file's text; `None` for anything else.
    pub fn parse(text: &str) -> Option<Ready> {
        let v: serde_json::Value = serde_json::from_str(text).ok()?;
        if v["ready"] != true {
            return None;
        }
        let addr = |key: &str| -> Option<Option<SocketAddr>> {
            match &v[key] {
                serde_json::Value::Null => Some(None),
                other => other.as_str()?.parse().ok().map(Some),
            }
        };
        Some(Ready {
            pid: u32::try_from(v["pid"].as_u64()?).ok()?,
            tls: match v["scheme"].as_str()? {
                "https" => true,
                "http" => false,
                _ => return None,
            },
            http: addr("http")??,
            grpc: addr("grpc")?,
            http3: addr("http3")?,
            admin: addr("admin")?,
            runtime_dir: PathBuf::from(v["runtime_dir"].as_str()?),
        })
    }
}

/// Waits until `child`, a `switchyard up` (or `dev`) started with
/// `--ready-file ready_file`, has written that file, and returns what it
/// says. Fails when the child exits first (the error says how) or when
/// `patience` runs out (`ErrorKind::TimedOut`).
///
/// The one readiness wait of every harness that starts the binary: the
/// file appears whole (renamed into place), so a file that is there is
/// complete.
pub fn wait_ready(child: &mut Child, ready_file: &Path, patience: Duration) -> std::io::Result<Ready> {
    let deadline = Instant::now() + patience;
    loop {
        match std::fs::read_to_string(ready_file) {
            Ok(text) => {
                return Ready::parse(&text).ok_or_else(|| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("{} is not a readiness file: {text}", ready_file.display()),
                    )
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        if let Some(status) = child.try_wait()? {
            return Err(NotReady::Exited(status).into());
        }
        if Instant::now() >= deadline {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the group was not ready within {patience:?}"),
            ));
        }
        // A supervisor starts in tens of milliseconds at best; a shorter
        // poll would only cost the machine the test runs on.
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Why [`wait_ready`] gave up on a child that exited.
#[derive(Debug)]
pub enum NotReady {
    /// The group stopped before it served (a configuration it refused,
    /// a port in use): its exit status.
    Exited(ExitStatus),
}

impl std::fmt::Display for NotReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotReady::Exited(status) => write!(f, "the group exited before it was ready ({status})"),
        }
    }
}

impl std::error::Error for NotReady {}

impl From<NotReady> for std::io::Error {
    fn from(err: NotReady) -> std::io::Error {
        std::io::Error::other(err)
    }
}

/// The harness's TLS client. It does not authenticate the group: the
/// group is the one this process just started on a loopback port, and its
/// certificate is the test's own business (tests of certificates bring
/// their own client).
mod tls {
    use std::io::Read;
    use std::sync::Arc;

    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::{DigitallySignedStruct, SignatureScheme};

    #[derive(Debug)]
    struct AnyCertificate(Arc<CryptoProvider>);

    impl ServerCertVerifier for AnyCertificate {
        fn verify_server_cert(
            &self,
            _end_entity: &CertificateDer<'_>,
            _intermediates: &[CertificateDer<'_>],
            _server_name: &ServerName<'_>,
            _ocsp: &[u8],
            _now: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            Ok(ServerCertVerified::assertion())
        }

        // The handshake's signatures are still checked: the key is the
        // certificate's.
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }

    pub(super) fn client() -> std::io::Result<rustls::ClientConnection> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(std::io::Error::other)?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
            .with_no_client_auth();
        let name = ServerName::try_from("localhost").map_err(std::io::Error::other)?;
        rustls::ClientConnection::new(Arc::new(config), name).map_err(std::io::Error::other)
    }

    /// Reads the answer until the server closes; a close without
    /// `close_notify` after a complete answer is the end too.
    pub(super) fn read_to_end(stream: &mut impl Read, out: &mut Vec<u8>) -> std::io::Result<()> {
        match stream.read_to_end(out) {
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !out.is_empty() => Ok(()),
            other => other.map(|_| ()),
        }
    }
}
