//! The `store` manager: the events of `switchyard_manager::store`, served
//! from SQLite.
//!
//! One process, one connection, handlers one at a time: every operation is
//! atomic for the whole group without locks (an increment is a read and a
//! write that nothing can come between). The keys live in the database,
//! not in a map: memory is SQLite's page cache (`cache_kib`) whatever the
//! number of keys.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rusqlite::{OptionalExtension, params};
use serde::Deserialize;
use switchyard_manager::store::{
    Changed, CompareAndSet, Counter, Delete, Deleted, Entry, Get, Increment, JsonText, List, Listed, Op, Set,
    SetIfAbsent, Swapped, Unwatch, Unwatched, Watch, Watching, Written,
};
use switchyard_manager::{Config, Context, Error, Json, LogLevel, Manager, Registry};

use crate::db::{self, Db, Durability, wall_ms};
use crate::{BuiltinError, positive, settings};

mod keys;
use keys::{Keys, shown};

/// Versions are handed out from blocks reserved in `meta`, so that a
/// version is never reused, even for a key deleted before a restart.
const VERSION_BLOCK: u64 = 1024;
/// Largest `List` page, in entries and in bytes of values.
const LIST_MAX: u32 = 1000;
const LIST_MAX_BYTES: usize = 1 << 20;

/// The `store` manager's `[managers.config]` table (docs/store.md).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct StoreSettings {
    /// Set by the supervisor from `--data-dir` / `[data] dir`.
    pub(crate) data_dir: Option<PathBuf>,
    /// `fsync` (default) or `group`.
    pub(crate) durability: Durability,
    /// With `group`: how often the log is fsynced, in milliseconds.
    pub(crate) group_commit_ms: u64,
    /// Longest key, in bytes (UTF-8); longer → 413.
    pub(crate) max_key_bytes: usize,
    /// Largest value, in bytes of JSON text; larger → 413.
    pub(crate) max_value_bytes: usize,
    /// SQLite page cache, in KiB: the store's memory, whatever the keys.
    pub(crate) cache_kib: u64,
    /// How often expired keys are purged, in milliseconds.
    pub(crate) purge_interval_ms: u64,
    /// At most this many expired keys are purged per round.
    pub(crate) purge_batch: u32,
    /// At most this many watches at once; more → 429.
    pub(crate) max_watches: usize,
    /// Key prefixes every caller shares; any other key is its caller's
    /// own: one manager's, or one client's (decision 0114).
    pub(crate) shared: Vec<String>,
    /// Where the keys live: `auto` (JetStream when the group has
    /// `[cluster]`, else SQLite), `sqlite` or `jetstream`.
    pub(crate) backend: Backend,
    /// JetStream: the bucket's replicas (1 to 5).
    pub(crate) replicas: usize,
    /// JetStream: the bucket's name (default `store-<cluster name>`).
    pub(crate) bucket: Option<String>,
    /// JetStream: the longest an operation waits for the bucket.
    pub(crate) op_timeout_ms: u64,
    /// Set by the supervisor from `[cluster]`.
    pub(crate) cluster: Option<switchyard_cluster::Config>,
}

/// The `backend` setting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Backend {
    #[default]
    Auto,
    Sqlite,
    Jetstream,
}

impl Default for StoreSettings {
    fn default() -> Self {
        StoreSettings {
            data_dir: None,
            durability: Durability::Fsync,
            group_commit_ms: 50,
            max_key_bytes: 1024,
            max_value_bytes: 1 << 20,
            cache_kib: 8 * 1024,
            purge_interval_ms: 1000,
            purge_batch: 1000,
            max_watches: 1024,
            shared: Vec::new(),
            backend: Backend::Auto,
            replicas: 3,
            bucket: None,
            op_timeout_ms: 2000,
            cluster: None,
        }
    }
}

impl StoreSettings {
    pub(crate) fn parse(value: &serde_json::Value) -> Result<StoreSettings, BuiltinError> {
        let s: StoreSettings = settings(value)?;
        positive("group_commit_ms", s.group_commit_ms)?;
        positive("max_key_bytes", s.max_key_bytes as u64)?;
        positive("max_value_bytes", s.max_value_bytes as u64)?;
        positive("cache_kib", s.cache_kib)?;
        positive("purge_interval_ms", s.purge_interval_ms)?;
        positive("purge_batch", s.purge_batch as u64)?;
        positive("max_watches", s.max_watches as u64)?;
        for (i, prefix) in s.shared.iter().enumerate() {
            if prefix.is_empty() || prefix.contains('\0') {
                return Err(BuiltinError::Config {
                    key: format!("shared[{i}]"),
                    message: "a shared namespace is a non-empty key prefix without NUL".into(),
                });
            }
        }
        positive("op_timeout_ms", s.op_timeout_ms)?;
        if s.op_timeout_ms > 10_000 {
            // A handler waits this long, and the watchdog ends a manager
            // whose handlers take `group.handler_timeout_ms` (30 s).
            return Err(BuiltinError::Config {
                key: "op_timeout_ms".into(),
                message: "must be at most 10000".into(),
            });
        }
        if !(1..=5).contains(&s.replicas) {
            return Err(BuiltinError::Config {
                key: "replicas".into(),
                message: "must be 1 to 5 (JetStream's limit)".into(),
            });
        }
        if let Some(bucket) = &s.bucket
            && (bucket.is_empty()
                || !bucket
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'))
        {
            return Err(BuiltinError::Config {
                key: "bucket".into(),
                message: format!("`{bucket}` must be letters, digits, `-` or `_`"),
            });
        }
        if s.max_key_bytes > 64 * 1024 {
            return Err(BuiltinError::Config {
                key: "max_key_bytes".into(),
                message: "must be at most 65536".into(),
            });
        }
        if s.max_value_bytes > 64 << 20 {
            return Err(BuiltinError::Config {
                key: "max_value_bytes".into(),
                message: "must be at most 67108864 (64 MiB)".into(),
            });
        }
        Ok(s)
    }
}

/// A `List` row: key, version, expiry, value (absent with `keys_only`).
type ListRow = (Vec<u8>, u64, Option<u64>, Option<Vec<u8>>);

struct WatchEntry {
    prefix: String,
    expires_ms: Option<u64>,
}

/// The live store: the database and what is derived from it.
struct Live {
    db: Db,
    /// The next version to hand out, and the end of the reserved block.
    next_version: u64,
    reserved: u64,
    watches: Vec<WatchEntry>,
    /// `group` durability: set by every write, cleared by the syncer.
    dirty: Option<Arc<AtomicBool>>,
}

/// The `store` manager.
pub struct Store {
    settings: StoreSettings,
    /// `None` only in the validation child, which serves nothing, and
    /// on JetStream.
    live: Option<Live>,
    /// The JetStream back end, when the keys live there.
    js: Option<jetstream::JsStore>,
}

fn too_large(what: &str, len: usize, key: &str, max: usize) -> Error {
    Error::new(
        413,
        format!("{what} of {len} bytes is over the store's limit (`{key}` = {max})"),
    )
}

pub(crate) fn expires(ttl_ms: Option<u64>, now: u64) -> Option<u64> {
    ttl_ms.map(|t| now.saturating_add(t.max(1)))
}

fn live_at(expires_ms: Option<u64>, now: u64) -> bool {
    expires_ms.is_none_or(|e| e > now)
}

/// The smallest byte string greater than every string starting with
/// `prefix` (`None`: no bound, for the empty prefix). UTF-8 never contains
/// 0xFF, so incrementing the last byte is enough.
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xFF {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

impl StoreSettings {
    /// `[cluster]`, when the keys live in JetStream.
    pub(crate) fn jetstream(&self) -> Option<&switchyard_cluster::Config> {
        match self.backend {
            Backend::Sqlite => None,
            Backend::Auto | Backend::Jetstream => self.cluster.as_ref().filter(|c| c.enabled()),
        }
    }
}

impl Manager for Store {
    const NAME: &'static str = "store";

    fn create(config: &Config) -> Result<Self, Error> {
        let settings = StoreSettings::parse(&config.value)?;
        if config.validation {
            return Ok(Store {
                settings,
                live: None,
                js: None,
            });
        }
        // Checked here, not in `parse`: the validation child is not given
        // `[cluster]` (the supervisor's check names this case).
        if settings.backend == Backend::Jetstream && settings.jetstream().is_none() {
            return Err(BuiltinError::Config {
                key: "backend".into(),
                message: "`jetstream` needs `[cluster]` (the NATS servers to reach JetStream through)".into(),
            }
            .into());
        }
        if let Some(cluster) = settings.jetstream() {
            let spec = crate::nats::BucketSpec {
                name: settings
                    .bucket
                    .clone()
                    .unwrap_or_else(|| format!("store-{}", cluster.name)),
                replicas: settings.replicas,
                max_value_bytes: settings.max_value_bytes,
            };
            let js = jetstream::JsStore::start(cluster, spec, Duration::from_millis(settings.op_timeout_ms))?;
            return Ok(Store {
                settings,
                live: None,
                js: Some(js),
            });
        }
        let dir = settings.data_dir.clone().ok_or_else(|| BuiltinError::Config {
            key: crate::DATA_DIR_KEY.into(),
            message: "no data directory was given (the supervisor sets it from --data-dir)".into(),
        })?;
        let db = db::open(&dir, Self::NAME, settings.durability, settings.cache_kib)?;
        let live = Live::start(db, &settings)?;
        Ok(Store {
            settings,
            live: Some(live),
            js: None,
        })
    }

    fn register(r: &mut Registry<Self>) {
        r.handle(Self::get)
            .handle(Self::set)
            .handle(Self::delete)
            .handle(Self::increment)
            .handle(Self::compare_and_set)
            .handle(Self::set_if_absent)
            .handle(Self::list)
            .handle(Self::watch)
            .handle(Self::unwatch)
            .every(
                |s| Duration::from_millis(s.settings.purge_interval_ms),
                Self::purge,
            );
    }
}

impl Live {
    fn start(db: Db, settings: &StoreSettings) -> Result<Live, BuiltinError> {
        let bad = |e: rusqlite::Error| BuiltinError::Database {
            path: db.path.clone(),
            message: e.to_string(),
        };
        db.conn
            .execute_batch(
                "CREATE TABLE IF NOT EXISTS kv (
                    key BLOB PRIMARY KEY,
                    value BLOB NOT NULL,
                    version INTEGER NOT NULL,
                    expires_ms INTEGER
                 ) WITHOUT ROWID;
                 CREATE INDEX IF NOT EXISTS kv_expiry ON kv(expires_ms) WHERE expires_ms IS NOT NULL;
                 CREATE TABLE IF NOT EXISTS watches (prefix BLOB PRIMARY KEY, expires_ms INTEGER) WITHOUT ROWID;",
            )
            .map_err(bad)?;
        let hwm: u64 = db
            .conn
            .query_row("SELECT value FROM meta WHERE name = 'version'", [], |r| r.get(0))
            .optional()
            .map_err(bad)?
            .unwrap_or(0);
        let max: u64 = db
            .conn
            .query_row("SELECT COALESCE(MAX(version), 0) FROM kv", [], |r| r.get(0))
            .map_err(bad)?;
        let now = wall_ms();
        db.conn
            .execute("DELETE FROM watches WHERE expires_ms <= ?1", [now])
            .map_err(bad)?;
        let watches = {
            let mut stmt = db
                .conn
                .prepare("SELECT prefix, expires_ms FROM watches")
                .map_err(bad)?;
            let rows = stmt
                .query_map([], |r| {
                    Ok(WatchEntry {
                        prefix: String::from_utf8_lossy(&r.get::<_, Vec<u8>>(0)?).into_owned(),
                        expires_ms: r.get(1)?,
                    })
                })
                .map_err(bad)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(bad)?
        };
        let dirty = (settings.durability == Durability::Group).then(|| {
            let dirty = Arc::new(AtomicBool::new(false));
            db::spawn_group_commit(
                db::wal_path(&db.path),
                dirty.clone(),
                Duration::from_millis(settings.group_commit_ms),
            );
            dirty
        });
        // The first write reserves a block (and persists its end) before
        // it uses a version: a restart writes nothing until asked to.
        let start = hwm.max(max) + 1;
        Ok(Live {
            db,
            next_version: start,
            reserved: start,
            watches,
            dirty,
        })
    }

    /// Persists the end of a new block of versions before any is used.
    fn reserve(&mut self) -> Result<(), Error> {
        let end = self.next_version + VERSION_BLOCK;
        self.db
            .conn
            .execute(
                "INSERT INTO meta(name, value) VALUES ('version', ?1)
                 ON CONFLICT(name) DO UPDATE SET value = excluded.value",
                [end],
            )
            .map_err(|e| self.db.failed(e))?;
        self.reserved = end;
        Ok(())
    }

    fn version(&mut self) -> Result<u64, Error> {
        if self.next_version >= self.reserved {
            self.reserve()?;
        }
        let v = self.next_version;
        self.next_version += 1;
        Ok(v)
    }

    fn wrote(&self) {
        if let Some(dirty) = &self.dirty {
            dirty.store(true, Ordering::Release);
        }
    }

    /// The live (unexpired) state of `key`: value, version, expiry.
    fn current(&self, key: &str, now: u64) -> Result<Option<(String, u64, Option<u64>)>, Error> {
        let row = self
            .db
            .conn
            .prepare_cached("SELECT value, version, expires_ms FROM kv WHERE key = ?1")
            .and_then(|mut stmt| {
                stmt.query_row([key.as_bytes()], |r| {
                    Ok((
                        r.get::<_, Vec<u8>>(0)?,
                        r.get::<_, u64>(1)?,
                        r.get::<_, Option<u64>>(2)?,
                    ))
                })
                .optional()
            })
            .map_err(|e| self.db.failed(e))?;
        Ok(row
            .filter(|(_, _, exp)| live_at(*exp, now))
            .map(|(v, version, exp)| (String::from_utf8_lossy(&v).into_owned(), version, exp)))
    }

    fn write(&mut self, key: &str, value: &str, expires_ms: Option<u64>) -> Result<u64, Error> {
        let version = self.version()?;
        self.db
            .conn
            .prepare_cached(
                "INSERT INTO kv(key, value, version, expires_ms) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT(key) DO UPDATE SET value = excluded.value,
                   version = excluded.version, expires_ms = excluded.expires_ms",
            )
            .and_then(|mut stmt| stmt.execute(params![key.as_bytes(), value.as_bytes(), version, expires_ms]))
            .map_err(|e| self.db.failed(e))?;
        self.wrote();
        Ok(version)
    }

    /// Emits `Changed` for each live watch `key` falls under.
    fn changed(&self, cx: &Context, key: &str, op: Op, version: u64, value: &JsonText) {
        if self.watches.is_empty() {
            return;
        }
        let now = wall_ms();
        for w in &self.watches {
            if key.starts_with(&w.prefix) && live_at(w.expires_ms, now) {
                let _ = cx.notify(&Changed {
                    watch: shown(&w.prefix).to_owned(),
                    key: shown(key).to_owned(),
                    op,
                    version,
                    value: value.clone(),
                });
            }
        }
    }
}

impl Store {
    fn live(&mut self) -> Result<&mut Live, Error> {
        self.live
            .as_mut()
            .ok_or_else(|| Error::unavailable("the store is not open"))
    }

    /// Where the keys of the request `cx` handles live (decision 0114).
    fn keys(&self, cx: &Context) -> Keys {
        Keys::of(cx, &self.settings.shared)
    }

    fn check_key(&self, key: &str) -> Result<(), Error> {
        if key.is_empty() {
            return Err(Error::unprocessable("the key must not be empty"));
        }
        if key.contains('\0') {
            return Err(Error::unprocessable("a key must not contain NUL"));
        }
        if key.len() > self.settings.max_key_bytes {
            return Err(too_large(
                "a key",
                key.len(),
                "max_key_bytes",
                self.settings.max_key_bytes,
            ));
        }
        Ok(())
    }

    /// A `List` or `Watch` prefix: no NUL (a scope's separator).
    fn check_prefix(&self, prefix: &str) -> Result<(), Error> {
        if prefix.contains('\0') {
            return Err(Error::unprocessable("a prefix must not contain NUL"));
        }
        Ok(())
    }

    fn check_value(&self, value: &JsonText) -> Result<(), Error> {
        if value.len() > self.settings.max_value_bytes {
            return Err(too_large(
                "a value",
                value.len(),
                "max_value_bytes",
                self.settings.max_value_bytes,
            ));
        }
        Ok(())
    }

    fn get(&mut self, ev: Get, cx: &mut Context) -> Result<Json<Entry>, Error> {
        self.check_key(&ev.key)?;
        let key = self.keys(cx).stored(&ev.key);
        if let Some(js) = &self.js {
            return js.get(key).map(|e| Json(Entry { key: ev.key, ..e }));
        }
        let now = wall_ms();
        let live = self.live()?;
        Ok(Json(match live.current(&key, now)? {
            Some((value, version, expires_at_ms)) => Entry {
                key: ev.key,
                found: true,
                value: JsonText::parse(value)?,
                version,
                expires_at_ms,
            },
            None => Entry {
                key: ev.key,
                ..Entry::default()
            },
        }))
    }

    fn set(&mut self, ev: Set, cx: &mut Context) -> Result<Json<Written>, Error> {
        self.check_key(&ev.key)?;
        self.check_value(&ev.value)?;
        let key = self.keys(cx).stored(&ev.key);
        let now = wall_ms();
        if let Some(js) = &self.js {
            let expiry = expires(ev.ttl_ms, now);
            return js.set(Set { key, ..ev }, expiry, cx).map(Json);
        }
        let live = self.live()?;
        let version = live.write(&key, ev.value.as_str(), expires(ev.ttl_ms, now))?;
        live.changed(cx, &key, Op::Set, version, &ev.value);
        Ok(Json(Written { version }))
    }

    fn delete(&mut self, ev: Delete, cx: &mut Context) -> Result<Json<Deleted>, Error> {
        self.check_key(&ev.key)?;
        let key = self.keys(cx).stored(&ev.key);
        if let Some(js) = &self.js {
            return js.delete(key, ev.version, cx).map(Json);
        }
        let now = wall_ms();
        let live = self.live()?;
        let Some((_, version, _)) = live.current(&key, now)? else {
            return Ok(Json(Deleted { deleted: false }));
        };
        if ev.version.is_some_and(|v| v != version) {
            return Ok(Json(Deleted { deleted: false }));
        }
        live.db
            .conn
            .prepare_cached("DELETE FROM kv WHERE key = ?1")
            .and_then(|mut stmt| stmt.execute([key.as_bytes()]))
            .map_err(|e| live.db.failed(e))?;
        live.wrote();
        live.changed(cx, &key, Op::Delete, version, &JsonText::null());
        Ok(Json(Deleted { deleted: true }))
    }

    fn increment(&mut self, ev: Increment, cx: &mut Context) -> Result<Json<Counter>, Error> {
        self.check_key(&ev.key)?;
        let key = self.keys(cx).stored(&ev.key);
        if let Some(js) = &self.js {
            return js.increment(Increment { key, ..ev }, cx).map(Json);
        }
        let now = wall_ms();
        let live = self.live()?;
        let (old, expiry) = match live.current(&key, now)? {
            None => (0, None),
            Some((text, _, expiry)) => {
                let old = serde_json::from_str::<i64>(&text).map_err(|_| {
                    Error::conflict(format!(
                        "the value of `{}` is not an integer, it cannot be incremented",
                        ev.key
                    ))
                })?;
                (old, expiry)
            }
        };
        let value = old
            .checked_add(ev.by)
            .ok_or_else(|| Error::conflict(format!("incrementing `{}` by {} overflows", ev.key, ev.by)))?;
        let expiry = if ev.ttl_ms.is_some() {
            expires(ev.ttl_ms, now)
        } else {
            expiry
        };
        let text = value.to_string();
        let version = live.write(&key, &text, expiry)?;
        live.changed(cx, &key, Op::Set, version, &JsonText::parse(text)?);
        Ok(Json(Counter { value, version }))
    }

    fn compare_and_set(&mut self, ev: CompareAndSet, cx: &mut Context) -> Result<Json<Swapped>, Error> {
        self.check_key(&ev.key)?;
        self.check_value(&ev.value)?;
        let key = self.keys(cx).stored(&ev.key);
        if let Some(js) = &self.js {
            return js.swap(key, ev.value, ev.ttl_ms, Some(ev.version), cx).map(Json);
        }
        let now = wall_ms();
        let live = self.live()?;
        let current = live.current(&key, now)?.map_or(0, |(_, v, _)| v);
        if current != ev.version {
            return Ok(Json(Swapped {
                swapped: false,
                version: current,
            }));
        }
        let version = live.write(&key, ev.value.as_str(), expires(ev.ttl_ms, now))?;
        live.changed(cx, &key, Op::Set, version, &ev.value);
        Ok(Json(Swapped {
            swapped: true,
            version,
        }))
    }

    fn set_if_absent(&mut self, ev: SetIfAbsent, cx: &mut Context) -> Result<Json<Swapped>, Error> {
        self.check_key(&ev.key)?;
        self.check_value(&ev.value)?;
        let key = self.keys(cx).stored(&ev.key);
        if let Some(js) = &self.js {
            return js.swap(key, ev.value, ev.ttl_ms, None, cx).map(Json);
        }
        let now = wall_ms();
        let live = self.live()?;
        if let Some((_, version, _)) = live.current(&key, now)? {
            return Ok(Json(Swapped {
                swapped: false,
                version,
            }));
        }
        let version = live.write(&key, ev.value.as_str(), expires(ev.ttl_ms, now))?;
        live.changed(cx, &key, Op::Set, version, &ev.value);
        Ok(Json(Swapped {
            swapped: true,
            version,
        }))
    }

    fn list(&mut self, ev: List, cx: &mut Context) -> Result<Json<Listed>, Error> {
        self.check_prefix(&ev.prefix)?;
        // The caller's keys, or a shared namespace's (decision 0114); the
        // page's `after` is a key of the same place.
        let keys = self.keys(cx);
        let place = keys.stored(&ev.prefix);
        let place = &place[..place.len() - ev.prefix.len()];
        let ev = List {
            after: ev.after.map(|a| format!("{place}{a}")),
            prefix: format!("{place}{}", ev.prefix),
            ..ev
        };
        if ev.prefix.len() - place.len() > self.settings.max_key_bytes {
            return Err(too_large(
                "a prefix",
                ev.prefix.len() - place.len(),
                "max_key_bytes",
                self.settings.max_key_bytes,
            ));
        }
        let limit = ev.limit.unwrap_or(LIST_MAX).clamp(1, LIST_MAX);
        if let Some(js) = &self.js {
            let mut listed = js.list(&ev, limit, LIST_MAX_BYTES)?;
            for e in &mut listed.entries {
                if let Some(k) = e.key.strip_prefix(place) {
                    e.key = k.to_owned();
                }
            }
            if let Some(k) = listed.next.as_deref().and_then(|n| n.strip_prefix(place)) {
                listed.next = Some(k.to_owned());
            }
            return Ok(Json(listed));
        }
        let now = wall_ms();
        let live = self.live()?;
        let lower = match &ev.after {
            Some(after) if after.as_str() >= ev.prefix.as_str() => after.as_bytes().to_vec(),
            _ => ev.prefix.as_bytes().to_vec(),
        };
        let inclusive = ev.after.as_ref().is_none_or(|a| a.as_str() < ev.prefix.as_str());
        // One more than the page: whether there is a next page.
        let upper = prefix_end(ev.prefix.as_bytes());
        let sql = format!(
            "SELECT key, version, expires_ms, {} FROM kv
             WHERE key {} ?1 AND (?2 IS NULL OR key < ?2) AND (expires_ms IS NULL OR expires_ms > ?3)
             ORDER BY key LIMIT ?4",
            if ev.keys_only { "NULL" } else { "value" },
            if inclusive { ">=" } else { ">" },
        );
        let mut entries = Vec::new();
        let mut next = None;
        let mut bytes = 0usize;
        let rows: Vec<ListRow> = live
            .db
            .conn
            .prepare_cached(&sql)
            .and_then(|mut stmt| {
                stmt.query_map(params![lower, upper, now, limit + 1], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
                })?
                .collect()
            })
            .map_err(|e| live.db.failed(e))?;
        for (i, (key, version, expires_at_ms, value)) in rows.into_iter().enumerate() {
            let key = String::from_utf8_lossy(&key);
            let key = key.strip_prefix(place).unwrap_or(&key).to_owned();
            let value = value.map(|v| String::from_utf8_lossy(&v).into_owned());
            let size = value.as_ref().map_or(0, String::len) + key.len();
            if i as u32 == limit || (!entries.is_empty() && bytes + size > LIST_MAX_BYTES) {
                next = entries.last().map(|e: &Entry| e.key.clone());
                break;
            }
            bytes += size;
            entries.push(Entry {
                key,
                found: true,
                value: match value {
                    Some(v) => JsonText::parse(v)?,
                    None => JsonText::null(),
                },
                version,
                expires_at_ms,
            });
        }
        Ok(Json(Listed { entries, next }))
    }

    fn watch(&mut self, ev: Watch, cx: &mut Context) -> Result<Json<Watching>, Error> {
        self.check_prefix(&ev.prefix)?;
        let shown_prefix = ev.prefix.clone();
        let ev = Watch {
            prefix: self.keys(cx).stored(&ev.prefix),
            ..ev
        };
        if shown_prefix.len() > self.settings.max_key_bytes {
            return Err(too_large(
                "a prefix",
                shown_prefix.len(),
                "max_key_bytes",
                self.settings.max_key_bytes,
            ));
        }
        let max = self.settings.max_watches;
        let now = wall_ms();
        let expires_ms = expires(ev.lease_ms, now);
        if let Some(js) = &self.js {
            return js.watch(ev.prefix, expires_ms, max).map(|w| {
                Json(Watching {
                    prefix: shown_prefix,
                    ..w
                })
            });
        }
        let live = self.live()?;
        live.watches.retain(|w| live_at(w.expires_ms, now));
        let known = live.watches.iter().position(|w| w.prefix == ev.prefix);
        if known.is_none() && live.watches.len() >= max {
            return Err(Error::new(
                429,
                format!("the store already has {max} watches (`max_watches`); end one with store.Unwatch"),
            ));
        }
        live.db
            .conn
            .prepare_cached(
                "INSERT INTO watches(prefix, expires_ms) VALUES (?1, ?2)
                 ON CONFLICT(prefix) DO UPDATE SET expires_ms = excluded.expires_ms",
            )
            .and_then(|mut stmt| stmt.execute(params![ev.prefix.as_bytes(), expires_ms]))
            .map_err(|e| live.db.failed(e))?;
        live.wrote();
        match known {
            Some(i) => live.watches[i].expires_ms = expires_ms,
            None => live.watches.push(WatchEntry {
                prefix: ev.prefix.clone(),
                expires_ms,
            }),
        }
        Ok(Json(Watching {
            prefix: shown_prefix,
            expires_at_ms: expires_ms,
        }))
    }

    fn unwatch(&mut self, ev: Unwatch, cx: &mut Context) -> Result<Json<Unwatched>, Error> {
        let ev = Unwatch {
            prefix: self.keys(cx).stored(&ev.prefix),
        };
        if let Some(js) = &self.js {
            return js.unwatch(ev.prefix).map(Json);
        }
        let live = self.live()?;
        let before = live.watches.len();
        live.watches.retain(|w| w.prefix != ev.prefix);
        live.db
            .conn
            .prepare_cached("DELETE FROM watches WHERE prefix = ?1")
            .and_then(|mut stmt| stmt.execute([ev.prefix.as_bytes()]))
            .map_err(|e| live.db.failed(e))?;
        live.wrote();
        Ok(Json(Unwatched {
            removed: live.watches.len() < before,
        }))
    }

    /// Removes up to `purge_batch` expired keys in one transaction (the
    /// rest at the next round), and tells the watches.
    fn purge(&mut self, cx: &mut Context) -> Result<(), Error> {
        let batch = self.settings.purge_batch;
        if let Some(js) = &self.js {
            let purged = js.purge(batch, cx)?;
            if purged > 0 {
                cx.log_at(LogLevel::Debug, &format!("purged {purged} expired keys"));
            }
            return Ok(());
        }
        let Some(live) = self.live.as_mut() else {
            return Ok(());
        };
        let now = wall_ms();
        let purged = purge_expired(live, now, batch).map_err(|e| live.db.failed(e))?;
        if !purged.is_empty() {
            live.wrote();
            for (key, version) in &purged {
                live.changed(cx, key, Op::Expire, *version, &JsonText::null());
            }
            cx.log_at(LogLevel::Debug, &format!("purged {} expired keys", purged.len()));
        }
        let before = live.watches.len();
        live.watches.retain(|w| live_at(w.expires_ms, now));
        if live.watches.len() < before {
            live.db
                .conn
                .execute("DELETE FROM watches WHERE expires_ms <= ?1", [now])
                .map_err(|e| live.db.failed(e))?;
        }
        Ok(())
    }
}

fn purge_expired(live: &mut Live, now: u64, batch: u32) -> Result<Vec<(String, u64)>, rusqlite::Error> {
    let tx = live.db.conn.transaction()?;
    let purged: Vec<(Vec<u8>, u64)> = {
        let mut stmt = tx.prepare_cached(
            "SELECT key, version FROM kv WHERE expires_ms <= ?1 ORDER BY expires_ms LIMIT ?2",
        )?;
        stmt.query_map(params![now, batch], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<Result<_, _>>()?
    };
    if purged.is_empty() {
        return Ok(Vec::new());
    }
    {
        let mut delete = tx.prepare_cached("DELETE FROM kv WHERE key = ?1 AND expires_ms <= ?2")?;
        for (key, _) in &purged {
            delete.execute(params![key, now])?;
        }
    }
    tx.commit()?;
    Ok(purged
        .into_iter()
        .map(|(k, v)| (String::from_utf8_lossy(&k).into_owned(), v))
        .collect())
}

pub(crate) mod jetstream;
pub mod transfer;

#[cfg(test)]
mod tests;
