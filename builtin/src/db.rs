//! The database both built-ins share: one SQLite file in the group's data
//! directory, in WAL mode, with a lock file per built-in so that two groups
//! (or two instances) never serve the same data.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::Connection;
use serde::Deserialize;

use crate::BuiltinError;

/// The database file, inside the data directory.
pub(crate) const DB_FILE: &str = "store.db";

/// How long a statement waits for the other built-in's write to finish.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// How writes are made durable (`durability` in the config).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Durability {
    /// Each write is committed and fsynced before it is answered
    /// (`synchronous = FULL`): it survives a power loss.
    #[default]
    Fsync,
    /// Each write is committed to the OS before it is answered (it survives
    /// a crash of any process) and the log is fsynced every
    /// `group_commit_ms` for every write since: a power loss or kernel crash
    /// may lose that last interval.
    Group,
}

/// An open database and the lock that makes it this process's.
pub(crate) struct Db {
    pub(crate) conn: Connection,
    pub(crate) path: PathBuf,
    /// Held for the life of the process (released by the kernel on any exit).
    _lock: File,
}

/// Milliseconds since the Unix epoch, by the wall clock.
pub(crate) fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Opens (creating if needed) the database in `dir` for the built-in
/// `role`, after taking `dir/<role>.lock`. Fails with a message that names
/// the file and what is wrong with it: not a database, not writable, in use.
pub(crate) fn open(
    dir: &Path,
    role: &str,
    durability: Durability,
    cache_kib: u64,
) -> Result<Db, BuiltinError> {
    std::fs::create_dir_all(dir).map_err(|e| BuiltinError::DataDir {
        dir: dir.to_owned(),
        message: e.to_string(),
    })?;
    let lock_path = dir.join(format!("{role}.lock"));
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| BuiltinError::DataDir {
            dir: dir.to_owned(),
            message: format!("cannot open {}: {e}", lock_path.display()),
        })?;
    lock.try_lock().map_err(|e| match e {
        std::fs::TryLockError::WouldBlock => BuiltinError::InUse {
            dir: dir.to_owned(),
            role: role.to_owned(),
        },
        std::fs::TryLockError::Error(e) => BuiltinError::DataDir {
            dir: dir.to_owned(),
            message: format!("cannot lock {}: {e}", lock_path.display()),
        },
    })?;
    let path = dir.join(DB_FILE);
    let bad = |e: rusqlite::Error| BuiltinError::Database {
        path: path.clone(),
        message: e.to_string(),
    };
    let conn = Connection::open(&path).map_err(bad)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(bad)?;
    // The first statement that reads the file: a file that is not a
    // database fails here ("file is not a database").
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .map_err(bad)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(BuiltinError::Database {
            path: path.clone(),
            message: format!("cannot use write-ahead logging here (journal mode stays {mode})"),
        });
    }
    let synchronous = match durability {
        Durability::Fsync => "FULL",
        Durability::Group => "NORMAL",
    };
    conn.execute_batch(&format!(
        "PRAGMA synchronous = {synchronous};
         PRAGMA cache_size = -{cache_kib};
         PRAGMA journal_size_limit = 67108864;
         PRAGMA temp_store = MEMORY;"
    ))
    .map_err(bad)?;
    // A write at start: an unwritable file or directory refuses here, not
    // at the first client's write.
    conn.execute_batch(
        "BEGIN IMMEDIATE;
         CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
         INSERT INTO meta(name, value) VALUES ('schema', 1) ON CONFLICT(name) DO NOTHING;
         COMMIT;",
    )
    .map_err(|e| {
        let _ = conn.execute_batch("ROLLBACK");
        bad(e)
    })?;
    Ok(Db {
        conn,
        path,
        _lock: lock,
    })
}

impl Db {
    /// The error of a statement, as a 500 that names the database.
    pub(crate) fn failed(&self, e: rusqlite::Error) -> switchyard_manager::Error {
        switchyard_manager::Error::internal(format!("store database {}: {e}", self.path.display()))
    }
}

/// The write-ahead log of the database at `path`.
pub(crate) fn wal_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push("-wal");
    PathBuf::from(name)
}

/// `group` durability: fsyncs the write-ahead log at most every `period`,
/// when something was written since, off the manager's thread.
pub(crate) fn spawn_group_commit(wal: PathBuf, dirty: Arc<AtomicBool>, period: Duration) {
    let spawned = std::thread::Builder::new()
        .name("store-group-commit".into())
        .spawn(move || {
            loop {
                std::thread::sleep(period);
                if dirty.swap(false, Ordering::AcqRel) {
                    // fsync flushes the file's pages whichever descriptor
                    // asks; SQLite keeps the log while its connection lives.
                    if let Err(e) = std::fs::OpenOptions::new()
                        .write(true)
                        .open(&wal)
                        .and_then(|f| f.sync_data())
                    {
                        dirty.store(true, Ordering::Release);
                        eprintln!("switchyard: cannot fsync {}: {e}", wal.display());
                    }
                }
            }
        });
    if let Err(e) = spawned {
        eprintln!("switchyard: cannot start the group-commit thread: {e}");
    }
}
