//! `switchyard store export` / `import`: the Store's live keys as JSON
//! lines (`{"key", "value", "expires_at_ms"}`), read from and written to
//! either back end, to move a store between SQLite and JetStream
//! (decision 0138). Versions are not carried: the back end receiving the
//! keys gives them its own.

use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

use rusqlite::{OpenFlags, params};
use serde::{Deserialize, Serialize};
use switchyard_manager::store::JsonText;

use super::jetstream::{self as js, JsStore, Wrote};
use super::{Live, StoreSettings};
use crate::BuiltinError;
use crate::db::{self, wall_ms};
use crate::nats::BucketSpec;

/// One key as exported.
#[derive(Debug, Serialize, Deserialize)]
pub struct Line {
    pub key: String,
    pub value: JsonText,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
}

fn io(e: std::io::Error) -> BuiltinError {
    BuiltinError::Config {
        key: "transfer".into(),
        message: e.to_string(),
    }
}

fn line_error(n: usize, message: impl std::fmt::Display) -> BuiltinError {
    BuiltinError::Config {
        key: format!("input line {n}"),
        message: message.to_string(),
    }
}

/// The Store's settings (its `config` JSON, as the supervisor gives it),
/// with `backend` forced when asked.
fn settings(config: &serde_json::Value, backend: Option<&str>) -> Result<StoreSettings, BuiltinError> {
    let mut config = config.clone();
    if let (Some(b), serde_json::Value::Object(map)) = (backend, &mut config) {
        map.insert("backend".into(), serde_json::Value::String(b.to_owned()));
    }
    StoreSettings::parse(&config)
}

/// Opens the JetStream back end and waits (bounded) for its bucket.
fn open_js(s: &StoreSettings) -> Result<Option<JsStore>, BuiltinError> {
    let Some(cluster) = s.jetstream() else {
        return Ok(None);
    };
    let spec = BucketSpec {
        name: s
            .bucket
            .clone()
            .unwrap_or_else(|| format!("store-{}", cluster.name)),
        replicas: s.replicas,
        max_value_bytes: s.max_value_bytes,
    };
    let store = JsStore::start(cluster, spec, Duration::from_millis(s.op_timeout_ms))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Err(e) = store.link().bucket() {
        if Instant::now() > deadline {
            return Err(BuiltinError::Config {
                key: "backend".into(),
                message: format!("JetStream not reachable within 30 s: {}", e.message),
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(Some(store))
}

fn failed(e: switchyard_manager::Error) -> BuiltinError {
    BuiltinError::Config {
        key: "backend".into(),
        message: format!("{} {}", e.status, e.message),
    }
}

/// Writes every live key, in key order, one JSON line each; returns how
/// many. The SQLite database is read as it is (a running group may keep
/// writing: the export is a consistent snapshot of one transaction).
pub fn export(
    config: &serde_json::Value,
    backend: Option<&str>,
    out: &mut dyn Write,
) -> Result<u64, BuiltinError> {
    let s = settings(config, backend)?;
    let mut n = 0u64;
    if let Some(store) = open_js(&s)? {
        let mut after: Option<String> = None;
        loop {
            let a = after.clone();
            let rows = store
                .link()
                .run(move |b| async move { js::scan(&b, "", a.as_deref(), 1000, false, false).await })
                .map_err(failed)?;
            let more = rows.len() > 1000;
            for row in rows.into_iter().take(1000) {
                let line = Line {
                    key: row.key.clone(),
                    value: JsonText::parse(row.value.unwrap_or_default()).map_err(|e| failed(e.into()))?,
                    expires_at_ms: row.expires,
                };
                writeln!(
                    out,
                    "{}",
                    serde_json::to_string(&line).map_err(|e| line_error(0, e))?
                )
                .map_err(io)?;
                after = Some(row.key);
                n += 1;
            }
            if !more {
                return Ok(n);
            }
        }
    }
    let dir = s.data_dir.clone().ok_or_else(|| BuiltinError::Config {
        key: crate::DATA_DIR_KEY.into(),
        message: "no data directory".into(),
    })?;
    let path = dir.join(db::DB_FILE);
    let bad = |e: rusqlite::Error| BuiltinError::Database {
        path: path.clone(),
        message: e.to_string(),
    };
    let conn = rusqlite::Connection::open_with_flags(&path, OpenFlags::SQLITE_OPEN_READ_ONLY).map_err(bad)?;
    let mut stmt = conn
        .prepare(
            "SELECT key, value, expires_ms FROM kv WHERE expires_ms IS NULL OR expires_ms > ?1 ORDER BY key",
        )
        .map_err(bad)?;
    let mut rows = stmt.query(params![wall_ms()]).map_err(bad)?;
    while let Some(row) = rows.next().map_err(bad)? {
        let key: Vec<u8> = row.get(0).map_err(bad)?;
        let value: Vec<u8> = row.get(1).map_err(bad)?;
        let line = Line {
            key: String::from_utf8_lossy(&key).into_owned(),
            value: JsonText::parse(String::from_utf8_lossy(&value).into_owned())
                .map_err(|e| failed(e.into()))?,
            expires_at_ms: row.get(2).map_err(bad)?,
        };
        writeln!(
            out,
            "{}",
            serde_json::to_string(&line).map_err(|e| line_error(0, e))?
        )
        .map_err(io)?;
        n += 1;
    }
    Ok(n)
}

/// Sets every key of `input` (JSON lines as [`export`] writes them);
/// returns how many. A key already there is overwritten; an expiry
/// already past is skipped. SQLite takes the Store's lock: stop the group
/// (or its store) first.
pub fn import(
    config: &serde_json::Value,
    backend: Option<&str>,
    input: &mut dyn BufRead,
) -> Result<u64, BuiltinError> {
    let s = settings(config, backend)?;
    let js = open_js(&s)?;
    let mut live = match &js {
        Some(_) => None,
        None => {
            let dir = s.data_dir.clone().ok_or_else(|| BuiltinError::Config {
                key: crate::DATA_DIR_KEY.into(),
                message: "no data directory".into(),
            })?;
            let db = db::open(&dir, "store", s.durability, s.cache_kib)?;
            Some(Live::start(db, &s)?)
        }
    };
    let mut n = 0u64;
    for (i, line) in input.lines().enumerate() {
        let line = line.map_err(io)?;
        if line.trim().is_empty() {
            continue;
        }
        let Line {
            key,
            value,
            expires_at_ms,
        } = serde_json::from_str(&line).map_err(|e| line_error(i + 1, e))?;
        if key.is_empty() || key.len() > s.max_key_bytes {
            return Err(line_error(i + 1, format!("key of {} bytes", key.len())));
        }
        if expires_at_ms.is_some_and(|e| e <= wall_ms()) {
            continue;
        }
        let value = value.as_str().to_owned();
        match (&js, &mut live) {
            (Some(store), _) => {
                let budget = (store.link().attempt_timeout(), store.link().timeout);
                let wrote = store
                    .link()
                    .run(move |b| async move {
                        js::write(&b, &key, Some(&value), expires_at_ms, None, budget).await
                    })
                    .map_err(failed)?;
                if !matches!(wrote, Wrote::Done(_)) {
                    return Err(line_error(i + 1, "the write was refused"));
                }
            }
            (None, Some(live)) => {
                live.write(&key, &value, expires_at_ms).map_err(failed)?;
            }
            // `live` is opened whenever `js` is not.
            (None, None) => {}
        }
        n += 1;
    }
    Ok(n)
}
