//! A private PostgreSQL server for a test: its own data directory, its own
//! unix socket in that directory (no TCP port to collide on), stopped and
//! removed when dropped.
//!
//! PostgreSQL refuses to run as root, and the tests may run as root: the
//! cluster then belongs to `nobody`, whose uid the server is started with
//! (decision 0121).
//! The binaries are looked up as Debian installs them
//! (`/usr/lib/postgresql/<version>/bin`, the newest first), or in
//! `SWITCHYARD_PG_BIN`. Without them a test is skipped with a message,
//! except under CI (`CI` set), where it fails.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::{Pid, Uid};
use tempfile::TempDir;

use super::{PATIENCE, eventually};

/// The uid and gid of `nobody` on Debian, the owner of a root test's cluster.
const NOBODY: u32 = 65534;

/// The port number in the socket's name (`.s.PGSQL.5432`); nothing listens
/// on TCP.
const PORT: u16 = 5432;

pub struct Postgres {
    child: Option<Child>,
    dir: TempDir,
}

/// The directory holding `initdb` and `postgres`, if PostgreSQL is installed.
fn binaries() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("SWITCHYARD_PG_BIN") {
        return Some(PathBuf::from(dir));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("postgres").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

impl Postgres {
    /// Starts a server, or `None` (after saying why) when PostgreSQL is not
    /// installed and this is not CI.
    pub fn start() -> Option<Postgres> {
        let Some(bin) = binaries() else {
            let message = "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin, no SWITCHYARD_PG_BIN): \
                           `apt-get install postgresql` to run this test";
            assert!(std::env::var_os("CI").is_none(), "{message}");
            eprintln!("SKIPPED: {message}");
            return None;
        };
        let dir = super::scratch_dir("pg");
        let as_root = Uid::effective().is_root();
        if as_root {
            std::os::unix::fs::chown(dir.path(), Some(NOBODY), Some(NOBODY))
                .expect("give the cluster to nobody");
        }
        let data = dir.path().join("data");
        let command = |program: &str| {
            let mut cmd = Command::new(bin.join(program));
            if as_root {
                cmd.uid(NOBODY).gid(NOBODY);
            }
            cmd.current_dir(dir.path());
            // SAFETY: prctl is async-signal-safe. Set after the uid change
            // (which would clear it): a test killed outright (a harness's
            // timeout) takes its server with it instead of leaving it
            // running; its backends follow their postmaster.
            unsafe {
                cmd.pre_exec(|| {
                    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
                });
            }
            cmd
        };
        let out = command("initdb")
            .args([
                "--auth=trust",
                "--username=postgres",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
                "-D",
            ])
            .arg(&data)
            .output()
            .expect("run initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let child = command("postgres")
            .arg("-D")
            .arg(&data)
            .arg("-k")
            .arg(dir.path())
            .args(["-p", &PORT.to_string()])
            .args(["-c", "listen_addresses="])
            // A test's cluster need not survive a crash of the machine.
            .args([
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
            ])
            // A query whose client went away (a cancelled handler's) ends
            // instead of running to its end.
            .args(["-c", "client_connection_check_interval=100"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start postgres");
        let mut pg = Postgres {
            child: Some(child),
            dir,
        };
        let socket = pg.dir.path().join(format!(".s.PGSQL.{PORT}"));
        eventually("PostgreSQL accepts connections", PATIENCE, || {
            if let Some(status) = pg.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                let mut log = String::new();
                if let Some(mut err) = pg.child.as_mut().and_then(|c| c.stderr.take()) {
                    let _ = err.read_to_string(&mut log);
                }
                panic!("postgres exited ({status}):\n{log}");
            }
            // The socket is there before the server accepts sessions
            // ("the database system is starting up"): ask it, as
            // `pg_isready` does, rather than only connect.
            std::os::unix::net::UnixStream::connect(&socket).map_err(|e| e.to_string())?;
            let ready = Command::new(bin.join("pg_isready"))
                .arg("-h")
                .arg(pg.dir.path())
                .args(["-p", &PORT.to_string(), "-U", "postgres", "-q"])
                .status()
                .map_err(|e| format!("run pg_isready: {e}"))?;
            if ready.success() {
                Ok(())
            } else {
                Err(format!("pg_isready: {ready}"))
            }
        });
        // Let its log drain without blocking it.
        if let Some(mut err) = pg.child.as_mut().and_then(|c| c.stderr.take()) {
            std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
        }
        Some(pg)
    }

    /// The directory of the server's socket.
    pub fn socket_dir(&self) -> &Path {
        self.dir.path()
    }

    /// A libpq connection string for database `db` as the `postgres`
    /// superuser, over the unix socket.
    pub fn conninfo(&self, db: &str) -> String {
        format!(
            "host={} port={PORT} user=postgres dbname={db}",
            self.dir.path().display()
        )
    }

    /// Creates database `name` (with `createdb`, beside the server's
    /// binaries).
    pub fn create_database(&self, name: &str) {
        let bin = binaries().expect("PostgreSQL was found at start");
        let out = Command::new(bin.join("createdb"))
            .args(["-h"])
            .arg(self.dir.path())
            .args(["-p", &PORT.to_string(), "-U", "postgres", name])
            .output()
            .expect("run createdb");
        assert!(
            out.status.success(),
            "createdb {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Postgres {
    /// Runs `sql` in database `db` with `psql` and returns its unaligned
    /// output (one row a line, fields split by `|`).
    pub fn psql(&self, db: &str, sql: &str) -> String {
        let bin = binaries().expect("PostgreSQL was found at start");
        let out = Command::new(bin.join("psql"))
            .arg("-h")
            .arg(self.dir.path())
            .args([
                "-p",
                &PORT.to_string(),
                "-U",
                "postgres",
                "-d",
                db,
                "-At",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                sql,
            ])
            .output()
            .expect("run psql");
        assert!(
            out.status.success(),
            "psql {sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim_end().to_owned()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // SIGINT is PostgreSQL's fast shutdown: sessions are ended, not
        // waited for.
        if let Ok(pid) = i32::try_from(child.id()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGINT);
        }
        let stopped = super::poll(Duration::from_secs(20), || match child.try_wait() {
            Ok(Some(_)) => Ok(()),
            _ => Err(()),
        });
        if stopped.is_err() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
